/**
 * Semantic model selection through real gRPC ext_proc streams, driven as Envoy drives them, against
 * a real Director on an in-memory fold: a request for a virtual model is classified, rewritten and
 * routed to a pod of the chosen model in one exchange; the chosen model's pool, permissions and
 * limits apply; a request no decision matches gets a 400; the decision is named on the response
 * and in the decision record.
 */
import { afterEach, describe, expect, it } from "vitest";
import { checkEvent } from "../../schemas/validate.js";
import type { ExtProcClient, PhaseResult } from "../extproc/envoy-client.js";
import { Director, type DirectorOptions } from "../routing/director.js";
import { FakeClock, MemorySink } from "../routing/stages/testing.js";
import { AUTO, CODER, GENERAL, MATH, putConfig, putModelConfig, semanticState } from "../routing/semantic/testing.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { ExtProcHandlerOptions } from "./extproc-server.js";
import { ExtProcTestServers } from "../../test/harness/extproc.js";

const reqHeaders = (extra: Record<string, string> = {}) => ({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", ...extra });

function setup(o: Partial<DirectorOptions> & { state?: GatewayState } = {}) {
  const clock = new FakeClock(1_000_000);
  const state = o.state ?? semanticState();
  putModelConfig(state, "auto", AUTO, 100);
  const sink = new MemorySink();
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now, ...o });
  return { sink, director, state, clock };
}

const servers = new ExtProcTestServers();
afterEach(() => servers.closeAll());

const serve = (opts: Partial<ExtProcHandlerOptions> & Pick<ExtProcHandlerOptions, "router">) => servers.serve({ ...opts });

const chat = (content: string, extra: Record<string, unknown> = {}) => Buffer.from(JSON.stringify({ model: "auto", messages: [{ role: "system", content: "be brief" }, { role: "user", content }], ...extra }));

/** One exchange up to the response: the request-body reply and the response-headers reply. */
async function exchange(client: ExtProcClient, body: Buffer, headers: Record<string, string> = {}) {
  const ex = client.open();
  await ex.requestHeaders(reqHeaders(headers));
  const routed = await ex.requestBody(body);
  if (routed.kind !== "continue") return { routed, response: undefined };
  const response = await ex.responseHeaders(200, { "content-type": "application/json" });
  await ex.responseBodyChunk(Buffer.from("{}"), true);
  await ex.end();
  return { routed, response };
}

function continued(r: PhaseResult) {
  if (r.kind !== "continue") throw new Error(`expected continue, got ${r.kind} ${r.kind === "immediate" ? r.body.toString() : ""}`);
  return r;
}

function immediate(r: PhaseResult) {
  if (r.kind !== "immediate") throw new Error(`expected an immediate response, got ${r.kind}`);
  return { status: r.status, error: (JSON.parse(r.body.toString()) as { error: { message: string; type: string; code: string; param: string | null } }).error };
}

