/**
 * The what-if's simulated pods (whatif.ts): one SimEngine each, with the router's view of what it
 * caches (folded from its KV cache events) and the load sample a scrape of it publishes. Pure.
 */
import type { LoadSample } from "../../schemas/events.js";
import type { EngineConfig, EngineObserver, EngineSnapshot } from "../sim/engine.js";
import { SimEngine } from "../sim/engine.js";
import { engineHashSeed, type KvCacheEvent } from "../sim/kv-cache.js";
import type { PrefixMatchInfo } from "../routing/mod.js";
import type { PodInfo } from "../views/pod-set.js";
import type { VirtualClock } from "./virtual-clock.js";
import { decodeRouterHash, HASH_TOKENS } from "./sim-prompts.js";

export type HistKey = "ttft" | "itl" | "e2e" | "queue" | "prefill" | "decode" | "promptTokens" | "generationTokens";
export const HIST_KEYS: readonly HistKey[] = ["ttft", "itl", "e2e", "queue", "prefill", "decode", "promptTokens", "generationTokens"];

export interface PodSim {
  readonly info: PodInfo;
  /** A scaled fleet's lifecycle (whatif.ts): created, routable once ready, leaving once draining. */
  state: "starting" | "ready" | "draining";
  readonly createdAt: number;
  /** Draining: removed at this time at the latest (the drain handshake's grace). */
  drainDeadline?: number;
  readonly engine: SimEngine;
  /** Router hashes (16-digit lower-case hex) of the blocks this engine caches right now. */
  readonly held: Set<string>;
  /** Engine block hash -> router hash, to undo a BlockRemoved (which names engine hashes only). */
  readonly byEngineHash: Map<bigint, string>;
  /** What the pod's /metrics histograms would sum and count (seconds, tokens), as vLLM records them. */
  readonly hist: Record<HistKey, { sum: number; count: number }>;
  /** Added to every TTFT measured on the pod (a calibrated class's time outside the engine). */
  readonly ttftOffsetMs: number;
}

/** A new pod's settings in a scaled fleet (the first pod class's). */
export interface PodTemplate {
  readonly config: EngineConfig;
  readonly ttftOffsetMs: number;
  readonly podClass: string;
}

/** One model's simulated pods. */
export interface Fleet {
  readonly model: string;
  readonly blockSize: number;
  readonly totalBlocks: number;
  /** Routable pods (ready, not draining) in PodSet's name order; a new array on every change. */
  pods: readonly PodInfo[];
  /** Every pod that exists (starting, ready, draining), by name. */
  readonly byName: Map<string, PodSim>;
  readonly sims: PodSim[];
  /** Pods a scaled fleet removed: their engines' totals still count. */
  readonly retired: PodSim[];
  readonly template: PodTemplate;
  /** The next new pod's index (sim-<n>). */
  nextIndex: number;
}

export function loadSampleOf(fleet: Fleet, sim: PodSim, snap: EngineSnapshot, now: number): LoadSample {
  const histograms: Record<string, { sum: number; count: number }> = {};
  for (const k of HIST_KEYS) histograms[k] = { sum: sim.hist[k].sum, count: sim.hist[k].count };
  const t = snap.totals;
  return {
    type: "load",
    model: fleet.model,
    pod: sim.info.pod,
    ts: now,
    stale: false,
    load: {
      running: snap.running,
      waiting: snap.waiting,
      kvCacheUsage: snap.kvUsage,
      prefixCacheQueries: t.prefixCacheQueries,
      prefixCacheHits: t.prefixCacheHits,
      // vLLM exports no hit-rate gauge or throughput gauge (SGLang does).
      cacheHitRate: null,
      promptTokens: t.promptTokens,
      generationTokens: t.generationTokens,
      genThroughput: null,
      preemptions: t.preemptions,
      blockSize: fleet.blockSize,
      numGpuBlocks: fleet.totalBlocks,
      runningLoras: [],
      waitingLoras: [],
      maxLora: null,
      histograms,
    },
  };
}

/** The prefix strategies' view of one request: the leading blocks each pod's engine holds (memoised per pod). */
export function prefixInfoOf(fleet: Fleet, keys: readonly string[]): PrefixMatchInfo {
  const matchedCache = new Map<string, number>();
  return {
    queried: keys.length,
    blockSize: fleet.blockSize,
    matched(pod) {
      let m = matchedCache.get(pod);
      if (m !== undefined) return m;
      const held = fleet.byName.get(pod)?.held;
      m = 0;
      if (held) while (m < keys.length && held.has(keys[m] as string)) m++;
      matchedCache.set(pod, m);
      return m;
    },
  };
}

