import { describe, expect, it } from "vitest";
import { leastBusyTimeStrategy } from "./least-busy-time.js";
import { leastGpuCacheStrategy, leastKvCacheStrategy } from "./least-kv-cache.js";
import { leastLatencyStrategy } from "./least-latency.js";
import { leastTokenLoadStrategy } from "./least-token-load.js";
import { powerOfTwoStrategy } from "./power-of-two.js";
import { ctxOf, hist, type PodLoadSpec, sample, seq, vllmSample } from "./testing.js";
import { throughputStrategy } from "./throughput.js";
import { tieOrderOf } from "./types.js";
import { leastRequestStrategy } from "./least-request.js";

const PODS3 = ["p1", "p2", "p3"];

describe("power-of-two - table", () => {
  it.each([
    // random draws: first pod index = floor(r0 * 3); second among the other two = floor(r1 * 2), shifted past the first.
    { name: "fewer in flight of the two drawn wins", draws: [0, 0.5, 0], inFlight: { p1: 5, p2: 1, p3: 3 }, drawn: ["p1", "p3"], want: "p3" },
    { name: "the global best is missed when not drawn", draws: [0, 0.9, 0], inFlight: { p1: 5, p2: 1, p3: 3 }, drawn: ["p1", "p3"], want: "p3" },
    { name: "second draw below the first keeps its index", draws: [0.5, 0, 0], inFlight: { p1: 5, p2: 1, p3: 3 }, drawn: ["p2", "p1"], want: "p2" },
    { name: "tie: the third draw decides (low)", draws: [0, 0.5, 0], inFlight: { p1: 2, p2: 0, p3: 2 }, drawn: ["p1", "p3"], want: "p1" },
    { name: "tie: the third draw decides (high)", draws: [0, 0.5, 0.9], inFlight: { p1: 2, p2: 0, p3: 2 }, drawn: ["p1", "p3"], want: "p3" },
    { name: "engine queue breaks a ledger tie; missing samples add nothing", draws: [0, 0.5, 0], inFlight: { p1: 1, p2: 0, p3: 1 }, load: { p1: sample({ waiting: 4 }) }, drawn: ["p1", "p3"], want: "p3" },
  ])("$name", ({ draws, inFlight, load, drawn, want }) => {
    const p = powerOfTwoStrategy.pick(ctxOf({ pods: PODS3, inFlight, load: load ?? {}, random: seq(...draws) }));
    expect(p.candidates.map((c) => c.pod.pod)).toEqual(drawn);
    expect(p.pod.pod).toBe(want);
  });

  it("always draws two distinct pods and can draw every pair", () => {
    const pairs = new Set<string>();
    for (let a = 0; a < 1; a += 0.05) {
      for (let b = 0; b < 1; b += 0.05) {
        const p = powerOfTwoStrategy.pick(ctxOf({ pods: ["p1", "p2", "p3", "p4"], random: seq(a, b, 0) }));
        const [x, y] = p.candidates.map((c) => c.pod.pod);
        expect(x).not.toBe(y);
        pairs.add([x, y].sort().join("+"));
      }
    }
    expect(pairs.size).toBe(6);
  });

  it("a single candidate is picked", () => {
    expect(powerOfTwoStrategy.pick(ctxOf({ pods: ["p1"], random: () => 0.99 })).pod.pod).toBe("p1");
  });
});

describe.each([leastKvCacheStrategy, leastGpuCacheStrategy])("$name - table", (strategy) => {
  const kv = (u: number | null) => sample({ kvCacheUsage: u });
  it.each<{ name: string; load: Record<string, PodLoadSpec>; inFlight?: Record<string, number>; random?: number; want: string; fallback?: string }>([
    { name: "lowest usage wins", load: { p1: kv(0.5), p2: kv(0.2), p3: kv(0.9) }, want: "p2" },
    { name: "usage outweighs requests in flight", load: { p1: kv(0.5), p2: kv(0.2), p3: kv(0.9) }, inFlight: { p2: 50 }, want: "p2" },
    { name: "missing sample is never preferred", load: { p1: undefined, p2: kv(0.8), p3: kv(0.9) }, want: "p2" },
    { name: "stale sample is never preferred", load: { p1: "stale", p2: kv(0.8), p3: kv(0.9) }, want: "p2" },
    { name: "sample flagged stale by the scraper is never preferred", load: { p1: "flagged-stale", p2: kv(0.8), p3: kv(0.9) }, want: "p2" },
    { name: "engine without the metric counts as missing", load: { p1: kv(null), p2: kv(0.8), p3: kv(0.9) }, want: "p2" },
    { name: "no metrics anywhere: least-request", load: {}, inFlight: { p1: 3, p2: 2, p3: 1 }, want: "p3", fallback: "least-request" },
    { name: "tie broken at random (low draw)", load: { p1: kv(0.3), p2: kv(0.3), p3: kv(0.5) }, random: 0, want: "p1" },
    { name: "tie broken at random (high draw)", load: { p1: kv(0.3), p2: kv(0.3), p3: kv(0.5) }, random: 0.99, want: "p2" },
  ])("$name", ({ load, inFlight, random, want, fallback }) => {
    const p = strategy.pick(ctxOf({ pods: PODS3, load, inFlight: inFlight ?? {}, random: () => random ?? 0 }));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBe(fallback);
  });

  it("reports raw scores, the worst representable for a pod without metrics", () => {
    const p = strategy.pick(ctxOf({ pods: ["p1", "p2"], load: { p1: kv(0.25) } }));
    expect(p.candidates.map((c) => c.score)).toEqual([0.25, Number.MAX_VALUE]);
    expect(p.better).toBe("lower");
  });
});

