import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { type EnqueueResult, type Fairness, FlowQueue, type FlowQueueOptions, type HeldRequest, type Order } from "./queue.js";
import { flowKeyOf, userOfFlow } from "./settings.js";

const BIG = 1_000_000;

function queue(o: Partial<FlowQueueOptions> = {}): FlowQueue<string> {
  return new FlowQueue<string>({ fairness: "round-robin", order: "fcfs", maxRequestsPerBand: BIG, maxBytesPerBand: BIG, ...o });
}

interface Add {
  band?: number;
  flow?: string;
  at?: number;
  ttl?: number;
  deadline?: number;
  bytes?: number;
}

function add(q: FlowQueue<string>, value: string, o: Add = {}): EnqueueResult<string> {
  const at = o.at ?? 0;
  return q.enqueue({ band: o.band ?? 0, flow: o.flow ?? "f", enqueuedAt: at, expiresAt: at + (o.ttl ?? 60_000), deadline: o.deadline ?? at + 60_000, bytes: o.bytes ?? 1, value });
}

function held(r: EnqueueResult<string>): HeldRequest<string> {
  if (!r.ok) throw new Error("expected the enqueue to succeed");
  return r.held;
}

const none = () => 0;

/** Repeated peek + take: the dispatch order. */
function drain(q: FlowQueue<string>, attained: (flow: string) => number = none): string[] {
  const out: string[] = [];
  for (let h = q.peek(attained); h !== undefined; h = q.peek(attained)) {
    expect(q.take(h.id)).toBe(h);
    out.push(h.value);
  }
  return out;
}

const values = (xs: readonly HeldRequest<string>[]) => xs.map((x) => x.value);

describe("flow queue - order between bands and inside a flow", () => {
  it("dispatches the highest band first, whatever the enqueue order", () => {
    const q = queue();
    add(q, "b0", { band: 0, at: 1 });
    add(q, "b-2", { band: -2, at: 0 });
    add(q, "b10", { band: 10, at: 5 });
    add(q, "b3", { band: 3, at: 2 });
    expect(drain(q)).toEqual(["b10", "b3", "b0", "b-2"]);
    expect(q.size).toBe(0);
  });

  it("fcfs orders a flow by enqueuedAt, then by id (not by arrival in the queue)", () => {
    const q = queue();
    add(q, "late", { at: 30 });
    add(q, "early", { at: 10 });
    add(q, "tie-first", { at: 20 });
    add(q, "tie-second", { at: 20 });
    expect(drain(q)).toEqual(["early", "tie-first", "tie-second", "late"]);
  });

  it("edf orders a flow by deadline, then enqueuedAt, then id", () => {
    const q = queue({ order: "edf" });
    add(q, "d50", { at: 1, deadline: 50 });
    add(q, "d20-at9", { at: 9, deadline: 20 });
    add(q, "d20-at3", { at: 3, deadline: 20 });
    add(q, "d20-at3-second", { at: 3, deadline: 20 });
    add(q, "d10", { at: 8, deadline: 10 });
    expect(drain(q)).toEqual(["d10", "d20-at3", "d20-at3-second", "d20-at9", "d50"]);
  });

  it("a live switch fcfs -> edf re-sorts the entries already held, and back", () => {
    const q = queue();
    // enqueuedAt ascending, deadlines descending: the two orders are exact opposites.
    for (let i = 0; i < 9; i++) add(q, `r${i}`, { at: i, deadline: 100 - i });
    expect(q.peek(none)?.value).toBe("r0");
    q.setOptions({ ...q.options, order: "edf" });
    expect(q.ordered(none, 3).map((h) => h.value)).toEqual(["r8", "r7", "r6"]);
    expect(q.peek(none)?.value).toBe("r8");
    q.take(q.peek(none)!.id);
    q.setOptions({ ...q.options, order: "fcfs" });
    expect(drain(q)).toEqual(["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"]);
  });

  it("mayDispatch gates bands: the highest band it allows goes, none allowed -> undefined", () => {
    const q = queue();
    add(q, "b5", { band: 5 });
    add(q, "b2", { band: 2 });
    add(q, "b-1", { band: -1 });
    const asked: number[] = [];
    const gate = (band: number) => {
      asked.push(band);
      return band < 5;
    };
    expect(q.peek(none, gate)?.value).toBe("b2");
    expect(asked).toEqual([5, 2]);
    expect(q.peek(none, (b) => b < 0)?.value).toBe("b-1");
    expect(q.peek(none, () => false)).toBeUndefined();
    expect(q.peek(none)?.value).toBe("b5");
  });

  it("an empty queue peeks undefined and take/remove of an unknown id return undefined", () => {
    const q = queue();
    expect(q.peek(none)).toBeUndefined();
    expect(q.take(1)).toBeUndefined();
    expect(q.remove(1)).toBeUndefined();
    const h = held(add(q, "x"));
    expect(q.take(h.id)).toBe(h);
    expect(q.take(h.id)).toBeUndefined();
    expect(q.remove(h.id)).toBeUndefined();
  });

  it("ids are unique and increasing; the held entry carries what was enqueued", () => {
    const q = queue();
    const a = held(add(q, "a", { band: 3, flow: "u", at: 7, ttl: 5, deadline: 9, bytes: 42 }));
    const b = held(add(q, "b"));
    expect(b.id).toBeGreaterThan(a.id);
    expect(a).toEqual({ id: a.id, band: 3, flow: "u", enqueuedAt: 7, expiresAt: 12, deadline: 9, bytes: 42, value: "a" });
    expect(q.get(a.id)).toBe(a);
  });

  it("refuses malformed entries (programming errors) with a TypeError", () => {
    const q = queue();
    expect(() => add(q, "x", { band: 1.5 })).toThrow(TypeError);
    expect(() => add(q, "x", { bytes: -1 })).toThrow(TypeError);
    expect(() => add(q, "x", { bytes: Number.POSITIVE_INFINITY })).toThrow(TypeError);
    expect(() => add(q, "x", { at: Number.NaN })).toThrow(TypeError);
    expect(q.size).toBe(0);
    expect(() => queue({ maxRequestsPerBand: -1 })).toThrow(RangeError);
    expect(() => queue({ order: "lifo" as Order })).toThrow(RangeError);
    expect(() => queue({ fairness: "strict" as Fairness })).toThrow(RangeError);
  });
});

