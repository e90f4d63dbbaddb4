import { describe, expect, it } from "vitest";
import { Director } from "./director.js";
import { RouteError } from "./errors.js";
import type { SectionStage } from "./pipeline.js";
import { stagesOf } from "./pipeline.js";
import type { PrefixSupport } from "./ports.js";
import type { RoutedRequest } from "./request.js";
import { REQUEST_PATH } from "./request-path.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "./stages/testing.js";

function setup(o: { prefix?: PrefixSupport } = {}) {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(2, "gw");
  const sink = new MemorySink();
  const seen: Array<{ stage: string; seconds: number }> = [];
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now, onStage: (stage, seconds) => seen.push({ stage, seconds }), ...(o.prefix ? { prefix: o.prefix } : {}) });
  return { clock, state, sink, director, seen };
}

describe("request path - the list, its table and its driver", () => {
  it("stage names are unique (they label a metric: a bounded, known set)", () => {
    const names = stagesOf(REQUEST_PATH).map((s) => s.name);
    expect(new Set(names).size).toBe(names.length);
  });

  it("a synchronous request visits every stage once, in order, and stays synchronous", () => {
    const { director, seen } = setup();
    const r = director.route({ headers: { "x-request-id": "s-1" }, body: chatBody() });
    expect(r).not.toBeInstanceOf(Promise);
    expect(seen.map((s) => s.stage)).toEqual(stagesOf(REQUEST_PATH).map((s) => s.name));
    expect(seen.every((s) => s.seconds >= 0 && s.seconds < 5)).toBe(true);
  });

  it("an awaiting stage (tokenize) is timed until it settles, and the path goes on after it", async () => {
    let release: (() => void) | undefined;
    const prefix: PrefixSupport = {
      tokenizer: { modeFor: () => "hf", tokenize: () => new Promise((resolve) => (release = () => resolve({ tokens: Uint32Array.of(1, 2, 3), mode: "hf" }))) },
      match: (_m, candidates, tokens) => ({ info: { queried: tokens.length, blockSize: 16, matched: () => 0 }, hashes: [], detail: candidates.map((c) => ({ pod: c.pod, indexBlocks: 0, indexGpuBlocks: 0, indexWeighted: 0, routedBlocks: 0 })) }),
      recordRouted: () => {},
      blocks: () => ({ size: 16, mode: "precise", hashes: [] }),
    };
    const { director, seen } = setup({ prefix });
    const p = director.route({ headers: { "x-request-id": "t-1", "routing-strategy": "prefix-cache" }, body: chatBody() });
    expect(p).toBeInstanceOf(Promise);
    expect(seen.map((s) => s.stage)).toEqual(["parse", "model-rewrite", "embed", "semantic", "plan", "pool-check", "key-models", "response-affinity", "rate-check"]);
    const t0 = performance.now();
    while (performance.now() - t0 < 5);
    release?.();
    const r = (await p) as RoutedRequest;
    expect(r.pod.model).toBe(MODEL);
    expect(seen.map((s) => s.stage).slice(9)).toEqual(["tokenize", "context-length", "flow-gate", "admit", "select", "engine-fields", "charge", "prefill-leg"]);
    expect(seen.find((s) => s.stage === "tokenize")?.seconds).toBeGreaterThanOrEqual(0.004);
  });

  it("a refusal is named after the stage that refused, with its phase and the parsed model", () => {
    const { director, state } = setup();
    const refusal = (f: () => unknown) => {
      try {
        f();
      } catch (err) {
        return (err as RouteError).refusal;
      }
      throw new Error("not refused");
    };
    expect(refusal(() => director.route({ headers: {}, body: Buffer.from("{") }))).toEqual({ stage: "parse", phase: "prepare" });
    expect(refusal(() => director.route({ headers: { "routing-strategy": "bogus" }, body: chatBody() }))).toEqual({ stage: "plan", phase: "prepare", model: MODEL });
    expect(refusal(() => director.route({ headers: {}, body: chatBody(), keyModels: ["other"] }))).toMatchObject({ stage: "key-models", phase: "prepare" });
    expect(refusal(() => director.route({ headers: {}, body: chatBody("org/unknown") }))).toEqual({ stage: "select", phase: "commit", model: "org/unknown" });
    for (const p of state.pods.readyPods(MODEL)) state.apply({ type: "pod", action: "upsert", model: MODEL, pod: p.pod, address: p.address, ready: false, engine: "vllm", ts: 0 }, { stream: "pods", subject: `pods.${p.pod}`, seq: 100 + Number(p.pod.slice(1)), serverTs: 0 });
    const err = (() => {
      try {
        director.route({ headers: {}, body: chatBody() });
      } catch (e) {
        return e as RouteError;
      }
    })();
    expect(err).toBeInstanceOf(RouteError);
    expect([err?.code, err?.refusal?.stage, err?.afterRouting]).toEqual(["no_ready_pod", "select", false]);
  });

  it("the commit section cannot await: an async stage does not type-check as a section stage", () => {
    // @ts-expect-error a section stage returns undefined; an async function returns a promise
    const bad: SectionStage = { name: "x", phase: "commit", run: async () => undefined };
    expect(bad.name).toBe("x");
  });
});
