import { describe, expect, it } from "vitest";
import { type AutoscalePolicy, autoscalePolicyError, resolvePolicy } from "../../schemas/autoscale.js";
import { apaDesired } from "./apa.js";
import { PolicyEvaluator } from "./evaluator.js";
import { KpaDecider } from "./kpa.js";
import { TimeWindow } from "./window.js";

const KPA = resolvePolicy({ model: "m", algorithm: "kpa", metric: "load.running", target: 10, minReplicas: 0, maxReplicas: 100, stableWindowMs: 60_000, panicWindowMs: 6_000 });

describe("TimeWindow", () => {
  it("averages the buckets in the window, keeps the max sample, and forgets what slid out", () => {
    const w = new TimeWindow(3000, 1000);
    expect(w.average(0)).toBeUndefined();
    w.record(0, 2);
    w.record(500, 4); // same bucket: mean 3, max 4
    w.record(1000, 9);
    expect(w.average(1500)).toBe(6);
    expect(w.max(1500)).toBe(9);
    // At 3000 the bucket starting at 0 is out ((3000 - 3000, 3000] starts after 0).
    expect(w.average(3000)).toBe(9);
    expect(w.size(4000)).toBe(0);
    expect(w.capacity).toBe(4);
  });
});

describe("KPA, worked by hand (target 10/pod, rates 2, panic threshold 2, stable 60 s)", () => {
  it("enters panic on a burst, never scales down while panicking, leaves after a calm stable window, reaches zero", () => {
    const k = new KpaDecider(KPA, 1, 0);
    // [t, ready pods, stable total, panic total] -> expected desired (the arithmetic in comments)
    const table: [number, number, number, number, number, boolean][] = [
      // dspc 1, dppc 1; up bound max(1, ceil(2x1)) = 2; 1/1 < 2: stable
      [1000, 1, 5, 5, 1, false],
      // dppc 4 -> clamped to 2; 4/1 >= 2: panic; max(1, 2, 1) = 2
      [2000, 1, 8, 35, 2, true],
      // dspc 2, dppc 6 -> clamp [1, 4] -> 4; 6/2 >= 2: panic extended; max(2, 4, 2) = 4
      [3000, 2, 12, 60, 4, true],
      // calm: dspc 2, dppc 1 -> clamp [2, 8] -> 2, 2; still within 60 s of the last panic: hold 4
      [4000, 4, 20, 10, 4, true],
      // 3000 + 60000 < 64000: panic over; dspc 1 -> clamped up to floor(4/2) = 2
      [64_000, 4, 10, 10, 2, false],
      // 0 demand: floor(2/2) = 1
      [65_000, 2, 0, 0, 1, false],
      // floor(1/2) = 0: scale to zero is allowed by KPA itself
      [66_000, 1, 0, 0, 0, false],
      // zero pods, a little demand in the stable window: ceil(0.05/10) = 1 (up bound max(1, 0) = 1)
      [67_000, 0, 0.05, 3, 1, false],
    ];
    for (const [t, n, s, p, want, panic] of table) {
      const a = k.step(t, n, s, p);
      expect({ t, desired: a.desired, inPanic: a.inPanic }).toEqual({ t, desired: want, inPanic: panic });
    }
  });

  it("starts in panic with more than one pod (no scale-down before the windows fill), and raises a start from zero to activationScale", () => {
    const k = new KpaDecider(KPA, 6, 0);
    expect(k.step(1000, 6, 0, 0)).toMatchObject({ inPanic: true, desired: 6 });
    expect(k.step(61_001, 6, 0, 0)).toMatchObject({ inPanic: false, desired: 3 });
    const a = new KpaDecider({ ...KPA, activationScale: 3 }, 0, 0);
    expect(a.step(1000, 0, 5, 5)).toMatchObject({ stablePods: 3, desired: 3 });
    expect(a.step(2000, 0, 0, 0).desired).toBe(0);
  });
});

describe("APA, worked by hand (target 10/pod, tolerance 0.1, rates 2)", () => {
  const s = resolvePolicy({ model: "m", algorithm: "apa", metric: "load.running", target: 10, minReplicas: 0, maxReplicas: 100 });
  it.each([
    [4, 15, 6, "up"], // u 1.5: ceil(4 x 1.5) = 6 <= ceil(2 x 4) = 8
    [4, 50, 8, "up"], // u 5: 20, capped at 8
    [4, 10.5, 4, "hold"], // u 1.05 inside [0.9, 1.1]
    [4, 5, 2, "down"], // u 0.5: ceil(2) = 2 >= floor(4/2) = 2
    [4, 1, 2, "down"], // u 0.1: ceil(0.4) = 1, floored at 2
    [0, 3, 1, "activate"], // zero pods, demand: activationScale
    [0, 0, 0, "hold"],
  ] as const)("N=%d, per pod %d -> %d (%s)", (n, v, want, band) => {
    expect(apaDesired(s, n, v)).toMatchObject({ desired: want, band });
  });
});