describe("flow queue - round-robin between flows", () => {
  it("rotates between the band's flows; a served flow goes to the back", () => {
    const q = queue();
    add(q, "a1", { flow: "a", at: 1 });
    add(q, "a2", { flow: "a", at: 2 });
    add(q, "a3", { flow: "a", at: 3 });
    add(q, "b1", { flow: "b", at: 4 });
    add(q, "c1", { flow: "c", at: 5 });
    add(q, "c2", { flow: "c", at: 6 });
    expect(drain(q)).toEqual(["a1", "b1", "c1", "a2", "c2", "a3"]);
  });

  it("a flow that becomes non-empty joins at the back of the turn", () => {
    const q = queue();
    add(q, "a1", { flow: "a" });
    add(q, "a2", { flow: "a" });
    add(q, "b1", { flow: "b" });
    q.take(q.peek(none)!.id); // a1; turn: b, a
    add(q, "c1", { flow: "c" }); // turn: b, a, c
    expect(drain(q)).toEqual(["b1", "a2", "c1"]);
  });

  it("a flow that empties and comes back starts at the back", () => {
    const q = queue();
    add(q, "a1", { flow: "a" });
    add(q, "b1", { flow: "b" });
    add(q, "b2", { flow: "b" });
    q.take(q.peek(none)!.id); // a1: a leaves the turn
    add(q, "a2", { flow: "a" }); // turn: b, a
    expect(drain(q)).toEqual(["b1", "a2", "b2"]);
  });

  it("peek does not advance the turn; remove (cancel) does not either", () => {
    const q = queue();
    add(q, "a1", { flow: "a", at: 1 });
    add(q, "a2", { flow: "a", at: 2 });
    add(q, "b1", { flow: "b", at: 3 });
    expect(q.peek(none)?.value).toBe("a1");
    expect(q.peek(none)?.value).toBe("a1");
    q.remove(q.peek(none)!.id);
    expect(q.peek(none)?.value).toBe("a2");
  });

  it("turns are per band", () => {
    const q = queue();
    add(q, "hi-a", { band: 1, flow: "a" });
    add(q, "lo-a", { band: 0, flow: "a" });
    add(q, "lo-b", { band: 0, flow: "b" });
    add(q, "lo-a2", { band: 0, flow: "a" });
    // Serving flow a in band 1 does not send a to the back in band 0.
    expect(drain(q)).toEqual(["hi-a", "lo-a", "lo-b", "lo-a2"]);
  });
});

