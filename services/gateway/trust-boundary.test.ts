/**
 * The ext_proc adapter at the trust boundary, driven as Envoy drives it (real gRPC, Envoy's phase
 * order) against a real Director:
 * - engine-reported usage is input from outside: a count that is fractional, negative or beyond the
 *   events' integer range is clamped and counted, so the release and decision record the gateway
 *   publishes always validate on every peer;
 * - a client's `authorization` never reaches an engine when it is a jetroute key, and is replaced by
 *   the engines' own key when one is set.
 */
import * as grpc from "@grpc/grpc-js";
import { afterEach, describe, expect, it } from "vitest";
import { MAX_COUNT } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { ExtProcClient } from "../extproc/envoy-client.js";
import { EXT_PROC_SERVER_OPTIONS, loadExtProc } from "../extproc/protos.js";
import { Director } from "../routing/director.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "../routing/stages/testing.js";
import { createLogger } from "../shared/log.js";
import { createExtProcHandler, type ExtProcHandlerOptions } from "./extproc-server.js";
import { engineCount, ResponseTracker } from "./response-tracker.js";

describe("engineCount", () => {
  it("keeps whole counts in range; floors fractions, clamps the rest, and says so; ignores non-numbers", () => {
    expect(engineCount(0)).toEqual({ value: 0, clamped: false });
    expect(engineCount(4096)).toEqual({ value: 4096, clamped: false });
    expect(engineCount(MAX_COUNT)).toEqual({ value: MAX_COUNT, clamped: false });
    expect(engineCount(1.5)).toEqual({ value: 1, clamped: true });
    expect(engineCount(-3)).toEqual({ value: 0, clamped: true });
    expect(engineCount(1e12)).toEqual({ value: MAX_COUNT, clamped: true });
    expect(engineCount(Number.POSITIVE_INFINITY)).toEqual({ value: MAX_COUNT, clamped: true });
    for (const v of [Number.NaN, "12", null, undefined, {}]) expect(engineCount(v)).toBeUndefined();
  });

  it("the tracker reports clamped usage from an SSE stream and from a JSON body", () => {
    const sse = new ResponseTracker("text/event-stream");
    sse.push(Buffer.from('data: {"choices":[]}\n\ndata: {"usage":{"prompt_tokens":12,"completion_tokens":1e12}}\n\ndata: [DONE]\n\n'));
    expect(sse.end()).toEqual({ promptTokens: 12, completionTokens: MAX_COUNT, clamped: true });
    const json = new ResponseTracker("application/json");
    json.push(Buffer.from('{"usage":{"prompt_tokens":7,"completion_tokens":3}}'));
    expect(json.end()).toEqual({ promptTokens: 7, completionTokens: 3 });
  });
});

const servers: Array<{ client: ExtProcClient; server: grpc.Server }> = [];
afterEach(() => {
  for (const s of servers.splice(0)) {
    s.client.close();
    s.server.forceShutdown();
  }
});

/** A real Director on an in-memory fold behind a real gRPC ext_proc server with these adapter options. */
async function serve(opts: Partial<ExtProcHandlerOptions>) {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(2, "gw");
  const sink = new MemorySink();
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now });
  const server = new grpc.Server(EXT_PROC_SERVER_OPTIONS);
  server.addService(loadExtProc().service, { Process: createExtProcHandler({ router: director, log: createLogger("test", "silent"), isReady: () => true, listModels: () => [], ...opts }) });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  const client = new ExtProcClient(`127.0.0.1:${port}`);
  servers.push({ client, server });
  return { client, sink, clock };
}

describe("ext_proc adapter - engine usage out of range", () => {
  it("1e12 completion tokens and a fractional prompt count: the record validates with clamped counts, counted once", async () => {
    let clamped = 0;
    const { client, sink } = await serve({ usageClamped: () => clamped++ });

    const ex = client.open();
    await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", "x-request-id": "big-usage" });
    expect((await ex.requestBody(chatBody())).kind).toBe("continue");
    await ex.responseHeaders(200, { "content-type": "text/event-stream" });
    await ex.responseBodyChunk(Buffer.from('data: {"usage":{"prompt_tokens":10.5,"completion_tokens":1e12}}\n\ndata: [DONE]\n\n'), true);
    await ex.end();

    const rec = sink.decisions.find((d) => d.id === "big-usage");
    expect(rec).toMatchObject({ outcome: "completed", promptTokens: 10, completionTokens: MAX_COUNT });
    expect(checkEvent("decision", rec).ok).toBe(true);
    for (const rel of sink.releases) expect(checkEvent("release", rel).ok, JSON.stringify(rel)).toBe(true);
    expect(clamped).toBe(1);
  });
});

