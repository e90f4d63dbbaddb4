import { describe, expect, it } from "vitest";
import {
  type BandSummary,
  DEFAULT_INVERSION_BOUND_MS,
  DEFAULT_SUMMARY_INTERVAL_MS,
  FleetQueues,
  MAX_BANDS,
  parseSummary,
  type ReplicaSummary,
  summaryOf,
  checkSummary,
  MAX_BAND_COUNT,
} from "./fleet.js";
import { FlowQueue } from "./queue.js";

const M = "llama";

function summary(gateway: string, ts: number, models: Record<string, BandSummary[]>): ReplicaSummary {
  return { gateway, ts, models };
}

describe("fleet queues - summaries in", () => {
  it("stores other replicas' summaries, ignores its own", () => {
    const f = new FleetQueues({ self: "g0" });
    expect(f.apply(summary("g0", 1, { [M]: [{ band: 5, count: 1, oldest: 0 }] }), 1)).toBe(false);
    expect(f.apply(summary("g1", 1, { [M]: [{ band: 5, count: 1, oldest: 0 }] }), 1)).toBe(true);
    expect(f.dump()).toEqual([summary("g1", 1, { [M]: [{ band: 5, count: 1, oldest: 0 }] })]);
    expect(f.stats().replicas).toBe(1);
  });

  it("a newer ts replaces; an older or equal one is ignored (out-of-order delivery)", () => {
    const f = new FleetQueues({ self: "g0" });
    f.apply(summary("g1", 10, { [M]: [{ band: 1, count: 1, oldest: 0 }] }), 10);
    expect(f.apply(summary("g1", 9, { [M]: [{ band: 2, count: 1, oldest: 0 }] }), 11)).toBe(false);
    expect(f.apply(summary("g1", 10, { [M]: [{ band: 3, count: 1, oldest: 0 }] }), 11)).toBe(false);
    expect(f.apply(summary("g1", 11, {}), 12)).toBe(true);
    expect(f.dump()).toEqual([summary("g1", 11, {})]);
  });

  it("keeps bands highest first and leaves empty ones out", () => {
    const f = new FleetQueues({ self: "g0" });
    f.apply(
      summary("g1", 1, {
        [M]: [
          { band: -1, count: 2, oldest: 5 },
          { band: 7, count: 1, oldest: 6 },
          { band: 3, count: 0, oldest: 0 },
        ],
      }),
      1,
    );
    expect(f.dump()[0]!.models[M]).toEqual([
      { band: 7, count: 1, oldest: 6 },
      { band: -1, count: 2, oldest: 5 },
    ]);
  });

  it("ignores and counts malformed summaries, never throws", () => {
    const f = new FleetQueues({ self: "g0" });
    const bad: unknown[] = [
      null,
      "x",
      42,
      [],
      {},
      { gateway: "g1", ts: 1 },
      { gateway: "", ts: 1, models: {} },
      { gateway: "g".repeat(1025), ts: 1, models: {} },
      { gateway: 7, ts: 1, models: {} },
      { gateway: "g1", ts: "1", models: {} },
      { gateway: "g1", ts: Number.NaN, models: {} },
      { gateway: "g1", ts: 1, models: [] },
      { gateway: "g1", ts: 1, models: null },
      { gateway: "g1", ts: 1, models: { [M]: "x" } },
      { gateway: "g1", ts: 1, models: { [M]: [null] } },
      { gateway: "g1", ts: 1, models: { [M]: [{ band: 1.5, count: 1, oldest: 0 }] } },
      { gateway: "g1", ts: 1, models: { [M]: [{ band: 1, count: -1, oldest: 0 }] } },
      { gateway: "g1", ts: 1, models: { [M]: [{ band: 1, count: 1, oldest: "0" }] } },
      { gateway: "g1", ts: 1, models: { [M]: [{ band: 1, count: 1, oldest: Number.POSITIVE_INFINITY }] } },
      { gateway: "g1", ts: 1, models: { [M]: [{ band: 1, count: 1 }] } },
      { gateway: "g1", ts: 1, models: { "": [] } },
    ];
    for (const s of bad) expect(f.apply(s as ReplicaSummary, 1)).toBe(false);
    expect(f.apply(summary("g1", 1, {}), Number.NaN)).toBe(false);
    expect(f.stats()).toEqual({ replicas: 0, malformed: bad.length + 1, truncated: 0, refused: 0, wrongGateway: 0, futureTs: 0, tooOld: 0 });
    // Extra fields (a newer peer) are fine, and dropped.
    expect(f.apply({ ...summary("g1", 1, { [M]: [{ band: 1, count: 1, oldest: 0, flows: 3 } as BandSummary] }), v: 2 } as ReplicaSummary, 1)).toBe(true);
    expect(f.dump()).toEqual([summary("g1", 1, { [M]: [{ band: 1, count: 1, oldest: 0 }] })]);
  });

  it("bounds: models beyond maxModels and bands beyond 33 are cut (the lowest bands) and counted", () => {
    const f = new FleetQueues({ self: "g0", maxModels: 2 });
    // 40 entries of bands in [-16, 16] (the lowest seven twice): cut to 33, the lowest first.
    const bands = Array.from({ length: 40 }, (_, i) => ({ band: (i % 33) - 16, count: 1, oldest: 0 }));
    expect(f.apply(summary("g1", 1, { a: bands, b: [], c: [{ band: 1, count: 1, oldest: 0 }] }), 1)).toBe(true);
    const kept = f.dump()[0]!.models;
    expect(Object.keys(kept)).toEqual(["a", "b"]);
    expect(kept.a!.length).toBe(MAX_BANDS);
    expect(kept.a![0]!.band).toBe(16);
    expect(kept.a![MAX_BANDS - 1]!.band).toBe(-13);
    expect(f.stats().truncated).toBe(1);
  });

  it("bounds: a new replica beyond maxReplicas is refused while the others are live, taken once one is stale", () => {
    const f = new FleetQueues({ self: "g0", maxReplicas: 2, staleMs: 300 });
    expect(f.apply(summary("g1", 0, {}), 0)).toBe(true);
    expect(f.apply(summary("g2", 0, {}), 100)).toBe(true);
    expect(f.apply(summary("g3", 0, {}), 200)).toBe(false);
    expect(f.stats().refused).toBe(1);
    // Known replicas still refresh.
    expect(f.apply(summary("g2", 1, {}), 250)).toBe(true);
    expect(f.apply(summary("g3", 1, {}), 301)).toBe(true); // g1 (0) is stale at 301
    expect(f.dump().map((s) => s.gateway).sort()).toEqual(["g2", "g3"]);
  });
});