describe("flow queue - least-attained between flows", () => {
  it("serves the flow with the least attained service, asking again at every peek", () => {
    const q = queue({ fairness: "least-attained" });
    for (let i = 0; i < 3; i++) add(q, `big${i}`, { flow: "big", at: i });
    for (let i = 0; i < 3; i++) add(q, `small${i}`, { flow: "small", at: 10 + i });
    const attained = new Map([
      ["big", 100],
      ["small", 5],
    ]);
    const out: string[] = [];
    for (let h = q.peek((f) => attained.get(f)!); h !== undefined; h = q.peek((f) => attained.get(f)!)) {
      q.take(h.id);
      out.push(h.value);
      attained.set(h.flow, attained.get(h.flow)! + 60);
    }
    // small 5 -> 65 -> 125; big 100 -> 160
    expect(out).toEqual(["small0", "small1", "big0", "small2", "big1", "big2"]);
  });

  it("on equal attained service, the flow whose head was enqueued first wins", () => {
    const q = queue({ fairness: "least-attained" });
    add(q, "a", { flow: "a", at: 20 });
    add(q, "b", { flow: "b", at: 10 });
    add(q, "c", { flow: "c", at: 30 });
    expect(drain(q)).toEqual(["b", "a", "c"]);
  });

  it("under edf the tie-break looks at each flow's head (earliest deadline), not its oldest entry", () => {
    const q = queue({ fairness: "least-attained", order: "edf" });
    add(q, "x-old-late-deadline", { flow: "x", at: 1, deadline: 1_000 });
    add(q, "x-head", { flow: "x", at: 5, deadline: 10 });
    add(q, "y-head", { flow: "y", at: 3, deadline: 500 });
    expect(q.peek(none)?.value).toBe("y-head");
  });

  it("does not call attained in round-robin mode, nor for other bands", () => {
    const asked: string[] = [];
    const q = queue();
    add(q, "a", { flow: "a" });
    q.peek((f) => {
      asked.push(f);
      return 0;
    });
    expect(asked).toEqual([]);
    q.setOptions({ ...q.options, fairness: "least-attained" });
    add(q, "lo", { band: -1, flow: "lo" });
    add(q, "b", { flow: "b" });
    q.peek((f) => {
      asked.push(f);
      return 0;
    });
    expect(asked.sort()).toEqual(["a", "b"]);
  });
});

