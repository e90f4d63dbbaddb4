import { describe, expect, it } from "vitest";
import { checkEvent } from "../../schemas/validate.js";
import { GatewayState } from "../views/gateway-state.js";
import { UsageSummaries } from "./usage-summary.js";

const T0 = 1_700_000_040_000;
const limits = (users: Record<string, { rpm?: number }>) => ({ type: "config-entry" as const, key: "limits", operation: "PUT" as const, value: { users } });
let rev = 0;
const setLimits = (s: GatewayState, users: Record<string, { rpm?: number }>) => s.apply(limits(users), { stream: "config", subject: "$KV.jr-config.limits", seq: ++rev, serverTs: T0 });
const charge = (s: GatewayState, user: string, ts: number) =>
  s.ownCharge({ type: "charge", id: String(ts), gateway: "gw-a", model: "m", pod: "p", ts, ttlMs: 600_000, promptTokens: 10, user }, ts);

describe("usage summaries - what a gateway publishes", () => {
  it("lists its limited users' own counts, valid by the schema, only when they changed", () => {
    const s = new GatewayState({ self: "gw-a", pool: "a" });
    const u = new UsageSummaries(s, { gateway: "gw-a", pool: "a", startedAt: 5, maxPayload: () => 1024 * 1024 });
    // Nothing admitted yet: nothing to say.
    expect(u.next(T0 + 1)).toBeUndefined();
    setLimits(s, { alice: { rpm: 10 } });
    charge(s, "alice", T0 + 2);
    charge(s, "bob", T0 + 3); // no limit: not listed
    const first = u.next(T0 + 4);
    expect(first).toEqual({ type: "usage", gateway: "gw-a", pool: "a", startedAt: 5, window: T0, ts: T0 + 4, users: [["alice", 1, 10]] });
    expect(checkEvent("usage", first).ok).toBe(true);
    // The gateway id comes right after the type: the followers' own-echo byte test finds it.
    expect(JSON.stringify(first)).toContain('"gateway":"gw-a",');
    expect(u.next(T0 + 5)).toBeUndefined();
    // New limits list bob too, without any new request.
    setLimits(s, { alice: { rpm: 10 }, default: { rpm: 5 } });
    expect(u.next(T0 + 6)?.users.sort()).toEqual([
      ["alice", 1, 10],
      ["bob", 1, 10],
    ]);
    // A new minute with no request: one empty summary (the last minute's counts no longer hold), then silence.
    expect(u.next(T0 + 60_001)).toMatchObject({ window: T0 + 60_000, users: [] });
    expect(u.next(T0 + 60_002)).toBeUndefined();
    expect(u.sent).toBe(3);
  });

  it("stays within the server's max_payload, keeping the most active users and counting the rest", () => {
    const s = new GatewayState({ self: "gw-a" });
    setLimits(s, { default: { rpm: 1_000 } });
    for (let i = 0; i < 200; i++) for (let k = 0; k <= i % 3; k++) charge(s, `user-${"x".repeat(200)}-${i}`, T0 + i * 3 + k);
    const u = new UsageSummaries(s, { gateway: "gw-a", startedAt: 5, maxPayload: () => 8_192 });
    const ev = u.next(T0 + 1_000);
    expect(ev).toBeDefined();
    if (!ev) return;
    expect(JSON.stringify(ev).length).toBeLessThanOrEqual(8_192 * 0.9);
    expect(ev.users.length).toBeGreaterThan(0);
    expect(ev.users.length + (ev.truncated ?? 0)).toBe(200);
    expect(ev.users.every((e) => e[1] === 3)).toBe(true);
    expect(u.truncatedUsers).toBe(ev.truncated);
    expect(checkEvent("usage", ev).ok).toBe(true);
  });

  it("counts bytes, not characters: user ids outside ASCII (3 bytes a character) stay within max_payload too", () => {
    const s = new GatewayState({ self: "gw-a" });
    setLimits(s, { default: { rpm: 1_000 } });
    for (let i = 0; i < 200; i++) charge(s, `${"\uFFFD".repeat(200)}-${i}`, T0 + i);
    const u = new UsageSummaries(s, { gateway: "gw-a", startedAt: 5, maxPayload: () => 8_192 });
    const ev = u.next(T0 + 1_000);
    expect(ev?.truncated).toBeGreaterThan(0);
    expect(Buffer.byteLength(JSON.stringify(ev))).toBeLessThanOrEqual(8_192 * 0.9);
  });

  it("re-sends an unchanged summary every 10 s, so a reader that evicted it gets it back", () => {
    const s = new GatewayState({ self: "gw-a", pool: "a" });
    setLimits(s, { alice: { rpm: 10 } });
    charge(s, "alice", T0 + 2);
    const u = new UsageSummaries(s, { gateway: "gw-a", pool: "a", startedAt: 5, maxPayload: () => 1024 * 1024 });
    expect(u.next(T0 + 3)).toBeDefined();
    expect(u.next(T0 + 9_999)).toBeUndefined();
    expect(u.next(T0 + 10_000)?.users).toEqual([["alice", 1, 10]]);
  });
});