describe("fleet queues - the dispatch gate", () => {
  const at = 10_000;

  function fleet(bands: BandSummary[], o: { gateway?: string; ts?: number; receivedAt?: number; boundMs?: number } = {}) {
    const f = new FleetQueues({ self: "g0", boundMs: o.boundMs });
    f.apply(summary(o.gateway ?? "g1", o.ts ?? at, { [M]: bands }), o.receivedAt ?? at);
    return f;
  }

  it("defaults: bound 250 ms, summaries every 100 ms, stale after 3 of them", () => {
    const f = new FleetQueues({ self: "g0" });
    expect(DEFAULT_INVERSION_BOUND_MS).toBe(250);
    expect(DEFAULT_SUMMARY_INTERVAL_MS).toBe(100);
    expect(f.boundMs).toBe(250);
    expect(f.staleMs).toBe(300);
  });

  it("a higher band's oldest beyond the bound blocks; exactly at the bound does not", () => {
    const f = fleet([{ band: 5, count: 2, oldest: at - 250 }]);
    expect(f.blocker(M, 4, at)).toBeUndefined();
    expect(f.blocker(M, 4, at + 1)).toEqual({ gateway: "g1", band: 5, oldest: at - 250, ageMs: 251 });
  });

  it("only bands strictly higher, of the same model, block", () => {
    const f = fleet([{ band: 5, count: 1, oldest: 0 }]);
    expect(f.blocker(M, 5, at)).toBeUndefined();
    expect(f.blocker(M, 6, at)).toBeUndefined();
    expect(f.blocker("other", -16, at)).toBeUndefined();
    expect(f.blocker(M, -16, at)?.band).toBe(5);
  });

  it("the age is measured without comparing clocks: a publisher an hour ahead blocks the same", () => {
    const hour = 3_600_000;
    // Published at its ts = at + 1 h, oldest waited 100 ms then; received at our `at`.
    const f = fleet([{ band: 2, count: 1, oldest: at + hour - 100 }], { ts: at + hour, receivedAt: at });
    expect(f.blocker(M, 0, at + 150)).toBeUndefined();
    expect(f.blocker(M, 0, at + 151)).toMatchObject({ band: 2, ageMs: 251 });
    const behind = fleet([{ band: 2, count: 1, oldest: at - hour - 100 }], { ts: at - hour, receivedAt: at });
    expect(behind.blocker(M, 0, at + 151)).toMatchObject({ band: 2, ageMs: 251 });
  });

  it("a lower but older band of the same replica blocks when the higher one is young", () => {
    const f = fleet([
      { band: 9, count: 1, oldest: at - 10 },
      { band: 3, count: 1, oldest: at - 1_000 },
    ]);
    expect(f.blocker(M, 0, at)).toMatchObject({ band: 3 });
    expect(f.blocker(M, 3, at)).toBeUndefined();
  });

  it("returns the highest blocking band across replicas, then the longest wait", () => {
    const f = new FleetQueues({ self: "g0" });
    f.apply(summary("g2", at, { [M]: [{ band: 6, count: 1, oldest: at - 300 }] }), at);
    f.apply(summary("g3", at, { [M]: [{ band: 6, count: 1, oldest: at - 900 }] }), at);
    f.apply(summary("g4", at, { [M]: [{ band: 8, count: 1, oldest: at - 100 }] }), at);
    // Seen last, the longest wait of all, but a lower band: it does not win.
    f.apply(summary("g1", at, { [M]: [{ band: 3, count: 1, oldest: at - 5_000 }] }), at);
    expect(f.blocker(M, 0, at)).toEqual({ gateway: "g3", band: 6, oldest: at - 900, ageMs: 900 });
    expect(f.blocker(M, 6, at)).toBeUndefined();
    expect(f.blocker(M, 5, at)?.gateway).toBe("g3");
    expect(f.blocker(M, 2, at + 200)?.gateway).toBe("g4"); // g4's band 8 has now waited 300 ms
  });

  it("an emptied replica's next summary lifts its block", () => {
    const f = fleet([{ band: 5, count: 1, oldest: 0 }]);
    expect(f.blocker(M, 0, at)).toBeDefined();
    f.apply(summary("g1", at + 1, {}), at + 1);
    expect(f.blocker(M, 0, at + 1)).toBeUndefined();
  });

  it("a summary not refreshed within staleMs blocks no more (before any sweep), and sweep drops it", () => {
    const f = fleet([{ band: 5, count: 1, oldest: 0 }]);
    expect(f.blocker(M, 0, at + 300)).toBeDefined();
    expect(f.blocker(M, 0, at + 301)).toBeUndefined();
    f.sweep(at + 300);
    expect(f.stats().replicas).toBe(1);
    f.sweep(at + 301);
    expect(f.stats().replicas).toBe(0);
    expect(f.dump()).toEqual([]);
  });

  it("a stale summary is replaced even by a lower ts (the replica restarted with a clock behind)", () => {
    const f = fleet([{ band: 5, count: 1, oldest: 0 }], { ts: 50_000 });
    expect(f.apply(summary("g1", 40_000, {}), at + 100)).toBe(false);
    expect(f.apply(summary("g1", 40_000, {}), at + 301)).toBe(true);
    expect(f.blocker(M, 0, at + 301)).toBeUndefined();
  });
});

