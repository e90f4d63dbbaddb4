/**
 * The request path as the ext_proc adapter drives it (real gRPC, Envoy's phase order, a real
 * Director on an in-memory fold): every stage of the list visited once, in the listed order; and
 * an InferenceModelRewrite decided by the core's model-rewrite stage (one body parse), scoped to
 * its pool, and kept in the decision record; the band written as the engine's priority for a pod
 * that schedules by priority (the engine-fields stage).
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import type { ExtProcClient, PhaseResult } from "../extproc/envoy-client.js";
import { Director, REQUEST_PATH, stagesOf } from "../routing/mod.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "../routing/stages/testing.js";
import type { PodEvent } from "../../schemas/events.js";
import { GatewayState } from "../views/gateway-state.js";
import { checkEvent } from "../../schemas/validate.js";
import { ExtProcTestServers } from "../../test/harness/extproc.js";
import { MODEL_CONFIG_KEY_PREFIX } from "../../schemas/config.js";
import { encodeToken } from "../../streams/tokens.js";

const reqHeaders = (extra: Record<string, string> = {}) => ({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", ...extra });

const servers = new ExtProcTestServers();
afterEach(() => servers.closeAll());

async function complete(client: ExtProcClient, body: Buffer, headers: Record<string, string>): Promise<PhaseResult> {
  const ex = client.open();
  await ex.requestHeaders(reqHeaders(headers));
  const routed = await ex.requestBody(body);
  if (routed.kind === "continue") {
    await ex.responseHeaders(200, { "content-type": "application/json" });
    await ex.responseBodyChunk(Buffer.from("{}"), true);
  }
  await ex.end();
  return routed;
}

describe("ext_proc adapter - the request path's stages", () => {
  it("a request walked from the ext_proc handler visits every stage once, in the listed order", async () => {
    const clock = new FakeClock(1_000_000);
    const state = stateWithPods(2, "gw");
    const visited: string[] = [];
    const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink: new MemorySink(), config: state.configs, clock, now: clock.now, onStage: (s, seconds) => {
      expect(seconds).toBeGreaterThanOrEqual(0);
      visited.push(s);
    } });
    const client = await servers.serve({ router: director, listModels: () => [MODEL] });
    const r = await complete(client, chatBody(), { "x-request-id": "walk-1" });
    expect(r.kind).toBe("continue");
    expect(visited).toEqual(stagesOf(REQUEST_PATH).map((s) => s.name));
    expect(new Set(visited).size).toBe(visited.length);
  });

  it("a refusal names its stage; the rejected record names the model the path parsed", async () => {
    const clock = new FakeClock(1_000_000);
    const state = stateWithPods(1, "gw");
    const sink = new MemorySink();
    const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now });
    const client = await servers.serve({ router: director, listModels: () => [MODEL] });
    const r = await complete(client, chatBody("org/unknown"), { "x-request-id": "nope" });
    expect(r).toMatchObject({ kind: "immediate", status: 404 });
    expect(sink.decisions.find((d) => d.id === "nope")).toMatchObject({ outcome: "rejected", model: "org/unknown", errorCode: "model_not_found" });
  });
});

describe("ext_proc adapter - InferenceModelRewrite in the core, scoped to its pool", () => {
  const TEAM_B = "team-b/private-model";
  function setup() {
    const clock = new FakeClock(1_000_000);
    const state = stateWithPods(2, "gw");
    const pod: PodEvent = { type: "pod", action: "upsert", model: TEAM_B, pod: "b0", address: "10.0.1.1:8000", ready: true, engine: "vllm", ts: 0 };
    state.apply(pod, { stream: "pods", subject: "pods.b0", seq: 10, serverTs: 0 });
    const put = (key: string, value: unknown, seq: number) => state.apply({ type: "config-entry", key, operation: "PUT", value }, { stream: "config", subject: key, seq, serverTs: 0 });
    // Pool A (MODEL's) names team B's model in a rule, and an alias nobody serves in another.
    put("inferencepool.team-a.p", { pool: "team-a/p", apiVersion: "llm-d.ai/v1alpha2", models: [MODEL], objectives: {}, rewrites: [
      { from: "hijack#0", models: [TEAM_B], targets: [{ model: MODEL, weight: 1 }] },
      { from: "alias#0", models: ["org/alias"], targets: [{ model: MODEL, weight: 1 }] },
    ] }, 1);
    put("inferencepool.team-b.p", { pool: "team-b/p", apiVersion: "llm-d.ai/v1alpha2", models: [TEAM_B], objectives: {}, rewrites: [] }, 2);
    const sink = new MemorySink();
    const director = new Director({
      gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now,
      modelRewrites: { active: () => state.poolPolicies.hasRewrites, rewrite: (m, id) => state.poolPolicies.rewrite(m, id, state.pods) },
    });
    return { sink, director };
  }

  it("a rule in pool A naming team B's model does not capture team B's requests", async () => {
    const { sink, director } = setup();
    const client = await servers.serve({ router: director, listModels: () => [MODEL, TEAM_B] });
    const r = await complete(client, chatBody(TEAM_B), { "x-request-id": "b-1" });
    expect(r.kind).toBe("continue");
    if (r.kind !== "continue") return;
    expect(r.bodyMutation).toBeUndefined();
    const rec = await vi.waitFor(() => sink.decisions.find((d) => d.id === "b-1") ?? Promise.reject(new Error("no record yet")));
    expect(rec).toMatchObject({ model: TEAM_B, pick: "b0" });
    expect(rec?.rewrite).toBeUndefined();
  });

  it("the pool's own alias is rewritten once, in the core: the engine gets the target, the record keeps the rewrite", async () => {
    const { sink, director } = setup();
    const client = await servers.serve({ router: director, listModels: () => [MODEL, TEAM_B] });
    const r = await complete(client, chatBody("org/alias"), { "x-request-id": "a-1" });
    expect(r.kind).toBe("continue");
    if (r.kind !== "continue") return;
    expect(JSON.parse((r.bodyMutation as Buffer).toString()).model).toBe(MODEL);
    expect(r.headerMutation.set["content-length"]).toBe(String((r.bodyMutation as Buffer).length));
    const rec = await vi.waitFor(() => sink.decisions.find((d) => d.id === "a-1") ?? Promise.reject(new Error("no record yet")));
    expect(rec).toMatchObject({ model: MODEL, rewrite: { from: "org/alias", rule: "alias#0", pool: "team-a/p" } });
    expect(checkEvent("decision", rec)).toMatchObject({ ok: true });
  });
});

describe("ext_proc adapter - the band reaches the engine as its priority", () => {
  function setup(schedulingPolicy?: "priority") {
    const clock = new FakeClock(1_000_000);
    const state = new GatewayState({ self: "gw" });
    const pod: PodEvent = { type: "pod", action: "upsert", model: MODEL, pod: "v0", address: "10.0.2.1:8000", ready: true, engine: "vllm", ...(schedulingPolicy ? { schedulingPolicy } : {}), ts: 0 };
    state.apply(pod, { stream: "pods", subject: "pods.v0", seq: 1, serverTs: 0 });
    const key = `${MODEL_CONFIG_KEY_PREFIX}${encodeToken(MODEL)}`;
    state.apply({ type: "config-entry", key, operation: "PUT", value: { flowControl: { objectives: { interactive: { priority: 10 } }, enginePriority: { scale: 3 } } } }, { stream: "config", subject: key, seq: 2, serverTs: 0 });
    const sink = new MemorySink();
    const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now });
    return { sink, director };
  }

  it("a vLLM pod with schedulingPolicy priority gets -band x scale in the body; the record keeps it and passes its schema", async () => {
    const { sink, director } = setup("priority");
    const client = await servers.serve({ router: director, listModels: () => [MODEL] });
    const r = await complete(client, chatBody(MODEL, { priority: 5 }), { "x-request-id": "prio-1", "x-jetroute-objective": "interactive" });
    expect(r.kind).toBe("continue");
    if (r.kind !== "continue") return;
    const body = JSON.parse((r.bodyMutation as Buffer).toString()) as Record<string, unknown>;
    expect(body).toMatchObject({ model: MODEL, priority: -30 });
    expect(r.headerMutation.set["content-length"]).toBe(String((r.bodyMutation as Buffer).length));
    const rec = await vi.waitFor(() => sink.decisions.find((d) => d.id === "prio-1") ?? Promise.reject(new Error("no record yet")));
    expect(rec).toMatchObject({ pick: "v0", flow: { band: 10, objective: "interactive" }, enginePriority: -30 });
    expect(checkEvent("decision", rec)).toMatchObject({ ok: true });
  });

  it("an FCFS pod: the client's body goes as sent, the record says why no priority was written", async () => {
    const { sink, director } = setup();
    const client = await servers.serve({ router: director, listModels: () => [MODEL] });
    const r = await complete(client, chatBody(MODEL, { priority: 5 }), { "x-request-id": "prio-2", "x-jetroute-objective": "interactive" });
    expect(r.kind).toBe("continue");
    if (r.kind !== "continue") return;
    expect(r.bodyMutation).toBeUndefined();
    const rec = await vi.waitFor(() => sink.decisions.find((d) => d.id === "prio-2") ?? Promise.reject(new Error("no record yet")));
    expect(rec).toMatchObject({ pick: "v0", flow: { band: 10 }, enginePriority: "fcfs-pod" });
  });
});