describe("PolicyEvaluator", () => {
  const apa = resolvePolicy({ model: "m", algorithm: "apa", metric: "load.running", target: 10, minReplicas: 1, maxReplicas: 6, stableWindowMs: 1000, panicWindowMs: 1000, scaleDownDelayMs: 5000 });

  it("applies a rise at once, holds a drop for the scale-down delay, and clamps to [min, max]", () => {
    const e = new PolicyEvaluator(apa);
    // 4 pods at 20 each (total 80): u 2 -> 8, clamped to max 6.
    const first = e.step({ now: 1000, readyPods: 4, value: 80 });
    expect(first).toMatchObject({ proposed: 8, delayed: 8, desired: 6 });
    expect(first.reason).toContain("clamped");
    const desired: number[] = [];
    for (let t = 2000; t <= 7000; t += 1000) desired.push(e.step({ now: t, readyPods: 4, value: 20 }).desired);
    // total 20 on 4 pods = 5/pod: u 0.5 -> 2; the 8 of t=1000 holds until its bucket leaves the 5 s window (t=6000).
    expect(desired).toEqual([6, 6, 6, 6, 2, 2]);
    // Almost no load: proposed 2 (floor(4/2)); below min it would be clamped up to 1, not 0.
    const e2 = new PolicyEvaluator({ ...apa, scaleDownDelayMs: 0 });
    expect(e2.step({ now: 1000, readyPods: 1, value: 0 }).desired).toBe(1);
  });

  it("holds the current count while the metric has no samples", () => {
    const e = new PolicyEvaluator(KPA);
    const r = e.step({ now: 1000, readyPods: 3, value: undefined });
    expect(r).toMatchObject({ desired: 3, stableAverage: null });
    expect(r.reason).toContain("no samples");
  });

  it("scales a fleet-wide metric (TTFT p90) by pods x figure under KPA", () => {
    const p = resolvePolicy({ model: "m", algorithm: "kpa", metric: "ttft.p90", target: 500, minReplicas: 0, maxReplicas: 50, stableWindowMs: 10_000, panicWindowMs: 2_000 });
    const e = new PolicyEvaluator(p);
    // 2 pods at p90 1,000 ms against 500: total 2,000 -> 4 pods (within [1, 4])
    expect(e.step({ now: 1000, readyPods: 2, value: 1000 }).kpa).toMatchObject({ stableTotal: 2000, stablePods: 4 });
  });
});

describe("policy validation", () => {
  const ok: AutoscalePolicy = { model: "m", algorithm: "kpa", metric: "load.running", target: 10, minReplicas: 0, maxReplicas: 4 };
  it.each([
    [{ ...ok, metric: "load.nonsense" }, "/metric: unknown metric"],
    [{ ...ok, metric: undefined }, "/metric: required"],
    [{ ...ok, target: 0 }, "/target: must be > 0"],
    [{ ...ok, target: -3 }, "/target: must be > 0"],
    [{ ...ok, minReplicas: 5 }, "/minReplicas: 5 is above /maxReplicas 4"],
    [{ ...ok, stableWindowMs: 500, scrapeIntervalMs: 1000 }, "/stableWindowMs: 500 ms is shorter than the scrape interval"],
    [{ ...ok, panicWindowMs: 900 }, "/panicWindowMs: 900 ms is shorter than the scrape interval"],
    [{ ...ok, panicWindowMs: 200_000 }, "/panicWindowMs: 200000 ms is longer than /stableWindowMs"],
    [{ ...ok, maxScaleUpRate: 1 }, "/maxScaleUpRate"],
    [{ ...ok, algorithm: "pd" }, "/pd: the pd planner needs its settings"],
    [{ ...ok, extra: 1 }, "Unexpected property"],
  ])("refuses %j naming the field", (p, msg) => {
    expect(autoscalePolicyError(p)).toContain(msg);
  });
  it("accepts a valid policy, signed or not", () => {
    expect(autoscalePolicyError(ok)).toBeUndefined();
    expect(autoscalePolicyError({ ...ok, sig: { key: "0123456789abcdef", at: 1, ed25519: "A".repeat(86) } })).toBeUndefined();
  });
});

describe("scale from zero", () => {
  it("requests held in the waiting room bring a model at zero pods to activationScale, whatever its metric reads", () => {
    const p = resolvePolicy({ model: "m", algorithm: "apa", metric: "load.running", target: 10, minReplicas: 0, maxReplicas: 4, stableWindowMs: 1000, panicWindowMs: 1000, scaleDownDelayMs: 0, activationScale: 2 });
    const e = new PolicyEvaluator(p);
    expect(e.step({ now: 1000, readyPods: 0, value: 0, held: 0 }).desired).toBe(0);
    const r = e.step({ now: 2000, readyPods: 0, value: 0, held: 3 });
    expect(r.desired).toBe(2);
    expect(r.reason).toContain("scale from zero: 3 request(s) held");
    const k = new PolicyEvaluator({ ...p, algorithm: "kpa" });
    expect(k.step({ now: 1000, readyPods: 0, value: undefined, held: 1 }).desired).toBe(2);
  });
});