describe("ext_proc adapter - the Responses and Messages APIs' first token and usage", () => {
  const sse = (events: Array<[string, object]>) => Buffer.from(events.map(([n, d]) => `event: ${n}\ndata: ${JSON.stringify({ type: n, ...d })}\n\n`).join(""));

  it.each([
    {
      path: "/v1/responses",
      body: { model: MODEL, input: "hi", stream: true },
      preamble: sse([
        ["response.created", { response: { id: "resp_1", usage: null } }],
        ["response.in_progress", { response: { id: "resp_1" } }],
      ]),
      rest: sse([
        ["response.output_item.added", { item: {} }],
        ["response.output_text.delta", { delta: " a" }],
        ["response.completed", { response: { id: "resp_1", usage: { input_tokens: 11, output_tokens: 1, total_tokens: 12 } } }],
      ]),
    },
    {
      path: "/v1/messages",
      body: { model: MODEL, max_tokens: 4, messages: [{ role: "user", content: "hi" }], stream: true },
      preamble: sse([
        ["message_start", { message: { id: "msg_1", usage: { input_tokens: 11, output_tokens: 0 } } }],
        ["content_block_start", { index: 0, content_block: { type: "text", text: "" } }],
        ["ping", {}],
      ]),
      rest: sse([
        ["content_block_delta", { index: 0, delta: { type: "text_delta", text: " a" } }],
        ["content_block_stop", { index: 0 }],
        ["message_delta", { delta: { stop_reason: "max_tokens" }, usage: { output_tokens: 1 } }],
        ["message_stop", {}],
      ]),
    },
  ])("$path: the first token is the first event past the preamble; usage from its events", async ({ path, body, preamble, rest }) => {
    const { client, sink, clock } = await serve({});
    const ex = client.open();
    await ex.requestHeaders({ ":method": "POST", ":path": path, ":authority": "gw", "content-type": "application/json", "x-request-id": `ttft${path}` });
    expect((await ex.requestBody(Buffer.from(JSON.stringify(body)))).kind).toBe("continue");
    await ex.responseHeaders(200, { "content-type": "text/event-stream" });
    clock.advance(5);
    await ex.responseBodyChunk(preamble, false);
    clock.advance(300);
    await ex.responseBodyChunk(rest, true);
    await ex.end();
    const rec = sink.decisions.find((d) => d.id === `ttft${path}`);
    expect(rec).toMatchObject({ outcome: "completed", ttftMs: 305, promptTokens: 11, completionTokens: 1 });
  });
});