describe("tie order only where a replica's own charges move the score", () => {
  const kv = (u: number) => sample({ kvCacheUsage: u });
  const load = { p1: kv(0.3), p2: kv(0.3), p3: kv(0.3) };
  it("a metric-only strategy keeps random ties under a tie order (its scores do not move between samples)", () => {
    const order = tieOrderOf(1, 2, 0); // replica 1 of 2 walks backwards from the end: p3 first
    const picks = [0, 0.5, 0.99].map((r) => leastKvCacheStrategy.pick({ ...ctxOf({ pods: PODS3, load, random: () => r }), ...(order ? { tieOrder: order } : {}) }).pod.pod);
    expect(picks).toEqual(["p1", "p2", "p3"]);
  });

  it("least-request follows the tie order (each pick raises the pod's count)", () => {
    const order = tieOrderOf(1, 2, 0);
    const picks = [0, 0.5, 0.99].map((r) => leastRequestStrategy.pick({ ...ctxOf({ pods: PODS3, random: () => r }), ...(order ? { tieOrder: order } : {}) }).pod.pod);
    expect(picks).toEqual(["p3", "p3", "p3"]);
  });
});

describe("least-token-load - table", () => {
  it.each<{ name: string; prefill?: Record<string, number>; kv?: Record<string, number>; inFlight?: Record<string, number>; load?: Record<string, PodLoadSpec>; random?: number; want: string }>([
    { name: "one long prompt in prefill outweighs several short chats", prefill: { p1: 30_000 }, kv: { p1: 30_000, p2: 600, p3: 900 }, inFlight: { p1: 1, p2: 3, p3: 4 }, want: "p2" },
    { name: "prefill work counts fully, KV held counts 0.3", prefill: { p1: 1_000 }, kv: { p1: 1_000, p2: 4_000 }, want: "p3" },
    { name: "decode-only pod: 0.3 x KV beats prefill of the same size", prefill: { p2: 1_000 }, kv: { p1: 3_000, p2: 1_000, p3: 5_000 }, want: "p1" },
    { name: "engine queue breaks a tie; missing samples add nothing", kv: { p1: 100, p2: 100, p3: 200 }, load: { p1: sample({ waiting: 3 }) }, want: "p2" },
    { name: "idle fleet: tie broken at random (high draw)", random: 0.99, want: "p3" },
  ])("$name", ({ prefill, kv, inFlight, load, random, want }) => {
    const p = leastTokenLoadStrategy.pick(ctxOf({ pods: PODS3, prefillTokensInFlight: prefill ?? {}, promptTokensInFlight: kv ?? {}, inFlight: inFlight ?? {}, load: load ?? {}, random: () => random ?? 0 }));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBeUndefined();
  });

  it("reports the token-load priority as the score", () => {
    const p = leastTokenLoadStrategy.pick(ctxOf({ pods: ["p1", "p2"], prefillTokensInFlight: { p1: 100 }, promptTokensInFlight: { p1: 300, p2: 50 } }));
    expect(p.candidates.map((c) => c.score)).toEqual([190, 15]);
    expect(p.better).toBe("lower");
  });
});

describe("least-busy-time - table", () => {
  const s = (kvCacheUsage: number | null, waiting: number | null = 0, running: number | null = 4) => sample({ kvCacheUsage, waiting, running });
  it.each<{ name: string; load: Record<string, PodLoadSpec>; inFlight?: Record<string, number>; want: string; fallback?: string }>([
    { name: "nothing waiting: lower KV usage (share of capacity in use) wins", load: { p1: s(0.6), p2: s(0.3) }, want: "p2" },
    { name: "an unsaturated pod beats one with a queue", load: { p1: s(0.95), p2: s(0.1, 2) }, want: "p1" },
    { name: "both saturated: shorter queue per running request wins", load: { p1: s(0.9, 8, 4), p2: s(0.9, 2, 4) }, want: "p2" },
    { name: "queue with nothing running counts per one running request", load: { p1: s(0.2, 3, 0), p2: s(0.9, 2, 1) }, want: "p2" },
    { name: "no KV figure and nothing waiting: missing", load: { p1: s(null), p2: s(0.99) }, want: "p2" },
    { name: "no KV figure but a queue: still scored", load: { p1: s(null, 1, 1), p2: s(0.5, 4, 1) }, want: "p1" },
    { name: "stale sample is never preferred", load: { p1: "stale", p2: s(0.99, 10, 1) }, want: "p2" },
    { name: "no metrics anywhere: least-request", load: { p1: "stale" }, inFlight: { p1: 2, p2: 1 }, want: "p2", fallback: "least-request" },
  ])("$name", ({ load, inFlight, want, fallback }) => {
    const p = leastBusyTimeStrategy.pick(ctxOf({ pods: ["p1", "p2"], load, inFlight: inFlight ?? {} }));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBe(fallback);
  });
});

