import { describe, expect, it } from "vitest";
import { StrategySpecError, strategyNames } from "../routing/strategies/registry.js";
import { mulberry32 } from "../shared/seeded-random.js";
import { FLEET_DEFAULTS } from "../sim/options.js";
import { chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
import { runWhatIf, simulateWhatIf, type TraceRequest, TTFT_EDGES_MS, ttftHistogram, WHATIF_ENGINE_DEFAULTS, type WhatIfOptions } from "./whatif.js";

const T0 = 1_700_000_000_000;
const SEED = chainSeed("m", null, 16);

/** Real router hashes (unpadded hex, as hashToHex writes them) of a token sequence. */
const hashesOf = (tokens: readonly number[], maxBlocks?: number): string[] => promptBlockHashes(tokens, SEED, 16, maxBlocks).map(hashToHex);

const tokens = (rnd: () => number, n: number): number[] => Array.from({ length: n }, () => 100 + Math.floor(rnd() * 31_000));

interface Workload {
  prompts: number;
  perPrompt: number;
  systemTokens: number;
  userTokens: number;
  ratePerS: number;
  outputTokens: number;
  seed: number;
  /** Bound on recorded hashes per request (the gateway's maxBlocks). */
  maxBlocks?: number;
}

/** Requests that each start with one of `prompts` system prompts, then a message of their own; Poisson arrivals. */
function sharedPromptTrace(w: Workload): TraceRequest[] {
  const rnd = mulberry32(w.seed);
  const systems = Array.from({ length: w.prompts }, () => tokens(rnd, w.systemTokens));
  const trace: TraceRequest[] = [];
  let ts = T0;
  for (let i = 0; i < w.prompts * w.perPrompt; i++) {
    ts += (-Math.log(1 - rnd()) / w.ratePerS) * 1000;
    const prompt = [...(systems[Math.floor(rnd() * w.prompts)] as number[]), ...tokens(rnd, w.userTokens)];
    trace.push({ requestId: `req-${i}`, ts, model: "m", blockSize: 16, hashes: hashesOf(prompt, w.maxBlocks), promptTokens: prompt.length, outputTokens: w.outputTokens });
  }
  return trace;
}

const request = (requestId: string, atMs: number, hashes: readonly string[], promptTokens: number, outputTokens = 4, model = "m"): TraceRequest => ({
  requestId,
  ts: T0 + atMs,
  model,
  blockSize: 16,
  hashes,
  promptTokens,
  outputTokens,
});

// 16 system prompts of 2048 tokens: 32k tokens of shared prefixes, twice what one pod caches
// (16k tokens here) but half what the fleet caches. Routed at random, every pod cycles through all
// 16 and evicts; routed by prefix, each pod keeps its share. 6 req/s keeps a randomly routed
// fleet 50-80% busy (asserted below, so the premise cannot silently drift).
const SHARED: Workload = { prompts: 16, perPrompt: 60, systemTokens: 2048, userTokens: 71, ratePerS: 6, outputTokens: 16, seed: 3 };
const SMALL_CACHE: WhatIfOptions["engine"] = { kvCapacityTokens: 16_384 };

describe("simulateWhatIf: strategies compared on engine caches", () => {
  it("prefix-cache gets a clearly higher hit rate and a far lower TTFT p50 than random on shared system prompts", () => {
    for (const seed of [3, 11]) {
      const trace = sharedPromptTrace({ ...SHARED, seed });
      const random = runWhatIf(trace, { strategy: "random", podsPerModel: { m: 4 }, engine: SMALL_CACHE });
      const prefix = runWhatIf(trace, { strategy: "prefix-cache", podsPerModel: { m: 4 }, engine: SMALL_CACHE });
      // Observed: random hit 0.44-0.45, p50 548 ms, busy 0.62-0.63; prefix-cache hit 0.94-0.95, p50 18 ms.
      expect(random.busyFraction).toBeGreaterThan(0.5);
      expect(random.busyFraction).toBeLessThan(0.85);
      expect(random.summary.completed).toBe(trace.length);
      expect(prefix.summary.completed).toBe(trace.length);
      expect(prefix.summary.hitRate).toBeGreaterThan(random.summary.hitRate + 0.3);
      expect(prefix.summary.ttft.p50Ms as number).toBeLessThan((random.summary.ttft.p50Ms as number) / 5);
      expect(prefix.summary.ttft.p99Ms as number).toBeLessThan(random.summary.ttft.p99Ms as number);
      // Random routing thrashed every cache; the routers' view still folded to what each engine holds.
      expect(random.prefixViewMismatches).toBe(0);
      expect(prefix.prefixViewMismatches).toBe(0);
    }
  });

  it("sends a repeated prompt to the pod whose cache holds it, which then prefills only the uncached tail", () => {
    const hashes = hashesOf(tokens(mulberry32(1), 128));
    // 8 full blocks + 4 tokens. The first prefill costs 132 × 0.25 ms; the repeat hits 8 blocks
    // and computes 4 tokens (1 ms). Any other pod would have taken 33 ms again.
    const trace = [request("a", 0, hashes, 132), request("b", 10_000, hashes, 132)];
    const s = simulateWhatIf(trace, { strategy: "prefix-cache", podsPerModel: { m: 8 } });
    expect(s.ttft.p50Ms).toBe(1);
    expect(s.ttft.p99Ms).toBe(33);
    expect(s.hitRate).toBeCloseTo(128 / 264, 10);
  });

  it("stops matching once the holding pod has evicted the prefix", () => {
    const rnd = mulberry32(2);
    const first = hashesOf(tokens(rnd, 128));
    // The tiny cache (64 blocks) is overwritten by three long unrelated prompts on every pod.
    const fillers = [1, 2, 3].flatMap((k) => [0, 1].map((p) => request(`fill-${k}-${p}`, 1_000 * k, hashesOf(tokens(rnd, 48 * 16)), 48 * 16, 1)));
    const trace = [request("a", 0, first, 132), ...fillers, request("b", 20_000, first, 132)];
    const run = runWhatIf(trace, { strategy: "prefix-cache", podsPerModel: { m: 2 }, engine: { kvCapacityTokens: 64 * 16 } });
    expect(run.summary.completed).toBe(trace.length);
    // No pod still holds a's blocks, so b computes its whole prompt again (33 ms), like a.
    expect(run.summary.ttft.counts[TTFT_EDGES_MS.indexOf(50)]).toBe(2);
    // Evictions (BlockRemoved) left the prefix view equal to the engines' caches.
    expect(run.prefixViewMismatches).toBe(0);
  });
});

describe("simulateWhatIf: determinism and accounting", () => {
  const trace = sharedPromptTrace({ ...SHARED, perPrompt: 15 });

  it("gives exactly the same summary for the same trace and options", () => {
    for (const strategy of ["random", "prefix-cache:2,least-request:1", "least-latency"]) {
      const opts: WhatIfOptions = { strategy, podsPerModel: { m: 4 }, engine: SMALL_CACHE, seed: 7 };
      expect(runWhatIf(trace, opts)).toEqual(runWhatIf(trace, opts));
    }
  });

  it("does not depend on the order the trace lists requests in, only on their arrival times", () => {
    const opts: WhatIfOptions = { strategy: "least-request", podsPerModel: { m: 4 }, engine: SMALL_CACHE };
    const shuffled = [...trace].sort((a, b) => (a.requestId.length % 3) - (b.requestId.length % 3) || b.ts - a.ts);
    expect(simulateWhatIf(shuffled, opts)).toEqual(simulateWhatIf(trace, opts));
  });

  it("uses the seed for random tie-breaks", () => {
    const a = simulateWhatIf(trace, { strategy: "random", podsPerModel: { m: 4 }, engine: SMALL_CACHE, seed: 1 });
    const b = simulateWhatIf(trace, { strategy: "random", podsPerModel: { m: 4 }, engine: SMALL_CACHE, seed: 2 });
    expect(a.ttft).not.toEqual(b.ttft);
  });

  it("completes every request and releases every charge exactly once, under every built-in strategy", () => {
    const small = sharedPromptTrace({ ...SHARED, perPrompt: 8, ratePerS: 12 });
    for (const strategy of strategyNames()) {
      const run = runWhatIf(small, { strategy, podsPerModel: { m: 3 }, engine: SMALL_CACHE });
      // The strategy name rides along so a failure says which strategy broke.
      expect({ ...run.summary, ttft: run.summary.ttft.n, spec: strategy }).toMatchObject({ spec: strategy, requests: small.length, completed: small.length, ttft: small.length });
      expect(run).toMatchObject({ ledgerSize: 0, charged: small.length, released: small.length, rejected: 0, inFlight: 0, pendingTimers: 0, prefixViewMismatches: 0 });
      expect(run.summary.makespanMs).toBeGreaterThan((small.at(-1) as TraceRequest).ts - small[0]!.ts);
    }
  });

  it("reports progress about every 1% of arrivals, ending at the total", () => {
    const calls: Array<[number, number]> = [];
    simulateWhatIf(trace, { strategy: "random", podsPerModel: { m: 4 }, onProgress: (done, total) => calls.push([done, total]) });
    expect(calls.at(-1)).toEqual([trace.length, trace.length]);
    expect(calls.length).toBe(100);
    expect(calls.every(([d], i) => i === 0 || d > (calls[i - 1] as [number, number])[0])).toBe(true);
  });

  it("compresses the arrivals by `speedup`", () => {
    const light = sharedPromptTrace({ ...SHARED, perPrompt: 10, ratePerS: 1 });
    const opts: WhatIfOptions = { strategy: "prefix-cache", podsPerModel: { m: 4 } };
    const span = (light.at(-1) as TraceRequest).ts - light[0]!.ts;
    const normal = simulateWhatIf(light, opts);
    const fast = simulateWhatIf(light, { ...opts, speedup: 4 });
    // Makespan = last arrival + its service time (a second at most when this light).
    expect(normal.makespanMs).toBeGreaterThan(span);
    expect(normal.makespanMs).toBeLessThan(span + 1_000);
    expect(fast.makespanMs).toBeGreaterThan(span / 4);
    expect(fast.makespanMs).toBeLessThan(span / 4 + 1_000);
  });

  it("simulates each model on its own fleet", () => {
    const rnd = mulberry32(9);
    const mixed = Array.from({ length: 60 }, (_, i) => request(`r${i}`, i * 50, hashesOf(tokens(rnd, 64)), 70, 4, i % 3 === 0 ? "big" : "small"));
    const run = runWhatIf(mixed, { strategy: "least-request", podsPerModel: { big: 2 }, defaultPods: 3 });
    expect(run).toMatchObject({ ledgerSize: 0, charged: 60, released: 60, inFlight: 0, pods: { big: 2, small: 3 } });
    expect(run.summary.completed).toBe(60);
  });
});

describe("simulateWhatIf: trace edge cases", () => {
  it("handles truncated hashes: only the recorded blocks can be shared", () => {
    const full = sharedPromptTrace({ ...SHARED, perPrompt: 20 });
    const truncated = sharedPromptTrace({ ...SHARED, perPrompt: 20, maxBlocks: 8 });
    const opts: WhatIfOptions = { strategy: "prefix-cache", podsPerModel: { m: 4 }, engine: SMALL_CACHE };
    const f = simulateWhatIf(full, opts);
    const t = simulateWhatIf(truncated, opts);
    expect(t.completed).toBe(truncated.length);
    expect(t.hitRate).toBeGreaterThan(0);
    // At most 8 blocks of a 2119-token prompt can hit.
    expect(t.hitRate).toBeLessThanOrEqual((8 * 16) / 2119);
    expect(f.hitRate).toBeGreaterThan(0.5);
    // The part past the bound is prefilled every time.
    expect(t.ttft.p50Ms as number).toBeGreaterThan(f.ttft.p50Ms as number);
  });

  it("takes hashes × blockSize as the prompt length when promptTokens is smaller, and at least one token", () => {
    const hashes = hashesOf(tokens(mulberry32(4), 128));
    // One request alone on an idle pod: TTFT = prompt tokens × 0.25 ms (one prefill step).
    expect(simulateWhatIf([request("short", 0, hashes, 10)], { strategy: "random", podsPerModel: {} }).ttft.p50Ms).toBe(32);
    expect(simulateWhatIf([request("empty", 0, [], 0)], { strategy: "random", podsPerModel: {} }).ttft.p50Ms).toBe(0.25);
    // Overrides left undefined (unset CLI flags) keep the defaults.
    expect(simulateWhatIf([request("short", 0, hashes, 10)], { strategy: "random", podsPerModel: {}, engine: { prefillMsPerToken: undefined } }).ttft.p50Ms).toBe(32);
    // Zero-padded and upper-case hex name the same blocks as hashToHex's form.
    const padded = hashes.map((h) => h.toUpperCase().padStart(16, "0"));
    const s = simulateWhatIf([request("a", 0, hashes, 132), request("b", 5_000, padded, 132)], { strategy: "prefix-cache", podsPerModel: { m: 4 } });
    expect(s.ttft.p50Ms).toBe(1);
  });

  it("returns an empty summary for an empty trace", () => {
    const calls: number[] = [];
    const run = runWhatIf([], { strategy: "random", podsPerModel: {}, onProgress: (d) => calls.push(d) });
    expect(run.summary).toEqual({
      strategy: "random",
      requests: 0,
      completed: 0,
      ttft: { edgesMs: [...TTFT_EDGES_MS], counts: TTFT_EDGES_MS.map(() => 0), n: 0, p50Ms: null, p99Ms: null },
      hitRate: 0,
      makespanMs: 0,
    });
    expect(run).toMatchObject({ ledgerSize: 0, pendingTimers: 0 });
    expect(calls).toEqual([]);
    // Under 100 arrivals, every arrival is a new percent.
    const few: number[] = [];
    simulateWhatIf([request("a", 0, [], 8), request("b", 1, [], 8), request("c", 2, [], 8)], { strategy: "random", podsPerModel: {}, onProgress: (d) => few.push(d) });
    expect(few).toEqual([1, 2, 3]);
  });

  it("rejects an unknown strategy with parseStrategy's error naming it, before simulating anything", () => {
    const trace = [request("a", 0, [], 10)];
    for (const [spec, named] of [["nope", "nope"], ["prefix-cache:2,nope", "nope"], ["random:zero", "random"]] as const) {
      let err: unknown;
      try {
        simulateWhatIf(trace, { strategy: spec, podsPerModel: {} });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(StrategySpecError);
      expect((err as StrategySpecError).spec).toBe(spec);
      expect((err as Error).message).toContain(JSON.stringify(named));
    }
    expect(() => simulateWhatIf([], { strategy: "nope", podsPerModel: {} })).toThrow(StrategySpecError);
  });

  it("refuses malformed hashes and block sizes the engine cannot share blocks at", () => {
    const hashes = hashesOf(tokens(mulberry32(5), 32));
    expect(() => simulateWhatIf([request("bad-hash", 0, ["12g4"], 16)], { strategy: "random", podsPerModel: {} })).toThrow(/bad-hash.*"12g4"/);
    expect(() => simulateWhatIf([request("long", 0, ["1".repeat(17)], 16)], { strategy: "random", podsPerModel: {} })).toThrow(/not a 64-bit hex/);
    const mixed = [request("a", 0, hashes, 32), { ...request("b", 10, hashes, 64), blockSize: 32 }];
    expect(() => simulateWhatIf(mixed, { strategy: "random", podsPerModel: {} })).toThrow(/request b: hashed with block size 32.*blocks of 16/);
    expect(() => simulateWhatIf([request("a", 0, hashes, 32)], { strategy: "random", podsPerModel: {}, engine: { blockSize: 32 } })).toThrow(/block size 16.*blocks of 32/);
    expect(() => simulateWhatIf([{ ...request("a", 0, ["1", "2"], 8), blockSize: 4 }], { strategy: "random", podsPerModel: {} })).toThrow(/blockSize must be an integer >= 5/);
    expect(() => simulateWhatIf([request("a", 0, [], 8)], { strategy: "random", podsPerModel: {}, engine: { decodeMsPerStep: 0 } })).toThrow(/decodeMsPerStep/);
    expect(() => simulateWhatIf([request("a", 0, [], 8)], { strategy: "random", podsPerModel: { m: 0 } })).toThrow(/podsPerModel\["m"\]/);
  });

  it("does not route a request that cannot fit one pod's KV cache, and serves the rest", () => {
    const trace = [request("ok-1", 0, [], 100), request("huge", 10, [], 70_000), request("ok-2", 20, [], 100)];
    const run = runWhatIf(trace, { strategy: "least-request", podsPerModel: { m: 2 } });
    expect(run.summary).toMatchObject({ requests: 3, completed: 2 });
    expect(run).toMatchObject({ rejected: 1, charged: 2, released: 2, ledgerSize: 0 });
  });

  it("defaults the engine to the simulator's own defaults", () => {
    const { maxBatch, maxNumBatchedTokens, prefillMsPerToken, decodeMsPerStep, decodeBatchSlope, kvCapacityTokens } = FLEET_DEFAULTS;
    expect(WHATIF_ENGINE_DEFAULTS).toEqual({ maxBatch, maxNumBatchedTokens, prefillMsPerToken, decodeMsPerStep, decodeBatchSlope, kvCapacityTokens });
  });
});

describe("ttftHistogram", () => {
  it("counts samples into the report's buckets (upper edges inclusive, the last takes the overflow)", () => {
    const h = ttftHistogram([0, 10, 10.5, 25, 99, 30_000, 30_001, 1e9]);
    expect(h.edgesMs).toEqual([10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000]);
    expect(h.counts).toEqual([2, 2, 0, 1, 0, 0, 0, 0, 0, 0, 3]);
    expect(h.n).toBe(8);
  });

  it("takes p50 and p99 from the exact samples (nearest rank), null when there are none", () => {
    const samples = Array.from({ length: 1000 }, (_, i) => 1000 - i);
    expect(ttftHistogram(samples)).toMatchObject({ p50Ms: 500, p99Ms: 990 });
    expect(ttftHistogram([7])).toMatchObject({ p50Ms: 7, p99Ms: 7 });
    expect(ttftHistogram([])).toMatchObject({ n: 0, p50Ms: null, p99Ms: null });
  });
});

describe("simulateWhatIf: speed (sanity bound only)", () => {
  it("simulates tens of thousands of requests a second on a 4-pod fleet with short outputs", () => {
    const rnd = mulberry32(6);
    const systems = Array.from({ length: 32 }, () => hashesOf(tokens(rnd, 256)));
    const n = 30_000;
    let ts = T0;
    const trace: TraceRequest[] = [];
    for (let i = 0; i < n; i++) {
      ts += (-Math.log(1 - rnd()) / 120) * 1000;
      // 16 shared blocks + 2 of the request's own (fake but distinct) + a 5-token remainder.
      const hashes = [...(systems[Math.floor(rnd() * systems.length)] as string[]), (i * 2 + 1).toString(16), (i * 2 + 2).toString(16)];
      trace.push({ requestId: `p${i}`, ts, model: "m", blockSize: 16, hashes, promptTokens: 18 * 16 + 5, outputTokens: 8 });
    }
    const opts: WhatIfOptions = { strategy: "prefix-cache", podsPerModel: { m: 4 } };
    simulateWhatIf(trace.slice(0, 3_000), opts); // warm-up (JIT)
    const start = performance.now();
    const s = simulateWhatIf(trace, opts);
    const perSecond = n / ((performance.now() - start) / 1000);
    console.info(`whatif: ${Math.round(perSecond)} simulated requests/s (4 pods, 293-token prompts, 8 output tokens, hit rate ${s.hitRate.toFixed(2)})`);
    expect(s.completed).toBe(n);
    expect(perSecond).toBeGreaterThan(2_000);
  });
});