describe("semantic model selection through ext_proc", () => {
  it("rewrites a virtual-model request and routes it to a pod of the chosen model in one exchange: model, kwargs, content-length, decision header and record", async () => {
    const { sink, director, state } = setup();
    const client = await serve({ router: director });
    const { routed, response } = await exchange(client, chat("Write a python function that reverses a list"), { "x-request-id": "r-code" });
    const r = continued(routed);
    const body = JSON.parse((r.bodyMutation as Buffer).toString()) as Record<string, unknown>;
    expect(body.model).toBe(CODER);
    expect(body.chat_template_kwargs).toEqual({ enable_thinking: true });
    expect(r.headerMutation.set["content-length"]).toBe(String((r.bodyMutation as Buffer).length));
    const coderAddresses = state.pods.readyPods(CODER).map((p) => p.address);
    expect(coderAddresses).toContain(r.headerMutation.set["x-gateway-destination-endpoint"]);
    expect(continued(response as PhaseResult).headerMutation.set["x-jetroute-decision"]).toBe("coding");
    expect(sink.charges.at(-1)?.model).toBe(CODER);
    const rec = sink.decisions.find((d) => d.id === "r-code");
    expect(rec).toMatchObject({ model: CODER, semantic: { virtualModel: "auto", decision: "coding", runnerUp: "default" } });
    expect(rec?.semantic?.signals.code).toMatchObject({ value: true });
    expect(rec?.semantic?.signals.math).toMatchObject({ value: false });
    // Other replicas and replay validate every record against its schema.
    expect(checkEvent("decision", rec).ok).toBe(true);
  });

  it("a decision's system prompt is prepended and the default decision routes the rest", async () => {
    const { sink, director } = setup();
    const client = await serve({ router: director });
    const m = continued((await exchange(client, chat("Compute the integral of x^2", { chat_template_kwargs: { foo: 1 } }), { "x-request-id": "r-math" })).routed);
    const body = JSON.parse((m.bodyMutation as Buffer).toString()) as { model: string; messages: Array<{ role: string; content: string }>; chat_template_kwargs: unknown };
    expect(body.model).toBe(MATH);
    expect(body.messages.map((x) => x.role)).toEqual(["system", "system", "user"]);
    expect(body.messages[0]?.content).toBe("You are a careful mathematician.");
    expect(body.chat_template_kwargs).toEqual({ foo: 1 });
    const g = continued((await exchange(client, chat("Tell me about the weather in spring"), { "x-request-id": "r-gen" })).routed);
    expect(JSON.parse((g.bodyMutation as Buffer).toString()).model).toBe(GENERAL);
    expect(sink.decisions.find((d) => d.id === "r-gen")?.semantic).toMatchObject({ decision: "default" });
    expect(sink.decisions.find((d) => d.id === "r-gen")?.semantic?.runnerUp).toBeUndefined();
  });

  it("a request of a real model is not rewritten (no body mutation, no decision header)", async () => {
    const { director } = setup();
    const client = await serve({ router: director });
    const { routed, response } = await exchange(client, Buffer.from(JSON.stringify({ model: GENERAL, messages: [{ role: "user", content: "python function" }] })));
    expect(continued(routed).bodyMutation).toBeUndefined();
    expect(continued(response as PhaseResult).headerMutation.set["x-jetroute-decision"]).toBeUndefined();
  });

  it("no decision matches and no default -> 400 no_matching_decision, recorded as a rejection, nothing charged", async () => {
    const { sink, director, state } = setup();
    putModelConfig(state, "strict-auto", { semantic: { ...AUTO.semantic, default: undefined } as NonNullable<typeof AUTO.semantic> }, 101);
    const client = await serve({ router: director });
    const { routed } = await exchange(client, Buffer.from(JSON.stringify({ model: "strict-auto", messages: [{ role: "user", content: "hello" }] })), { "x-request-id": "r-none" });
    const e = immediate(routed);
    expect(e.status).toBe(400);
    expect(e.error).toMatchObject({ code: "no_matching_decision", type: "invalid_request_error", param: "model" });
    expect(e.error.message).toContain("strict-auto");
    expect(sink.charges).toHaveLength(0);
    const rejected = sink.decisions.find((d) => d.id === "r-none");
    expect(rejected).toMatchObject({ outcome: "rejected", status: 400, errorCode: "no_matching_decision", semantic: { virtualModel: "strict-auto", decision: "(none)" } });
    expect(checkEvent("decision", rejected).ok).toBe(true);
  });

  it("the chosen model's pool applies: a pooled gateway answers 421 when the decision picks another pool's model", async () => {
    // Pool chat's gateway folds only its own pool's pods: the coder's are pool code's.
    const state = semanticState([GENERAL, MATH]);
    putConfig(state, "pool.code", { models: [CODER] }, 50);
    const { director } = setup({ state, pool: { pool: "chat" } });
    const client = await serve({ router: director });
    const e = immediate((await exchange(client, chat("python function please"))).routed);
    expect(e.status).toBe(421);
    expect(e.error.code).toBe("wrong_pool");
    // The same gateway routes a request its decision keeps in its pool.
    expect((await exchange(client, chat("hello there"))).routed.kind).toBe("continue");
  });

  it("the API key's permissions apply to the chosen model (403 model_not_allowed), and its class is a signal", async () => {
    const { director } = setup();
    const client = await serve({
      router: director,
      auth: { authenticate: (a) => (a === "Bearer gold" ? { ok: true, user: "alice", hash: "h1", keyClass: "gold" } : { ok: true, user: "bob", hash: "h2", models: [GENERAL, MATH] }) },
    });
    const denied = immediate((await exchange(client, chat("python function please"), { authorization: "Bearer bob" })).routed);
    expect(denied.status).toBe(403);
    expect(denied.error).toMatchObject({ code: "model_not_allowed", type: "permission_error" });
    expect(denied.error.message).toContain('decision "coding"');
    expect((await exchange(client, chat("hello"), { authorization: "Bearer bob" })).routed.kind).toBe("continue");
    const gold = continued((await exchange(client, chat("hello"), { authorization: "Bearer gold" })).routed);
    expect(JSON.parse((gold.bodyMutation as Buffer).toString()).model).toBe(MATH);
  });

  it("the chosen model's rate limit applies (its profile's requestsPerSecond), not the virtual model's", async () => {
    const { director, state } = setup();
    putModelConfig(state, CODER, { defaultProfile: "p", profiles: { p: { requestsPerSecond: 1 } } }, 102);
    const client = await serve({ router: director });
    expect((await exchange(client, chat("python function one"))).routed.kind).toBe("continue");
    const limited = immediate((await exchange(client, chat("python function two"))).routed);
    expect(limited.status).toBe(429);
    // Another decision's model is not limited.
    expect((await exchange(client, chat("hello"))).routed.kind).toBe("continue");
  });

  it("the chosen model's strategy applies (its locked strategy), and an action's profile selects the chosen model's profile", async () => {
    const { director, state } = setup();
    putModelConfig(state, CODER, { lockedRoutingStrategy: "random" }, 103);
    putModelConfig(state, MATH, { defaultProfile: "plain", profiles: { plain: { routingStrategy: "least-request" }, deep: { routingStrategy: "least-kv-cache" } } }, 104);
    putModelConfig(state, "auto", { semantic: { ...AUTO.semantic, decisions: AUTO.semantic?.decisions.map((d) => (d.name === "math" ? { ...d, action: { ...d.action, profile: "deep" } } : d)) } as NonNullable<typeof AUTO.semantic> }, 105);
    const client = await serve({ router: director });
    const code = continued((await exchange(client, chat("python function please"))).routed);
    expect(code.headerMutation.set["routing-strategy"]).toBe("random");
    const math = continued((await exchange(client, chat("solve this equation"))).routed);
    expect(math.headerMutation.set["routing-strategy"]).toBe("least-kv-cache");
  });

  it("an oversized message is classified on its bounded prefix and routed, never a 5xx", async () => {
    const { sink, director } = setup();
    const client = await serve({ router: director });
    const huge = `${"lorem ipsum dolor ".repeat(60_000)} python function`;
    const r = continued((await exchange(client, chat(huge), { "x-request-id": "r-huge" })).routed);
    // The keyword sits past the classified prefix: the request goes to the default model.
    expect(JSON.parse((r.bodyMutation as Buffer).toString()).model).toBe(GENERAL);
    expect(sink.decisions.find((d) => d.id === "r-huge")?.semantic?.signals.long).toMatchObject({ value: true });
  });
});