describe("throughput - table", () => {
  const gen = (g: number) => sample({ histograms: { generationTokens: hist(g) } });
  it.each<{ name: string; inFlight: Record<string, number>; prompt?: Record<string, number>; load?: Record<string, PodLoadSpec>; want: string; scores: number[] }>([
    {
      name: "prompt tokens in flight count twice",
      inFlight: { p1: 2, p2: 4 },
      prompt: { p1: 1000, p2: 200 },
      load: { p1: gen(100), p2: gen(100) },
      want: "p2",
      scores: [2 * 1000 + 2 * 100, 2 * 200 + 4 * 100],
    },
    { name: "longer outputs per request weigh more", inFlight: { p1: 2, p2: 3 }, load: { p1: gen(500), p2: gen(100) }, want: "p2", scores: [1000, 300] },
    { name: "missing output mean: the other candidates' mean", inFlight: { p1: 1, p2: 2 }, load: { p2: gen(300) }, want: "p1", scores: [300, 600] },
    { name: "no metrics anywhere: 100 tokens per request, never a fallback", inFlight: { p1: 1, p2: 3 }, prompt: { p1: 500 }, want: "p2", scores: [1100, 300] },
  ])("$name", ({ inFlight, prompt, load, want, scores }) => {
    const p = throughputStrategy.pick(ctxOf({ pods: ["p1", "p2"], inFlight, promptTokensInFlight: prompt ?? {}, load: load ?? {} }));
    expect(p.pod.pod).toBe(want);
    expect(p.candidates.map((c) => c.score)).toEqual(scores);
    expect(p.fallback).toBeUndefined();
  });
});

describe("least-latency - table", () => {
  // Request prompt = 100 tokens = every pod's mean prompt, so prefill is the pod's mean unless stated.
  const fast = vllmSample({ queue: 0.05, prefill: 0.1, decode: 1.0 }); // 0.05 + 0.1 + 1.0 = 1150 ms
  const slow = vllmSample({ queue: 0.1, prefill: 0.2, decode: 2.0 }); // 2300 ms
  const sglang = sample({
    // SGLang: TTFT, ITL, queue histograms and token counters over e2e.count finished requests.
    histograms: { ttft: hist(0.3), queue: hist(0.1), itl: hist(0.02), e2e: hist(3) },
    promptTokens: 1000,
    generationTokens: 1000,
  }); // queue 0.1 + prefill (0.3 - 0.1) + 0.02 × 100 = 2300 ms

  it.each<{ name: string; load: Record<string, PodLoadSpec>; inFlight?: Record<string, number>; promptTokens?: number; want: string; fallback?: string; score?: number }>([
    { name: "lowest queue + prefill + decode wins", load: { p1: slow, p2: fast }, want: "p2", score: 1150 },
    { name: "a long engine queue outweighs fast history", load: { p1: slow, p2: vllmSample({ queue: 0.05, prefill: 0.1, decode: 1.0 }, { waiting: 20 }) }, want: "p1" },
    { name: "requests charged by any gateway but not yet running count as queue", load: { p1: slow, p2: vllmSample({ queue: 0.05, prefill: 0.1, decode: 1.0 }, { running: 5 }) }, inFlight: { p2: 25 }, want: "p1" },
    {
      name: "prefill scales with this prompt: a long prompt goes to the faster prefill per token",
      load: { p1: vllmSample({ prefill: 0.2, prompt: 1000, decode: 1.0 }), p2: vllmSample({ prefill: 0.1, prompt: 100, decode: 1.0 }) },
      promptTokens: 1000,
      want: "p1",
    },
    { name: "SGLang pods are estimated from TTFT and ITL", load: { p1: sglang, p2: slow }, want: "p1", score: 2300 },
    { name: "a pod without a sample is never preferred", load: { p1: slow, p2: undefined }, want: "p1" },
    { name: "a stale pod is never preferred", load: { p1: slow, p2: "stale" }, want: "p1" },
    {
      name: "a fresh pod without finished requests borrows its peers' means (and gets traffic when they queue)",
      load: { p1: vllmSample({ queue: 0.1, prefill: 0.2, decode: 2.0 }, { waiting: 10 }), p2: sample() },
      want: "p2",
      score: 2300,
    },
    { name: "no metrics anywhere: least-request", load: { p1: "stale" }, inFlight: { p1: 1 }, want: "p2", fallback: "least-request" },
  ])("$name", ({ load, inFlight, promptTokens, want, fallback, score }) => {
    const p = leastLatencyStrategy.pick(ctxOf({ pods: ["p1", "p2"], load, inFlight: inFlight ?? {}, ...(promptTokens ? { promptTokens } : {}) }));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBe(fallback);
    if (score !== undefined) expect(p.candidates.find((c) => c.pod.pod === want)?.score).toBeCloseTo(score, 6);
  });
});
