/**
 * Per-user rate limits across gateway pools: the rate view's own per-user counts (what a gateway's
 * `usage` summary says) and its fold of other namespaces' summaries, through `GatewayState.apply`.
 */
import { describe, expect, it } from "vitest";
import type { ChargeEvent, ReleaseEvent, UsageSummary } from "../../schemas/events.js";
import { type EventMeta, GatewayState } from "./gateway-state.js";
import { RateView } from "./rate-view.js";

const MIN = 60_000;
const T0 = 1_700_000_040_000; // a whole minute
let seq = 0;
const meta = (serverTs: number): EventMeta => ({ stream: "usage", subject: "jr.usage.x.g", seq: ++seq, serverTs });
const summary = (gateway: string, pool: string | undefined, window: number, ts: number, users: Array<[string, number, number]>, startedAt = 1): UsageSummary => ({
  type: "usage",
  gateway,
  ...(pool !== undefined ? { pool } : {}),
  startedAt,
  window,
  ts,
  users,
});
const charge = (gateway: string, id: string, user: string, ts: number, promptTokens = 10): ChargeEvent => ({ type: "charge", id, gateway, model: "m", pod: "p", ts, ttlMs: 600_000, promptTokens, user });

describe("rate view - own per-user usage of the minute", () => {
  it("counts only own requests, with the engine's corrections and completions, and rolls with the minute", () => {
    const r = new RateView();
    r.request("alice", "m", 10, T0 + 1, true);
    r.request("alice", "m", 10, T0 + 2, true);
    r.request("alice", "m", 99, T0 + 3); // another replica's: not in the summary
    r.request("bob", "m", 5, T0 + 4, true);
    r.correctPrompt("alice", 4, T0 + 1, true);
    r.completion("alice", 20, T0 + 5, true);
    r.completion("bob", 7, T0 + 6); // another replica's release
    expect(r.ownUsage(T0 + 10, 10).users.sort()).toEqual([
      ["alice", 2, 44],
      ["bob", 1, 5],
    ]);
    expect(r.userRequests("alice", T0 + 10)).toBe(3);
    // A retracted own request leaves the summary too.
    r.retract("bob", "m", 5, T0 + 4);
    expect(r.ownUsage(T0 + 10, 10).users).toEqual([["alice", 2, 44]]);
    // The next minute starts empty; its window start is a whole minute.
    const next = r.ownUsage(T0 + MIN + 1, 10);
    expect(next).toEqual({ window: T0 + MIN, users: [], truncated: 0 });
    r.sweep(T0 + MIN);
    expect(r.dump(T0 + MIN).mine).toEqual([]);
  });

  it("lists the most active users first when over the bound, counting the rest", () => {
    const r = new RateView();
    for (let i = 0; i < 5; i++) for (let k = 0; k <= i; k++) r.request(`u${i}`, "m", 1, T0 + k, true);
    const u = r.ownUsage(T0 + 100, 2, (user) => user !== "u4");
    expect(u.users).toEqual([
      ["u3", 4, 4],
      ["u2", 3, 3],
    ]);
    expect(u.truncated).toBe(2);
  });
});