describe("fleet queues - summaries out", () => {
  it("summaryOf: per model, the queue's bands without bytes; empty models left out", () => {
    const a = new FlowQueue<null>({ fairness: "round-robin", order: "fcfs", maxRequestsPerBand: 10, maxBytesPerBand: 1e6 });
    const b = new FlowQueue<null>({ fairness: "round-robin", order: "fcfs", maxRequestsPerBand: 10, maxBytesPerBand: 1e6 });
    const r = (band: number, at: number) => ({ band, flow: "u", enqueuedAt: at, expiresAt: at + 1e4, deadline: at + 1e4, bytes: 100, value: null });
    a.enqueue(r(2, 7));
    a.enqueue(r(2, 5));
    a.enqueue(r(-1, 9));
    const s = summaryOf("g1", 20, new Map([
      ["m-a", a],
      ["m-b", b],
    ]));
    expect(s).toEqual({
      gateway: "g1",
      ts: 20,
      models: {
        "m-a": [
          { band: 2, count: 2, oldest: 5 },
          { band: -1, count: 1, oldest: 9 },
        ],
      },
    });
    // What goes on the wire comes back the same.
    expect(parseSummary(JSON.parse(JSON.stringify(s)))).toEqual({ summary: s, truncated: false });
  });

  it("a model named __proto__ stays a plain key end to end", () => {
    const q = { summary: () => [{ band: 1, count: 1, oldest: 0 }] };
    const s = summaryOf("g1", 1, new Map([["__proto__", q]]));
    expect(Object.getPrototypeOf(s.models)).toBe(Object.prototype);
    expect(Object.keys(s.models)).toEqual(["__proto__"]);
    const f = new FleetQueues({ self: "g0" });
    expect(f.apply(JSON.parse(JSON.stringify(s)), 1)).toBe(true);
    expect(f.blocker("__proto__", 0, 260)?.band).toBe(1);
    expect(Object.keys(f.dump()[0]!.models)).toEqual(["__proto__"]);
  });
});

