/**
 * The gateway configuration's cross-field check on the CHARGES follower's pace: other replicas'
 * charges must be read inside the rate guard's window, or the guard stops reserving room for
 * admissions this replica has not seen yet.
 */
import { describe, expect, it } from "vitest";
import { DEFAULT_FOLD_PACE_MS, GatewayConfigError, resolveGatewayConfig } from "./config.js";

const N = "nats://127.0.0.1:4222";

describe("resolveGatewayConfig: --fold-pace-ms", () => {
  it("defaults to a pace below the default rate guard window", () => {
    const c = resolveGatewayConfig({ nats: N });
    expect(c.foldPaceMs).toBe(DEFAULT_FOLD_PACE_MS);
    expect(c.foldPaceMs).toBeLessThan(c.rateConfirmMs);
  });

  it("refuses a pace at or above --rate-confirm-ms, accepts it with the guard off or widened", () => {
    expect(() => resolveGatewayConfig({ nats: N, foldPaceMs: 25, rateConfirmMs: 25 })).toThrow(GatewayConfigError);
    expect(() => resolveGatewayConfig({ nats: N, foldPaceMs: 40 })).toThrow(/foldPaceMs \(40\) must be below \/rateConfirmMs \(25\)/);
    expect(resolveGatewayConfig({ nats: N, foldPaceMs: 40, rateConfirmMs: 0 }).foldPaceMs).toBe(40);
    expect(resolveGatewayConfig({ nats: N, foldPaceMs: 40, rateConfirmMs: 65 }).foldPaceMs).toBe(40);
    expect(resolveGatewayConfig({ nats: N, foldPaceMs: 0 }).foldPaceMs).toBe(0);
  });

  it("refuses a pace beyond the maximum", () => {
    expect(() => resolveGatewayConfig({ nats: N, foldPaceMs: 101, rateConfirmMs: 0 })).toThrow(/foldPaceMs/);
  });
});