describe("flow queue - bounds and drop choice", () => {
  it("a non-sheddable newcomer to a band full by count is refused; other bands are unaffected", () => {
    const q = queue({ maxRequestsPerBand: 2 });
    add(q, "a", { band: 0 });
    add(q, "b", { band: 0 });
    add(q, "s", { band: -1 });
    expect(add(q, "c", { band: 0 })).toEqual({ ok: false, reason: "full" });
    expect(q.size).toBe(3);
    expect(add(q, "d", { band: 1 }).ok).toBe(true);
    expect(values(q.ordered(none, 10))).toEqual(["d", "a", "b", "s"]);
  });

  it("the byte bound: filling a band exactly fits, one byte more is refused", () => {
    const q = queue({ maxBytesPerBand: 100 });
    expect(add(q, "a", { bytes: 60 }).ok).toBe(true);
    expect(add(q, "b", { bytes: 41 })).toEqual({ ok: false, reason: "full" });
    expect(add(q, "c", { bytes: 40 }).ok).toBe(true);
    expect(q.bytes).toBe(100);
    expect(add(q, "d", { bytes: 0 }).ok).toBe(true);
  });

  it("a sheddable newcomer to its full band replaces the band's oldest (by enqueuedAt), which is returned", () => {
    const q = queue({ maxRequestsPerBand: 3 });
    const younger = held(add(q, "younger", { band: -1, at: 10 }));
    const oldest = held(add(q, "oldest", { band: -1, at: 5 }));
    add(q, "mid", { band: -1, at: 7 });
    add(q, "other-band", { band: -2, at: 0 });
    const r = add(q, "new", { band: -1, at: 20 });
    expect(r.ok && values(r.dropped)).toEqual(["oldest"]);
    expect(q.get(oldest.id)).toBeUndefined();
    expect(q.get(younger.id)).toBe(younger);
    expect(q.size).toBe(4);
    expect(values(q.ordered(none, 10))).toEqual(["mid", "younger", "new", "other-band"]);
  });

  it("a sheddable newcomer drops as many of its band's oldest as its bytes need", () => {
    const q = queue({ maxBytesPerBand: 100 });
    add(q, "a", { band: -3, at: 1, bytes: 30 });
    add(q, "b", { band: -3, at: 2, bytes: 30 });
    add(q, "c", { band: -3, at: 3, bytes: 30 });
    const r = add(q, "big", { band: -3, at: 4, bytes: 65 });
    expect(r.ok && values(r.dropped)).toEqual(["a", "b"]);
    expect(q.bytes).toBe(95);
  });

  it("a sheddable newcomer that could not fit even in an empty band is refused and drops nothing", () => {
    const q = queue({ maxBytesPerBand: 100 });
    add(q, "a", { band: -1, bytes: 50 });
    expect(add(q, "huge", { band: -1, bytes: 101 })).toEqual({ ok: false, reason: "full" });
    expect(q.size).toBe(1);
    const none0 = queue({ maxRequestsPerBand: 0 });
    expect(add(none0, "x", { band: -1 })).toEqual({ ok: false, reason: "full" });
  });

  it("the total bound sheds the oldest of the lowest sheddable band below the newcomer, never band >= 0", () => {
    const q = queue({ maxTotalRequests: 5 });
    add(q, "keep0", { band: 0, at: 0 });
    add(q, "m1-old", { band: -1, at: 1 });
    add(q, "m3-young", { band: -3, at: 9 });
    add(q, "m3-old", { band: -3, at: 2 });
    add(q, "m1-young", { band: -1, at: 8 });
    const r1 = add(q, "n1", { band: 2, at: 10 });
    expect(r1.ok && values(r1.dropped)).toEqual(["m3-old"]);
    const r2 = add(q, "n2", { band: 0, at: 11 });
    expect(r2.ok && values(r2.dropped)).toEqual(["m3-young"]);
    const r3 = add(q, "n3", { band: 0, at: 12 });
    expect(r3.ok && values(r3.dropped)).toEqual(["m1-old"]);
    expect(values(q.ordered(none, 10))).toEqual(["n1", "keep0", "n2", "n3", "m1-young"]);
  });

  it("the total bound: a non-sheddable newcomer never sheds its own band or a band >= 0 below it", () => {
    const q = queue({ maxTotalRequests: 2 });
    add(q, "b0", { band: 0 });
    add(q, "b1", { band: 1 });
    expect(add(q, "b2", { band: 2 })).toEqual({ ok: false, reason: "full" });
    expect(add(q, "b1-again", { band: 1 })).toEqual({ ok: false, reason: "full" });
    expect(q.size).toBe(2);
  });

  it("the total bound: a sheddable newcomer sheds lower sheddable bands first, then its own band's oldest, never a higher one", () => {
    const q = queue({ maxTotalRequests: 4 });
    add(q, "m2", { band: -2, at: 5 });
    add(q, "m1-old", { band: -1, at: 1 });
    add(q, "m1-young", { band: -1, at: 2 });
    add(q, "zero", { band: 0, at: 0 });
    const r1 = add(q, "n1", { band: -1, at: 10 });
    expect(r1.ok && values(r1.dropped)).toEqual(["m2"]);
    const r2 = add(q, "n2", { band: -1, at: 11 });
    expect(r2.ok && values(r2.dropped)).toEqual(["m1-old"]);
    // Band -2 is empty and only -2 or lower may be shed for a -2 newcomer: refused.
    expect(add(q, "n3", { band: -2, at: 12 })).toEqual({ ok: false, reason: "full" });
    expect(values(q.ordered(none, 10))).toEqual(["zero", "m1-young", "n1", "n2"]);
  });

  it("the total byte bound is all or nothing: when shedding every eligible entry would not do, nothing is shed", () => {
    const q = queue({ maxTotalBytes: 100 });
    add(q, "zero", { band: 0, bytes: 70 });
    add(q, "m1", { band: -1, bytes: 20 });
    expect(add(q, "n", { band: 1, bytes: 40 })).toEqual({ ok: false, reason: "full" });
    expect(q.size).toBe(2);
    const r = add(q, "n", { band: 1, bytes: 30 });
    expect(r.ok && values(r.dropped)).toEqual(["m1"]);
    expect(q.bytes).toBe(100);
  });

  it("per-band and total bounds together: a sheddable newcomer first makes room in its band, then sheds the lowest band", () => {
    const q = queue();
    add(q, "m2", { band: -2, at: 0 });
    add(q, "m3", { band: -3, at: 5 });
    add(q, "m1", { band: -1, at: 9 });
    q.setOptions({ ...q.options, maxRequestsPerBand: 1, maxTotalRequests: 2 });
    // Band -1 is full: m1 goes; the total (m2, m3 + n = 3 > 2) then sheds band -3 before -2.
    const r = add(q, "n", { band: -1, at: 10 });
    expect(r.ok && values(r.dropped)).toEqual(["m1", "m3"]);
    expect(values(q.ordered(none, 10))).toEqual(["n", "m2"]);
    // Nothing at or below -3 is held: a -3 newcomer is refused by the total.
    expect(add(q, "m3-again", { band: -3, at: 11 })).toEqual({ ok: false, reason: "full" });
  });

  it("lowering a bound live keeps what is held; later enqueues see the new bound", () => {
    const q = queue();
    for (let i = 0; i < 4; i++) add(q, `r${i}`, { at: i });
    q.setOptions({ ...q.options, maxRequestsPerBand: 2 });
    expect(q.size).toBe(4);
    expect(add(q, "r4")).toEqual({ ok: false, reason: "full" });
    q.setOptions({ ...q.options, maxRequestsPerBand: 10 });
    expect(add(q, "r5").ok).toBe(true);
  });
});

