import { describe, expect, it } from "vitest";
import { MAX_DRIFT_KEYS, PredictionDrift } from "./latency-drift.js";

const rec = (model: string, podClass: string | undefined, predicted: number, actual: number | undefined, o: { tpot?: [number, number]; outcome?: "completed" | "error"; source?: "class" | "pooled" | "prior" } = {}) => ({
  model,
  outcome: o.outcome ?? ("completed" as const),
  ...(actual !== undefined ? { ttftMs: actual } : {}),
  ...(o.tpot ? { tpotMs: o.tpot[1] } : {}),
  prediction: { ttftMs: predicted, tpotMs: o.tpot?.[0] ?? 10, source: o.source ?? ("class" as const), ...(podClass ? { podClass } : {}) },
});

describe("PredictionDrift", () => {
  it("keeps the mean absolute percentage error of the last requests per model and class", () => {
    const d = new PredictionDrift(4);
    d.record(rec("m", "fast", 110, 100, { tpot: [10, 8] })); // 10 %, TPOT 25 %
    d.record(rec("m", "fast", 80, 100)); // 20 %
    d.record(rec("m", "slow", 300, 200, { source: "prior" })); // 50 %
    expect(d.figures()).toEqual([
      { model: "m", podClass: "fast", ttftApe: expect.closeTo(0.15, 10), tpotApe: 0.25, samples: 2, sources: { class: 2, pooled: 0, prior: 0 } },
      { model: "m", podClass: "slow", ttftApe: 0.5, tpotApe: null, samples: 1, sources: { class: 0, pooled: 0, prior: 1 } },
    ]);
    // Rolling: four more at 0 % push the first ones out.
    for (let i = 0; i < 4; i++) d.record(rec("m", "fast", 100, 100));
    expect(d.figures()[0]?.ttftApe).toBe(0);
  });

  it("skips records without a prediction, an actual TTFT, or a completed outcome, and bounds its series", () => {
    const d = new PredictionDrift();
    expect(d.record(rec("m", "a", 10, undefined))).toBe(false);
    expect(d.record(rec("m", "a", 10, 0.5))).toBe(false);
    expect(d.record(rec("m", "a", 10, 20, { outcome: "error" }))).toBe(false);
    expect(d.record({ model: "m", outcome: "completed", ttftMs: 20 })).toBe(false);
    for (let i = 0; i < MAX_DRIFT_KEYS + 10; i++) d.record(rec("m", `c${i}`, 10, 20));
    expect(d.figures()).toHaveLength(MAX_DRIFT_KEYS);
    expect(d.untracked).toBe(10);
    // No class: the unclassed series.
    const e = new PredictionDrift();
    e.record(rec("m", undefined, 10, 20));
    expect(e.figures()[0]?.podClass).toBe("_");
  });
});
