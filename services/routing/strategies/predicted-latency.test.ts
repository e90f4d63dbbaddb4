import { describe, expect, it } from "vitest";
import { LatencyModel } from "../../views/latency-model.js";
import type { PodInfo } from "../../views/pod-set.js";
import { latencyFeaturesOf, predictedLatencyStrategy, predictedLatencyTargetsStrategy, targetScore } from "./predicted-latency.js";
import { parseStrategy, strategyTraits } from "./registry.js";
import { ctxOf, NOW, sample } from "./testing.js";
import type { RoutingContext } from "./types.js";

/** A model that has learned: class "fast" = 10 ms + 1 ms per uncached block, "slow" = 2.5x that; TPOT 5 / 12.5 ms. */
function learned(): LatencyModel {
  const m = new LatencyModel();
  for (let i = 0; i < 200; i++) {
    const prompt = 160 + 16 * (i % 50);
    const decoding = i % 4;
    for (const [cls, k] of [["fast", 1], ["slow", 2.5]] as const) {
      m.learn("m", NOW - 5_000 + i, { x: [prompt, 0, 0, decoding, 0, 0], cls, ttftMs: k * (10 + prompt / 16), tpotMs: k * (5 + decoding) });
    }
  }
  return m;
}

const withClasses = (ctx: RoutingContext, classes: Record<string, string>, latency?: LatencyModel): RoutingContext => ({
  ...ctx,
  pods: ctx.pods.map((p): PodInfo => ({ ...p, ...(classes[p.pod] ? { podClass: classes[p.pod] } : {}) })),
  ...(latency ? { latency } : {}),
});

describe("predicted-latency", () => {
  it("picks the lowest predicted TTFT: the fast class", () => {
    const m = learned();
    const idle = withClasses(ctxOf({ pods: ["p1", "p2"], promptTokens: 800 }), { p1: "slow", p2: "fast" }, m);
    expect(predictedLatencyStrategy.pick(idle).pod.pod).toBe("p2");
    const scores = predictedLatencyStrategy.pick(idle).candidates.map((c) => c.score);
    // fast: 10 + 50 blocks = 60 ms; slow: 150 ms (within 5 %: the ridge prior pulls a little).
    expect(Math.abs((scores[1] as number) / 60 - 1)).toBeLessThan(0.05);
    expect(Math.abs((scores[0] as number) / 150 - 1)).toBeLessThan(0.05);
  });

  it("breaks equal TTFTs by the lower TPOT", () => {
    const m = new LatencyModel();
    // Same TTFT on both classes; TPOT 5 vs 9 ms.
    for (let i = 0; i < 50; i++) {
      m.learn("m", NOW - 1_000, { x: [160, 0, 0, 0, 0, 0], cls: "a", ttftMs: 20, tpotMs: 9 });
      m.learn("m", NOW - 1_000, { x: [160, 0, 0, 0, 0, 0], cls: "b", ttftMs: 20, tpotMs: 5 });
    }
    const ctx = withClasses(ctxOf({ pods: ["p1", "p2"], promptTokens: 160 }), { p1: "a", p2: "b" }, m);
    expect(predictedLatencyStrategy.pick(ctx).pod.pod).toBe("p2");
  });

  it("reads the features a decision has: prompt, cached blocks, the ledger's prefill and decoding, LOAD's queue and KV", () => {
    const ctx = ctxOf({ pods: ["p1"], promptTokens: 1000, inFlight: { p1: 3 }, prefillTokensInFlight: { p1: 700 }, load: { p1: sample({ waiting: 2, kvCacheUsage: 0.4567 }) } });
    const prefix = { queried: 62, blockSize: 16, matched: () => 40 };
    expect(latencyFeaturesOf(ctx, ctx.pods[0] as PodInfo, 1000, prefix, NOW)).toEqual({ promptTokens: 1000, cachedTokens: 640, prefillTokens: 700, decoding: 3, waiting: 2, kvPermille: 457 });
    // Without a prefix match nothing counts as cached; without a fresh sample no queue.
    expect(latencyFeaturesOf(ctx, ctx.pods[0] as PodInfo, 1000, undefined, NOW + 10_000)).toMatchObject({ cachedTokens: 0, waiting: 0, kvPermille: 0 });
  });

  it("falls back to least-request without a latency model, and predicts from the prior with an empty one", () => {
    const bare = ctxOf({ pods: ["p1", "p2"], inFlight: { p1: 2, p2: 0 } });
    const p = predictedLatencyStrategy.pick(bare);
    expect(p.pod.pod).toBe("p2");
    expect(p.fallback).toBe("least-request");
    const cold = predictedLatencyStrategy.pick({ ...bare, latency: new LatencyModel() });
    expect(cold.fallback).toBeUndefined();
    // The prior charges 1 ms per decoding request: the idle pod wins.
    expect(cold.pod.pod).toBe("p2");
  });

  it("targets: the slowest pod that still meets the targets; none meets them -> the least excess", () => {
    const m = learned();
    const base = ctxOf({ pods: ["p1", "p2"], promptTokens: 800 });
    const ctx = (slo: { ttftMs?: number; tpotMs?: number }) => withClasses({ ...base, slo }, { p1: "slow", p2: "fast" }, m);
    // Both meet 200 ms: the slow one (least headroom) keeps the fast one free.
    expect(predictedLatencyTargetsStrategy.pick(ctx({ ttftMs: 200 })).pod.pod).toBe("p1");
    // Only the fast one meets 100 ms.
    expect(predictedLatencyTargetsStrategy.pick(ctx({ ttftMs: 100 })).pod.pod).toBe("p2");
    // Neither meets 30 ms: the smaller excess (the fast one).
    expect(predictedLatencyTargetsStrategy.pick(ctx({ ttftMs: 30 })).pod.pod).toBe("p2");
    // No targets: as predicted-latency.
    expect(predictedLatencyTargetsStrategy.pick(withClasses(base, { p1: "slow", p2: "fast" }, m)).pod.pod).toBe("p2");
    expect(targetScore({ ttftMs: 50, tpotMs: 10, source: "class", samples: 1 }, { ttftMs: 100, tpotMs: 20 })).toBe(0.5);
    expect(targetScore({ ttftMs: 150, tpotMs: 10, source: "class", samples: 1 }, { ttftMs: 100 })).toBe(1.5);
  });

  it("combines with prefix-cache and reads the prefix match", () => {
    const s = parseStrategy("predicted-latency:1,prefix-cache:1");
    expect(s.needs?.promptTokenIds).toBe(true);
    expect(strategyTraits("predicted-latency").prefixMatch).toBe(true);
    const m = learned();
    // Both fast; p1 holds the whole prompt: fewer uncached blocks and the longer match agree.
    const ctx = withClasses({ ...ctxOf({ pods: ["p1", "p2"], promptTokens: 800 }), prefix: { queried: 50, blockSize: 16, matched: (p) => (p === "p1" ? 50 : 0) } }, { p1: "fast", p2: "fast" }, m);
    expect(s.pick(ctx).pod.pod).toBe("p1");
  });
});
