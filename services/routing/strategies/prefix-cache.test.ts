import { describe, expect, it } from "vitest";
import { prefixCachePrebleStrategy, prefixCacheStrategy } from "./prefix-cache.js";
import { registryHas } from "./prefix-cache.test-support.js";
import type { PodInfo } from "../../views/pod-set.js";
import type { RoutingContext } from "./types.js";

const pod = (name: string): PodInfo => ({ model: "m", pod: name, address: `${name}:1`, engine: "vllm", role: "combined", adapters: [], labels: {}, ready: true, updatedAt: 0 });

function ctx(inFlight: Record<string, number | undefined>, matched: Record<string, number | undefined> | undefined, queried = 10, random = () => 0): RoutingContext {
  return {
    request: { model: "m", requestId: "r", promptTokens: queried * 16 },
    pods: Object.keys(inFlight).map(pod),
    now: 0,
    random,
    ledger: { outstanding: (_m, p) => ({ requests: inFlight[p] ?? 0, promptTokens: (inFlight[p] ?? 0) * 100, prefillRequests: 0, prefillTokens: 0 }) },
    load: { fresh: () => undefined, get: () => undefined },
    ...(matched ? { prefix: { queried, blockSize: 16, matched: (p: string) => matched[p] ?? 0 } } : {}),
  };
}

describe("prefix-cache - AIBrix semantics on the shared index", () => {
  const s = prefixCacheStrategy();
  it.each([
    { name: "longest match wins", inFlight: { a: 1, b: 1, c: 1 }, matched: { a: 2, b: 7, c: 0 }, want: "b", fallback: undefined },
    { name: "equal match: fewer in flight", inFlight: { a: 2, b: 1, c: 3 }, matched: { a: 5, b: 5, c: 5 }, want: "b", fallback: undefined },
    { name: "a pod above mean + 2 sd is not eligible", inFlight: { a: 7, b: 1, c: 1, d: 1, e: 1, f: 1, g: 1, h: 1 }, matched: { a: 9, b: 3 }, want: "b", fallback: undefined },
    { name: "one request in flight on the holder of the prefix keeps it eligible", inFlight: { a: 1, b: 0, c: 0 }, matched: { a: 9, b: 0, c: 0 }, want: "a", fallback: undefined },
    { name: "imbalance beyond 8 -> least-request", inFlight: { a: 10, b: 1 }, matched: { a: 0, b: 9 }, want: "b", fallback: "least-request (imbalance)" },
    { name: "imbalance guard even against the match", inFlight: { a: 1, b: 10 }, matched: { a: 0, b: 9 }, want: "a", fallback: "least-request (imbalance)" },
    { name: "no match -> least-request", inFlight: { a: 3, b: 1 }, matched: { a: 0, b: 0 }, want: "b", fallback: "least-request (no match)" },
    { name: "no index -> least-request", inFlight: { a: 3, b: 1 }, matched: undefined, want: "b", fallback: "least-request" },
  ])("$name", ({ inFlight, matched, want, fallback }) => {
    const p = s.pick(ctx(inFlight, matched));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBe(fallback);
  });
});

describe("prefix-cache-preble", () => {
  it("best match above half the prompt: least loaded among the best matches", () => {
    expect(prefixCachePrebleStrategy.pick(ctx({ a: 4, b: 2, c: 0 }, { a: 8, b: 8, c: 1 })).pod.pod).toBe("b");
  });
  it("otherwise the cost model: uncached prefill + queued work", () => {
    // Prompt 160 tokens. a: 112 uncached, idle -> 112; c: 160 uncached, idle -> 160; b: 96 + 3 x 100.
    expect(prefixCachePrebleStrategy.pick(ctx({ a: 0, b: 3, c: 0 }, { a: 3, b: 4, c: 0 })).pod.pod).toBe("a");
    // a now has one request in flight (100 prompt tokens queued): 212 > 160.
    expect(prefixCachePrebleStrategy.pick(ctx({ a: 1, b: 3, c: 0 }, { a: 3, b: 4, c: 0 })).pod.pod).toBe("c");
  });
  it("is registered by name", () => {
    expect(registryHas("prefix-cache")).toBe(true);
    expect(registryHas("prefix-cache-preble")).toBe(true);
  });
});