describe("ext_proc adapter - the client's authorization and the engines'", () => {
  async function upstreamHeaders(opts: Partial<ExtProcHandlerOptions>, authorization: string | undefined) {
    const { client } = await serve(opts);
    const ex = client.open();
    const r = await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", ...(authorization ? { authorization } : {}) });
    ex.cancel();
    if (r.kind !== "continue") throw new Error(`expected continue, got ${r.kind}`);
    return r.headerMutation;
  }
  const auth: ExtProcHandlerOptions["auth"] = { authenticate: (h) => (h === "Bearer jr-key" ? { ok: true, user: "alice" } : { ok: false, reason: "unknown" }) } as ExtProcHandlerOptions["auth"];

  it("--auth required: the jetroute key is removed from the upstream request; the key's user is set", async () => {
    const m = await upstreamHeaders({ auth }, "Bearer jr-key");
    expect(m.remove).toContain("authorization");
    expect(m.remove).toContain("x-api-key");
    expect(m.set).toEqual({ user: "alice" });
  });

  it("x-jetroute-on-behalf-of never reaches an engine (auth or not); a key without the delegate permission sending it is refused 403 before routing", async () => {
    expect((await upstreamHeaders({ auth }, "Bearer jr-key")).remove).toContain("x-jetroute-on-behalf-of");
    expect((await upstreamHeaders({}, undefined)).remove).toContain("x-jetroute-on-behalf-of");
    const { client } = await serve({ auth });
    const r = await client.open().requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", authorization: "Bearer jr-key", "x-jetroute-on-behalf-of": "a".repeat(64) });
    if (r.kind !== "immediate") throw new Error(`expected a 403, got ${r.kind}`);
    expect(r.status).toBe(403);
    expect(JSON.parse(r.body.toString())).toMatchObject({ error: { type: "permission_error", code: "delegation_not_allowed", param: "x-jetroute-on-behalf-of" } });
  });

  it("/v1/messages: Anthropic's `x-api-key` is the jetroute key when there is no bearer token, and is removed upstream; other paths do not read it", async () => {
    const { client } = await serve({ auth });
    const open = (path: string, headers: Record<string, string>) => client.open().requestHeaders({ ":method": "POST", ":path": path, ":authority": "gw", "content-type": "application/json", ...headers });
    const ok = await open("/v1/messages", { "x-api-key": "jr-key" });
    if (ok.kind !== "continue") throw new Error(`expected continue, got ${ok.kind}`);
    expect(ok.headerMutation.remove).toEqual(expect.arrayContaining(["authorization", "x-api-key"]));
    expect(ok.headerMutation.set).toEqual({ user: "alice" });
    // A bearer token wins over x-api-key.
    expect((await open("/v1/messages", { authorization: "Bearer wrong", "x-api-key": "jr-key" })).kind).toBe("immediate");
    const chat = await open("/v1/chat/completions", { "x-api-key": "jr-key" });
    if (chat.kind !== "immediate") throw new Error(`expected a 401, got ${chat.kind}`);
    expect(chat.status).toBe(401);
    // The 401 on /v1/messages is Anthropic-shaped.
    const refused = await open("/v1/messages", { "x-api-key": "not-a-key" });
    if (refused.kind !== "immediate") throw new Error(`expected a 401, got ${refused.kind}`);
    expect([refused.status, JSON.parse(refused.body.toString())]).toEqual([401, { type: "error", error: { type: "authentication_error", message: expect.stringMatching(/^invalid_api_key: /) } }]);
  });

  it("an engine key replaces whatever the client sent (with and without --auth)", async () => {
    const withAuth = await upstreamHeaders({ auth, engineApiKey: "engine-secret" }, "Bearer jr-key");
    expect(withAuth.set).toEqual({ authorization: "Bearer engine-secret", user: "alice" });
    const without = await upstreamHeaders({ engineApiKey: "engine-secret" }, "Bearer client-guess");
    expect(without.set).toEqual({ authorization: "Bearer engine-secret" });
    expect(without.remove).toContain("x-api-key");
  });

  it("no auth and no engine key: the client's authorization goes through (it may be the engine's own key); routing headers are always stripped", async () => {
    const m = await upstreamHeaders({}, "Bearer the-engines-key");
    expect(m.remove).not.toContain("authorization");
    expect(m.remove).toEqual(expect.arrayContaining(["x-gateway-destination-endpoint", "target-pod"]));
    expect(m.set).toEqual({});
  });
});

describe("ext_proc adapter - pod addresses on the response", () => {
  async function responseHeaders(opts: Partial<ExtProcHandlerOptions>) {
    const { client } = await serve(opts);
    const ex = client.open();
    await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json" });
    const routed = await ex.requestBody(chatBody());
    const h = await ex.responseHeaders(200, { "content-type": "application/json" });
    ex.cancel();
    if (routed.kind !== "continue" || h.kind !== "continue") throw new Error("expected the request routed");
    return { endpoint: routed.headerMutation.set["x-gateway-destination-endpoint"], echoed: h.headerMutation.set };
  }

  it("by default the client learns the strategy and request id, not the pod's address (Envoy still gets it)", async () => {
    const { endpoint, echoed } = await responseHeaders({});
    expect(endpoint).toMatch(/:\d+$/);
    expect(echoed["target-pod"]).toBeUndefined();
    expect(Object.values(echoed)).not.toContain(endpoint);
    expect(echoed["routing-strategy"]).toBe("least-request");
    expect(echoed["request-id"]).toBeTruthy();
  });

  it("--expose-pod-addresses echoes target-pod as AIBrix does", async () => {
    const { endpoint, echoed } = await responseHeaders({ exposePodAddresses: true });
    expect(echoed["target-pod"]).toBe(endpoint);
  });
});
