/**
 * The flow bench: its figures' arithmetic (inversion sweep against a brute-force count, Jain's
 * index, max-min fair shares, the capacity model), and one very short pass of `npm run bench --
 * flow` end to end (needs dist/ built, as `npm test` does), which checks the plumbing and the
 * shape of the final JSON line, not the performance targets.
 */
import { describe, expect, it } from "vitest";
import { runBench } from "../../test/harness/cli.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { buildFlowMix, FLOW_MIX_DEFAULTS } from "../workloads/flow-mix.js";
import { FLOW_ENGINE_DEFAULTS } from "./flow.js";
import { type BandDispatch, type BandHold, countInversions, jainIndex, maxMinFairShares, modelCapacity } from "./flow-figures.js";

const M = "m";

describe("flow bench - inversions", () => {
  const hold = (band: number, enqueuedAt: number, leftAt: number, model = M): BandHold => ({ model, band, enqueuedAt, leftAt });
  const at = (band: number, t: number, model = M): BandDispatch => ({ model, band, at: t });

  it("counts a lower band dispatched while an older higher band was held", () => {
    expect(countInversions([at(0, 1_000)], [hold(10, 500, 1_500)], 250)).toBe(1);
  });

  it("is strict at both ends: enqueued exactly bound before, or leaving at the dispatch, does not count", () => {
    expect(countInversions([at(0, 1_000)], [hold(10, 750, 2_000)], 250)).toBe(0);
    expect(countInversions([at(0, 1_000)], [hold(10, 749, 2_000)], 250)).toBe(1);
    expect(countInversions([at(0, 1_000)], [hold(10, 0, 1_000)], 250)).toBe(0);
    expect(countInversions([at(0, 1_000)], [hold(10, 0, 1_001)], 250)).toBe(1);
  });

  it("ignores the same band, lower bands, other models, and counts a dispatch once", () => {
    expect(countInversions([at(0, 1_000)], [hold(0, 0, 2_000)], 250)).toBe(0);
    expect(countInversions([at(10, 1_000)], [hold(0, 0, 2_000)], 250)).toBe(0);
    expect(countInversions([at(0, 1_000, "other")], [hold(10, 0, 2_000)], 250)).toBe(0);
    expect(countInversions([at(0, 1_000)], [hold(10, 0, 2_000), hold(5, 0, 2_000), hold(10, 100, 3_000)], 250)).toBe(1);
  });

  it("agrees with a brute-force count on random data", () => {
    const rand = mulberry32(7);
    const bands = [-1, 0, 5, 10];
    const pick = () => bands[Math.floor(rand() * bands.length)] as number;
    const model = () => (rand() < 0.8 ? "a" : "b");
    const holds: BandHold[] = Array.from({ length: 400 }, () => {
      const enqueuedAt = Math.floor(rand() * 10_000);
      return { model: model(), band: pick(), enqueuedAt, leftAt: enqueuedAt + Math.floor(rand() * 1_500) };
    });
    const dispatches: BandDispatch[] = Array.from({ length: 600 }, () => ({ model: model(), band: pick(), at: Math.floor(rand() * 11_000) }));
    const brute = dispatches.filter((d) => holds.some((h) => h.model === d.model && h.band > d.band && h.enqueuedAt < d.at - 250 && h.leftAt > d.at)).length;
    expect(brute).toBeGreaterThan(0);
    expect(countInversions(dispatches, holds, 250)).toBe(brute);
  });
});

describe("flow bench - fairness", () => {
  it("computes Jain's index", () => {
    expect(jainIndex([1, 1])).toBe(1);
    expect(jainIndex([1, 0])).toBe(0.5);
    expect(jainIndex([0.5, 1])).toBeCloseTo(0.9, 6);
    expect(jainIndex([])).toBeNull();
    expect(jainIndex([0, 0])).toBeNull();
  });

  it("water-fills max-min fair shares", () => {
    expect(maxMinFairShares([10, 1], 5)).toEqual([4, 1]);
    expect(maxMinFairShares([3, 3], 4)).toEqual([2, 2]);
    expect(maxMinFairShares([3, 1], 10)).toEqual([3, 1]);
    expect(maxMinFairShares([3, 1], 0)).toEqual([0, 0]);
  });
});

describe("flow bench - capacity model", () => {
  it("follows the simulator's timing model", () => {
    const sample = buildFlowMix({ ...FLOW_MIX_DEFAULTS, rate: 1, durationMs: 500_000 }).slice(0, 300);
    const c = modelCapacity(sample, FLOW_ENGINE_DEFAULTS);
    expect(c.batchSize).toBe(FLOW_ENGINE_DEFAULTS.maxBatch);
    // Twice the pods or twice the time scale: twice the requests per wall second.
    expect(modelCapacity(sample, { ...FLOW_ENGINE_DEFAULTS, pods: 2 * FLOW_ENGINE_DEFAULTS.pods }).rps).toBeCloseTo(2 * c.rps, 6);
    expect(modelCapacity(sample, { ...FLOW_ENGINE_DEFAULTS, timeScale: 2 * FLOW_ENGINE_DEFAULTS.timeScale }).rps).toBeCloseTo(2 * c.rps, 6);
    // Slower prefill: more engine time per request.
    expect(modelCapacity(sample, { ...FLOW_ENGINE_DEFAULTS, prefillMsPerToken: 2 * FLOW_ENGINE_DEFAULTS.prefillMsPerToken }).rps).toBeLessThan(c.rps);
    // A KV cache holding two requests caps the batch at two.
    const twoFit = Math.ceil((2.5 * (c.meanPromptTokens + c.meanMaxTokens)) / FLOW_ENGINE_DEFAULTS.blockSize);
    expect(modelCapacity(sample, { ...FLOW_ENGINE_DEFAULTS, kvCacheBlocks: twoFit }).batchSize).toBe(2);
  });
});

