import { describe, expect, it } from "vitest";
import type { GatewayHeartbeat } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import type { RoutedRequest } from "../routing/request.js";
import { heartbeatOf, outstandingBytes } from "./heartbeat.js";

const routed = (i: number, decoding = false): RoutedRequest =>
  ({ chargeId: i.toString(36), pod: { model: "m", pod: `p${i % 3}` }, promptTokens: 10 + i, startedAt: 1_000 + i, ...(decoding ? { firstChunkAt: 2_000 } : {}) }) as unknown as RoutedRequest;
const bytes = (hb: GatewayHeartbeat) => Buffer.byteLength(JSON.stringify(hb));

describe("heartbeat - what every other replica reconciles against", () => {
  const base = { gateway: "gw", now: 5_000, intervalMs: 1_000, startedAt: 100, chargeTtlMs: 600_000, maxListed: 3, beat: 4 };

  it("says how far it has folded PODS (the drain handshake's acknowledgement), in every part of a split beat", () => {
    const [one] = heartbeatOf({ ...base, podsSeq: 42 }, "up", [routed(1)]);
    expect(one?.podsSeq).toBe(42);
    expect(checkEvent("heartbeat", one).ok).toBe(true);
    const parts = heartbeatOf({ ...base, maxListed: 100, podsSeq: 42, maxBytes: 400 }, "up", [1, 2, 3, 4, 5, 6].map((i) => routed(i)));
    expect(parts.length).toBeGreaterThan(1);
    expect(parts.every((p) => p.podsSeq === 42)).toBe(true);
  });

  it("lists every charge held, with its prefill/decode state, up to the bound, then says truncated", () => {
    const [two, ...rest] = heartbeatOf(base, "up", [routed(1), routed(2, true)]);
    expect(rest).toEqual([]);
    expect(two?.outstanding).toEqual([
      { id: "1", model: "m", pod: "p1", promptTokens: 11, ts: 1_001 },
      { id: "2", model: "m", pod: "p2", promptTokens: 12, ts: 1_002, decoding: true },
    ]);
    expect(two?.truncated).toBeUndefined();
    expect(two?.beat).toBe(4);
    expect(two?.parts).toBeUndefined();
    const many = heartbeatOf(base, "up", [1, 2, 3, 4, 5].map((i) => routed(i)));
    expect(many).toHaveLength(1);
    expect(many[0]?.outstanding).toHaveLength(3);
    expect(many[0]?.truncated).toBe(true);
  });

  it("a going-down heartbeat lists nothing: receivers drop the gateway's charges at once", () => {
    expect(heartbeatOf(base, "down", [routed(1)])).toEqual([{ type: "heartbeat", gateway: "gw", ts: 5_000, intervalMs: 1_000, startedAt: 100, state: "down", beat: 4 }]);
  });

  it("a list past maxBytes is split into parts of one beat, each within maxBytes, in order, nothing lost", () => {
    const inFlight = Array.from({ length: 1_000 }, (_, i) => routed(i, i % 2 === 0));
    const one = heartbeatOf({ ...base, maxListed: 10_000 }, "up", inFlight);
    expect(one).toHaveLength(1);
    const maxBytes = Math.ceil(bytes(one[0] as GatewayHeartbeat) / 3.5);
    const parts = heartbeatOf({ ...base, maxListed: 10_000, maxBytes }, "up", inFlight);
    expect(parts).toHaveLength(4);
    for (const [i, p] of parts.entries()) {
      expect(bytes(p)).toBeLessThanOrEqual(maxBytes);
      expect(p).toMatchObject({ type: "heartbeat", gateway: "gw", ts: 5_000, intervalMs: 1_000, startedAt: 100, state: "up", chargeTtlMs: 600_000, beat: 4, part: i, parts: 4 });
      expect(p.truncated).toBeUndefined();
      expect(checkEvent("heartbeat", p).ok).toBe(true);
    }
    // Packed greedily: every part but the last is close to full.
    for (const p of parts.slice(0, -1)) expect(bytes(p)).toBeGreaterThan(maxBytes - 200);
    expect(parts.flatMap((p) => p.outstanding ?? [])).toEqual(one[0]?.outstanding);
  });

  it("the bound on listed charges still applies to a split beat: every part says truncated", () => {
    const inFlight = Array.from({ length: 100 }, (_, i) => routed(i));
    const parts = heartbeatOf({ ...base, maxListed: 50, maxBytes: 1_000 }, "up", inFlight);
    expect(parts.length).toBeGreaterThan(1);
    expect(parts.flatMap((p) => p.outstanding ?? [])).toHaveLength(50);
    for (const p of parts) expect(p.truncated).toBe(true);
  });

  it("a charge that cannot fit even alone is left out and the beat marked truncated (never an oversized message)", () => {
    const huge = { ...routed(1), chargeId: "x".repeat(250) } as RoutedRequest;
    const parts = heartbeatOf({ ...base, maxListed: 10, maxBytes: 300 }, "up", [routed(2), huge, routed(3)]);
    for (const p of parts) {
      expect(bytes(p)).toBeLessThanOrEqual(300);
      expect(p.truncated).toBe(true);
    }
    expect(parts.flatMap((p) => p.outstanding ?? []).map((c) => c.id)).toEqual(["2", "3"]);
  });

  it("measures a listed charge exactly as its JSON, without serializing it (quotes, escapes, non-ASCII, fractions)", () => {
    const names = new Map<string, number>();
    const odd = ["a", 'q"uote', "back\\slash", "tab\tnew\nline", "ümlaut", "日本語", "emoji 🚀", "\u0001ctl", "</script>", "x".repeat(253)];
    const nums = [0, 7, 9, 10, 99, 100, 123_456, 1_753_000_000_000, 1_753_000_000_000.5, 0.1, 1e21, 999_999_999_999_999];
    for (const [i, id] of odd.entries()) {
      for (const [j, n] of nums.entries()) {
        const c = { id, model: odd[(i + 3) % odd.length] as string, pod: odd[(i + j) % odd.length] as string, promptTokens: Math.floor(n), ts: n, ...(j % 2 ? { decoding: true } : {}) };
        expect(outstandingBytes(c, names)).toBe(Buffer.byteLength(JSON.stringify(c)));
        expect(outstandingBytes(c)).toBe(Buffer.byteLength(JSON.stringify(c)));
      }
    }
  });
});