describe("flow queue - expiry, removal, summaries", () => {
  it("expire(now) removes every entry with expiresAt <= now, earliest expiry first, from any band or flow", () => {
    const q = queue();
    add(q, "e30", { band: 2, flow: "a", at: 0, ttl: 30 });
    add(q, "e10", { band: -1, flow: "b", at: 0, ttl: 10 });
    add(q, "e20", { band: 0, flow: "a", at: 0, ttl: 20 });
    add(q, "e31", { band: 0, flow: "c", at: 0, ttl: 31 });
    expect(q.nextExpiry()).toBe(10);
    expect(q.expire(9)).toEqual([]);
    expect(values(q.expire(10))).toEqual(["e10"]);
    expect(values(q.expire(30))).toEqual(["e20", "e30"]);
    expect(q.nextExpiry()).toBe(31);
    expect(q.size).toBe(1);
    expect(q.summary()).toEqual([{ band: 0, count: 1, bytes: 1, oldest: 0 }]);
    expect(drain(q)).toEqual(["e31"]);
    expect(q.nextExpiry()).toBeUndefined();
  });

  it("removing (a client went away) keeps the rest in order and the counts right", () => {
    const q = queue();
    const hs = ["a", "b", "c", "d", "e"].map((v, i) => held(add(q, v, { at: i, bytes: 10 * (i + 1) })));
    expect(q.remove(hs[2]!.id)).toBe(hs[2]);
    expect(q.remove(hs[0]!.id)).toBe(hs[0]);
    expect(q.size).toBe(3);
    expect(q.bytes).toBe(20 + 40 + 50);
    expect(q.summary()).toEqual([{ band: 0, count: 3, bytes: 110, oldest: 1 }]);
    expect(q.expire(Number.POSITIVE_INFINITY).length).toBe(3);
    expect(q.summary()).toEqual([]);
  });

  it("summary: per band highest first, count, bytes and oldest enqueuedAt (it moves when the oldest leaves)", () => {
    const q = queue({ order: "edf" });
    add(q, "x", { band: -1, at: 7, bytes: 3 });
    const oldest = held(add(q, "y", { band: 4, flow: "a", at: 2, bytes: 5, deadline: 900 }));
    add(q, "z", { band: 4, flow: "b", at: 6, bytes: 6, deadline: 100 });
    add(q, "w", { band: 4, flow: "b", at: 3, bytes: 1, deadline: 1_000 });
    expect(q.summary()).toEqual([
      { band: 4, count: 3, bytes: 12, oldest: 2 },
      { band: -1, count: 1, bytes: 3, oldest: 7 },
    ]);
    q.remove(oldest.id);
    expect(q.summary()[0]).toEqual({ band: 4, count: 2, bytes: 7, oldest: 3 });
  });

  it("flows: per band and flow, count and oldest (under edf the oldest, not the head)", () => {
    const q = queue({ order: "edf" });
    add(q, "a1", { band: 1, flow: "a", at: 5, deadline: 10 });
    add(q, "a2", { band: 1, flow: "a", at: 2, deadline: 90 });
    add(q, "b1", { band: 1, flow: "b", at: 4 });
    add(q, "c1", { band: 0, flow: "c", at: 1 });
    expect(q.flows()).toEqual([
      { band: 1, flow: "a", count: 2, oldest: 2 },
      { band: 1, flow: "b", count: 1, oldest: 4 },
      { band: 0, flow: "c", count: 1, oldest: 1 },
    ]);
    q.take(q.peek(none)!.id);
    expect(q.flows().map((f) => f.flow)).toEqual(["b", "a", "c"]);
  });

  it("a drained queue holds no bands or flows", () => {
    const q = queue();
    for (let i = 0; i < 50; i++) add(q, `r${i}`, { band: (i % 5) - 2, flow: `f${i % 7}`, at: i });
    drain(q);
    expect(q.summary()).toEqual([]);
    expect(q.flows()).toEqual([]);
    expect(q.bytes).toBe(0);
  });

  it("ordered is the dispatch order without taking anything, and stops at the limit", () => {
    for (const fairness of ["round-robin", "least-attained"] as const) {
      const q = queue({ fairness, order: "edf" });
      for (let i = 0; i < 40; i++) add(q, `r${i}`, { band: i % 3, flow: `f${i % 4}`, at: i, deadline: (i * 37) % 50 });
      const attained = (f: string) => Number(f.slice(1)) % 2;
      const head = values(q.ordered(attained, 7));
      expect(head.length).toBe(7);
      const all = values(q.ordered(attained, 1_000));
      expect(all.length).toBe(40);
      expect(q.size).toBe(40);
      expect(all.slice(0, 7)).toEqual(head);
      expect(drain(q, attained)).toEqual(all);
    }
  });
});

