import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../shared/seeded-random.js";
import { countInversions, type Dispatch, findInversions, type HeldInterval } from "./inversions.js";

const M = "llama";

/** The contract's definition, word for word, in O(d x h). */
function naive(ds: readonly Dispatch[], hs: readonly HeldInterval[], boundMs: number): number[] {
  const out: number[] = [];
  ds.forEach((d, i) => {
    if (hs.some((h) => h.model === d.model && h.band > d.band && h.enqueuedAt < d.at - boundMs && h.leftAt > d.at)) out.push(i);
  });
  return out;
}

describe("priority inversions - the contract's definition", () => {
  const high: HeldInterval = { model: M, band: 5, enqueuedAt: 1_000, leftAt: 2_000 };

  it("a lower band dispatched while an older higher-band request waited beyond the bound is an inversion", () => {
    expect(countInversions([{ model: M, band: 0, at: 1_500 }], [high])).toBe(1);
  });

  it("the enqueue edge: enqueued exactly at t - bound does not count, 1 ms earlier does", () => {
    expect(countInversions([{ model: M, band: 0, at: 1_250 }], [high], 250)).toBe(0);
    expect(countInversions([{ model: M, band: 0, at: 1_251 }], [high], 250)).toBe(1);
    expect(countInversions([{ model: M, band: 0, at: 1_100 }], [high], 99)).toBe(1);
    expect(countInversions([{ model: M, band: 0, at: 1_100 }], [high], 100)).toBe(0);
  });

  it("the leave edge: a request that left exactly at t was no longer held", () => {
    expect(countInversions([{ model: M, band: 0, at: 2_000 }], [high])).toBe(0);
    expect(countInversions([{ model: M, band: 0, at: 1_999 }], [high])).toBe(1);
    expect(countInversions([{ model: M, band: 0, at: 2_001 }], [high])).toBe(0);
  });

  it("only strictly higher bands of the same model count", () => {
    const at = 1_500;
    expect(countInversions([{ model: M, band: 5, at }], [high])).toBe(0);
    expect(countInversions([{ model: M, band: 6, at }], [high])).toBe(0);
    expect(countInversions([{ model: "other", band: 0, at }], [high])).toBe(0);
    expect(countInversions([{ model: M, band: -16, at }], [high])).toBe(1);
  });

  it("counts dispatches, not pairs: one dispatch behind two waiting requests is one inversion", () => {
    const ds: Dispatch[] = [
      { model: M, band: 0, at: 1_500 },
      { model: M, band: 7, at: 1_500 },
      { model: M, band: 1, at: 1_600 },
      { model: "other", band: 0, at: 1_500 },
    ];
    const hs = [high, { ...high, band: 6 }, { model: "other", band: 1, enqueuedAt: 0, leftAt: 1_400 }];
    expect(findInversions(ds, hs)).toEqual([0, 2]);
    expect(countInversions(ds, hs)).toBe(2);
  });

  it("nothing held, nothing dispatched: no inversions", () => {
    expect(countInversions([], [high])).toBe(0);
    expect(countInversions([{ model: M, band: 0, at: 1 }], [])).toBe(0);
  });

  it("agrees with the definition over random records, out of order, any bound", () => {
    const rec = fc.record({ model: fc.constantFrom("a", "b"), band: fc.integer({ min: -3, max: 3 }) });
    const held = fc.tuple(rec, fc.integer({ min: 0, max: 200 }), fc.integer({ min: 0, max: 100 })).map(([r, enq, wait]) => ({ ...r, enqueuedAt: enq, leftAt: enq + wait }));
    const dispatch = fc.tuple(rec, fc.integer({ min: 0, max: 300 })).map(([r, at]) => ({ ...r, at }));
    fc.assert(
      fc.property(fc.array(dispatch, { maxLength: 60 }), fc.array(held, { maxLength: 60 }), fc.integer({ min: 0, max: 80 }), (ds, hs, bound) => {
        expect(findInversions(ds, hs, bound)).toEqual(naive(ds, hs, bound));
      }),
      { numRuns: 500 },
    );
  });

  it("100,000 dispatches against 100,000 held intervals (sort + sweep, not pairs)", () => {
    const r = mulberry32(19);
    const hs: HeldInterval[] = [];
    const ds: Dispatch[] = [];
    for (let i = 0; i < 100_000; i++) {
      const band = Math.floor(r() * 33) - 16;
      const enqueuedAt = Math.floor(r() * 600_000);
      const leftAt = enqueuedAt + Math.floor(r() * 2_000);
      hs.push({ model: `m${i % 3}`, band, enqueuedAt, leftAt });
      ds.push({ model: `m${i % 3}`, band, at: leftAt });
    }
    const got = findInversions(ds, hs);
    // Spot-check against the definition (a full O(n^2) check is what this must not be).
    const sample = new Set(got);
    for (let k = 0; k < 300; k++) {
      const i = Math.floor(r() * ds.length);
      const d = ds[i]!;
      const want = hs.some((h) => h.model === d.model && h.band > d.band && h.enqueuedAt < d.at - 250 && h.leftAt > d.at);
      expect(sample.has(i)).toBe(want);
    }
    expect(got.length).toBeGreaterThan(0);
    expect(got.length).toBeLessThan(ds.length);
  });
});
