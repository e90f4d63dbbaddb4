import { describe, expect, it } from "vitest";
import { normalise } from "./combine.js";
import { leastKvCacheStrategy } from "./least-kv-cache.js";
import { leastRequestStrategy } from "./least-request.js";
import { cachedSpecCount, findStrategy, isStrategySpecError, parseStrategy, StrategySpecError } from "./registry.js";
import { ctxOf, sample } from "./testing.js";

describe("combination - spec parsing", () => {
  it.each([
    { spec: "least-request", name: "least-request" },
    { spec: "least-request:3", name: "least-request" },
    { spec: "least-kv-cache:2,least-request:1", name: "least-kv-cache:2,least-request:1" },
    { spec: " least-kv-cache : 2 , least-request ", name: "least-kv-cache:2,least-request:1" },
    { spec: "least-request:0.5,random:.25,throughput:2.", name: "least-request:0.5,random:0.25,throughput:2" },
    { spec: "slo-pack-load", name: "slo-pack-load" },
    { spec: "session-affinity:3,least-request", name: "session-affinity:3,least-request:1" },
  ])("$spec -> $name", ({ spec, name }) => {
    expect(parseStrategy(spec).name).toBe(name);
    expect(findStrategy(spec)?.name).toBe(name);
  });

  it("a single name is the registered strategy itself", () => {
    expect(parseStrategy("least-request")).toBe(leastRequestStrategy);
    expect(parseStrategy("least-kv-cache:7")).toBe(leastKvCacheStrategy);
  });

  it.each([
    { spec: "", part: undefined, message: /empty/ },
    { spec: "   ", part: undefined, message: /empty/ },
    { spec: "nope", part: "nope", message: /unknown routing strategy "nope"; known: random, least-request/ },
    { spec: "least-request,nope:2", part: "nope:2", message: /unknown routing strategy "nope"/ },
    { spec: "least-request,,random", part: "", message: /empty part/ },
    { spec: "least-request,", part: "", message: /empty part/ },
    { spec: "least-request:0", part: "least-request:0", message: /weight of "least-request" must be a positive number, got "0"/ },
    { spec: "least-request:-1", part: "least-request:-1", message: /positive number/ },
    { spec: "least-request:abc", part: "least-request:abc", message: /positive number/ },
    { spec: "least-request:1e3", part: "least-request:1e3", message: /positive number/ },
    { spec: "least-request:", part: "least-request:", message: /positive number, got ""/ },
    { spec: "least-request:Infinity", part: "least-request:Infinity", message: /positive number/ },
    { spec: "random,least-request,random:2", part: "random:2", message: /"random" appears twice/ },
    { spec: "slo,least-request", part: "slo", message: /"slo" is exclusive and cannot be combined/ },
    { spec: "least-request:1,slo-pack-load:1", part: "slo-pack-load", message: /exclusive/ },
    { spec: "x".repeat(600), part: undefined, message: /longer than 512/ },
    { spec: Array(17).fill("random").join(","), part: undefined, message: /more than 16/ },
  ])("refuses $spec", ({ spec, part, message }) => {
    let err: unknown;
    try {
      parseStrategy(spec);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StrategySpecError);
    expect(isStrategySpecError(err)).toBe(true);
    expect((err as StrategySpecError).spec).toBe(spec);
    expect((err as StrategySpecError).part).toBe(part);
    expect((err as Error).message).toMatch(message);
    expect(findStrategy(spec)).toBeUndefined();
  });

  it("caches parsed combinations, bounded", () => {
    const a = parseStrategy("least-request:1,random:0.1");
    expect(parseStrategy("least-request:1,random:0.1")).toBe(a);
    for (let w = 1; w <= 400; w++) parseStrategy(`least-request:1,random:${w}`);
    expect(cachedSpecCount()).toBeLessThanOrEqual(256);
  });
});

