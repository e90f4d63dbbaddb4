import fc from "fast-check";
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
    // b's heartbeat lapses: its charge stops counting once the stream's time passes the timeout.
    expect(l.advance(3999)).toBe(0);
    expect(l.advance(4001)).toBe(1);
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
    expect(l.advance(1400)).toBe(0);
    expect(l.advance(1500)).toBe(1);
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

describe("charge ledger - heartbeats split into parts (lists past max_payload)", () => {
  const listed = (ids: string[], ts: number) => ids.map((id) => ({ id, model: "m", pod: "p1", promptTokens: 5, ts }));
  const whole = (ts: number, ids: string[]): GatewayHeartbeat => ({ ...hb("b", ts), chargeTtlMs: 60_000, outstanding: listed(ids, ts) });
  /** The beat's parts: `slices[i]` is what part i lists. */
  const parted = (ts: number, beat: number, slices: string[][]): GatewayHeartbeat[] =>
    slices.map((ids, part) => ({ ...hb("b", ts), beat, part, parts: slices.length, chargeTtlMs: 60_000, outstanding: listed(ids, ts) }));
  const ids = (n: number, from = 0) => Array.from({ length: n }, (_, i) => `r${from + i}`);
  /** A ledger that saw b's charges r0..r9 (and so b alive), one of whose releases (r9) was lost. */
  const seeded = () => {
    const l = new ChargeLedger({ self: "a", heartbeatTimeoutMs: 3000 });
    l.applyFromStream(whole(1000, []), 1000, 1000);
    for (const id of ids(10)) l.applyFromStream(charge(id, "b", "p1", 1000), 1000, 1000);
    return l;
  };

  it("a split beat reconciles exactly like the whole list", () => {
    // The list: r0..r8 held, r9 released (release lost), r10 and r11 charged (charges lost).
    const list = [...ids(9), "r10", "r11"];
    const a = seeded();
    a.applyFromStream(whole(2000, list), 2000, 2000);
    const b = seeded();
    for (const p of parted(2000, 7, [list.slice(0, 4), list.slice(4, 8), list.slice(8)])) b.applyFromStream(p, 2000, 2000);
    expect(b.dump(2000)).toEqual(a.dump(2000));
    expect(b.chargesOf("b")).toBe(11);
    expect([b.reconciledAdded, b.reconciledRemoved]).toEqual([2, 1]);
    expect(b.incompleteBeats).toBe(0);
  });

  it("adds what each part lists at once, but removes nothing until the last part is in", () => {
    const l = seeded();
    const [p0, p1] = parted(2000, 1, [["r0", "r20"], ["r1"]]) as [GatewayHeartbeat, GatewayHeartbeat];
    l.applyFromStream(p0, 2000, 2000);
    expect(l.chargesOf("b")).toBe(11); // r20 added, nothing removed yet
    l.applyFromStream(p1, 2000, 2000);
    expect(l.chargesOf("b")).toBe(3); // r0, r1, r20
    expect(l.reconciledRemoved).toBe(8);
    // A duplicate of a part of a completed beat changes nothing.
    l.applyFromStream(p0, 2000, 2000);
    expect(l.chargesOf("b")).toBe(3);
  });

  it("a missing part never removes anything, however many beats go by incomplete", () => {
    const l = seeded();
    for (let beat = 1; beat <= 5; beat++) {
      const [p0] = parted(1000 + beat * 500, beat, [["r0"], ["r1"], ["r2"]]);
      l.applyFromStream(p0 as GatewayHeartbeat, 1000 + beat * 500, 1000 + beat * 500); // parts 1 and 2 lost
    }
    expect(l.chargesOf("b")).toBe(10);
    expect(l.reconciledRemoved).toBe(0);
    expect(l.incompleteBeats).toBe(4); // the fifth is still in progress
    expect(l.isAlive("b", 3500)).toBe(true); // every part is a sign of life
  });

  it("a newer beat arriving before the older one completed discards the older partial beat", () => {
    const l = seeded();
    const older = parted(2000, 3, [["r0"], ["r1"]]) as [GatewayHeartbeat, GatewayHeartbeat];
    const newer = parted(2000, 4, [["r0", "r1", "r2"], ["r3"]]) as [GatewayHeartbeat, GatewayHeartbeat];
    l.applyFromStream(older[0], 2000, 2000);
    l.applyFromStream(newer[0], 2000, 2000);
    // The older beat's last part, late: completing it would remove r2..r9, which beat 4 still lists in part.
    l.applyFromStream(older[1], 2000, 2000);
    expect(l.chargesOf("b")).toBe(10);
    expect(l.incompleteBeats).toBe(1);
    l.applyFromStream(newer[1], 2000, 2000);
    expect(l.chargesOf("b")).toBe(4); // beat 4's list: r0..r3
  });

  it("parts keyed by process: a restarted gateway's beat 0 is newer than the old process's beat 900", () => {
    const l = seeded();
    const old = parted(2000, 900, [["r0"], ["r1"]]);
    l.applyFromStream(old[0] as GatewayHeartbeat, 2000, 2000);
    const restarted = parted(2100, 0, [["r5"], ["r6"]]).map((p) => ({ ...p, startedAt: 2050 }));
    for (const p of restarted) l.applyFromStream(p, 2100, 2100);
    expect(l.chargesOf("b")).toBe(2);
  });

  it("a truncated split beat only adds; a whole heartbeat after a partial beat behaves as ever", () => {
    const l = seeded();
    for (const p of parted(2000, 1, [["r0"], ["r30"]])) l.applyFromStream({ ...p, truncated: true }, 2000, 2000);
    expect(l.chargesOf("b")).toBe(11);
    l.applyFromStream(parted(2500, 2, [["r0"], ["r1"]])[0] as GatewayHeartbeat, 2500, 2500);
    l.applyFromStream(whole(3000, ["r0", "r1"]), 3000, 3000);
    expect(l.chargesOf("b")).toBe(2);
    expect(l.incompleteBeats).toBe(1);
  });
});