describe("gateway state - other namespaces' usage summaries", () => {
  const pooled = (pool: string | undefined, self = "gw-self") => new GatewayState({ self, ...(pool !== undefined ? { pool } : {}) });

  it("adds another pool's counts to the user's, ignoring its own namespace's and its own", () => {
    const s = pooled("b");
    s.apply(charge("gw-b2", "c1", "alice", T0 + 5), { stream: "charges", subject: "x", seq: 1, serverTs: T0 + 5 });
    expect(s.rates.userRequests("alice", T0 + 10)).toBe(1);
    expect(s.apply(summary("gw-a", "a", T0, T0 + 8, [["alice", 3, 30]]), meta(T0 + 9))).toEqual({ applied: true });
    expect(s.rates.userRequests("alice", T0 + 10)).toBe(4);
    expect(s.rates.userTokens("alice", T0 + 10)).toBe(40);
    // Pool b's own gateways: already counted from b's CHARGES stream.
    expect(s.apply(summary("gw-b2", "b", T0, T0 + 8, [["alice", 1, 10]]), meta(T0 + 9)).ignored).toBe("own-namespace");
    expect(s.apply(summary("gw-self", "b", T0, T0 + 8, [["alice", 1, 10]]), meta(T0 + 9)).ignored).toBe("own-echo");
    // The unpooled namespace is another namespace for a pool, and a pool for the unpooled one.
    expect(s.apply(summary("gw-plain", undefined, T0, T0 + 8, [["alice", 2, 2]]), meta(T0 + 9)).applied).toBe(true);
    expect(s.rates.userRequests("alice", T0 + 10)).toBe(6);
    expect(s.usageCursor).toBe(seq);
    const plain = pooled(undefined);
    expect(plain.apply(summary("gw-plain2", undefined, T0, T0 + 8, [["alice", 2, 2]]), meta(T0 + 9)).ignored).toBe("own-namespace");
    expect(plain.apply(summary("gw-a", "a", T0, T0 + 8, [["alice", 3, 30]]), meta(T0 + 9)).applied).toBe(true);
    expect(plain.rates.userRequests("alice", T0 + 10)).toBe(3);
    // Another user is unaffected.
    expect(s.rates.userRequests("bob", T0 + 10)).toBe(0);
  });

  it("the latest summary of a gateway and minute replaces the one before; an older one is stale", () => {
    const s = pooled("b");
    s.apply(summary("gw-a", "a", T0, T0 + 100, [["alice", 2, 20], ["bob", 1, 1]]), meta(T0 + 100));
    s.apply(summary("gw-a", "a", T0, T0 + 200, [["alice", 5, 50]]), meta(T0 + 200));
    expect(s.rates.userRequests("alice", T0 + 300)).toBe(5);
    expect(s.rates.userRequests("bob", T0 + 300)).toBe(0);
    expect(s.apply(summary("gw-a", "a", T0, T0 + 150, [["alice", 3, 30]]), meta(T0 + 300)).ignored).toBe("stale");
    expect(s.rates.userRequests("alice", T0 + 300)).toBe(5);
    // Two gateways of pool a, and a restarted gw-a (another start time): each counts.
    s.apply(summary("gw-a2", "a", T0, T0 + 200, [["alice", 1, 10]]), meta(T0 + 300));
    s.apply(summary("gw-a", "a", T0, T0 + 400, [["alice", 2, 20]], 999), meta(T0 + 400));
    expect(s.rates.userRequests("alice", T0 + 500)).toBe(8);
    expect(s.rates.foreignGateways).toBe(3);
    expect(s.rates.dump(T0 + 500).foreign).toEqual([["alice", 8, 80]]);
  });

  it("counts a summary only in its own minute; a dead gateway's counts last until the minute ends", () => {
    const s = pooled("b");
    s.apply(summary("gw-a", "a", T0, T0 + 59_000, [["alice", 4, 40]]), meta(T0 + 59_000));
    expect(s.rates.userRequests("alice", T0 + 59_999)).toBe(4);
    // The next minute: nothing from the last one, whether or not it was swept yet.
    expect(s.rates.userRequests("alice", T0 + MIN)).toBe(0);
    s.apply(summary("gw-a", "a", T0 + MIN, T0 + MIN + 500, [["alice", 1, 10]]), meta(T0 + MIN + 500));
    expect(s.rates.userRequests("alice", T0 + MIN + 600)).toBe(1);
    // A late summary of the minute before still replaces that minute's (clock skew across a boundary) ...
    expect(s.apply(summary("gw-a", "a", T0, T0 + 59_900, [["alice", 5, 50]]), meta(T0 + MIN + 700)).applied).toBe(true);
    expect(s.rates.userRequests("alice", T0 + 59_950)).toBe(5);
    // ... and the sweep drops every minute that is over.
    s.sweep(T0 + MIN + 800);
    expect(s.rates.foreignEntries).toBe(1);
    s.sweep(T0 + 2 * MIN);
    expect(s.rates.foreignEntries).toBe(0);
    expect(s.rates.foreignGateways).toBe(0);
    // A summary of a minute long over (a booting gateway reads the stream's last ones) is not held.
    expect(s.apply(summary("gw-a", "a", T0, T0 + 100, [["alice", 4, 40]]), meta(T0 + 3 * MIN)).ignored).toBe("expired");
    expect(s.rates.foreignEntries).toBe(0);
  });

  it("holds a bounded number of entries and gateways, dropping the least recently updated", () => {
    const s = new GatewayState({ self: "me", pool: "b", foreignUsage: { maxEntries: 5, maxGateways: 2 } });
    s.apply(summary("g1", "a", T0, T0 + 1, [["u1", 1, 1], ["u2", 1, 1]]), meta(T0 + 1));
    s.apply(summary("g2", "a", T0, T0 + 2, [["u1", 1, 1], ["u2", 1, 1]]), meta(T0 + 2));
    // g1 again: it becomes the most recent.
    s.apply(summary("g1", "a", T0, T0 + 3, [["u1", 2, 2], ["u2", 2, 2]]), meta(T0 + 3));
    expect(s.rates.userRequests("u1", T0 + 4)).toBe(3);
    // A third gateway: g2 (least recently updated) goes.
    s.apply(summary("g3", "c", T0, T0 + 4, [["u3", 1, 1]]), meta(T0 + 4));
    expect(s.rates.foreignGateways).toBe(2);
    expect(s.rates.foreignEvicted).toBe(1);
    expect(s.rates.userRequests("u1", T0 + 5)).toBe(2);
    // More entries than fit: g1 goes, and the summary itself is cut at the bound.
    s.apply(summary("g4", "c", T0, T0 + 5, [["v1", 1, 1], ["v2", 1, 1], ["v3", 1, 1], ["v4", 1, 1], ["v5", 1, 1], ["v6", 1, 1]]), meta(T0 + 5));
    expect(s.rates.foreignEntries).toBeLessThanOrEqual(5);
    expect(s.rates.userRequests("u1", T0 + 6)).toBe(0);
    expect(s.rates.userRequests("v5", T0 + 6)).toBe(1);
    expect(s.rates.userRequests("v6", T0 + 6)).toBe(0);
  });

  it("a gateway's own requests and releases fill its summary; other replicas' do not", () => {
    const s = pooled("a", "gw-a");
    s.ownCharge(charge("gw-a", "1", "alice", T0 + 1), T0 + 1);
    s.ownCharge(charge("gw-a", "2", "alice", T0 + 2), T0 + 2, { counted: false }); // a strict-mode retry
    s.apply(charge("gw-a2", "3", "alice", T0 + 3), { stream: "charges", subject: "x", seq: 1, serverTs: T0 + 3 });
    const rel: ReleaseEvent = { type: "release", id: "1", gateway: "gw-a", model: "m", pod: "p", ts: T0 + 9, outcome: "completed", user: "alice", completionTokens: 5, promptTokens: 12, chargedPromptTokens: 10, chargedAt: T0 + 1 };
    s.ownRelease(rel);
    expect(s.rates.ownUsage(T0 + 10, 10).users).toEqual([["alice", 1, 17]]);
    // The fold's snapshot and a clone carry the usage state.
    s.apply(summary("gw-b", "b", T0, T0 + 5, [["alice", 2, 2]]), meta(T0 + 5));
    const clone = s.cloneAs("gw-a");
    expect(clone.snapshot(T0 + 10)).toEqual(s.snapshot(T0 + 10));
    expect(clone.rates.userRequests("alice", T0 + 10)).toBe(4);
  });
});