describe("combination - normalisation", () => {
  it.each([
    { name: "lower is better: min -> 1, max -> 0", scores: [1, 3, 5], better: "lower" as const, want: [1, 0.5, 0] },
    { name: "higher is better: max -> 1, min -> 0", scores: [1, 3, 5], better: "higher" as const, want: [0, 0.5, 1] },
    { name: "missing -> 0 (worst), ignored for min/max", scores: [2, undefined, 4], better: "lower" as const, want: [1, 0, 0] },
    { name: "all equal: no opinion, everyone 1", scores: [7, 7, 7], better: "lower" as const, want: [1, 1, 1] },
    { name: "equal present values still beat missing", scores: [7, undefined], better: "higher" as const, want: [1, 0] },
    { name: "a single pod", scores: [3], better: "lower" as const, want: [1] },
  ])("$name", ({ scores, better, want }) => {
    expect(normalise(scores, better)).toEqual(want);
  });
});

describe("combination - weights and picks", () => {
  // least-kv-cache prefers p1 (0.1 vs 0.9); least-request prefers p2 (0 vs 10 in flight).
  const conflict = { pods: ["p1", "p2"], load: { p1: sample({ kvCacheUsage: 0.1 }), p2: sample({ kvCacheUsage: 0.9 }) }, inFlight: { p1: 10, p2: 0 } };

  it.each([
    { spec: "least-kv-cache:2,least-request:1", want: "p1", scores: [2, 1] },
    { spec: "least-kv-cache:1,least-request:2", want: "p2", scores: [1, 2] },
    { spec: "least-kv-cache:1.5,least-request:0.5", want: "p1", scores: [1.5, 0.5] },
  ])("$spec picks $want", ({ spec, want, scores }) => {
    const p = parseStrategy(spec).pick(ctxOf(conflict));
    expect(p.pod.pod).toBe(want);
    expect(p.candidates.map((c) => c.score)).toEqual(scores);
    expect(p.better).toBe("higher");
  });

  it("equal weighted sums tie, broken at random", () => {
    const s = parseStrategy("least-kv-cache:1,least-request:1");
    expect(s.pick(ctxOf({ ...conflict, random: () => 0 })).pod.pod).toBe("p1");
    expect(s.pick(ctxOf({ ...conflict, random: () => 0.99 })).pod.pod).toBe("p2");
  });

  it("a pod missing one scorer's metric scores 0 for that scorer only", () => {
    const ctx = ctxOf({ pods: ["p1", "p2", "p3"], load: { p1: sample({ kvCacheUsage: 0.5 }), p2: sample({ kvCacheUsage: 0.2 }) }, inFlight: { p1: 0, p2: 4, p3: 0 } });
    const p = parseStrategy("least-kv-cache:1,least-request:1").pick(ctx);
    // p1: kv 0 + lr 1; p2: kv 1 + lr 0; p3: kv missing 0 + lr 1 -> three-way tie at 1.
    expect(p.candidates.map((c) => c.score)).toEqual([1, 1, 1]);
  });

  it("a scorer blind for every pod adds nothing; the others decide", () => {
    const p = parseStrategy("least-kv-cache:5,least-request:1").pick(ctxOf({ pods: ["p1", "p2"], inFlight: { p1: 3, p2: 1 } }));
    expect(p.pod.pod).toBe("p2");
    expect(p.fallback).toBeUndefined();
  });

  it("every scorer blind: least-request", () => {
    const p = parseStrategy("least-kv-cache,least-busy-time").pick(ctxOf({ pods: ["p1", "p2"], load: { p1: "stale" }, inFlight: { p1: 3, p2: 1 } }));
    expect(p.pod.pod).toBe("p2");
    expect(p.fallback).toBe("least-request");
  });

  it("random adds noise scaled by its weight", () => {
    const p = parseStrategy("least-kv-cache:1,random:0.1").pick(ctxOf({ pods: ["p1", "p2"], load: { p1: sample({ kvCacheUsage: 0.3 }), p2: sample({ kvCacheUsage: 0.3 }) }, random: () => 0.5 }));
    // Both kv equal (1 each); random scores equal too (0.5 each -> normalised 1): a tie.
    expect(p.candidates.map((c) => c.score)).toEqual([1.1, 1.1]);
  });
});
