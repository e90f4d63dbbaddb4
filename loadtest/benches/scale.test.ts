/**
 * The scale bench (loadtest/benches/scale.ts) and the fold bench (fold.ts) at small sizes, side by
 * side in one run, on a real nats-server and real gateway processes: the JSON line's shape and
 * that every figure was measured. No CPU figure is compared here: on a shared, loaded CI host the
 * ratios the bench reports (live fold over bulk fold, pool b's cost per pool a request) move with
 * the neighbours' load, so they are the bench's to report (`npm run bench -- scale`,
 * docs/benchmarks.md "scale"), not the suite's to assert. Pool isolation itself is asserted by
 * event counts in test/pools.test.ts.
 *
 * Issue 13's "fitted constants agree with the fold benchmark within 30 %" is not asserted either:
 * at the paced rates a 2-core host can carry, a replica's CPU per request is dominated by
 * per-wake-up costs, so the fitted slope is a small difference of two large, noisy CPU figures.
 */
import { describe, expect, it } from "vitest";
import { FOLD_FAMILIES, runFoldBench } from "./fold.js";
import { hostPinningPlan } from "../pinning.js";
import { fitLine, runScaleBench } from "./scale.js";

describe("scale bench", () => {
  it("fits a line by least squares", () => {
    const { intercept, slope } = fitLine([{ x: 0, y: 1 }, { x: 1, y: 3 }, { x: 3, y: 7 }]);
    expect(intercept).toBeCloseTo(1, 9);
    expect(slope).toBeCloseTo(2, 9);
    expect(fitLine([{ x: 0, y: 0 }, { x: 1, y: 1 }, { x: 2, y: 0 }]).slope).toBeCloseTo(0, 9);
    expect(() => fitLine([{ x: 1, y: 1 }, { x: 1, y: 2 }])).toThrow(/two or more distinct x/);
  });

  it("refuses replica counts without 1 or with a single count", async () => {
    await expect(runScaleBench({ replicas: [2, 4] })).rejects.toThrow(/must include 1/);
    await expect(runScaleBench({ replicas: [1] })).rejects.toThrow(/two or more distinct/);
  });

  it("measures R = 1 and 2 of pool a, the observer and pool b side by side with the fold bench", async () => {
    const fold = await runFoldBench({ events: 2_000, rounds: 1 });
    for (const f of FOLD_FAMILIES) expect(fold.families[f], f).toBeGreaterThan(0);
    const o = fold.options;
    expect(fold.per_request_us).toBeCloseTo(fold.detail.charge.total_us + fold.detail.release.total_us + fold.detail.heartbeat.total_us / o.foreignRate, 1);

    const scale = await runScaleBench({ replicas: [1, 2], rate: 200, concurrency: 16, durationMs: 1_000, rounds: 1 });
    const line = JSON.stringify(scale);
    expect(line.startsWith('{"bench":"scale","results":[{"replicas":1,"fold_cpu_us_per_foreign_request":null,')).toBe(true);
    expect(scale.results.map((r) => r.replicas)).toEqual([1, 2]);
    for (const r of scale.results) {
      expect(r.rounds).toHaveLength(1);
      for (const c of r.rounds) {
        expect(c.own).toHaveLength(r.replicas);
        // The pool routed; how evenly the paced generators keep up on a saturated 2-core host is a
        // load figure (the bench reports it), not a property.
        expect(c.own.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
      }
      for (const v of [r.cpu_us_per_own_request, r.cpu_us_per_s, r.observer_fold_us_per_request, r.other_pool_us_per_request, r.nats_us_per_request, r.host_busy_fraction]) expect(Number.isFinite(v)).toBe(true);
      if (r.replicas === 1) expect(r.fold_cpu_us_per_foreign_request).toBeNull();
      else expect(Number.isFinite(r.fold_cpu_us_per_foreign_request)).toBe(true);
      if (r.replicas === 1) expect(r.foreign_rps_per_replica).toBe(0);
      else expect(r.foreign_rps_per_replica).toBeGreaterThan(0);
      // Every replica's routing really cost it CPU, and nats-server carried the pool's messages.
      expect(r.cpu_us_per_own_request).toBeGreaterThan(0);
      expect(r.nats_us_per_request).toBeGreaterThan(0);
    }
    expect(Number.isFinite(scale.fit.fold_cpu_us_per_foreign_request)).toBe(true);
    expect(Number.isFinite(scale.fit.router_us_per_request)).toBe(true);
    expect(scale.fit.points.map((p) => p.replicas)).toEqual([1, 2]);
    expect(typeof scale.host.saturated).toBe("boolean");
    // The pinned R = 1 cell (loadtest/pinning.ts): every figure measured, the loop probe read.
    if (hostPinningPlan().available) {
      const p = scale.pinned as NonNullable<typeof scale.pinned>;
      for (const [k, v] of Object.entries(p)) expect(Number.isFinite(v), k).toBe(true);
      expect(p.gateway_cpu_ms_per_request).toBeGreaterThan(0);
      expect(p.max_own_loop_block_ms).toBeGreaterThan(0);
      expect(scale.pinning).toEqual({ gateway_cpus: hostPinningPlan().gatewayCpus, other_cpus: hostPinningPlan().otherCpus });
    } else expect(scale.pinning).toHaveProperty("note");

    const ratios = scale.results.map((r) => r.observer_fold_us_per_request / fold.per_request_us);
    for (const r of scale.results) {
      for (const c of r.rounds) {
        expect(c.bulk_fold_us_per_request).toBeGreaterThan(0);
        expect(c.observer_live_over_bulk).toBeCloseTo(c.observer_fold_us_per_request / c.bulk_fold_us_per_request, 1);
      }
    }
    process.stderr.write(
      `[scale.test] bulk fold per request ${fold.per_request_us} µs; observer (live) per R ${scale.results.map((r) => r.observer_fold_us_per_request).join(", ")} µs ` +
        `(live/bulk ${ratios.map((x) => x.toFixed(2)).join(", ")}; in-run bulk ${scale.results.map((r) => r.bulk_fold_us_per_request).join(", ")} µs, observer_live_over_bulk ${scale.results.map((r) => r.observer_live_over_bulk).join(", ")}); fitted f ${scale.fit.fold_cpu_us_per_foreign_request} µs (fit/bulk ${(scale.fit.fold_cpu_us_per_foreign_request / fold.per_request_us).toFixed(2)}); ` +
        `other pool ${scale.other_pool_us_per_request} µs; host busy ${scale.host.max_busy_fraction}, load ${scale.host.load_average_start}-${scale.host.load_average_end}\n`,
    );
  }, 240_000);
});
