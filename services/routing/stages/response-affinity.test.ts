import { describe, expect, it } from "vitest";
import type { PodEvent } from "../../../schemas/events.js";
import { type ResponseLocationEvent, tenantDigest } from "../../../schemas/responses.js";
import { GatewayState } from "../../views/gateway-state.js";
import { contextOf, type RequestContext, upstreamBodyOf } from "../context.js";
import { RouteError } from "../errors.js";
import { SaturationDetector } from "../flow/saturation.js";
import type { StageEnv } from "../pipeline.js";
import type { StoredTurn } from "../ports.js";
import { responseAffinityStage } from "./response-affinity.js";

const MODEL = "m/llama";
const T0 = 1_750_000_000_000;
const msg = (text: string) => ({ type: "message", role: "user", content: text });
const out = (text: string) => ({ type: "message", role: "assistant", content: [{ type: "output_text", text }] });

function fleet(pods: Array<Partial<PodEvent> & { pod: string }>): GatewayState {
  const s = new GatewayState({ self: "gw-self" });
  let seq = 0;
  for (const p of pods) s.apply({ type: "pod", action: "upsert", model: MODEL, ready: true, engine: "vllm", address: `10.0.0.${p.pod.slice(-1)}:8000`, ts: T0, ...p }, { stream: "pods", subject: "jr.pods.x", seq: ++seq, serverTs: T0 });
  return s;
}

function located(s: GatewayState, id: string, pod: string, owner = "alice", stored = true): void {
  const ev: ResponseLocationEvent = { type: "response-location", action: "stored", id, tenant: tenantDigest(owner), gateway: "gw-b", ts: T0, model: MODEL, pod, expiresAt: T0 + 3_600_000, stored };
  s.apply(ev, { stream: "responses", subject: "jr.resploc.x", seq: s.responsesCursor + 1, serverTs: T0 });
}

function envOf(state: GatewayState, store?: Map<string, StoredTurn>, saturated: ReadonlySet<string> = new Set()): StageEnv & { reads: string[] } {
  const reads: string[] = [];
  const detector = new SaturationDetector({ ledger: state.ledger, load: state.load });
  return {
    state,
    views: { pods: state.pods, ledger: state.ledger, load: state.load },
    now: () => T0 + 1_000,
    // Flow control on for the model when some pods are to be saturated (its detector then decides).
    flow: { settingsFor: () => (saturated.size > 0 ? { saturation: { queueDepth: 5, kvCacheUsage: 0.8 } } : undefined), detector: { podRoom: (p: { pod: string }) => (saturated.has(p.pod) ? { utilization: 2, full: true } : detector.podRoom(p as never, { queueDepth: 5, kvCacheUsage: 0.8 }, T0)) } },
    reads,
    ...(store
      ? {
          responses: {
            stored: async (owner: string, id: string) => {
              reads.push(`${owner}:${id}`);
              return store.get(`${owner}:${id}`);
            },
          },
        }
      : {}),
  } as unknown as StageEnv & { reads: string[] };
}

function request(body: Record<string, unknown>, tenant: string | null = "alice"): RequestContext {
  const ctx = contextOf({ headers: { ":path": "/v1/responses" }, body: Buffer.from(JSON.stringify(body)), ...(tenant ? { tenant } : {}) });
  ctx.parsed = { model: MODEL, stream: false, promptTokens: 3, body: structuredClone(body) };
  return ctx;
}

const sent = (ctx: RequestContext) => {
  const b = upstreamBodyOf(ctx);
  return b ? (JSON.parse(b.toString()) as Record<string, unknown>) : undefined;
};

const storeOf = (...turns: Array<StoredTurn & { owner?: string }>) => new Map(turns.map(({ owner, ...t }) => [`${owner ?? "alice"}:${t.id}`, t]));
const t1: StoredTurn = { id: "resp_1", model: MODEL, pod: "pod-1", input: [msg("hi")], output: [out("hello")] };
const t2: StoredTurn = { id: "resp_2", model: MODEL, pod: "pod-1", previousResponseId: "resp_1", input: [msg("more")], output: [{ type: "reasoning", encrypted_content: "x", summary: [] }, out("sure")] };

