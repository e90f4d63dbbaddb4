import { describe, expect, it } from "vitest";
import { runChargeLagBench } from "./charge-lag.js";

describe("charge-lag bench", () => {
  it("measures every charge of A arriving in B's ledger, paced and bounded in time", async () => {
    const t0 = Date.now();
    const r = await runChargeLagBench({ rate: 100, durationMs: 500, warmupMs: 100 });
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(r).toMatchObject({ bench: "charge-lag", mode: "eventual", missing: 0 });
    // 100/s over 500 ms: the schedule sends 50 (a slow request may push the last past the window).
    expect(r.samples).toBeGreaterThanOrEqual(45);
    expect(r.samples).toBeLessThanOrEqual(50);
    expect(r.p50_ms).toBeGreaterThan(0);
    expect(r.p99_ms).toBeGreaterThanOrEqual(r.p50_ms);
    expect(r.max_ms).toBeGreaterThanOrEqual(r.p99_ms);
    expect(r.breakdown.core_nats.samples).toBe(r.samples);
    expect(r.breakdown.publish.samples).toBe(r.samples);
  });
});
