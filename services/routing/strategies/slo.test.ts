import { describe, expect, it } from "vitest";
import { parseStrategy, StrategySpecError } from "./registry.js";
import { headrooms, sloLeastLoadStrategy, sloPackLoadStrategy, sloStrategy } from "./slo.js";
import { ctxOf, type PodLoadSpec, sample, vllmSample } from "./testing.js";
import type { SloTargets } from "./types.js";

// Request prompt = 100 = every pod's mean prompt and no queue, so TTFT = mean prefill, TPOT = mean ITL.
const p1 = vllmSample({ prefill: 0.1, decode: 2, itl: 0.02 }); // TTFT 100 ms, TPOT 20 ms
const p2 = vllmSample({ prefill: 0.4, decode: 4, itl: 0.04 }); // TTFT 400 ms, TPOT 40 ms
const p3 = vllmSample({ prefill: 2.0, decode: 8, itl: 0.08 }); // TTFT 2000 ms, TPOT 80 ms
const LOAD = { p1, p2, p3 };
const TARGETS: SloTargets = { ttftMs: 500, tpotMs: 50 };
// Headroom vs TARGETS: p1 min(0.8, 0.6) = 0.6; p2 min(0.2, 0.2) = 0.2; p3 misses.

describe("slo family - table", () => {
  it.each<{ name: string; strategy: typeof sloStrategy; load?: Record<string, PodLoadSpec>; slo?: SloTargets; inFlight?: Record<string, number>; want: string; fallback?: string }>([
    { name: "slo-least-load: most headroom", strategy: sloLeastLoadStrategy, want: "p1" },
    { name: "slo-pack-load: least headroom that still meets the targets", strategy: sloPackLoadStrategy, want: "p2" },
    {
      name: "slo: fewest in flight among pods meeting the targets (engines run what the ledger counts)",
      strategy: sloStrategy,
      load: { p1: { ...p1, running: 3 }, p2: { ...p2, running: 1 }, p3 },
      inFlight: { p1: 3, p2: 1, p3: 0 },
      want: "p2",
    },
    {
      name: "charged requests the engine does not run yet count against TTFT",
      strategy: sloStrategy,
      inFlight: { p1: 3, p2: 1, p3: 0 },
      want: "p1",
    },
    { name: "TTFT target only", strategy: sloPackLoadStrategy, slo: { ttftMs: 2500 }, want: "p3" },
    { name: "TPOT target only", strategy: sloPackLoadStrategy, slo: { tpotMs: 45 }, want: "p2" },
    {
      name: "KV pressure (>90%) slows decode ×1.5: p2 no longer meets TPOT",
      strategy: sloPackLoadStrategy,
      load: { p1, p2: vllmSample({ prefill: 0.4, decode: 4, itl: 0.04 }, { kvCacheUsage: 0.95 }), p3 },
      want: "p1",
    },
    {
      name: "queued requests count against TTFT: p1 with 5 waiting misses",
      strategy: sloLeastLoadStrategy,
      load: { p1: vllmSample({ prefill: 0.1, decode: 2, itl: 0.02 }, { waiting: 5 }), p2, p3 },
      want: "p2",
    },
    { name: "pods without metrics cannot meet a target", strategy: sloLeastLoadStrategy, load: { p1: undefined, p2: "stale", p3: sample({ kvCacheUsage: 0 }) }, inFlight: { p1: 1, p2: 1 }, want: "p3", fallback: "least-request" },
    { name: "none meets the targets: least-latency", strategy: sloPackLoadStrategy, slo: { ttftMs: 10 }, want: "p1", fallback: "least-latency" },
    { name: "no targets configured: least-latency", strategy: sloLeastLoadStrategy, slo: {}, want: "p1", fallback: "least-latency" },
    { name: "targets that are not positive numbers are not targets", strategy: sloPackLoadStrategy, slo: { ttftMs: 0, tpotMs: Number.NaN }, want: "p1", fallback: "least-latency" },
    { name: "a bad target is dropped, the good one still applies", strategy: sloPackLoadStrategy, slo: { ttftMs: -5, tpotMs: 45 }, want: "p2" },
    { name: "no metrics at all: least-latency, then least-request", strategy: sloStrategy, load: {}, inFlight: { p1: 2, p2: 1, p3: 2 }, want: "p2", fallback: "least-request" },
  ])("$name", ({ strategy, load, slo, inFlight, want, fallback }) => {
    const p = strategy.pick(ctxOf({ pods: ["p1", "p2", "p3"], load: load ?? LOAD, slo: slo ?? TARGETS, inFlight: inFlight ?? {} }));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBe(fallback);
  });

  it("without ctx.slo at all: least-latency", () => {
    const p = sloStrategy.pick(ctxOf({ pods: ["p1", "p2", "p3"], load: LOAD }));
    expect(p.pod.pod).toBe("p1");
    expect(p.fallback).toBe("least-latency");
  });

  it("reports headroom per candidate", () => {
    const ctx = ctxOf({ pods: ["p1", "p2", "p3"], load: LOAD, slo: TARGETS });
    const room = headrooms(ctx, TARGETS);
    expect(room[0]).toBeCloseTo(0.6, 9);
    expect(room[1]).toBeCloseTo(0.2, 9);
    expect(room[2]).toBeLessThan(0);
    const p = sloLeastLoadStrategy.pick(ctx);
    expect(p.better).toBe("higher");
    expect(p.candidates.map((c) => c.score)).toEqual(room);
  });

  it("ties are broken at random", () => {
    const load = { p1, p2: p1, p3 };
    const pick = (r: number) => sloLeastLoadStrategy.pick(ctxOf({ pods: ["p1", "p2", "p3"], load, slo: TARGETS, random: () => r })).pod.pod;
    expect(pick(0)).toBe("p1");
    expect(pick(0.99)).toBe("p2");
  });

  it("is exclusive: combining it is a spec error", () => {
    for (const spec of ["slo,least-request", "random:1,slo-least-load:2"]) expect(() => parseStrategy(spec)).toThrow(StrategySpecError);
    expect(sloStrategy.exclusive).toBe(true);
  });
});
