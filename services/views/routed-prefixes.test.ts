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

  it("holds the same entries whatever order the routings were applied in (a gateway's own at once, its peers' from the stream)", () => {
    // g1 routes blocks 1-2 to pod a at t=105 and applies it at once; g2's routing of the same
    // blocks to a at t=100 reaches g1 later. Replay applies g2's (up to the decision's cursor)
    // before g1's own: both must then agree that a was routed them at 105, not 100.
    const own = { model: "m", pod: "a", ts: 105, ttlMs: 60_000 };
    const peer = { model: "m", pod: "a", ts: 100, ttlMs: 60_000 };
    const live = new RoutedPrefixes();
    live.add(own, H(1, 2));
    live.add(peer, H(1, 2));
    const replayed = new RoutedPrefixes();
    replayed.add(peer, H(1, 2));
    replayed.add(own, H(1, 2));
    expect(live.dump(0)).toEqual(replayed.dump(0));
    // 5,103 ms: within 5 s of 105 (counts) but not of 100.
    expect(live.match("m", H(1, 2), 5_103, ["a"], 5_000).blocks.get("a")).toBe(2);
    expect(replayed.match("m", H(1, 2), 5_103, ["a"], 5_000).blocks.get("a")).toBe(2);
  });

  it("keeps the most recently routed pods of a block, whatever the order they arrived in", () => {
    const routings = ["a", "b", "c", "d"].map((pod, i) => ({ model: "m", pod, ts: 100 + i * 10, ttlMs: 60_000 }));
    const dumps = [routings, [...routings].reverse(), [routings[2], routings[0], routings[3], routings[1]]].map((order) => {
      const r = new RoutedPrefixes({ maxPodsPerBlock: 2 });
      for (const ev of order) r.add(ev as (typeof routings)[number], H(7));
      return r.dump(0);
    });
    expect(dumps[0]).toEqual([[expect.any(String), ["c@120", "d@130"]]]);
    expect(dumps[1]).toEqual(dumps[0]);
    expect(dumps[2]).toEqual(dumps[0]);
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