// ---- A model: the same rules written the slow, obvious way, checked against the queue. ----

type E = HeldRequest<string>;

class Reference {
  entries: E[] = [];
  /** Per band, users in turn order; per band and user, flows in turn order. */
  users = new Map<number, string[]>();
  uflows = new Map<string, string[]>();
  nextId = 1;
  private uk = (band: number, flow: string) => `${band}|${userOfFlow(flow)}`;
  private hasFlow = (band: number, flow: string) => this.entries.some((x) => x.band === band && x.flow === flow);
  private hasUser = (band: number, flow: string) => this.entries.some((x) => x.band === band && userOfFlow(x.flow) === userOfFlow(flow));
  private turnOrder(band: number): string[] {
    return (this.users.get(band) ?? []).flatMap((u) => this.uflows.get(`${band}|${u}`) ?? []);
  }
  constructor(public o: FlowQueueOptions) {}

  private age = (a: E, b: E) => a.enqueuedAt - b.enqueuedAt || a.id - b.id;
  private inFlow = (a: E, b: E) => (this.o.order === "edf" ? a.deadline - b.deadline || this.age(a, b) : this.age(a, b));

  private detach(e: E): E {
    this.entries = this.entries.filter((x) => x !== e);
    if (!this.hasFlow(e.band, e.flow)) {
      const k = this.uk(e.band, e.flow);
      const t = (this.uflows.get(k) ?? []).filter((f) => f !== e.flow);
      if (t.length > 0) this.uflows.set(k, t);
      else this.uflows.delete(k);
    }
    if (!this.hasUser(e.band, e.flow)) {
      const t = (this.users.get(e.band) ?? []).filter((u) => u !== userOfFlow(e.flow));
      if (t.length > 0) this.users.set(e.band, t);
      else this.users.delete(e.band);
    }
    return e;
  }

  enqueue(r: Omit<E, "id">): EnqueueResult<string> {
    const o = this.o;
    const sum = (xs: E[]) => ({ n: xs.length, b: xs.reduce((s, x) => s + x.bytes, 0) });
    const bandOk = (xs: E[]) => {
      const s = sum(xs.filter((x) => x.band === r.band));
      return s.n + 1 <= o.maxRequestsPerBand && s.b + r.bytes <= o.maxBytesPerBand;
    };
    const totalOk = (xs: E[]) => {
      const s = sum(xs);
      return s.n + 1 <= (o.maxTotalRequests ?? Number.POSITIVE_INFINITY) && s.b + r.bytes <= (o.maxTotalBytes ?? Number.POSITIVE_INFINITY);
    };
    const mine = sum(this.entries.filter((x) => x.band === r.band && userOfFlow(x.flow) === userOfFlow(r.flow)));
    if (mine.n + 1 > (o.maxRequestsPerUser ?? Number.POSITIVE_INFINITY) || mine.b + r.bytes > (o.maxBytesPerUser ?? Number.POSITIVE_INFINITY)) return { ok: false, reason: "user-full" };
    let plan = [...this.entries];
    const dropped: E[] = [];
    if (!bandOk(plan)) {
      if (r.band >= 0) return { ok: false, reason: "full" };
      for (const x of plan.filter((x) => x.band === r.band).sort(this.age)) {
        if (bandOk(plan)) break;
        plan = plan.filter((y) => y !== x);
        dropped.push(x);
      }
      if (!bandOk(plan)) return { ok: false, reason: "full" };
    }
    const eligible = plan.filter((x) => x.band < 0 && (x.band < r.band || (r.band < 0 && x.band === r.band))).sort((a, b) => a.band - b.band || this.age(a, b));
    for (const x of eligible) {
      if (totalOk(plan)) break;
      plan = plan.filter((y) => y !== x);
      dropped.push(x);
    }
    if (!totalOk(plan)) return { ok: false, reason: "full" };
    for (const d of dropped) this.detach(d);
    const e: E = { id: this.nextId++, ...r };
    if (!this.hasUser(e.band, e.flow)) this.users.set(e.band, [...(this.users.get(e.band) ?? []), userOfFlow(e.flow)]);
    if (!this.hasFlow(e.band, e.flow)) this.uflows.set(this.uk(e.band, e.flow), [...(this.uflows.get(this.uk(e.band, e.flow)) ?? []), e.flow]);
    this.entries.push(e);
    return { ok: true, held: e, dropped };
  }

  remove(id: number): E | undefined {
    const e = this.entries.find((x) => x.id === id);
    return e && this.detach(e);
  }

  take(id: number): E | undefined {
    const e = this.remove(id);
    if (e && this.hasFlow(e.band, e.flow)) {
      const k = this.uk(e.band, e.flow);
      this.uflows.set(k, [...this.uflows.get(k)!.filter((f) => f !== e.flow), e.flow]);
    }
    if (e && this.hasUser(e.band, e.flow)) {
      const u = userOfFlow(e.flow);
      this.users.set(e.band, [...this.users.get(e.band)!.filter((x) => x !== u), u]);
    }
    return e;
  }