export function checkConfig(c: EngineConfig, model: string): void {
  const fail = (field: keyof EngineConfig, rule: string): never => {
    throw new RangeError(`engine.${field} ${rule}, got ${c[field]} (model ${JSON.stringify(model)})`);
  };
  if (!Number.isInteger(c.blockSize) || c.blockSize < HASH_TOKENS) fail("blockSize", `must be an integer >= ${HASH_TOKENS} (a rebuilt block carries its router hash in ${HASH_TOKENS} tokens)`);
  if (!Number.isInteger(c.maxBatch) || c.maxBatch < 1) fail("maxBatch", "must be an integer >= 1");
  if (!Number.isInteger(c.maxNumBatchedTokens) || c.maxNumBatchedTokens < c.maxBatch) fail("maxNumBatchedTokens", `must be an integer >= maxBatch (${c.maxBatch})`);
  // Zero-cost steps would let the engine spin through steps without time moving, and past its
  // per-wake-up step bound it yields to the event loop (setImmediate), which a virtual run has not.
  if (!(c.prefillMsPerToken > 0) || !Number.isFinite(c.prefillMsPerToken)) fail("prefillMsPerToken", "must be > 0 in a simulation");
  if (!(c.decodeMsPerStep > 0) || !Number.isFinite(c.decodeMsPerStep)) fail("decodeMsPerStep", "must be > 0 in a simulation");
  if (!(c.decodeBatchSlope >= 0) || !Number.isFinite(c.decodeBatchSlope)) fail("decodeBatchSlope", "must be >= 0");
  if (!Number.isInteger(c.kvCapacityTokens) || c.kvCapacityTokens < c.blockSize) fail("kvCapacityTokens", `must be an integer >= blockSize (${c.blockSize})`);
}

export function podSim(info: PodInfo, config: EngineConfig, clock: VirtualClock, ttftOffsetMs = 0, createdAt = 0): PodSim {
  const held = new Set<string>();
  const byEngineHash = new Map<bigint, string>();
  const hist = Object.fromEntries(HIST_KEYS.map((k) => [k, { sum: 0, count: 0 }])) as PodSim["hist"];
  const observe = (k: HistKey, v: number): void => {
    hist[k].sum += v;
    hist[k].count++;
  };
  // As services/sim/metrics.ts feeds vLLM's histograms: durations in seconds, request-level
  // histograms only for requests that reached the engine core.
  const observer: EngineObserver = {
    onFirstToken: (ms) => observe("ttft", ms / 1000),
    onInterToken: (ms) => observe("itl", ms / 1000),
    onFinished: (f) => {
      if (f.queueMs === undefined) return;
      observe("e2e", f.e2eMs / 1000);
      observe("queue", f.queueMs / 1000);
      observe("prefill", (f.prefillMs ?? 0) / 1000);
      observe("decode", (f.decodeMs ?? 0) / 1000);
      observe("promptTokens", f.promptTokens);
      observe("generationTokens", f.generationTokens);
    },
  };
  const onEvents = (events: KvCacheEvent[]): void => {
    for (const ev of events) {
      if (ev.type === "BlockStored") {
        const bs = ev.blockSize;
        for (let b = 0; b < ev.blockHashes.length; b++) {
          const key = decodeRouterHash(ev.tokenIds, b * bs);
          // Prompt remainders and generated tokens: no router hash, nothing a router could match.
          if (key === undefined) continue;
          byEngineHash.set(ev.blockHashes[b] as bigint, key);
          held.add(key);
        }
      } else if (ev.type === "BlockRemoved") {
        for (const h of ev.blockHashes) {
          const key = byEngineHash.get(h);
          if (key === undefined) continue;
          byEngineHash.delete(h);
          held.delete(key);
        }
      } else {
        byEngineHash.clear();
        held.clear();
      }
    }
  };
  const engine = new SimEngine(config, clock, observer, { hashSeed: engineHashSeed(`${info.model}\0${info.pod}`), onEvents });
  return { info, state: "ready", createdAt, engine, held, byEngineHash, hist, ttftOffsetMs };
}

/** Whether the pod's folded prefix view names exactly the rebuilt prompt blocks its engine caches. */
export function prefixViewAgrees(sim: PodSim): boolean {
  const listed = new Set<string>();
  for (const b of sim.engine.cacheListing().blocks) {
    const key = decodeRouterHash(b.tokenIds, 0);
    if (key !== undefined) listed.add(key);
  }
  return listed.size === sim.held.size && sim.byEngineHash.size === sim.held.size && [...listed].every((k) => sim.held.has(k));
}