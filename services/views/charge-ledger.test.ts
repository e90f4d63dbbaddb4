import { describe, expect, it } from "vitest";
import type { ChargeEvent, GatewayHeartbeat } from "../../schemas/events.js";
import { ChargeLedger, tokenLoad } from "./charge-ledger.js";

const charge = (id: string, gateway: string, pod: string, ts: number, extra: Partial<ChargeEvent> = {}): ChargeEvent => ({
  type: "charge", id, gateway, model: "m", pod, ts, ttlMs: 60_000, promptTokens: 10, ...extra,
});
const hb = (gateway: string, ts: number, state: "up" | "down" = "up"): GatewayHeartbeat => ({
  type: "heartbeat", gateway, ts, intervalMs: 1000, startedAt: 0, state,
});

describe("charge ledger - counting", () => {
  it("counts charges per pod and releases them once", () => {
    const l = new ChargeLedger({ self: "a" });
    l.charge(charge("r1", "a", "p1", 1000), 1000);
    l.charge(charge("r2", "a", "p1", 1000), 1000);
    l.charge(charge("r3", "a", "p2", 1000), 1000);
    expect(l.outstanding("m", "p1")).toEqual({ requests: 2, promptTokens: 20, prefillRequests: 2, prefillTokens: 20 });
    expect(l.release({ gateway: "a", id: "r1" })).toBe(true);
    expect(l.release({ gateway: "a", id: "r1" })).toBe(false);
    expect(l.outstanding("m", "p1").requests).toBe(1);
    expect(l.outstanding("m", "unknown").requests).toBe(0);
  });

  it("skips its own echoes so a released charge is not resurrected", () => {
    const l = new ChargeLedger({ self: "a" });
    const c = charge("r1", "a", "p1", 1000);
    l.charge(c, 1000);
    l.release({ gateway: "a", id: "r1" });
    l.applyFromStream(c, 1000, 1001);
    expect(l.outstanding("m", "p1").requests).toBe(0);
  });

  it("applies another gateway's charge only while that gateway is alive", () => {
    const l = new ChargeLedger({ self: "a", heartbeatTimeoutMs: 3000 });
    l.applyFromStream(hb("b", 1000), 1000, 1000);
    l.applyFromStream(charge("r1", "b", "p1", 1000), 1000, 1000);
    expect(l.outstanding("m", "p1").requests).toBe(1);
    // b's heartbeat lapses: its charge stops counting at the next sweep.
    expect(l.sweep(3999)).toBe(0);
    expect(l.sweep(4001)).toBe(1);
    expect(l.outstanding("m", "p1").requests).toBe(0);
    // A charge from a gateway already known to be dead is not counted.
    l.applyFromStream(charge("r2", "b", "p1", 4002), 4002 - 5000, 4002);
    expect(l.outstanding("m", "p1").requests).toBe(0);
  });

  it("drops a gateway's charges at once when it says down", () => {
    const l = new ChargeLedger({ self: "a" });
    l.applyFromStream(hb("b", 1000), 1000, 1000);
    l.applyFromStream(charge("r1", "b", "p1", 1000), 1000, 1000);
    l.applyFromStream(hb("b", 1100, "down"), 1100, 1100);
    expect(l.outstanding("m", "p1").requests).toBe(0);
  });

  it("expires charges by TTL", () => {
    const l = new ChargeLedger({ self: "a" });
    l.charge(charge("r1", "a", "p1", 1000, { ttlMs: 500 }), 1000);
    expect(l.sweep(1400, 0)).toBe(0);
    expect(l.sweep(1500, 0)).toBe(1);
    expect(l.size).toBe(0);
  });

  it("stays within its bound, evicting the oldest charge", () => {
    const l = new ChargeLedger({ self: "a", maxCharges: 3 });
    for (let i = 0; i < 5; i++) l.charge(charge(`r${i}`, "a", "p1", 1000), 1000);
    expect(l.size).toBe(3);
    expect(l.evicted).toBe(2);
    expect(l.outstanding("m", "p1").requests).toBe(3);
    expect(l.release({ gateway: "a", id: "r0" })).toBe(false);
    expect(l.release({ gateway: "a", id: "r4" })).toBe(true);
  });

  it("ignores releases of charges it never saw", () => {
    const l = new ChargeLedger({ self: "a" });
    l.applyFromStream({ type: "release", id: "x", gateway: "b", model: "m", pod: "p1", ts: 1, outcome: "completed" }, 1, 1);
    expect(l.outstanding("m", "p1").requests).toBe(0);
  });

  it("a heartbeat's outstanding list heals a lost release and a lost charge", () => {
    const l = new ChargeLedger({ self: "a" });
    const hbWith = (ts: number, ids: string[]): GatewayHeartbeat => ({
      ...hb("b", ts),
      chargeTtlMs: 60_000,
      outstanding: ids.map((id) => ({ id, model: "m", pod: "p1", promptTokens: 5, ts })),
    });
    l.applyFromStream(hbWith(1000, []), 1000, 1000);
    l.applyFromStream(charge("r1", "b", "p1", 1000), 1000, 1000);
    l.applyFromStream(charge("r2", "b", "p1", 1000), 1000, 1000);
    // r1's release was lost; r3's charge was lost. The next heartbeat lists r2 and r3.
    l.applyFromStream(hbWith(2000, ["r2", "r3"]), 2000, 2000);
    expect(l.outstanding("m", "p1")).toMatchObject({ requests: 2, promptTokens: 15 });
    expect(l.release({ gateway: "b", id: "r1" })).toBe(false);
    expect(l.release({ gateway: "b", id: "r3" })).toBe(true);
    expect(l.reconciledRemoved).toBe(1);
    expect(l.reconciledAdded).toBe(1);
  });

  it("a truncated list only adds, never removes", () => {
    const l = new ChargeLedger({ self: "a" });
    l.applyFromStream(hb("b", 1000), 1000, 1000);
    l.applyFromStream(charge("r1", "b", "p1", 1000), 1000, 1000);
    l.applyFromStream({ ...hb("b", 2000), truncated: true, outstanding: [{ id: "r9", model: "m", pod: "p2", promptTokens: 1, ts: 2000 }] }, 2000, 2000);
    expect(l.outstanding("m", "p1").requests).toBe(1);
    expect(l.outstanding("m", "p2").requests).toBe(1);
  });

  it("tracks prefill vs decode: token load = active prefill tokens + 0.3 x KV tokens", () => {
    const l = new ChargeLedger({ self: "a" });
    l.charge(charge("r1", "a", "p1", 1000, { promptTokens: 100 }), 1000);
    l.charge(charge("r2", "a", "p1", 1000, { promptTokens: 50 }), 1000);
    expect(tokenLoad(l.outstanding("m", "p1"))).toBe(150 + 0.3 * 150);
    expect(l.markDecoding("a", "r1")).toBe(true);
    expect(l.markDecoding("a", "r1")).toBe(false);
    expect(l.outstanding("m", "p1")).toEqual({ requests: 2, promptTokens: 150, prefillRequests: 1, prefillTokens: 50 });
    l.release({ gateway: "a", id: "r1" });
    l.release({ gateway: "a", id: "r2" });
    expect(l.outstanding("m", "p1")).toEqual({ requests: 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 });
  });

  it("learns another replica's first tokens from its heartbeat list", () => {
    const l = new ChargeLedger({ self: "a" });
    l.applyFromStream(hb("b", 1000), 1000, 1000);
    l.applyFromStream(charge("r1", "b", "p1", 1000, { promptTokens: 80 }), 1000, 1000);
    expect(l.outstanding("m", "p1").prefillTokens).toBe(80);
    l.applyFromStream({ ...hb("b", 1500), outstanding: [{ id: "r1", model: "m", pod: "p1", promptTokens: 80, ts: 1000, decoding: true }] }, 1500, 1500);
    expect(l.outstanding("m", "p1")).toMatchObject({ requests: 1, prefillRequests: 0, prefillTokens: 0 });
  });
});

