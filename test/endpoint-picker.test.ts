/**
 * The endpoint picker protocol (Gateway API Inference Extension, docs/proposals/004; see
 * docs/inference-pool.md) between a real gateway and the proxy: first on the wire with the
 * Envoy-faithful ext_proc client (exact header, `envoy.lb` metadata, ordered fallback list,
 * subset hint, served endpoint), then through the Envoy stand-in (`jetroute front`): fallbacks
 * tried in order, the served endpoint reported back, FailOpen and FailClose when the picker is gone.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient, type PhaseResult } from "../services/extproc/envoy-client.js";
import { type FrontServer, startFront } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { MODEL, quietLog, startTestEnv, type TestEnv } from "./harness/env.js";

const chat = () => Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello" }] }));
const reqHeaders = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json" };
const LIST = "x-gateway-destination-endpoint";

function continued(r: PhaseResult) {
  if (r.kind !== "continue") throw new Error(`expected continue, got ${r.kind}`);
  return r;
}

/** An engine that answers every request with its own address. */
async function engine(): Promise<{ server: http.Server; address: string }> {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", async () => {
      // Slow enough that concurrent requests overlap (least-request then spreads them over every pod).
      await new Promise((r) => setTimeout(r, 150));
      const body = JSON.stringify({ id: "x", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }], usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } });
      res.writeHead(200, { "content-type": "application/json", "x-served-by": `127.0.0.1:${(server.address() as AddressInfo).port}` }).end(body);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, address: `127.0.0.1:${(server.address() as AddressInfo).port}` };
}

async function post(port: number): Promise<{ status: number; servedBy?: string; body: string }> {
  const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: chat() });
  return { status: res.status, servedBy: res.headers.get("x-served-by") ?? undefined, body: await res.text() };
}

describe("endpoint picker protocol: gateway <-> proxy", () => {
  let env: TestEnv;
  let gw: GatewayHandle;
  let client: ExtProcClient;
  const engines: { server: http.Server; address: string }[] = [];
  const fronts: FrontServer[] = [];
  const metric = async (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(await (await fetch(`http://127.0.0.1:${gw.adminPort}/metrics`)).text())?.[1] ?? Number.NaN);

  beforeAll(async () => {
    env = await startTestEnv();
    for (let i = 0; i < 3; i++) engines.push(await engine());
    for (const [i, e] of engines.entries()) await env.publishPod({ pod: `pick-${i}`, address: e.address });
    // A pod whose engine is gone (its port closed): ready in PODS, refusing connections.
    await env.publishPod({ pod: "pick-dead", address: "127.0.0.1:9" });
    gw = await env.gateway({ destinationFallbacks: 2, adminPort: 0, adminHost: "127.0.0.1" });
    client = new ExtProcClient(`127.0.0.1:${gw.port}`);
  });
  afterAll(async () => {
    client?.close();
    for (const f of fronts) await f.close();
    for (const e of engines) e.server.close();
    await env?.stop();
  });

  it("header and envoy.lb metadata carry the same ordered list (chosen first, then fallbacks), within the subset hint; an empty subset is a 503", async () => {
    const ex = client.open();
    await ex.requestHeaders(reqHeaders);
    const b = continued(await ex.requestBody(chat()));
    const list = b.headerMutation.set[LIST] as string;
    const entries = list.split(",");
    expect(entries).toHaveLength(3);
    expect(new Set(entries).size).toBe(3);
    expect(b.dynamicMetadata).toEqual({ "envoy.lb": { [LIST]: list } });
    // AIBrix's header names the chosen endpoint alone.
    expect(b.headerMutation.set["target-pod"]).toBe(entries[0]);
    ex.cancel();

    const subset = [engines[1]?.address, engines[2]?.address] as string[];
    const ex2 = client.open({ metadataContext: { "envoy.lb.subset_hint": { "x-gateway-destination-endpoint-subset": subset } } });
    await ex2.requestHeaders(reqHeaders);
    const b2 = continued(await ex2.requestBody(chat()));
    expect((b2.headerMutation.set[LIST] as string).split(",").sort()).toEqual([...subset].sort());
    expect(b2.dynamicMetadata).toEqual({ "envoy.lb": { [LIST]: b2.headerMutation.set[LIST] } });
    ex2.cancel();

    const ex3 = client.open({ metadataContext: { "envoy.lb.subset_hint": { "x-gateway-destination-endpoint-subset": [] } } });
    await ex3.requestHeaders(reqHeaders);
    const r3 = await ex3.requestBody(chat());
    expect(r3.kind === "immediate" && r3.status).toBe(503);
  });

  it("the served endpoint reported on the response path is read: one other than the chosen one is counted", async () => {
    const before = await metric("jetroute_gateway_served_by_fallback_total");
    const ex = client.open();
    await ex.requestHeaders(reqHeaders);
    const entries = (continued(await ex.requestBody(chat())).headerMutation.set[LIST] as string).split(",");
    await ex.responseHeaders(200, { "content-type": "application/json" }, false, { "envoy.lb": { "x-gateway-destination-endpoint-served": entries[1] as string } });
    await ex.responseBodyChunk(Buffer.from("{}"), true);
    await ex.end();
    expect(await metric("jetroute_gateway_served_by_fallback_total")).toBe(before + 1);
  });

  it("through the Envoy stand-in: a dead chosen endpoint falls back down the list, and the proxy reports which endpoint served", async () => {
    const front = await startFront({ port: 0, gateways: [`127.0.0.1:${gw.port}`], logger: quietLog });
    fronts.push(front);
    const before = await metric("jetroute_gateway_served_by_fallback_total");
    // Eight at once over four pods: least-request gives the dead pod two of them; each falls back.
    const results = await Promise.all(Array.from({ length: 8 }, () => post(front.port)));
    expect(results.map((r) => r.status)).toEqual(Array(8).fill(200));
    const served = results.map((r) => r.servedBy as string);
    expect(served.every((s) => engines.some((e) => e.address === s))).toBe(true);
    expect(await metric("jetroute_gateway_served_by_fallback_total")).toBe(before + 2);
  });

  it("FailClose: the picker unreachable -> the proxy answers 500 and forwards nothing; FailOpen: the proxy forwards to a pool endpoint itself", async () => {
    const dead = "127.0.0.1:1";
    const closed = await startFront({ port: 0, gateways: [dead], failureMode: "FailClose", poolEndpoints: [engines[0]?.address as string], logger: quietLog });
    const open = await startFront({ port: 0, gateways: [dead], failureMode: "FailOpen", poolEndpoints: engines.map((e) => e.address), logger: quietLog });
    fronts.push(closed, open);
    const c = await post(closed.port);
    expect(c.status).toBe(500);
    expect(JSON.parse(c.body)).toMatchObject({ error: { code: 500 } });
    expect(c.servedBy).toBeUndefined();
    const got = new Set<string>();
    for (let i = 0; i < 3; i++) {
      const o = await post(open.port);
      expect(o.status).toBe(200);
      got.add(o.servedBy as string);
    }
    // The proxy's own round-robin over the pool.
    expect([...got].sort()).toEqual(engines.map((e) => e.address).sort());
  });
});
