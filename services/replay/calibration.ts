/**
 * The calibrated what-if's fleet: engine parameters per pod class fitted to the recorded outcomes
 * of the window (replay folds every release's latency sample into one fit per model and class,
 * services/views/latency-model.ts), instead of the simulator's defaults. Pure.
 *
 * The fitted regressions read as the simulator's engine model (services/sim/engine.ts):
 *   TTFT = offset + prefill ms/token × uncached tokens + ... : prefillMsPerToken = the uncached-block
 *          coefficient / 16; the intercept is what a recorded TTFT spends outside the engine's
 *          prefill (network, proxy, scheduling) and is added to every simulated TTFT;
 *   TPOT = step + slope × decoding requests + ... : decodeMsPerStep = the intercept,
 *          decodeBatchSlope = the decoding coefficient / the intercept.
 * A class the fleet had but no outcome fitted keeps the simulator's defaults.
 */
import type { LatencyCoefficients } from "../views/latency-model.js";
import type { CalibrationSummary } from "./report-types.js";
import type { SimClass } from "./whatif.js";

const BLOCK = 16;

export function calibratedClasses(
  fits: readonly LatencyCoefficients[],
  fleetClasses: Readonly<Record<string, Readonly<Record<string, number>>>>,
): { classes: Record<string, SimClass[]>; summary: CalibrationSummary["classes"] } {
  const classes: Record<string, SimClass[]> = {};
  const summary: CalibrationSummary["classes"] = [];
  for (const [model, counts] of Object.entries(fleetClasses)) {
    const list: SimClass[] = [];
    for (const [podClass, pods] of Object.entries(counts).sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
      const fit = fits.find((f) => f.model === model && f.podClass === podClass && f.samples > 0);
      if (!fit) {
        list.push({ podClass: podClass === "_" ? "" : podClass, pods, engine: {}, ttftOffsetMs: 0 });
        continue;
      }
      const [t0 = 0, tUncached = 0] = fit.ttft;
      const [p0 = 0, pDecoding = 0] = fit.tpot;
      const prefillMsPerToken = Math.max(0.001, tUncached / BLOCK);
      const decodeMsPerStep = fit.tpotSamples > 0 ? Math.max(0.1, p0) : undefined;
      const decodeBatchSlope = decodeMsPerStep !== undefined ? Math.max(0, pDecoding / decodeMsPerStep) : undefined;
      const ttftOffsetMs = Math.max(0, t0);
      list.push({
        podClass: podClass === "_" ? "" : podClass,
        pods,
        engine: { prefillMsPerToken, ...(decodeMsPerStep !== undefined ? { decodeMsPerStep, decodeBatchSlope } : {}) },
        ttftOffsetMs,
      });
      const r3 = (x: number) => Math.round(x * 1000) / 1000;
      summary.push({ model, podClass, pods, samples: fit.samples, prefillMsPerToken: r3(prefillMsPerToken), decodeMsPerStep: r3(decodeMsPerStep ?? 0), decodeBatchSlope: r3(decodeBatchSlope ?? 0), ttftOffsetMs: r3(ttftOffsetMs) });
    }
    if (list.length > 0) classes[model] = list;
  }
  return { classes, summary };
}
