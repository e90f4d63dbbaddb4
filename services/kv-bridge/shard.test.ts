import { describe, expect, it } from "vitest";
import { ownsPod, parseShard, shardOwner } from "./shard.js";

const pods = Array.from({ length: 600 }, (_, i) => `vllm-llama-${i.toString(36)}-7f9c`);

describe("kv-bridge shard - rendezvous ownership", () => {
  it("parses i/n and rejects nonsense", () => {
    expect(parseShard("2/5")).toEqual({ index: 2, count: 5 });
    for (const bad of ["5/5", "1", "-1/3", "1/0", "a/b", "1/2/3"]) expect(() => parseShard(bad)).toThrow(/invalid shard/);
  });

  it("each pod has exactly one owner and the load is spread", () => {
    const shards = [0, 1, 2].map((i) => ({ index: i, count: 3 }));
    const counts = shards.map((s) => pods.filter((p) => ownsPod(s, p)).length);
    expect(counts.reduce((a, b) => a + b)).toBe(pods.length);
    for (const c of counts) expect(c).toBeGreaterThan(150);
    expect(pods.every((p) => shards.filter((s) => ownsPod(s, p)).length === 1)).toBe(true);
  });

  it("going from 3 to 4 replicas moves only the pods the new replica takes", () => {
    const moved = pods.filter((p) => shardOwner(p, 3) !== shardOwner(p, 4));
    expect(moved.every((p) => shardOwner(p, 4) === 3)).toBe(true);
    expect(moved.length).toBeGreaterThan(100);
    expect(moved.length).toBeLessThan(200);
  });
});
