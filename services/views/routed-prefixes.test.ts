import { describe, expect, it } from "vitest";
import { RoutedPrefixes } from "./routed-prefixes.js";

const H = (...xs: number[]) => xs.map(BigInt);

describe("routed prefixes - shared routing history", () => {
  it("matches each pod's leading run of routed blocks, stopping at its first miss", () => {
    const r = new RoutedPrefixes();
    r.add({ model: "m", pod: "a", ts: 0, ttlMs: 1000 }, H(1, 2, 3));
    r.add({ model: "m", pod: "b", ts: 0, ttlMs: 1000 }, H(1, 9));
    const m = r.match("m", H(1, 2, 3, 4), 10, ["a", "b", "c"]);
    expect(Object.fromEntries(m.blocks)).toEqual({ a: 3, b: 1 });
    expect(r.match("other", H(1, 2), 10, ["a"]).blocks.size).toBe(0);
  });

  it("expires entries and sweeps them", () => {
    const r = new RoutedPrefixes();
    r.add({ model: "m", pod: "a", ts: 0, ttlMs: 100 }, H(1, 2));
    expect(r.match("m", H(1, 2), 99, ["a"]).blocks.get("a")).toBe(2);
    expect(r.match("m", H(1, 2), 100, ["a"]).blocks.size).toBe(0);
    expect(r.sweep(100)).toBe(2);
    expect(r.size).toBe(0);
  });

  it("stays within its block bound and forgets removed pods", () => {
    const r = new RoutedPrefixes({ maxBlocks: 3 });
    r.add({ model: "m", pod: "a", ts: 0, ttlMs: 1000 }, H(1, 2, 3, 4, 5));
    expect(r.size).toBe(3);
    expect(r.evicted).toBe(2);
    r.add({ model: "m", pod: "b", ts: 0, ttlMs: 1000 }, H(5));
    r.removePod("m", "a");
    expect(r.match("m", H(5), 1, ["a", "b"]).blocks.get("b")).toBe(1);
    expect(r.match("m", H(3), 1, ["a", "b"]).blocks.size).toBe(0);
  });

  it("a maximum age bounds what counts, independently of the publisher's TTL", () => {
    const r = new RoutedPrefixes();
    r.add({ model: "m", pod: "a", ts: 0, ttlMs: 120_000 }, H(1, 2));
    expect(r.match("m", H(1, 2), 4_000, ["a"], 5_000).blocks.get("a")).toBe(2);
    expect(r.match("m", H(1, 2), 6_000, ["a"], 5_000).blocks.size).toBe(0);
    expect(r.match("m", H(1, 2), 6_000, ["a"]).blocks.get("a")).toBe(2);
  });
});
