import { describe, expect, it } from "vitest";
import type { ModelConfig } from "../../../schemas/config.js";
import type { PodInfo } from "../../views/pod-set.js";
import { contextOf, type SelectedContext, upstreamBodyOf } from "../context.js";
import type { StageEnv } from "../pipeline.js";
import { engineFieldsStage } from "./engine-fields.js";
import { parseStage } from "./parse.js";
import { chatBody, MODEL } from "./testing.js";

const pod = (o: Partial<PodInfo> = {}): PodInfo => ({ model: MODEL, pod: "p0", address: "10.0.0.1:8000", engine: "vllm", role: "combined", adapters: [], labels: {}, ready: true, updatedAt: 0, ...o });

/** The stage's environment: one model config, and the managed adapters' bases. */
function envOf(config: ModelConfig | undefined, bases: Record<string, string> = {}): StageEnv {
  return {
    config: { get: (m: string) => (m === MODEL ? config : undefined) },
    views: { pods: { baseOf: (m: string) => bases[m] } },
  } as unknown as StageEnv;
}

/** A context as the select stage leaves it: parsed, `p` picked, with a band when `band` is given. */
function selected(p: PodInfo, o: { band?: number; body?: Buffer; path?: string } = {}): SelectedContext {
  const ctx = contextOf({ headers: { "x-request-id": "r-1", ...(o.path ? { ":path": o.path } : {}) }, body: o.body ?? chatBody() });
  parseStage.run(ctx, {} as StageEnv);
  Object.assign(ctx, {
    strategy: { name: "least-request" },
    requestId: "r-1",
    chargeId: "c-1",
    cursors: { pods: 0, load: 0, charges: 0, kv: 0, config: 0 },
    now: 0,
    pick: { pod: p, candidates: [] },
    routingRequest: { model: MODEL, requestId: "r-1", promptTokens: 3 },
    ...(o.band !== undefined ? { flow: { band: o.band, enqueuedAt: 0, waitMs: 0 } } : {}),
  });
  return ctx as SelectedContext;
}

const sent = (ctx: SelectedContext): Record<string, unknown> | undefined => {
  const b = upstreamBodyOf(ctx);
  return b ? (JSON.parse(b.toString()) as Record<string, unknown>) : undefined;
};

const flowOn = (enginePriority?: NonNullable<ModelConfig["flowControl"]>["enginePriority"]): ModelConfig => ({ flowControl: { ...(enginePriority !== undefined ? { enginePriority } : {}) } }) as ModelConfig;

describe("engine-fields stage: the band as the engine's priority", () => {
  it("a vLLM pod scheduling by priority gets -band x scale, replacing the client's priority, and the record says so", () => {
    const ctx = selected(pod({ schedulingPolicy: "priority" }), { band: 10, body: chatBody(MODEL, { priority: 99 }) });
    engineFieldsStage.run(ctx, envOf(flowOn({ scale: 2 })));
    expect(sent(ctx)).toEqual({ model: MODEL, messages: [{ role: "user", content: "hello there" }], priority: -20 });
    expect(ctx.engineFields).toEqual({ enginePriority: -20 });
  });

  it("/v1/messages: nothing written and nothing recorded (the engines' Messages request has no `priority`)", () => {
    const body = Buffer.from(JSON.stringify({ model: MODEL, max_tokens: 8, messages: [{ role: "user", content: "hello there" }] }));
    const ctx = selected(pod({ schedulingPolicy: "priority" }), { band: 10, body, path: "/v1/messages" });
    expect(ctx.parsed.api).toBe("messages");
    engineFieldsStage.run(ctx, envOf(flowOn({ scale: 2 })));
    expect(upstreamBodyOf(ctx)).toBeUndefined();
    expect(ctx.engineFields).toBeUndefined();
  });

  it("an SGLang pod gets +band (and -band when it runs low values first)", () => {
    const ctx = selected(pod({ engine: "sglang", schedulingPolicy: "priority" }), { band: 7 });
    engineFieldsStage.run(ctx, envOf(flowOn()));
    expect(sent(ctx)?.priority).toBe(7);
    const low = selected(pod({ engine: "sglang", schedulingPolicy: "priority-low-values-first" }), { band: 7 });
    engineFieldsStage.run(low, envOf(flowOn()));
    expect(sent(low)?.priority).toBe(-7);
  });

  it("an FCFS pod, a model with enginePriority off, or a request without a band: the client's body goes as sent", () => {
    const client = chatBody(MODEL, { priority: 3 });
    const cases: Array<[SelectedContext, ModelConfig | undefined, SelectedContext["engineFields"]]> = [
      [selected(pod(), { band: 10, body: client }), flowOn(), { enginePriority: "fcfs-pod" }],
      [selected(pod({ schedulingPolicy: "priority" }), { band: 10, body: client }), flowOn("off"), { enginePriority: "off" }],
      [selected(pod({ schedulingPolicy: "priority" }), { body: client }), undefined, undefined],
    ];
    for (const [ctx, config, recorded] of cases) {
      engineFieldsStage.run(ctx, envOf(config));
      expect(upstreamBodyOf(ctx)).toBeUndefined();
      expect(ctx.engineFields).toEqual(recorded);
    }
  });

  it("a strict commit's next attempt on another pod starts from the client's body", () => {
    const ctx = selected(pod({ schedulingPolicy: "priority" }), { band: 4 });
    const env = envOf(flowOn());
    engineFieldsStage.run(ctx, env);
    expect(sent(ctx)?.priority).toBe(-4);
    Object.assign(ctx, { pick: { pod: pod({ pod: "p1" }), candidates: [] } });
    engineFieldsStage.run(ctx, env);
    expect(upstreamBodyOf(ctx)).toBeUndefined();
    expect(ctx.engineFields).toEqual({ enginePriority: "fcfs-pod" });
  });
});

describe("engine-fields stage: a managed adapter's name on SGLang", () => {
  it("SGLang pods get `base:adapter` as the model; vLLM pods keep the adapter's name", () => {
    const bases = { "tenant-a": MODEL };
    const sg = selected(pod({ engine: "sglang", adapters: ["tenant-a"] }), { body: chatBody("tenant-a") });
    engineFieldsStage.run(sg, envOf(undefined, bases));
    expect(sent(sg)?.model).toBe(`${MODEL}:tenant-a`);
    expect(sg.parsed.model).toBe("tenant-a");
    expect(sg.engineFields).toEqual({ engineModel: `${MODEL}:tenant-a` });
    const vl = selected(pod({ adapters: ["tenant-a"] }), { body: chatBody("tenant-a") });
    engineFieldsStage.run(vl, envOf(undefined, bases));
    expect(upstreamBodyOf(vl)).toBeUndefined();
    expect(vl.engineFields).toBeUndefined();
  });

  it("both fields at once: an adapter with a band on a priority-scheduling SGLang pod", () => {
    const ctx = selected(pod({ engine: "sglang", schedulingPolicy: "priority", adapters: ["tenant-a"] }), { band: 2, body: chatBody("tenant-a") });
    engineFieldsStage.run(ctx, envOf(flowOn(), { "tenant-a": MODEL }));
    expect(sent(ctx)).toMatchObject({ model: `${MODEL}:tenant-a`, priority: 2 });
  });
});
