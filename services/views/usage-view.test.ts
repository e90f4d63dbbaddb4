import { describe, expect, it } from "vitest";
import { UsageView } from "./usage-view.js";

const MIN = 60_000;
const T0 = 10 * MIN; // a bucket boundary (30 s buckets)

describe("usage view - tokens", () => {
  it("weighs prompt tokens ×1 and completion tokens ×2", () => {
    const v = new UsageView();
    v.record({ user: "a", promptTokens: 100, completionTokens: 50, ts: T0 });
    v.record({ user: "a", promptTokens: 10, completionTokens: 0, ts: T0 + 1_000 });
    expect(v.tokens("a", T0 + 2_000)).toBe(210);
    expect(v.tokens("nobody", T0)).toBe(0);
  });

  it.each([
    { name: "inside the window", at: T0 + 4 * MIN, want: 100 },
    { name: "last moment its bucket is in the window", at: T0 + 5 * MIN - 1, want: 100 },
    { name: "expired once its bucket leaves the window", at: T0 + 5 * MIN, want: 0 },
    { name: "long gone", at: T0 + 60 * MIN, want: 0 },
  ])("a record at T0 is $name", ({ at, want }) => {
    const v = new UsageView();
    v.record({ user: "a", promptTokens: 100, completionTokens: 0, ts: T0 });
    expect(v.tokens("a", at)).toBe(want);
  });

  it("slides: old buckets expire while new ones count", () => {
    const v = new UsageView();
    for (let m = 0; m < 8; m++) v.record({ user: "a", promptTokens: 1, completionTokens: 0, ts: T0 + m * MIN });
    // At T0 + 7.5 min the window holds the records of minutes 3..7.
    expect(v.tokens("a", T0 + 7 * MIN + 30_000)).toBe(5);
  });

  it("a late record inside the window counts; one older than the window is ignored", () => {
    const v = new UsageView();
    v.record({ user: "a", promptTokens: 10, completionTokens: 0, ts: T0 + 6 * MIN });
    v.record({ user: "a", promptTokens: 5, completionTokens: 0, ts: T0 + 3 * MIN });
    v.record({ user: "a", promptTokens: 7, completionTokens: 0, ts: T0 });
    expect(v.tokens("a", T0 + 6 * MIN)).toBe(15);
    expect(v.ignored).toBe(1);
  });

  it.each([
    { name: "empty user", r: { user: "", promptTokens: 1, completionTokens: 1, ts: T0 } },
    { name: "no tokens", r: { user: "a", promptTokens: 0, completionTokens: 0, ts: T0 } },
    { name: "negative tokens", r: { user: "a", promptTokens: -5, completionTokens: 0, ts: T0 } },
    { name: "NaN tokens", r: { user: "a", promptTokens: Number.NaN, completionTokens: 0, ts: T0 } },
    { name: "NaN time", r: { user: "a", promptTokens: 1, completionTokens: 0, ts: Number.NaN } },
  ])("ignores a record with $name", ({ r }) => {
    const v = new UsageView();
    v.record(r);
    expect(v.size).toBe(0);
    expect(v.ignored).toBe(1);
  });
});

describe("usage view - bounds and memory", () => {
  it("reports min and max over users active in the window", () => {
    const v = new UsageView({ boundsEveryMs: 0 });
    expect(v.bounds(T0)).toEqual({ min: 0, max: 0, users: 0 });
    v.record({ user: "a", promptTokens: 100, completionTokens: 0, ts: T0 });
    v.record({ user: "b", promptTokens: 1000, completionTokens: 0, ts: T0 + 3 * MIN });
    expect(v.bounds(T0 + 3 * MIN)).toEqual({ min: 100, max: 1000, users: 2 });
    // a's record expires; computing the bounds also frees it.
    expect(v.bounds(T0 + 6 * MIN)).toEqual({ min: 1000, max: 1000, users: 1 });
    expect(v.size).toBe(1);
  });

  it("recomputes the bounds at most every boundsEveryMs", () => {
    const v = new UsageView({ boundsEveryMs: 1_000 });
    v.record({ user: "a", promptTokens: 100, completionTokens: 0, ts: T0 });
    expect(v.bounds(T0).max).toBe(100);
    v.record({ user: "b", promptTokens: 500, completionTokens: 0, ts: T0 });
    expect(v.bounds(T0 + 999).max).toBe(100);
    expect(v.bounds(T0 + 1_000).max).toBe(500);
  });

  it("keeps at most maxUsers, dropping the least recently active", () => {
    const v = new UsageView({ maxUsers: 3 });
    for (const [i, user] of ["a", "b", "c"].entries()) v.record({ user, promptTokens: 1, completionTokens: 0, ts: T0 + i });
    v.record({ user: "a", promptTokens: 1, completionTokens: 0, ts: T0 + 10 }); // a is active again
    v.record({ user: "d", promptTokens: 1, completionTokens: 0, ts: T0 + 11 });
    expect(v.size).toBe(3);
    expect(v.evicted).toBe(1);
    expect(v.tokens("b", T0 + 20)).toBe(0);
    expect(v.tokens("a", T0 + 20)).toBe(2);
    expect(v.tokens("d", T0 + 20)).toBe(1);
  });

  it("sweep forgets users with nothing left in the window", () => {
    const v = new UsageView();
    v.record({ user: "a", promptTokens: 1, completionTokens: 0, ts: T0 });
    v.record({ user: "b", promptTokens: 1, completionTokens: 0, ts: T0 + 4 * MIN });
    expect(v.sweep(T0 + 6 * MIN)).toBe(1);
    expect(v.size).toBe(1);
  });

  it("custom window, resolution and weights", () => {
    const v = new UsageView({ windowMs: 10_000, buckets: 5, inputWeight: 0.5, outputWeight: 3 });
    v.record({ user: "a", promptTokens: 10, completionTokens: 10, ts: 0 });
    expect(v.tokens("a", 9_999)).toBe(35);
    expect(v.tokens("a", 10_000)).toBe(0);
  });
});
