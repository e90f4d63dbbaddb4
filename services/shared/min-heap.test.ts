import { describe, expect, it } from "vitest";
import { mulberry32 } from "./seeded-random.js";
import { MinHeap } from "./min-heap.js";

describe("min-heap", () => {
  it("pops in the caller's order, ties broken by the caller's key", () => {
    const r = mulberry32(7);
    const items = Array.from({ length: 2_000 }, (_, n) => ({ at: Math.floor(r() * 50), n }));
    const h = new MinHeap<{ at: number; n: number }>((a, b) => (a.at !== b.at ? a.at < b.at : a.n < b.n));
    for (const x of items) h.push(x);
    expect(h.size).toBe(2_000);
    const out: Array<{ at: number; n: number }> = [];
    for (let x = h.pop(); x !== undefined; x = h.pop()) out.push(x);
    expect(out).toEqual([...items].sort((a, b) => a.at - b.at || a.n - b.n));
    expect(h.pop()).toBeUndefined();
  });

  it("retain keeps a valid heap of what it keeps", () => {
    const h = new MinHeap<number>((a, b) => a < b);
    for (const x of [9, 3, 7, 1, 8, 2, 6]) h.push(x);
    h.retain((x) => x % 2 === 0);
    expect(h.peek()).toBe(2);
    h.push(5);
    expect([h.pop(), h.pop(), h.pop(), h.pop(), h.pop()]).toEqual([2, 5, 6, 8, undefined]);
  });
});
