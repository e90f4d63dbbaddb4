import { describe, expect, it } from "vitest";
import type { LatencySample } from "../../schemas/events.js";
import { mulberry32 } from "../shared/seeded-random.js";
import { GatewayState } from "./gateway-state.js";
import { BUCKET_MS, DEFAULT_PRIOR, LatencyModel, MAX_CLASSES_PER_MODEL, ttftRegressors, tpotRegressors, WINDOW_BUCKETS } from "./latency-model.js";

/** A fixed "fleet": TTFT = 10 + 0.3 ms/token uncached + 0.3 ms/token queued + 2 ms/decoding (x speed), TPOT = 12 + 1 ms/decoding (x speed). */
function samples(n: number, seed: number, speed: number, cls: string | undefined, t0 = 1_000_000): Array<{ ts: number; s: LatencySample }> {
  const r = mulberry32(seed);
  const out: Array<{ ts: number; s: LatencySample }> = [];
  for (let i = 0; i < n; i++) {
    const prompt = 100 + Math.floor(r() * 2000);
    const cached = Math.floor(r() * prompt * 0.8);
    const prefill = Math.floor(r() * 4000);
    const decoding = Math.floor(r() * 16);
    const ttft = speed * (10 + 0.3 * (prompt - cached) + 0.3 * prefill + 2 * decoding);
    const tpot = speed * (12 + decoding);
    out.push({ ts: t0 + i * 10, s: { x: [prompt, cached, prefill, decoding, 0, 0], ...(cls ? { cls } : {}), ttftMs: ttft, tpotMs: tpot } });
  }
  return out;
}
const f = (prompt: number, cached: number, prefill: number, decoding: number) => ({ promptTokens: prompt, cachedTokens: cached, prefillTokens: prefill, decoding, waiting: 0, kvPermille: 0 });