const HEAD_KEYS = [
  "bench",
  "replicas",
  "interactive_ttft_p99_ms",
  "interactive_ttft_p99_ms_off",
  "jain_fairness",
  "jain_fairness_off",
  "priority_inversion_ratio",
  "single_replica_interactive_ttft_p99_ms",
  "expired",
  "dropped",
];


describe("flow bench (smoke)", () => {
  it("runs off, on, on-fcfs, on-1 and unloaded end to end and prints one JSON line with every field", async () => {
    const { code, stdout, stderr } = await runBench([
      "flow", "--duration-ms", "2000", "--replicas", "2", "--pods", "2", "--time-scale", "4",
      "--cpu-phase-ms", "500", "--cpu-settle-ms", "300", "--cpu-rounds", "1",
    ]);
    expect(code, stderr.slice(-3000)).toBe(0);
    const lines = stdout.trim().split("\n");
    expect(lines).toHaveLength(1);
    const r = JSON.parse(lines[0] as string) as Record<string, unknown> & { runs: Array<Record<string, number | null> & { run: string; engine_priority: boolean }> };
    expect(Object.keys(r).slice(0, HEAD_KEYS.length)).toEqual(HEAD_KEYS);
    expect(r).toMatchObject({ bench: "flow", replicas: 2 });
    for (const k of ["interactive_ttft_p99_ms", "interactive_ttft_p99_ms_off", "single_replica_interactive_ttft_p99_ms", "interactive_ttft_p99_ms_unloaded", "interactive_ttft_p99_ms_engine_priority_off"]) {
      expect(r[k], k).toBeGreaterThan(0);
      expect(r[k], k).toBeLessThan(60_000);
    }
    for (const k of ["jain_fairness", "jain_fairness_off", "jain_fairness_offered", "jain_fairness_offered_off"]) {
      expect(r[k], k).toBeGreaterThan(0);
      expect(r[k], k).toBeLessThanOrEqual(1);
    }
    for (const k of ["priority_inversion_ratio", "priority_inversion_ratio_off"]) {
      expect(r[k], k).toBeGreaterThanOrEqual(0);
      expect(r[k], k).toBeLessThanOrEqual(1);
    }
    for (const k of ["expired", "dropped"]) expect(Number.isInteger(r[k]) && (r[k] as number) >= 0, k).toBe(true);
    for (const k of ["gateway_cpu_us_per_request", "gateway_cpu_us_per_request_off", "gateway_cpu_ratio", "capacity_model_rps", "capacity_measured_rps"]) {
      expect(r[k], k).toBeGreaterThan(0);
    }
    expect(typeof r.flow_control_supported).toBe("boolean");
    // Issue 36: the on run's pods schedule by priority; batch completions of both on runs.
    expect(r.engine_priority).toBe(true);
    for (const k of ["batch_completed", "batch_completed_engine_priority_off"]) expect(Number.isInteger(r[k]) && (r[k] as number) >= 0, k).toBe(true);

    expect(r.runs.map((x) => [x.run, x.replicas, x.engine_priority])).toEqual([["off", 2, false], ["on", 2, true], ["on-fcfs", 2, false], ["on-1", 1, true], ["unloaded", 2, true]]);
    const requests = r.runs[0]?.requests as number;
    expect(requests).toBeGreaterThan(20);
    // The idle-fleet reference plays the schedule's interactive requests only.
    const unloaded = r.runs.find((x) => x.run === "unloaded");
    expect(unloaded?.requests).toBe(r.runs[0]?.interactive);
    expect(unloaded?.batch_completed).toBe(0);
    for (const run of r.runs.filter((x) => x.run !== "unloaded")) {
      // The same schedule in every run; nothing fails, every answered request has its record.
      expect(run.requests, String(run.run)).toBe(requests);
      expect(run.interactive_failed, String(run.run)).toBe(0);
      expect(run.errors, String(run.run)).toBe(0);
      expect(run.records_missing, String(run.run)).toBe(0);
      expect(run.dispatches, String(run.run)).toBeGreaterThan(0);
      expect(run.dispatches as number, String(run.run)).toBeLessThanOrEqual(requests);
    }
    // Without flow control nothing waits at a gateway.
    expect(r.runs[0]?.flow_records).toBe(0);
    expect(stderr).toMatch(/int p99 ms/);
  }, 240_000);
});
