import { describe, expect, it } from "vitest";
import { calibratedClasses } from "./calibration.js";

describe("calibratedClasses", () => {
  it("reads a class's fit as engine settings: prefill per token, decode step and slope, TTFT offset", () => {
    const fits = [
      { model: "m", podClass: "fast", samples: 100, tpotSamples: 100, ttft: [6, 0.64, 0.6, 1, 5], tpot: [2, 0.5, 0.01] },
      { model: "m", podClass: "slow", samples: 50, tpotSamples: 0, ttft: [-3, 1.6, 1.5, 2, 9], tpot: [15, 0.75, 0.06] },
    ];
    const { classes, summary } = calibratedClasses(fits, { m: { fast: 2, slow: 2, h100: 1 } });
    expect(classes.m).toEqual([
      { podClass: "fast", pods: 2, engine: { prefillMsPerToken: 0.04, decodeMsPerStep: 2, decodeBatchSlope: 0.25 }, ttftOffsetMs: 6 },
      // A class the fleet had without outcomes keeps the simulator's defaults.
      { podClass: "h100", pods: 1, engine: {}, ttftOffsetMs: 0 },
      // No TPOT sample: only the prefill is calibrated; a negative intercept is no offset.
      { podClass: "slow", pods: 2, engine: { prefillMsPerToken: 0.1 }, ttftOffsetMs: 0 },
    ]);
    expect(summary.map((s) => s.podClass)).toEqual(["fast", "slow"]);
  });

  it("keeps the unclassed pods unclassed", () => {
    const { classes } = calibratedClasses([{ model: "m", podClass: "_", samples: 1, tpotSamples: 1, ttft: [1, 1.6, 0, 0, 0], tpot: [3, 0, 0] }], { m: { _: 4 } });
    expect(classes.m?.[0]).toMatchObject({ podClass: "", pods: 4, engine: { prefillMsPerToken: 0.1, decodeMsPerStep: 3 } });
  });
});