describe("LatencyModel", () => {
  it("predicts from the prior, and says so, before any outcome", () => {
    const m = new LatencyModel();
    const p = m.predict("m", "a100", f(1600, 0, 0, 0), 0);
    const prior = DEFAULT_PRIOR.ttft.reduce((s, w, i) => s + w * (ttftRegressors(f(1600, 0, 0, 0))[i] as number), 0);
    expect(p).toEqual({ ttftMs: prior, tpotMs: DEFAULT_PRIOR.tpot.reduce((s, w, i) => s + w * (tpotRegressors(f(1600, 0, 0, 0))[i] as number), 0), source: "prior", samples: 0 });
  });

  it("pins a fixed sequence: four samples of one class, its fit pulled towards the pooled one and the prior", () => {
    const m = new LatencyModel();
    const seq: Array<[number[], number, number]> = [
      [[1600, 0, 0, 0, 0, 0], 70, 16],
      [[1600, 1440, 0, 1, 0, 100], 14, 17],
      [[3200, 0, 1600, 2, 1, 300], 250, 19],
      [[800, 800, 0, 0, 0, 0], 6, 15],
    ];
    seq.forEach(([x, ttftMs, tpotMs], i) => {
      m.learn("m", 1000 + i, { x, cls: "a", ttftMs, tpotMs });
    });
    const q = f(2000, 400, 800, 1);
    const a = m.predict("m", "a", q, 2000);
    expect(a.source).toBe("class");
    expect(a.samples).toBe(4);
    expect(a.ttftMs).toBeCloseTo(246.60311024520556, 9);
    expect(a.tpotMs).toBeCloseTo(18.02635830011721, 9);
    const b = m.predict("m", "b", q, 2000);
    expect(b).toMatchObject({ source: "pooled", samples: 0 });
    expect(b.ttftMs).toBeCloseTo(311.5922500774762, 9);
  });

  it("learns a class's TTFT and TPOT within a few percent, and the other class from its own samples", () => {
    const m = new LatencyModel();
    for (const { ts, s } of samples(400, 1, 1, "fast")) m.learn("m", ts, s);
    for (const { ts, s } of samples(400, 2, 2.5, "slow")) m.learn("m", ts, s);
    const now = 1_000_000 + 4_000;
    const fast = m.predict("m", "fast", f(1000, 200, 1000, 4), now);
    const slow = m.predict("m", "slow", f(1000, 200, 1000, 4), now);
    const truth = 10 + 0.3 * 800 + 0.3 * 1000 + 8;
    expect(fast.source).toBe("class");
    expect(fast.samples).toBe(400);
    expect(Math.abs(fast.ttftMs - truth) / truth).toBeLessThan(0.03);
    expect(Math.abs(slow.ttftMs - 2.5 * truth) / (2.5 * truth)).toBeLessThan(0.03);
    expect(Math.abs(fast.tpotMs - 16) / 16).toBeLessThan(0.03);
    expect(Math.abs(slow.tpotMs - 40) / 40).toBeLessThan(0.03);
    // A class never seen borrows the model's pooled fit.
    expect(m.predict("m", "h100", f(1000, 200, 1000, 4), now).source).toBe("pooled");
    expect(m.predict("other", "fast", f(1000, 200, 1000, 4), now).source).toBe("prior");
  });

  it("is the same model on two replicas folding the same releases in different orders", () => {
    const all = [...samples(300, 3, 1, "fast"), ...samples(300, 4, 2.5, "slow"), ...samples(50, 5, 1.5, undefined)];
    const a = new LatencyModel();
    const b = new LatencyModel();
    for (const { ts, s } of all) a.learn("m", ts, s);
    const shuffled = [...all];
    const r = mulberry32(9);
    for (let i = shuffled.length - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [shuffled[i], shuffled[j]] = [shuffled[j] as (typeof all)[number], shuffled[i] as (typeof all)[number]];
    }
    for (const { ts, s } of shuffled) b.learn("m", ts, s);
    expect(b.dump()).toEqual(a.dump());
    for (const cls of ["fast", "slow", undefined, "new"]) {
      const pa = a.predict("m", cls, f(777, 300, 2500, 7), 1_003_000);
      const pb = b.predict("m", cls, f(777, 300, 2500, 7), 1_003_000);
      expect(pb.ttftMs).toBe(pa.ttftMs);
      expect(pb.tpotMs).toBe(pa.tpotMs);
    }
  });

  it("is the same model in any fold order while the window moves: late samples, evictions and cached fits included", () => {
    // 3 classes over 40 buckets (the window is 12; "slow" stops after 20): each order rejects as
    // late and evicts other samples as it goes, yet every order must end in the same state (and
    // the same state as one folded in time order); one replica also predicts
    // after every sample (caching fits), including at a time behind the newest sample (a peer's
    // clock ahead of this gateway's).
    const spread = (xs: Array<{ ts: number; s: LatencySample }>, step: number) => xs.map((x, i) => ({ ...x, ts: i * step }));
    const all = [...spread(samples(200, 3, 1, "fast"), 2_003), ...spread(samples(120, 4, 2.5, "slow"), 1_666), ...spread(samples(80, 5, 1.5, undefined), 4_999)];
    const order = (seed: number) => {
      const xs = [...all];
      const r = mulberry32(seed);
      for (let i = xs.length - 1; i > 0; i--) {
        const j = Math.floor(r() * (i + 1));
        [xs[i], xs[j]] = [xs[j] as (typeof all)[number], xs[i] as (typeof all)[number]];
      }
      return xs;
    };
    const inTime = [...all].sort((x, y) => x.ts - y.ts);
    const a = new LatencyModel();
    for (const { ts, s } of inTime) a.learn("m", ts, s);
    const newest = inTime.at(-1)?.ts as number;
    const times = [newest, newest - 5 * BUCKET_MS, newest - 11 * BUCKET_MS, 200_000];
    for (const seed of [11, 12, 13]) {
      const b = new LatencyModel();
      for (const { ts, s } of order(seed)) {
        b.learn("m", ts, s);
        for (const cls of ["fast", "slow"]) b.predict("m", cls, f(777, 300, 2500, 7), newest - 5 * BUCKET_MS);
      }
      expect(b.dump()).toEqual(a.dump());
      for (const now of times) {
        for (const cls of ["fast", "slow", undefined]) expect(b.predict("m", cls, f(777, 300, 2500, 7), now)).toEqual(a.predict("m", cls, f(777, 300, 2500, 7), now));
      }
    }
    expect(a.predict("m", "fast", f(777, 300, 2500, 7), newest).source).toBe("class");
  });

  it("counts and never learns a missing, negative or absurd TTFT; an absurd TPOT keeps the TTFT", () => {
    const m = new LatencyModel();
    const x = [100, 0, 0, 0, 0, 0];
    expect(m.learn("m", 0, { x })).toBe(false);
    expect(m.learn("m", 0, { x, ttftMs: -1 })).toBe(false);
    expect(m.learn("m", 0, { x, ttftMs: 61_000 })).toBe(false);
    expect(m.learn("m", 0, { x, ttftMs: Number.NaN })).toBe(false);
    // A release stamped far ahead of the broker (a skewed gateway clock) would slide the window past the present.
    expect(m.learn("m", 100_000, { x, ttftMs: 50 }, 50_000)).toBe(false);
    expect(m.rejected.future).toBe(1);
    expect(m.rejected).toMatchObject({ ttftMissing: 1, ttftAbsurd: 3 });
    expect(m.predict("m", undefined, f(100, 0, 0, 0), 0).source).toBe("prior");
    expect(m.learn("m", 0, { x, ttftMs: 50, tpotMs: 20_000 })).toBe(true);
    expect(m.rejected.tpotAbsurd).toBe(1);
    expect(m.learned).toBe(1);
  });

  it("forgets samples older than its window and drops late ones", () => {
    const m = new LatencyModel();
    for (const { ts, s } of samples(50, 6, 1, "a", 0)) m.learn("m", ts, s);
    expect(m.predict("m", "a", f(500, 0, 0, 0), 400).source).toBe("class");
    const later = WINDOW_BUCKETS * BUCKET_MS + 1;
    expect(m.predict("m", "a", f(500, 0, 0, 0), later).source).toBe("prior");
    m.learn("m", later, { x: [500, 0, 0, 0, 0, 0], cls: "a", ttftMs: 100 });
    expect(m.learn("m", 0, { x: [500, 0, 0, 0, 0, 0], cls: "a", ttftMs: 100 })).toBe(false);
    expect(m.rejected.late).toBe(1);
  });

  it("keeps one entry per class however many pods share it, and bounds the classes of a model", () => {
    const m = new LatencyModel();
    // 10,000 pods of 4 classes: 4 entries (+ the pooled one).
    for (let pod = 0; pod < 10_000; pod++) m.learn("m", 1_000, { x: [100, 0, 0, 0, 0, 0], cls: `gpu-${pod % 4}`, ttftMs: 20 });
    expect(m.size).toBe(5);
    for (let c = 0; c < 200; c++) m.learn("m2", 1_000, { x: [100, 0, 0, 0, 0, 0], cls: `c${c}`, ttftMs: 20 });
    expect(m.size).toBe(5 + MAX_CLASSES_PER_MODEL + 1);
    expect(m.rejected.full).toBe(200 - MAX_CLASSES_PER_MODEL);
  });

  it("folds releases into GatewayState: a gateway's own at once, the others' from the stream, the same model as an observer's", () => {
    const a = new GatewayState({ self: "gw-a" });
    const observer = new GatewayState();
    const rel = (gateway: string, i: number, s: LatencySample) => ({ type: "release" as const, gateway, model: "m", pod: "p", id: `c${i}`, ts: 1_000_000 + i, outcome: "completed" as const, latency: s });
    const all = [...samples(30, 7, 1, "fast"), ...samples(30, 8, 2, "slow")];
    let seq = 0;
    all.forEach(({ s }, i) => {
      const gateway = i % 2 === 0 ? "gw-a" : "gw-b";
      const ev = rel(gateway, i, s);
      if (gateway === "gw-a") a.ownRelease(ev);
      else a.apply(ev, { stream: "charges", subject: "x", seq: ++seq, serverTs: ev.ts });
    });
    // The observer reads them as a batch, in another order.
    observer.apply({ type: "releases", gateway: "gw-b", model: "m", pod: "p", releases: all.filter((_, i) => i % 2 === 1).map(({ s }, k) => ({ id: `b${k}`, ts: 1_000_000 + 2 * k + 1, outcome: "completed" as const, latency: s })) }, { stream: "charges", subject: "x", seq: 1, serverTs: 0 });
    all.forEach(({ s }, i) => {
      if (i % 2 === 0) observer.apply(rel("gw-a", i, s), { stream: "charges", subject: "x", seq: 2 + i, serverTs: 0 });
    });
    expect(observer.latency.dump()).toEqual(a.latency.dump());
    expect(a.latency.learned).toBe(60);
    // A copy for replay carries the model.
    expect(a.cloneAs("gw-c").latency.dump()).toEqual(a.latency.dump());
  });
});