describe("charge ledger - replica rank", () => {
  it("ranks itself among the live gateways by id, the same on every replica", () => {
    const a = new ChargeLedger({ self: "gw-b", heartbeatTimeoutMs: 3000 });
    expect(a.rank(1000)).toEqual({ index: 0, count: 1 });
    a.applyFromStream(hb("gw-c", 1000), 1000, 1000);
    a.applyFromStream(hb("gw-a", 1000), 1000, 1000);
    expect(a.rank(1001)).toEqual({ index: 1, count: 3 });
    const c = new ChargeLedger({ self: "gw-c", heartbeatTimeoutMs: 3000 });
    c.applyFromStream(hb("gw-a", 1000), 1000, 1000);
    c.applyFromStream(hb("gw-b", 1000), 1000, 1000);
    expect(c.rank(1001)).toEqual({ index: 2, count: 3 });
  });

  it("drops a gateway whose heartbeat lapsed or that said down", () => {
    const l = new ChargeLedger({ self: "gw-b", heartbeatTimeoutMs: 3000 });
    l.applyFromStream(hb("gw-a", 1000), 1000, 1000);
    l.applyFromStream(hb("gw-c", 1000), 1000, 1000);
    expect(l.rank(1000).count).toBe(3);
    l.applyFromStream(hb("gw-a", 1500, "down"), 1500, 1500);
    expect(l.rank(1500)).toEqual({ index: 0, count: 2 });
    // gw-c's last heartbeat is now older than the timeout (the cache lasts at most 250 ms).
    expect(l.rank(4100)).toEqual({ index: 0, count: 1 });
  });
});