async function refusal(run: () => void | Promise<void>): Promise<RouteError | undefined> {
  try {
    await run();
  } catch (e) {
    if (e instanceof RouteError) return e;
    throw e;
  }
  return undefined;
}

describe("response-affinity stage", () => {
  it("keeps the turn of a first request, and strips a client's request_id", async () => {
    const ctx = request({ model: MODEL, input: "hi", instructions: "be brief", request_id: "resp_someone_elses" });
    await responseAffinityStage.run(ctx, envOf(fleet([{ pod: "pod-1" }])));
    expect(ctx.responseTurn).toEqual({ owner: "alice", store: true, input: [msg("hi")], instructions: "be brief" });
    expect(sent(ctx)).toEqual({ model: MODEL, input: "hi", instructions: "be brief" });
    expect(ctx.subset).toBeUndefined();
  });

  it("pins a continuation to the pod holding the previous response, without reading the store", async () => {
    const state = fleet([{ pod: "pod-0" }, { pod: "pod-1" }, { pod: "pod-2" }]);
    located(state, "resp_2", "pod-1");
    const env = envOf(state, storeOf(t1, t2));
    const ctx = request({ model: MODEL, input: "next", previous_response_id: "resp_2", store: false });
    await responseAffinityStage.run(ctx, env);
    expect(ctx.subset).toEqual(["10.0.0.1:8000"]);
    expect(ctx.responseTurn).toMatchObject({ store: false, previousResponseId: "resp_2", affinity: { action: "pin", reason: "owner", owner: "pod-1" } });
    expect(upstreamBodyOf(ctx)).toBeUndefined();
    expect(env.reads).toEqual([]);
  });

  it("a pod gone: the chain is expanded from the store into the body, previous_response_id removed, encrypted reasoning dropped", async () => {
    const state = fleet([{ pod: "pod-0" }, { pod: "pod-2" }]);
    located(state, "resp_2", "pod-1");
    const env = envOf(state, storeOf(t1, t2));
    const ctx = request({ model: MODEL, input: "next", previous_response_id: "resp_2", instructions: "new rules" });
    await responseAffinityStage.run(ctx, env);
    expect(ctx.subset).toBeUndefined();
    expect(sent(ctx)).toEqual({ model: MODEL, instructions: "new rules", input: [msg("hi"), out("hello"), msg("more"), out("sure"), msg("next")] });
    expect(ctx.responseTurn?.affinity).toEqual({ action: "expand", reason: "owner-gone", owner: "pod-1", turns: 2, dropped: 1 });
    // The turn stored for this request is its own input, not the expansion.
    expect(ctx.responseTurn?.input).toEqual([msg("next")]);
    expect(ctx.parsed?.promptTokens).toBeGreaterThan(3);
  });

  it("a saturated or draining owner is not pinned when the store can stand in", async () => {
    const state = fleet([{ pod: "pod-0" }, { pod: "pod-1" }]);
    located(state, "resp_2", "pod-1");
    const ctx = request({ model: MODEL, input: "next", previous_response_id: "resp_2" });
    await responseAffinityStage.run(ctx, envOf(state, storeOf(t1, t2), new Set(["pod-1"])));
    expect(ctx.responseTurn?.affinity?.reason).toBe("owner-saturated");
    const draining = fleet([{ pod: "pod-0" }, { pod: "pod-1", draining: { deadline: T0 + 60_000 } }]);
    located(draining, "resp_2", "pod-1");
    const ctx2 = request({ model: MODEL, input: "next", previous_response_id: "resp_2" });
    await responseAffinityStage.run(ctx2, envOf(draining, storeOf(t1, t2)));
    expect(ctx2.responseTurn?.affinity?.reason).toBe("owner-draining");
  });

  it("without flow control, only a fresh load sample makes the owner saturated: without metrics affinity wins", async () => {
    const state = fleet([{ pod: "pod-0" }, { pod: "pod-1" }]);
    located(state, "resp_2", "pod-1");
    // The owner busy in the ledger, no load sample: still pinned.
    state.ownCharge({ type: "charge", id: "c1", gateway: "gw-self", model: MODEL, pod: "pod-1", ts: T0, ttlMs: 60_000, promptTokens: 10 }, T0);
    const ctx = request({ model: MODEL, input: "next", previous_response_id: "resp_2" });
    await responseAffinityStage.run(ctx, envOf(state, storeOf(t1, t2)));
    expect(ctx.responseTurn?.affinity?.action).toBe("pin");
    // A fresh sample with a long queue: expanded.
    state.apply({ type: "load", model: MODEL, pod: "pod-1", ts: T0 + 900, stale: false, load: { running: 8, waiting: 9, kvCacheUsage: 0.5 } } as never, { stream: "load", subject: "jr.load.x", seq: 1, serverTs: T0 + 900 });
    const busy = request({ model: MODEL, input: "next", previous_response_id: "resp_2" });
    await responseAffinityStage.run(busy, envOf(state, storeOf(t1, t2)));
    expect(busy.responseTurn?.affinity).toMatchObject({ action: "expand", reason: "owner-saturated" });
  });

  it("a response this replica has not folded yet is pinned by the pod its stored turn names", async () => {
    const state = fleet([{ pod: "pod-0" }, { pod: "pod-1" }]);
    const ctx = request({ model: MODEL, input: "next", previous_response_id: "resp_2" });
    await responseAffinityStage.run(ctx, envOf(state, storeOf(t1, t2)));
    expect(ctx.subset).toEqual(["10.0.0.1:8000"]);
    expect(ctx.responseTurn?.affinity).toEqual({ action: "pin", reason: "owner", owner: "pod-1" });
  });

  it("another tenant's response, an unknown id, a malformed id or a broken chain: 404 response_not_found, never 403", async () => {
    const state = fleet([{ pod: "pod-1" }]);
    located(state, "resp_2", "pod-1");
    const env = envOf(state, storeOf(t1, t2));
    for (const [body, tenant] of [
      [{ model: MODEL, input: "x", previous_response_id: "resp_2" }, "mallory"],
      [{ model: MODEL, input: "x", previous_response_id: "resp_nope" }, "alice"],
      [{ model: MODEL, input: "x", previous_response_id: "resp with spaces" }, "alice"],
    ] as const) {
      const err = await refusal(() => responseAffinityStage.run(request(body, tenant), env));
      expect(err?.status).toBe(404);
      expect(err?.code).toBe("response_not_found");
      expect(err?.param).toBe("previous_response_id");
    }
    // The owner gone and a link missing from the store.
    const broken = fleet([{ pod: "pod-0" }]);
    located(broken, "resp_2", "pod-1");
    const err = await refusal(() => responseAffinityStage.run(request({ model: MODEL, input: "x", previous_response_id: "resp_2" }), envOf(broken, storeOf(t2))));
    expect(err?.kind).toBe("responseNotFound");
  });

  it("without --auth every request is one tenant; without a store an unknown id is left to the engine", async () => {
    const state = fleet([{ pod: "pod-1" }]);
    located(state, "resp_2", "pod-1", "anonymous");
    const ctx = request({ model: MODEL, input: "x", previous_response_id: "resp_2" }, null);
    await responseAffinityStage.run(ctx, envOf(state));
    expect(ctx.responseTurn?.affinity?.action).toBe("pin");
    const unknown = request({ model: MODEL, input: "x", previous_response_id: "resp_9" }, null);
    await responseAffinityStage.run(unknown, envOf(state));
    expect(unknown.responseTurn?.affinity).toBeUndefined();
    expect(unknown.subset).toBeUndefined();
  });

  it("does nothing for other APIs", async () => {
    const ctx = contextOf({ headers: { ":path": "/v1/chat/completions" }, body: Buffer.from("{}") });
    ctx.parsed = { model: MODEL, stream: false, promptTokens: 1, body: { model: MODEL, messages: [], request_id: "x" } };
    await responseAffinityStage.run(ctx, envOf(fleet([])));
    expect(ctx.responseTurn).toBeUndefined();
    expect(upstreamBodyOf(ctx)).toBeUndefined();
  });
});