describe("fleet queues - summaries checked against their subject, bands and clock", () => {
  const one = (band: number, oldest = 0) => ({ [M]: [{ band, count: 1, oldest }] });

  it("accepts a summary only from the gateway its subject names; another gateway's credentials cannot shadow it", () => {
    const f = new FleetQueues({ self: "g0" });
    expect(f.applyFrom("g1", summary("g1", 100, one(1)), 100)).toEqual({ stored: true });
    // g2 publishes on its own subject a summary naming g1, with a later ts, to shadow g1's.
    expect(f.applyFrom("g2", summary("g1", 10_000, one(16)), 101)).toEqual({ stored: false, refused: "wrong-gateway" });
    expect(f.applyFrom(undefined, summary("g1", 10_000, one(16)), 101)).toEqual({ stored: false, refused: "wrong-gateway" });
    expect(f.applyFrom("g1", summary("g1", 200, one(2)), 200)).toEqual({ stored: true });
    expect(f.dump()).toEqual([summary("g1", 200, one(2))]);
    expect(f.stats().wrongGateway).toBe(2);
  });

  it("bands outside [-16, 16] are malformed", () => {
    const f = new FleetQueues({ self: "g0" });
    for (const band of [17, -17, 1_000_000]) expect(f.applyFrom("g1", summary("g1", 1, one(band)), 1)).toEqual({ stored: false, refused: "malformed" });
    expect(f.applyFrom("g1", summary("g1", 1, one(16)), 1).stored).toBe(true);
    expect(f.applyFrom("g1", summary("g1", 2, one(-16)), 2).stored).toBe(true);
    expect(f.stats().malformed).toBe(3);
  });

  it("a ts ahead of the receive time by more than maxFutureMs is refused: it would make the gateway's real summaries look old", () => {
    const f = new FleetQueues({ self: "g0", maxFutureMs: 5_000 });
    expect(f.applyFrom("g1", summary("g1", 1_000 + 5_001, one(16)), 1_000)).toEqual({ stored: false, refused: "future-ts" });
    // Within the skew allowance it is stored, and the next real summary (later ts) replaces it.
    expect(f.applyFrom("g1", summary("g1", 1_000 + 5_000, one(3)), 1_000).stored).toBe(true);
    expect(f.applyFrom("g1", summary("g1", 6_001, one(1)), 1_100).stored).toBe(true);
    expect(f.stats().futureTs).toBe(1);
  });

  it("a band older than maxAgeMs at publication is refused (no request is held that long)", () => {
    const f = new FleetQueues({ self: "g0", maxAgeMs: 60_000 });
    expect(f.applyFrom("g1", summary("g1", 100_000, one(16, 100_000 - 60_001)), 100_000)).toEqual({ stored: false, refused: "too-old" });
    expect(f.blocker(M, 0, 100_000)).toBeUndefined();
    expect(f.applyFrom("g1", summary("g1", 100_000, one(16, 40_000)), 100_000).stored).toBe(true);
    expect(f.blocker(M, 0, 100_000)?.gateway).toBe("g1");
    expect(f.stats().tooOld).toBe(1);
  });

  it("a malformed payload is refused, never thrown", () => {
    const f = new FleetQueues({ self: "g0" });
    for (const x of [null, 1, "x", { gateway: "g1" }, { gateway: "g1", ts: 1, models: { [M]: [{ band: 1.5, count: 1, oldest: 0 }] } }]) {
      expect(f.applyFrom("g1", x, 1)).toEqual({ stored: false, refused: "malformed" });
    }
    expect(f.applyFrom("g1", summary("g1", 1, {}), Number.NaN)).toEqual({ stored: false, refused: "malformed" });
  });
});

describe("fleet queues - checkSummary, the one trust check every reader uses", () => {
  const ok = (count: number) => ({ gateway: "gw-a", ts: 1_000, models: { m: [{ band: 0, count, oldest: 900 }] } });

  it("keeps an honest summary and refuses one that speaks for another gateway's subject", () => {
    expect(checkSummary("gw-a", ok(3), 1_000).parsed?.summary.models.m).toEqual([{ band: 0, count: 3, oldest: 900 }]);
    expect(checkSummary("gw-b", ok(3), 1_000).refused).toBe("wrong-gateway");
    expect(checkSummary(undefined, ok(3), 1_000).refused).toBe("wrong-gateway");
  });

  it("refuses a count no replica can hold (a forged queue signal for the autoscaler or adapter demand)", () => {
    expect(checkSummary("gw-a", ok(MAX_BAND_COUNT), 1_000).parsed).toBeDefined();
    expect(checkSummary("gw-a", ok(MAX_BAND_COUNT + 1), 1_000).refused).toBe("malformed");
  });

  it("refuses a ts far ahead of the receive time", () => {
    expect(checkSummary("gw-a", { ...ok(1), ts: 1_000 + 60_000 }, 1_000).refused).toBe("future-ts");
  });
});