  expire(now: number): E[] {
    const out = this.entries.filter((x) => x.expiresAt <= now).sort((a, b) => a.expiresAt - b.expiresAt || a.id - b.id);
    for (const e of out) this.detach(e);
    return out;
  }

  head(band: number, flow: string): E {
    return this.entries.filter((x) => x.band === band && x.flow === flow).sort(this.inFlow)[0]!;
  }

  peek(attained: (f: string) => number, may: (b: number) => boolean): E | undefined {
    const bands = [...new Set(this.entries.map((x) => x.band))].sort((a, b) => b - a).filter(may);
    const band = bands[0];
    if (band === undefined) return undefined;
    const turn = this.turnOrder(band);
    if (this.o.fairness === "round-robin") return this.head(band, turn[0]!);
    const heads = turn.map((f) => this.head(band, f)).sort((a, b) => attained(a.flow) - attained(b.flow) || this.age(a, b));
    return heads[0];
  }

  flows() {
    const bands = [...new Set(this.entries.map((x) => x.band))].sort((a, b) => b - a);
    return bands.flatMap((band) =>
      this.turnOrder(band).map((flow) => {
        const xs = this.entries.filter((x) => x.band === band && x.flow === flow);
        return { band, flow, count: xs.length, oldest: Math.min(...xs.map((x) => x.enqueuedAt)) };
      }),
    );
  }

  summary() {
    const bands = [...new Set(this.entries.map((x) => x.band))].sort((a, b) => b - a);
    return bands.map((band) => {
      const xs = this.entries.filter((x) => x.band === band);
      return { band, count: xs.length, bytes: xs.reduce((s, x) => s + x.bytes, 0), oldest: Math.min(...xs.map((x) => x.enqueuedAt)) };
    });
  }
}

const options = fc.record({
  fairness: fc.constantFrom<Fairness>("round-robin", "least-attained"),
  order: fc.constantFrom<Order>("fcfs", "edf"),
  maxRequestsPerBand: fc.integer({ min: 0, max: 6 }),
  maxBytesPerBand: fc.integer({ min: 0, max: 40 }),
  maxTotalRequests: fc.option(fc.integer({ min: 0, max: 12 }), { nil: undefined }),
  maxTotalBytes: fc.option(fc.integer({ min: 0, max: 80 }), { nil: undefined }),
  maxRequestsPerUser: fc.option(fc.integer({ min: 0, max: 5 }), { nil: undefined }),
  maxBytesPerUser: fc.option(fc.integer({ min: 0, max: 30 }), { nil: undefined }),
});

const op = fc.oneof(
  {
    arbitrary: fc.record({
      k: fc.constant("enqueue" as const),
      band: fc.integer({ min: -3, max: 2 }),
      flow: fc.constantFrom("a", "b", "c", "d", "a\u0000x", "a\u0000y", "\u0000p", "\u0000anonymous"),
      dt: fc.integer({ min: -3, max: 3 }),
      ttl: fc.integer({ min: 0, max: 30 }),
      deadline: fc.integer({ min: 0, max: 30 }),
      bytes: fc.integer({ min: 0, max: 12 }),
    }),
    weight: 6,
  },
  { arbitrary: fc.record({ k: fc.constant("take" as const), gate: fc.integer({ min: -4, max: 3 }) }), weight: 4 },
  { arbitrary: fc.record({ k: fc.constant("remove" as const), id: fc.integer({ min: 1, max: 60 }) }), weight: 2 },
  { arbitrary: fc.record({ k: fc.constant("expire" as const), dt: fc.integer({ min: 0, max: 10 }) }), weight: 1 },
  { arbitrary: fc.record({ k: fc.constant("options" as const), o: options }), weight: 1 },
);

