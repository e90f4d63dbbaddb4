import { describe, expect, it } from "vitest";
import type { RoutedRequest } from "./request.js";
import { heartbeatOf } from "./heartbeat.js";

const routed = (i: number, decoding = false): RoutedRequest =>
  ({ chargeId: i.toString(36), pod: { model: "m", pod: `p${i % 3}` }, promptTokens: 10 + i, startedAt: 1_000 + i, ...(decoding ? { firstChunkAt: 2_000 } : {}) }) as unknown as RoutedRequest;

describe("heartbeat - what every other replica reconciles against", () => {
  const base = { gateway: "gw", now: 5_000, intervalMs: 1_000, startedAt: 100, chargeTtlMs: 600_000, maxListed: 3 };

  it("lists every charge held, with its prefill/decode state, up to the bound, then says truncated", () => {
    const two = heartbeatOf(base, "up", [routed(1), routed(2, true)]);
    expect(two.outstanding).toEqual([
      { id: "1", model: "m", pod: "p1", promptTokens: 11, ts: 1_001 },
      { id: "2", model: "m", pod: "p2", promptTokens: 12, ts: 1_002, decoding: true },
    ]);
    expect(two.truncated).toBeUndefined();
    const many = heartbeatOf(base, "up", [1, 2, 3, 4, 5].map((i) => routed(i)));
    expect(many.outstanding).toHaveLength(3);
    expect(many.truncated).toBe(true);
  });

  it("a going-down heartbeat lists nothing: receivers drop the gateway's charges at once", () => {
    expect(heartbeatOf(base, "down", [routed(1)])).toEqual({ type: "heartbeat", gateway: "gw", ts: 5_000, intervalMs: 1_000, startedAt: 100, state: "down" });
  });
});