describe("charge ledger - a whole list and the same list in parts reconcile alike (property)", () => {
  // The whole-list path stamps the listed entries; the parted path collects the listed keys in a
  // set. Random histories of two peers' charges, releases and heartbeats (random lists: held,
  // released, never seen, decoding, duplicates, truncated) must leave both ledgers identical.
  type Op =
    | { kind: "charge"; gw: number; id: number; pod: number; tokens: number }
    | { kind: "release"; gw: number; id: number }
    | { kind: "beat"; gw: number; ids: number[]; decoding: boolean[]; truncated: boolean; split: number }
    | { kind: "down"; gw: number };
  const op: fc.Arbitrary<Op> = fc.oneof(
    { weight: 4, arbitrary: fc.record({ kind: fc.constant("charge" as const), gw: fc.nat(1), id: fc.nat(30), pod: fc.nat(2), tokens: fc.nat(1000) }) },
    { weight: 3, arbitrary: fc.record({ kind: fc.constant("release" as const), gw: fc.nat(1), id: fc.nat(30) }) },
    {
      weight: 3,
      arbitrary: fc.record({ kind: fc.constant("beat" as const), gw: fc.nat(1), ids: fc.array(fc.nat(30), { maxLength: 20 }), decoding: fc.array(fc.boolean(), { minLength: 20, maxLength: 20 }), truncated: fc.boolean(), split: fc.integer({ min: 2, max: 4 }) }),
    },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant("down" as const), gw: fc.nat(1) }) },
  );

  it("identical dumps and counters after every step (2,000 histories)", () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 40 }), (ops) => {
        const whole = new ChargeLedger({ self: "me", heartbeatTimeoutMs: 60_000 });
        const parted = new ChargeLedger({ self: "me", heartbeatTimeoutMs: 60_000 });
        let t = 1_000;
        let beat = 0;
        for (const o of ops) {
          t += 10;
          const gw = `g${o.gw}`;
          if (o.kind === "charge") {
            const ev = charge(`c${o.id}`, gw, `p${o.pod}`, t, { promptTokens: o.tokens });
            whole.applyFromStream(ev, t, t);
            parted.applyFromStream(ev, t, t);
          } else if (o.kind === "release") {
            const ev = { type: "release" as const, id: `c${o.id}`, gateway: gw, model: "m", pod: "p0", ts: t, outcome: "completed" as const };
            whole.applyFromStream(ev, t, t);
            parted.applyFromStream(ev, t, t);
          } else if (o.kind === "down") {
            whole.applyFromStream(hb(gw, t, "down"), t, t);
            parted.applyFromStream(hb(gw, t, "down"), t, t);
          } else {
            const list = o.ids.map((id, i) => ({ id: `c${id}`, model: "m", pod: `p${id % 3}`, promptTokens: id, ts: t - 5, ...(o.decoding[i] ? { decoding: true } : {}) }));
            const base = { ...hb(gw, t), startedAt: 0, beat: ++beat, chargeTtlMs: 60_000, ...(o.truncated ? { truncated: true } : {}) };
            whole.applyFromStream({ ...base, outstanding: list }, t, t);
            const size = Math.ceil(list.length / o.split) || 1;
            const slices = Array.from({ length: o.split }, (_, p) => list.slice(p * size, (p + 1) * size));
            for (const [part, s] of slices.entries()) parted.applyFromStream({ ...base, part, parts: o.split, outstanding: s }, t, t);
          }
          expect(parted.dump(t)).toEqual(whole.dump(t));
          expect([parted.reconciledAdded, parted.reconciledRemoved, parted.size]).toEqual([whole.reconciledAdded, whole.reconciledRemoved, whole.size]);
          for (const pod of ["p0", "p1", "p2"]) expect(parted.outstanding("m", pod)).toEqual(whole.outstanding("m", pod));
        }
      }),
      { numRuns: 2_000 },
    );
  });

  it("is not vacuous: the histories remove and add through heartbeats", () => {
    const l = new ChargeLedger({ self: "me", heartbeatTimeoutMs: 60_000 });
    l.applyFromStream(charge("c1", "g0", "p0", 1_000), 1_000, 1_000);
    l.applyFromStream(charge("c2", "g0", "p0", 1_000), 1_000, 1_000);
    l.applyFromStream({ ...hb("g0", 1_010), chargeTtlMs: 60_000, outstanding: [{ id: "c2", model: "m", pod: "p0", promptTokens: 10, ts: 1_000, decoding: true }, { id: "c3", model: "m", pod: "p1", promptTokens: 7, ts: 1_000 }] }, 1_010, 1_010);
    expect([l.reconciledAdded, l.reconciledRemoved, l.chargesOf("g0")]).toEqual([1, 1, 2]);
    expect(l.outstanding("m", "p0")).toEqual({ requests: 1, promptTokens: 10, prefillRequests: 0, prefillTokens: 0 });
    expect(l.outstanding("m", "p1")).toEqual({ requests: 1, promptTokens: 7, prefillRequests: 1, prefillTokens: 7 });
  });
});
