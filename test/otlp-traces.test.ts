/**
 * OpenTelemetry traces against a real OTLP/HTTP receiver (a node:http server collecting the
 * POSTed ExportTraceServiceRequest JSON): a gateway with --otlp-endpoint sends, per request, a
 * GenAI request span that is the child of the client's `traceparent` and one child span per stage
 * the request visited, in order; a refusal's span names its stage; a gateway without the flag sends
 * nothing; a full queue drops spans and counts them, never blocking.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient, type PhaseResult } from "../services/extproc/envoy-client.js";
import { REQUEST_PATH, stagesOf } from "../services/routing/mod.js";
import { OtlpTraceExporter } from "../services/gateway/otlp-traces.js";
import type { OtlpSpan } from "../services/gateway/trace-spans.js";
import { resolveGatewayConfig, GatewayConfigError } from "../services/gateway/config.js";
import { runJetroute } from "./harness/cli.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

interface Export {
  path: string;
  contentType: string | undefined;
  service: string;
  spans: OtlpSpan[];
}

class Receiver {
  readonly exports: Export[] = [];
  private server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (c: Buffer) => parts.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(parts).toString()) as {
        resourceSpans: { resource: { attributes: { key: string; value: { stringValue: string } }[] }; scopeSpans: { spans: OtlpSpan[] }[] }[];
      };
      for (const rs of body.resourceSpans) {
        const service = rs.resource.attributes.find((a) => a.key === "service.name")?.value.stringValue ?? "";
        this.exports.push({ path: req.url ?? "", contentType: req.headers["content-type"], service, spans: rs.scopeSpans.flatMap((s) => s.spans) });
      }
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  async listen(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }
  get spans(): OtlpSpan[] {
    return this.exports.flatMap((e) => e.spans);
  }
  close(): Promise<void> {
    return new Promise((r) => this.server.close(() => r()));
  }
}

const TRACE = "0af7651916cd43dd8448eb211c80319c";
const PARENT = "b7ad6b7169203331";
const chat = (model = MODEL) => Buffer.from(JSON.stringify({ model, max_tokens: 32, messages: [{ role: "user", content: "hello" }] }));

async function route(c: ExtProcClient, headers: Record<string, string>, body = chat()): Promise<PhaseResult> {
  const ex = c.open();
  await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", ...headers });
  const r = await ex.requestBody(body);
  ex.cancel();
  return r;
}

const attr = (s: OtlpSpan | undefined, key: string) => s?.attributes.find((a) => a.key === key)?.value;

describe("OpenTelemetry traces (--otlp-endpoint)", () => {
  let env: TestEnv;
  let receiver: Receiver;
  let endpoint: string;
  beforeAll(async () => {
    env = await startTestEnv();
    receiver = new Receiver();
    endpoint = await receiver.listen();
    await env.publishPod({ pod: "pod-0", address: "127.0.0.1:9300" });
  });
  afterAll(async () => {
    await env?.stop();
    await receiver?.close();
  });

  it("a routed request: a request span carrying the client's trace, and one child span per stage, in order", async () => {
    const g = await env.gateway({ id: "traced", otlpEndpoint: `${endpoint}/`, otlpServiceName: "edge-router" });
    await waitFor(() => g.views.pods.readyPods(MODEL).length === 1, 5_000, "the pod is seen");
    const c = new ExtProcClient(`127.0.0.1:${g.port}`);
    const r = await route(c, { traceparent: `00-${TRACE}-${PARENT}-01`, "x-request-id": "t-1" });
    expect(r.kind).toBe("continue");
    await g.traces?.flush();
    await waitFor(() => receiver.spans.some((s) => s.traceId === TRACE && s.parentSpanId === PARENT), 5_000, "the request span");

    const exp = receiver.exports.find((e) => e.spans.some((s) => s.traceId === TRACE));
    expect(exp).toMatchObject({ path: "/v1/traces", contentType: "application/json", service: "edge-router" });
    const root = receiver.spans.find((s) => s.traceId === TRACE && s.parentSpanId === PARENT);
    expect(root).toMatchObject({ name: `chat ${MODEL}`, kind: 2, status: { code: 0 } });
    expect(root?.spanId).toMatch(/^[0-9a-f]{16}$/);
    expect(attr(root, "gen_ai.operation.name")).toEqual({ stringValue: "chat" });
    expect(attr(root, "gen_ai.request.model")).toEqual({ stringValue: MODEL });
    expect(attr(root, "gen_ai.request.max_tokens")).toEqual({ intValue: "32" });
    expect(attr(root, "server.address")).toEqual({ stringValue: "127.0.0.1:9300" });
    expect(attr(root, "jetroute.strategy")).toEqual({ stringValue: "least-request" });
    const children = receiver.spans.filter((s) => s.parentSpanId === root?.spanId);
    expect(children.map((s) => s.name)).toEqual(stagesOf(REQUEST_PATH).map((s) => s.name));
    for (const s of children) {
      expect(s.traceId).toBe(TRACE);
      expect(BigInt(s.startTimeUnixNano)).toBeGreaterThanOrEqual(BigInt(root!.startTimeUnixNano));
      expect(BigInt(s.endTimeUnixNano)).toBeLessThanOrEqual(BigInt(root!.endTimeUnixNano));
      expect(BigInt(s.endTimeUnixNano)).toBeGreaterThanOrEqual(BigInt(s.startTimeUnixNano));
    }
    expect(g.traces?.stats).toMatchObject({ dropped: 0, failed: 0 });
    c.close();
  });

  it("an unsampled traceparent is not continued; an invalid one is ignored (a new trace); a refusal's span names its stage and error", async () => {
    const g = await env.gateway({ id: "traced-2", otlpEndpoint: endpoint });
    const c = new ExtProcClient(`127.0.0.1:${g.port}`);
    // A client span not sampled (flags 00) is not continued.
    expect((await route(c, { traceparent: `00-${"3".repeat(32)}-${PARENT}-00` })).kind).toBe("continue");
    const bad = `00-${TRACE.toUpperCase()}-${PARENT}-01`;
    const r = await route(c, { traceparent: bad, "x-request-id": "t-2" }, chat("org/nobody-serves-this"));
    expect(r).toMatchObject({ kind: "immediate", status: 404 });
    await g.traces?.flush();
    const refused = () => receiver.spans.find((s) => s.name === "chat org/nobody-serves-this");
    await waitFor(() => refused() !== undefined, 5_000, "the refused request's span");
    const root = refused();
    expect(root?.traceId).toMatch(/^[0-9a-f]{32}$/);
    expect(root?.traceId).not.toBe(TRACE);
    expect(receiver.spans.some((s) => s.traceId === "3".repeat(32))).toBe(false);
    expect(root?.parentSpanId).toBeUndefined();
    expect(root?.status.code).toBe(2);
    const stage = (attr(root, "jetroute.refusal.stage") as { stringValue: string } | undefined)?.stringValue;
    expect(stage).toBeDefined();
    expect(attr(root, "error.type")).toEqual({ stringValue: "model_not_found" });
    const children = receiver.spans.filter((s) => s.parentSpanId === root?.spanId);
    expect(children.at(-1)?.name).toBe(stage);
    expect(children.at(-1)?.status.code).toBe(2);
    c.close();
  });

  it("a gateway without --otlp-endpoint sends nothing", async () => {
    const untraced = await env.gateway({ id: "untraced" });
    expect(untraced.traces).toBeUndefined();
    const c = new ExtProcClient(`127.0.0.1:${untraced.port}`);
    expect((await route(c, { traceparent: `00-${"1".repeat(32)}-${PARENT}-01` })).kind).toBe("continue");
    c.close();
    // A traced gateway's request, routed after it, reaches the receiver; the untraced one's never did.
    const traced = await env.gateway({ id: "traced-3", otlpEndpoint: endpoint });
    const t = new ExtProcClient(`127.0.0.1:${traced.port}`);
    expect((await route(t, { traceparent: `00-${"2".repeat(32)}-${PARENT}-01` })).kind).toBe("continue");
    await traced.traces?.flush();
    await waitFor(() => receiver.spans.some((s) => s.traceId === "2".repeat(32)), 5_000, "the traced gateway's span");
    expect(receiver.spans.some((s) => s.traceId === "1".repeat(32))).toBe(false);
    t.close();
  });

  it("the exporter's queue is bounded: spans beyond it are dropped and counted; add never blocks", async () => {
    const ex = new OtlpTraceExporter({ endpoint, serviceName: "bounded", maxQueue: 3, maxBatch: 100, intervalMs: 60_000 });
    const span = (i: number): OtlpSpan => ({ traceId: TRACE, spanId: `${i}`.padStart(16, "0"), name: "s", kind: 1, startTimeUnixNano: "1", endTimeUnixNano: "2", attributes: [], status: { code: 0 } });
    ex.add([span(1), span(2), span(3), span(4), span(5)]);
    expect(ex.stats).toMatchObject({ queued: 3, dropped: 2 });
    await ex.close();
    expect(ex.stats).toMatchObject({ exported: 3, failed: 0 });
    expect(receiver.exports.filter((e) => e.service === "bounded").flatMap((e) => e.spans)).toHaveLength(3);
  });

  it("an unreachable receiver fails the export, not the request path; bad endpoints are refused", async () => {
    const ex = new OtlpTraceExporter({ endpoint: "http://127.0.0.1:1", timeoutMs: 2_000, intervalMs: 60_000 });
    ex.add([{ traceId: TRACE, spanId: PARENT, name: "s", kind: 1, startTimeUnixNano: "1", endTimeUnixNano: "2", attributes: [], status: { code: 0 } }]);
    await ex.close();
    expect(ex.stats).toMatchObject({ exported: 0, failed: 1 });
    expect(() => resolveGatewayConfig({ nats: "nats://127.0.0.1:4222", otlpEndpoint: "grpc://collector:4317" })).toThrow(GatewayConfigError);
    expect(() => new OtlpTraceExporter({ endpoint: "file:///x" })).toThrow(/http or https/);
  });

  it("jetroute gateway refuses a bad --otlp-endpoint before starting", async () => {
    const r = await runJetroute(["gateway", "--otlp-endpoint", "grpc://collector:4317"]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain("--otlp-endpoint must be an http or https URL");
  });
});
