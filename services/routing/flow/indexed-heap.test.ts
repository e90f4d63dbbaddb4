import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { IndexedHeap } from "./indexed-heap.js";

interface Item {
  key: number;
  id: number;
  at: number;
}

const heap = () =>
  new IndexedHeap<Item>(
    (a, b) => a.key < b.key || (a.key === b.key && a.id < b.id),
    (x) => x.at,
    (x, i) => {
      x.at = i;
    },
  );

const sorted = (xs: Item[]) => [...xs].sort((a, b) => a.key - b.key || a.id - b.id);

describe("indexed heap", () => {
  it("removes any item and keeps popping in order, over random push/remove/pop histories", () => {
    const op = fc.oneof(
      fc.record({ k: fc.constant("push" as const), key: fc.integer({ min: 0, max: 50 }) }),
      fc.record({ k: fc.constant("remove" as const), pick: fc.nat() }),
      fc.record({ k: fc.constant("pop" as const) }),
    );
    fc.assert(
      fc.property(fc.array(op, { minLength: 100, maxLength: 400 }), (ops) => {
        const h = heap();
        let held: Item[] = [];
        let id = 0;
        for (const o of ops) {
          if (o.k === "push") {
            const x = { key: o.key, id: id++, at: -1 };
            h.push(x);
            held.push(x);
          } else if (o.k === "remove") {
            if (held.length === 0) continue;
            const x = held[o.pick % held.length]!;
            expect(h.remove(x)).toBe(true);
            expect(h.remove(x)).toBe(false);
            expect(x.at).toBe(-1);
            held = held.filter((y) => y !== x);
          } else {
            const want = sorted(held)[0];
            expect(h.pop()).toBe(want);
            held = held.filter((y) => y !== want);
          }
          expect(h.size).toBe(held.length);
          expect(h.peek()).toBe(sorted(held)[0]);
        }
        const out: Item[] = [];
        for (let x = h.pop(); x !== undefined; x = h.pop()) out.push(x);
        expect(out).toEqual(sorted(held));
      }),
      { numRuns: 300 },
    );
  });

  it("rebuild restores the order after the ordering changed", () => {
    let desc = false;
    const h = new IndexedHeap<Item>(
      (a, b) => (desc ? a.key > b.key : a.key < b.key),
      (x) => x.at,
      (x, i) => {
        x.at = i;
      },
    );
    const items = [5, 1, 9, 3, 7, 2, 8].map((key, id) => ({ key, id, at: -1 }));
    for (const x of items) h.push(x);
    desc = true;
    h.rebuild();
    // Removal by position still works after the rebuild moved everything.
    expect(h.remove(items[0]!)).toBe(true);
    const out: number[] = [];
    for (let x = h.pop(); x !== undefined; x = h.pop()) out.push(x.key);
    expect(out).toEqual([9, 8, 7, 3, 2, 1]);
  });

  it("an item is not removed from a heap it is not in", () => {
    const a = heap();
    const b = heap();
    const x = { key: 1, id: 1, at: -1 };
    const y = { key: 2, id: 2, at: -1 };
    a.push(x);
    b.push(y);
    // y's position (0) is valid in a, but a holds x there.
    expect(a.remove(y)).toBe(false);
    expect(a.peek()).toBe(x);
  });
});