describe("flow queue - against a slow reference model", () => {
  it("every operation's result, the summary and the dispatch order agree over random histories", () => {
    fc.assert(
      fc.property(options, fc.array(op, { minLength: 20, maxLength: 120 }), fc.array(fc.integer({ min: 0, max: 2 }), { minLength: 4, maxLength: 4 }), (o, ops, credit) => {
        const q = new FlowQueue<string>(o);
        const ref = new Reference(o);
        const attained = (f: string) => credit["abcd".indexOf(userOfFlow(f))] ?? 0;
        let now = 100;
        let n = 0;
        for (const x of ops) {
          switch (x.k) {
            case "enqueue": {
              const r = { band: x.band, flow: x.flow, enqueuedAt: now + x.dt, expiresAt: now + x.ttl, deadline: now + x.deadline, bytes: x.bytes, value: `v${n++}` };
              expect(q.enqueue(r)).toEqual(ref.enqueue(r));
              now++;
              break;
            }
            case "take": {
              const may = (b: number) => b <= x.gate;
              const p = q.peek(attained, may);
              expect(p).toEqual(ref.peek(attained, may));
              if (p) expect(q.take(p.id)).toEqual(ref.take(p.id));
              break;
            }
            case "remove":
              expect(q.remove(x.id)).toEqual(ref.remove(x.id));
              break;
            case "expire":
              now += x.dt;
              expect(q.expire(now)).toEqual(ref.expire(now));
              break;
            case "options":
              q.setOptions(x.o);
              ref.o = x.o;
              break;
          }
          expect(q.summary()).toEqual(ref.summary());
          expect(q.flows()).toEqual(ref.flows());
          expect(q.size).toBe(ref.entries.length);
        }
        // Drain both: the remaining dispatch order agrees, and ordered() predicted it.
        const predicted = q.ordered(attained, Number.POSITIVE_INFINITY);
        const out: E[] = [];
        for (let p = q.peek(attained); p; p = q.peek(attained)) {
          expect(p).toEqual(ref.peek(attained, () => true));
          out.push(q.take(p.id)!);
          ref.take(p.id);
        }
        expect(out).toEqual(predicted);
        expect(q.size).toBe(0);
      }),
      { numRuns: 400 },
    );
  });
});

describe("flow queue - round-robin between users, then between a user's fairness ids", () => {
  it("a client naming a new fairness id per request does not take the turns of a tenant that queued first", () => {
    const q = queue();
    for (let i = 0; i < 100; i++) add(q, `a${i}`, { flow: flowKeyOf("alice", undefined), at: i });
    for (let i = 0; i < 100; i++) add(q, `m${i}`, { flow: flowKeyOf("mallory", `id-${i}`), at: 100 + i });
    const next100 = drain(q).slice(0, 100);
    const alice = next100.filter((v) => v.startsWith("a")).length;
    expect(alice).toBe(50);
    expect(next100.slice(0, 4)).toEqual(["a0", "m0", "a1", "m1"]);
  });

  it("a user's fairness ids take turns within that user's turn", () => {
    const q = queue();
    add(q, "u-x1", { flow: flowKeyOf("u", "x"), at: 1 });
    add(q, "u-x2", { flow: flowKeyOf("u", "x"), at: 2 });
    add(q, "u-y1", { flow: flowKeyOf("u", "y"), at: 3 });
    add(q, "v1", { flow: flowKeyOf("v", undefined), at: 4 });
    add(q, "v2", { flow: flowKeyOf("v", undefined), at: 5 });
    expect(drain(q)).toEqual(["u-x1", "v1", "u-y1", "v2", "u-x2"]);
  });

  it("anonymous requests are one user, whatever fairness ids they name", () => {
    const q = queue();
    add(q, "n1", { flow: flowKeyOf(undefined, "p"), at: 1 });
    add(q, "n2", { flow: flowKeyOf(undefined, "q"), at: 2 });
    add(q, "n3", { flow: flowKeyOf(undefined, undefined), at: 3 });
    add(q, "k1", { flow: flowKeyOf("k", undefined), at: 4 });
    expect(drain(q)).toEqual(["n1", "k1", "n2", "n3"]);
  });
});

describe("flow queue - per-user cap inside a band", () => {
  it("refuses a user's request over its share of the band (count or bytes), whatever fairness id it names; others still fit", () => {
    const q = queue({ maxRequestsPerUser: 2, maxBytesPerUser: 10 });
    expect(add(q, "m1", { flow: flowKeyOf("m", "1"), bytes: 4 }).ok).toBe(true);
    expect(add(q, "m2", { flow: flowKeyOf("m", "2"), bytes: 4 }).ok).toBe(true);
    expect(add(q, "m3", { flow: flowKeyOf("m", "3"), bytes: 1 })).toEqual({ ok: false, reason: "user-full" });
    expect(add(q, "a1", { flow: flowKeyOf("a", undefined), bytes: 8 }).ok).toBe(true);
    expect(add(q, "a2", { flow: flowKeyOf("a", undefined), bytes: 3 })).toEqual({ ok: false, reason: "user-full" });
    // The cap is per band: the same user fits in another band.
    expect(add(q, "m-hi", { band: 1, flow: flowKeyOf("m", "1"), bytes: 4 }).ok).toBe(true);
    // A dispatch frees the user's share.
    q.take(q.peek(none, (b) => b === 0)!.id);
    expect(add(q, "m4", { flow: flowKeyOf("m", "4"), bytes: 4 }).ok).toBe(true);
    expect(q.size).toBe(4);
  });
});
