/**
 * The refusals the ext_proc adapter makes itself, before or around routing: a body over its limit
 * (413), a gateway whose views are not caught up or that is shutting down (503), and an unexpected
 * failure (500). Driven as Envoy drives it (real gRPC, Envoy's phase order) against a real
 * Director on an in-memory fold: no NATS needed.
 */
import { afterEach, describe, expect, it } from "vitest";
import type { ExtProcClient, PhaseResult } from "../extproc/envoy-client.js";
import { Director, type PrefixSupport } from "../routing/director.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "../routing/stages/testing.js";
import type { ExtProcHandlerOptions } from "./extproc-server.js";
import { ExtProcTestServers } from "../../test/harness/extproc.js";

const reqHeaders = (extra: Record<string, string> = {}) => ({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", ...extra });

function setup(o: { prefix?: PrefixSupport } = {}) {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(2, "gw");
  const sink = new MemorySink();
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now, ...(o.prefix ? { prefix: o.prefix } : {}) });
  return { sink, director };
}

const servers = new ExtProcTestServers();
afterEach(() => servers.closeAll());

const serve = (opts: Partial<ExtProcHandlerOptions> & Pick<ExtProcHandlerOptions, "router">) => servers.serve({ listModels: () => [MODEL], ...opts });

function immediate(r: PhaseResult) {
  if (r.kind !== "immediate") throw new Error(`expected an immediate response, got ${r.kind}`);
  return { status: r.status, contentType: r.headers["content-type"], error: (JSON.parse(r.body.toString()) as { error: { message: string; type: string; code: string; param: string | null } }).error };
}

async function post(client: ExtProcClient, body: Buffer, headers: Record<string, string> = {}): Promise<PhaseResult> {
  const ex = client.open();
  const h = await ex.requestHeaders(reqHeaders(headers));
  if (h.kind !== "continue") return h;
  const r = await ex.requestBody(body);
  if (r.kind === "continue") ex.cancel();
  return r;
}

describe("ext_proc adapter - refusals of its own", () => {
  it("a body over the limit -> 413 request_too_large, recorded as a rejection, nothing charged; a body at the limit is routed", async () => {
    const { sink, director } = setup();
    const atLimit = chatBody();
    const client = await serve({ router: director, maxBodyBytes: atLimit.length });
    expect((await post(client, atLimit)).kind).toBe("continue");
    expect(sink.charges).toHaveLength(1);

    const over = immediate(await post(client, chatBody(MODEL, { user: "u" }), { "x-request-id": "too-big" }));
    expect([over.status, over.contentType]).toEqual([413, "application/json"]);
    expect(over.error).toMatchObject({ code: "request_too_large", type: "invalid_request_error", param: null });
    expect(sink.charges).toHaveLength(1);
    expect(sink.decisions.find((d) => d.id === "too-big")).toMatchObject({ outcome: "rejected", status: 413, errorCode: "request_too_large", pick: null });
  });

  it("a body sent in chunks is measured whole: chunks each under the limit, together over it -> 413 request_too_large", async () => {
    const { sink, director } = setup();
    const body = chatBody();
    const client = await serve({ router: director, maxBodyBytes: body.length - 1 });
    const ex = client.open();
    await ex.requestHeaders(reqHeaders());
    const half = Math.floor(body.length / 2);
    const first = await ex.send("request_body", { request_body: { body: body.subarray(0, half), end_of_stream: false } });
    expect(first.kind).toBe("continue");
    const last = immediate(await ex.send("request_body", { request_body: { body: body.subarray(half), end_of_stream: true } }));
    expect([last.status, last.error.code]).toEqual([413, "request_too_large"]);
    expect(sink.charges).toHaveLength(0);
  });

  it("views not caught up yet -> 503 gateway_not_ready (overloaded_error), nothing charged; once ready the same request is routed", async () => {
    const { sink, director } = setup();
    let ready = false;
    const client = await serve({ router: director, isReady: () => ready });
    const early = immediate(await post(client, chatBody(), { "x-request-id": "early" }));
    expect([early.status, early.error.code, early.error.type]).toEqual([503, "gateway_not_ready", "overloaded_error"]);
    expect(sink.charges).toHaveLength(0);
    expect(sink.decisions.find((d) => d.id === "early")).toMatchObject({ outcome: "rejected", status: 503, errorCode: "gateway_not_ready" });
    ready = true;
    expect((await post(client, chatBody())).kind).toBe("continue");
    expect(sink.charges).toHaveLength(1);
  });

  it("a gateway shutting down (director drained) -> 503 gateway_not_ready, nothing charged", async () => {
    const { sink, director } = setup();
    const client = await serve({ router: director });
    director.drain();
    const r = immediate(await post(client, chatBody()));
    expect([r.status, r.error.code]).toEqual([503, "gateway_not_ready"]);
    expect(r.error.message).toMatch(/shutting down/);
    expect(sink.charges).toHaveLength(0);
  });

  it("an unexpected failure while routing (a tokenizer throwing) -> 500 internal_error that does not leak the failure, recorded, nothing charged", async () => {
    const unreachable = () => {
      throw new Error("not reached: the tokenizer failed first");
    };
    const prefix: PrefixSupport = {
      tokenizer: { tokenize: () => Promise.reject(new Error("tokenizer exploded at 0xdeadbeef")) },
      match: unreachable,
      recordRouted: unreachable,
      blocks: unreachable,
    };
    const { sink, director } = setup({ prefix });
    const client = await serve({ router: director });
    const r = immediate(await post(client, chatBody(), { "routing-strategy": "prefix-cache", "x-request-id": "boom" }));
    expect([r.status, r.contentType]).toEqual([500, "application/json"]);
    expect(r.error).toMatchObject({ code: "internal_error", type: "api_error", param: null });
    expect(r.error.message).not.toMatch(/exploded|deadbeef/);
    expect(sink.charges).toHaveLength(0);
    expect(sink.decisions.find((d) => d.id === "boom")).toMatchObject({ outcome: "rejected", status: 500, errorCode: "internal_error" });
  });

  it("a failure in the handler outside routing (listing models) -> 500 internal_error", async () => {
    const { director } = setup();
    const client = await serve({
      router: director,
      listModels: () => {
        throw new Error("pod set unreadable");
      },
    });
    const ex = client.open();
    const r = immediate(await ex.requestHeaders({ ":method": "GET", ":path": "/v1/models", ":authority": "gw" }, true));
    expect(r.status).toBe(500);
    expect(r.error).toMatchObject({ code: "internal_error", type: "api_error" });
    expect(r.error.message).not.toMatch(/unreadable/);
  });
});
