import { describe, expect, it } from "vitest";
import { measureApply, runDiscoveryBench } from "./discovery.js";

// The bench's machinery on a small fleet; no figures are judged here (they belong to the bench).
describe("discovery bench (short)", () => {
  it("measures every Ready transition it makes and reports the documented fields", { timeout: 60_000 }, async () => {
    const r = await runDiscoveryBench({ pods: 40, rate: 20, durationMs: 1_000, applyEvents: 200 });
    expect(r.bench).toBe("discovery");
    expect(r.pods).toBe(40);
    expect(r.missing).toBe(0);
    expect(r.samples).toBeGreaterThanOrEqual(Math.floor(r.changes / 2) - 1);
    expect(r.samples).toBeGreaterThan(3);
    for (const k of ["ready_to_routable_p50_ms", "ready_to_routable_p99_ms", "apply_us_mean", "apply_us_p99"] as const) expect(Number.isFinite(r[k])).toBe(true);
    expect(r.ready_to_routable_p99_ms).toBeGreaterThanOrEqual(r.ready_to_routable_p50_ms);
  });
  it("the apply loop folds the events it is given", () => {
    const r = measureApply(10, 100);
    expect(r.p99).toBeGreaterThanOrEqual(0);
    expect(Number.isFinite(r.mean)).toBe(true);
  });
});
