/**
 * The what-if simulation of `jetroute replay --simulate`: re-sends a recorded arrival trace to a
 * simulated fleet under a chosen routing strategy and measures TTFT and prefix-cache hit rate.
 *
 * Everything runs in virtual time (virtual-clock.ts): no timers, no wall clock, no I/O. Each pod
 * is an unmodified `SimEngine` (the simulator's copy of vLLM's scheduler and prefix-caching block
 * pool); routing uses the real strategy objects over a real `ChargeLedger` and `LoadView`. The
 * same trace and options always give the same summary.
 *
 * Hits are decided by the engines' caches, not by the recorded prefix index: a prompt is rebuilt
 * from its recorded router block hashes, block i's tokens derived from hash i alone, so two
 * requests that shared a hash prefix share token blocks and each engine recognises the shared
 * prefix through its own cache, with its own capacity and eviction, as a real engine would. The
 * prefix strategies see what the engines hold through their KV cache events, as the gateway does
 * through the kv-bridge (minus the propagation delay).
 *
 * Reading router hashes back out of cache events: the first five tokens of a rebuilt block encode
 * its 64-bit router hash (14 bits each, ids below HIGH_TOKEN_BASE); every other token that can
 * start a block (prompt remainder, generated tokens) is drawn from HIGH_TOKEN_BASE up. A stored
 * block therefore names its router hash itself, without hashing every prompt a second time per
 * pod to learn the engine's hashes in advance. This needs blocks of at least five tokens and the
 * engine's block size equal to the router's, which jetroute always has (the gateway hashes with
 * the block size the engine reports).
 *
 * Simplifications, each on purpose: one gateway (no peer charges, no tie order); cache events and
 * load samples reach the router without delay (samples on the scrape grid); no optimistic
 * "routed prefixes"; a request that cannot fit one pod's KV cache is refused, no other
 * max_model_len applies (the recorded fleet did serve these prompts); the summary names the
 * strategy by its canonical spec (Strategy.name).
 */
import { mulberry32 } from "../shared/seeded-random.js";
import type { LoadSample } from "../../schemas/events.js";
import type { EngineConfig, EngineObserver, EngineSnapshot } from "../sim/engine.js";
import { SimEngine } from "../sim/engine.js";
import { engineHashSeed, type KvCacheEvent } from "../sim/kv-cache.js";
import { parseStrategy } from "../routing/strategies/registry.js";
import type { PrefixMatchInfo, RoutingContext, Strategy } from "../routing/strategies/types.js";
import { ChargeLedger } from "../views/charge-ledger.js";
import { LoadView } from "../views/load-view.js";
import type { PodInfo } from "../views/pod-set.js";
import type { Histogram, SimulationSummary } from "./report-types.js";
import { VirtualClock } from "./virtual-clock.js";
import { LatencyModel } from "../views/latency-model.js";
import { featureVector, latencyFeaturesOf } from "../routing/strategies/predicted-latency.js";

export interface TraceRequest {
  requestId: string;
  /** Arrival time, epoch ms (the recorded decision time). */
  ts: number;
  model: string;
  /** Router block size the hashes were computed with (tokens per block). */
  blockSize: number;
  /** The prompt's router block hashes (lower-case hex), in order; possibly truncated to a bound. */
  hashes: readonly string[];
  /** Prompt length in tokens (>= hashes.length * blockSize normally; if smaller, use hashes.length * blockSize). */
  promptTokens: number;
  /** Tokens to generate (recorded completion tokens, else max_tokens, else a default of 64). */
  outputTokens: number;
}

export interface WhatIfOptions {
  /** Strategy spec, as accepted by parseStrategy (e.g. "random", "least-request", "prefix-cache", "prefix-cache:2,least-request:1"). */
  strategy: string;
  /** Simulated pods per model (the recorded fleet size); a model missing here gets `defaultPods`. */
  podsPerModel: Readonly<Record<string, number>>;
  defaultPods?: number;
  /** Engine model overrides (defaults: the simulator's defaults from services/sim/options.ts, with the trace's block size). */
  engine?: Partial<EngineConfig>;
  /** Arrival times are divided by this (2 = twice as fast). Default 1. */
  speedup?: number;
  /** Seeds the strategies' random tie-breaks. Default 1. */
  seed?: number;
  /** Load samples reach the router this often (virtual ms), like the metrics-scraper. Default 100. */
  scrapeIntervalMs?: number;
  /** Called every ~1% of arrivals (for a progress bar). */
  onProgress?: (done: number, total: number) => void;
  /**
   * Calibrated fleets (replay's fit of the recorded outcomes, docs/latency-model.md): per model,
   * pods per class with their own engine settings and a fixed TTFT offset (what the recorded TTFT
   * spends outside the engine: network, proxy). A model listed here ignores `podsPerModel`.
   */
  classes?: Readonly<Record<string, ReadonlyArray<SimClass>>>;
}

/** One simulated pod class of a calibrated fleet. */
export interface SimClass {
  readonly podClass: string;
  readonly pods: number;
  readonly engine: Partial<EngineConfig>;
  readonly ttftOffsetMs: number;
}

/** TTFT histogram bucket edges (ms) of the replay report. */
export const TTFT_EDGES_MS: readonly number[] = Object.freeze([10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000]);

/**
 * The simulator's engine defaults (FLEET_DEFAULTS in services/sim/options.ts, checked equal by the
 * test). Copied rather than imported: options.ts pulls in the ZMQ publisher, and this module must
 * stay free of I/O.
 */
export const WHATIF_ENGINE_DEFAULTS: Readonly<Omit<EngineConfig, "blockSize">> = Object.freeze({
  maxBatch: 8,
  maxNumBatchedTokens: 2048,
  prefillMsPerToken: 0.25,
  decodeMsPerStep: 15,
  decodeBatchSlope: 0.05,
  kvCapacityTokens: 65_536,
});

/** Block size of a model none of whose requests carries hashes (the simulator's default). */
const DEFAULT_BLOCK_SIZE = 16;
/** Tokens at the head of a block that carry its router hash. */
const HASH_TOKENS = 5;
const VOCAB_BASE = 100;
const VOCAB_END = 32_000;
/** Ids of hash-carrying head tokens are below this; tokens of unhashed content start here. */
const HIGH_TOKEN_BASE = VOCAB_BASE + (1 << 14);
const GATEWAY = "whatif";
/** Charges here end only by release: no heartbeat lapses and no TTL sweep runs in a simulation. */
const CHARGE_TTL_MS = 2 ** 52;

/** Final state of a run, for tests: what a correct run leaves behind. */
export interface WhatIfRun {
  summary: SimulationSummary;
  /** Charges still in the ledger (0 when every charge was released exactly once). */
  ledgerSize: number;
  charged: number;
  released: number;
  /** Requests that could not fit one pod's KV cache (prompt + output), never routed. */
  rejected: number;
  /** Requests submitted and not finished (0 after a complete run). */
  inFlight: number;
  /** Timers left on the virtual clock (0: nothing was left scheduled). */
  pendingTimers: number;
  /** Share of scrapes, over every pod up to the last finish, that found the pod with work (a utilisation estimate). */
  busyFraction: number;
  /** Simulated pods per model. */
  pods: Record<string, number>;
  /**
   * Pods whose prefix view (the router hashes folded from cache events) differs from what the
   * engine's cache listing holds at the end: 0 unless the event folding is wrong.
   */
  prefixViewMismatches: number;
}

export function simulateWhatIf(trace: readonly TraceRequest[], opts: WhatIfOptions): SimulationSummary {
  return runWhatIf(trace, opts).summary;
}

/** Histogram with the report's bucket edges; p50/p99 are nearest-rank over the exact samples. */
export function ttftHistogram(samplesMs: readonly number[]): Histogram {
  const edges = [...TTFT_EDGES_MS];
  const counts = edges.map(() => 0);
  const last = edges.length - 1;
  for (const v of samplesMs) {
    let i = 0;
    while (i < last && v > (edges[i] as number)) i++;
    counts[i] = (counts[i] as number) + 1;
  }
  const n = samplesMs.length;
  if (n === 0) return { edgesMs: edges, counts, n, p50Ms: null, p99Ms: null };
  const sorted = Float64Array.from(samplesMs).sort();
  const rank = (q: number): number => sorted[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))] as number;
  return { edgesMs: edges, counts, n, p50Ms: rank(0.5), p99Ms: rank(0.99) };
}

type HistKey = "ttft" | "itl" | "e2e" | "queue" | "prefill" | "decode" | "promptTokens" | "generationTokens";
const HIST_KEYS: readonly HistKey[] = ["ttft", "itl", "e2e", "queue", "prefill", "decode", "promptTokens", "generationTokens"];

interface PodSim {
  readonly info: PodInfo;
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

interface Fleet {
  readonly model: string;
  readonly blockSize: number;
  readonly totalBlocks: number;
  readonly pods: readonly PodInfo[];
  readonly byName: ReadonlyMap<string, PodSim>;
  readonly sims: readonly PodSim[];
}

/** `simulateWhatIf` with the end state exposed; internal to the replay command and its tests. */
export function runWhatIf(trace: readonly TraceRequest[], opts: WhatIfOptions): WhatIfRun {
  // First, so a bad spec fails before any work (StrategySpecError names the spec).
  const strategy = parseStrategy(opts.strategy);
  const settings = runSettings(opts);
  const sim = new Simulation(trace, opts, strategy, settings);

  const total = trace.length;
  const order = arrivalOrder(trace);
  const first = order.length > 0 ? (trace[order[0] as number] as TraceRequest).ts : 0;
  if (total > 0) sim.startScrapes();
  let reportedPercent = 0;
  for (let k = 0; k < order.length; k++) {
    const index = order[k] as number;
    const r = trace[index] as TraceRequest;
    sim.advanceTo((r.ts - first) / settings.speedup);
    sim.route(r, index);
    // Once per whole percent reached: at most 100 calls, one per arrival for traces under 100.
    const percent = Math.floor(((k + 1) * 100) / total);
    if (percent > reportedPercent) {
      reportedPercent = percent;
      opts.onProgress?.(k + 1, total);
    }
  }
  sim.drain();
  return sim.result(total);
}

interface RunSettings {
  speedup: number;
  seed: number;
  scrapeIntervalMs: number;
  defaultPods: number;
}

/** The run's options with their defaults, checked. */
function runSettings(opts: WhatIfOptions): RunSettings {
  const speedup = opts.speedup ?? 1;
  const seed = opts.seed ?? 1;
  const scrapeIntervalMs = opts.scrapeIntervalMs ?? 100;
  const defaultPods = opts.defaultPods ?? 4;
  if (!(speedup > 0) || !Number.isFinite(speedup)) throw new RangeError(`speedup must be a positive number, got ${speedup}`);
  if (!(scrapeIntervalMs > 0) || !Number.isFinite(scrapeIntervalMs)) throw new RangeError(`scrapeIntervalMs must be a positive number, got ${scrapeIntervalMs}`);
  if (!Number.isInteger(defaultPods) || defaultPods < 1) throw new RangeError(`defaultPods must be an integer >= 1, got ${defaultPods}`);
  return { speedup, seed, scrapeIntervalMs, defaultPods };
}

/**
 * One run in virtual time: the simulated fleets, the router's views of them (ledger, load samples,
 * prefix views), and the tallies the result reports.
 */
class Simulation {
  private readonly clock = new VirtualClock();
  readonly ledger = new ChargeLedger({ self: GATEWAY });
  readonly load: LoadView;
  private readonly latency = new LatencyModel();
  private readonly random: () => number;
  private readonly fleets: Map<string, Fleet>;
  private readonly ttfts: number[] = [];
  private charged = 0;
  private released = 0;
  private rejected = 0;
  private completed = 0;
  private inFlight = 0;
  private lastFinishMs = 0;
  /** Virtual time of the next arrival (+Infinity once every request has arrived). */
  private nextArrivalMs = 0;
  private tickIndex = 0;
  private busySamples = 0;

  constructor(
    trace: readonly TraceRequest[],
    opts: WhatIfOptions,
    private readonly strategy: Strategy,
    private readonly settings: RunSettings,
  ) {
    // Simulated scrapes never fail, so no sample should ever read as missing: the gateway's 2 s
    // staleness bound, widened when the interval itself is that long.
    this.load = new LoadView(Math.max(2_000, 2 * settings.scrapeIntervalMs));
    this.random = mulberry32(settings.seed);
    this.fleets = buildFleets(trace, opts, settings.defaultPods, this.clock);
  }

  startScrapes(): void {
    this.clock.at(0, this.scrape);
  }

  /** Runs the fleet up to the next arrival, at virtual time `atMs`. */
  advanceTo(atMs: number): void {
    this.nextArrivalMs = atMs;
    this.clock.runUntil(atMs);
  }

  /** After the last arrival: runs the fleet until nothing is left scheduled. */
  drain(): void {
    this.nextArrivalMs = Number.POSITIVE_INFINITY;
    this.clock.run();
  }

  /**
   * Scrapes run on a fixed grid (k × interval). While the whole fleet is idle nothing a scrape
   * reads can change, so the grid points up to the next arrival are skipped: the sample the
   * router then sees is the one the skipped scrapes would have produced.
   */
  private readonly scrape = (): void => {
    const now = this.clock.now();
    let idle = true;
    for (const fleet of this.fleets.values()) {
      for (const sim of fleet.sims) {
        const snap = sim.engine.snapshot();
        if (snap.running > 0 || snap.waiting > 0) {
          idle = false;
          this.busySamples++;
        }
        this.load.apply(loadSampleOf(fleet, sim, snap, now));
      }
    }
    if (idle && !Number.isFinite(this.nextArrivalMs)) return;
    const interval = this.settings.scrapeIntervalMs;
    this.tickIndex = idle ? Math.max(this.tickIndex + 1, Math.floor(this.nextArrivalMs / interval)) : this.tickIndex + 1;
    this.clock.at(this.tickIndex * interval, this.scrape);
  };

  /** Routes arrival `index` of the trace now and submits it to the picked pod's engine. */
  route(r: TraceRequest, index: number): void {
    const fleet = this.fleets.get(r.model) as Fleet;
    const now = this.clock.now();
    // buildFleets has checked that hashed requests use the fleet's block size.
    const { keys, hi, lo } = parseHashes(r);
    const promptLen = Math.max(1, keys.length * fleet.blockSize, finiteInt(r.promptTokens, 0));
    const outputLen = Math.max(1, finiteInt(r.outputTokens, 64));
    // A real engine refuses a request that cannot fit its KV cache alone (max_model_len); the
    // simulated one would throw. Such a request is not routed and does not complete.
    if (Math.ceil((promptLen + outputLen) / fleet.blockSize) > fleet.totalBlocks) {
      this.rejected++;
      return;
    }
    const ctx: RoutingContext = {
      // No user and no session in a trace: vtc-basic and session-affinity take their fallbacks.
      request: { model: r.model, requestId: r.requestId, promptTokens: promptLen },
      pods: fleet.pods,
      load: this.load,
      ledger: this.ledger,
      now,
      random: this.random,
      prefix: prefixInfoOf(fleet, keys),
      latency: this.latency,
    };
    const picked = this.strategy.pick(ctx).pod;
    const sim = fleet.byName.get(picked.pod);
    if (!sim) throw new Error(`strategy ${this.strategy.name} picked ${picked.pod}, which is not a candidate for ${r.model}`);
    // Unique per arrival: request ids may repeat in a trace (retries), charges must not collide.
    const chargeId = String(index);
    // The picked pod's features before this request's own charge counts on it (as the director's).
    const sample = featureVector(latencyFeaturesOf(this, picked, promptLen, ctx.prefix, now));
    if (!this.ledger.charge({ type: "charge", id: chargeId, gateway: GATEWAY, model: r.model, pod: picked.pod, ts: now, ttlMs: CHARGE_TTL_MS, promptTokens: promptLen }, now)) {
      throw new Error(`charge ${chargeId} was refused by the ledger`);
    }
    this.charged++;
    this.inFlight++;
    let firstAt: number | undefined;
    sim.engine.submit({
      promptTokens: promptTokens(hi, lo, promptLen, fleet.blockSize, r.requestId),
      outputTokens: highTokens(r.requestId, 0x6f7574, outputLen),
      onToken: (_token, i, atMs) => {
        if (i !== 0) return;
        firstAt = atMs;
        this.ttfts.push(atMs - now + sim.ttftOffsetMs);
        this.ledger.markDecoding(GATEWAY, chargeId);
      },
      onFinish: () => {
        // The simulated fleet learns its own latency model, as a gateway would (predicted-latency*).
        const end = this.clock.now();
        if (firstAt !== undefined) this.latency.learn(r.model, end, { x: sample, ...(picked.podClass ? { cls: picked.podClass } : {}), ttftMs: firstAt - now + sim.ttftOffsetMs, ...(outputLen > 1 ? { tpotMs: (end - firstAt) / (outputLen - 1) } : {}) });
        if (this.ledger.release({ gateway: GATEWAY, id: chargeId })) this.released++;
        this.inFlight--;
        this.completed++;
        this.lastFinishMs = Math.max(this.lastFinishMs, this.clock.now());
      },
    });
  }

  /** The end state of a run of `total` arrivals. */
  result(total: number): WhatIfRun {
    let hits = 0;
    let queries = 0;
    let podCount = 0;
    let prefixViewMismatches = 0;
    const pods: Record<string, number> = {};
    for (const fleet of this.fleets.values()) {
      pods[fleet.model] = fleet.sims.length;
      for (const sim of fleet.sims) {
        podCount++;
        if (!prefixViewAgrees(sim)) prefixViewMismatches++;
        const t = sim.engine.snapshot().totals;
        hits += t.prefixCacheHits;
        queries += t.prefixCacheQueries;
      }
    }
    const { completed, lastFinishMs } = this;
    return {
      summary: {
        strategy: this.strategy.name,
        requests: total,
        completed,
        ttft: ttftHistogram(this.ttfts),
        hitRate: queries > 0 ? hits / queries : 0,
        makespanMs: completed > 0 ? lastFinishMs : 0,
      },
      ledgerSize: this.ledger.size,
      charged: this.charged,
      released: this.released,
      rejected: this.rejected,
      inFlight: this.inFlight,
      pendingTimers: this.clock.pending,
      // Skipped scrapes were all idle ones, so the grid up to the last finish is the denominator.
      busyFraction: completed > 0 ? this.busySamples / (podCount * (Math.floor(lastFinishMs / this.settings.scrapeIntervalMs) + 1)) : 0,
      pods,
      prefixViewMismatches,
    };
  }
}

/** The load sample a scrape of `sim` at `now` publishes, from its engine's snapshot. */
function loadSampleOf(fleet: Fleet, sim: PodSim, snap: EngineSnapshot, now: number): LoadSample {
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
function prefixInfoOf(fleet: Fleet, keys: readonly string[]): PrefixMatchInfo {
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

/** Trace indices by arrival time, ties in trace order (the trace is usually sorted already). */
function arrivalOrder(trace: readonly TraceRequest[]): Uint32Array {
  const order = new Uint32Array(trace.length);
  let sorted = true;
  for (let i = 0; i < trace.length; i++) {
    order[i] = i;
    const ts = (trace[i] as TraceRequest).ts;
    if (!Number.isFinite(ts)) throw new RangeError(`request ${(trace[i] as TraceRequest).requestId}: arrival time must be a finite number, got ${ts}`);
    if (i > 0 && ts < (trace[i - 1] as TraceRequest).ts) sorted = false;
  }
  if (!sorted) order.sort((a, b) => (trace[a] as TraceRequest).ts - (trace[b] as TraceRequest).ts || a - b);
  return order;
}

/** One fleet per model in the trace, pods named sim-0.. in name order, each with its own engine hash seed. */
function buildFleets(trace: readonly TraceRequest[], opts: WhatIfOptions, defaultPods: number, clock: VirtualClock): Map<string, Fleet> {
  // A model's block size: the engine override, else the first hashed request's (the router hashes
  // with the block size the engine reports, so one model has one).
  const blockSizes = new Map<string, number | undefined>();
  for (const r of trace) {
    const known = blockSizes.get(r.model);
    if (known === undefined) blockSizes.set(r.model, r.hashes.length > 0 ? r.blockSize : undefined);
  }
  // A CLI passes unset flags as undefined: those must keep the default, not override it.
  const overrides = Object.fromEntries(Object.entries(opts.engine ?? {}).filter(([, v]) => v !== undefined)) as Partial<EngineConfig>;
  const fleets = new Map<string, Fleet>();
  let podCounter = 0;
  for (const [model, traced] of blockSizes) {
    const blockSize = overrides.blockSize ?? traced ?? DEFAULT_BLOCK_SIZE;
    const config: EngineConfig = { ...WHATIF_ENGINE_DEFAULTS, ...overrides, blockSize };
    checkConfig(config, model);
    const n = (Object.hasOwn(opts.podsPerModel, model) ? opts.podsPerModel[model] : undefined) ?? defaultPods;
    if (!Number.isInteger(n) || n < 1) throw new RangeError(`podsPerModel[${JSON.stringify(model)}] must be an integer >= 1, got ${n}`);
    const classes: ReadonlyArray<SimClass> = (Object.hasOwn(opts.classes ?? {}, model) ? opts.classes?.[model] : undefined) ?? [{ podClass: "", pods: n, engine: {}, ttftOffsetMs: 0 }];
    const sims: PodSim[] = [];
    let i = 0;
    let totalBlocks = Number.POSITIVE_INFINITY;
    for (const k of classes) {
      const own = Object.fromEntries(Object.entries(k.engine).filter(([, v]) => v !== undefined)) as Partial<EngineConfig>;
      const c: EngineConfig = { ...config, ...own, blockSize };
      checkConfig(c, model);
      totalBlocks = Math.min(totalBlocks, Math.floor(c.kvCapacityTokens / blockSize));
      for (let j = 0; j < k.pods; j++, i++) {
        const g = podCounter++;
        const info: PodInfo = {
          model,
          pod: `sim-${i}`,
          address: `10.${(g >> 16) & 255}.${(g >> 8) & 255}.${g & 255}:8000`,
          engine: "vllm",
          role: "combined",
          ...(k.podClass !== "" ? { podClass: k.podClass } : {}),
          adapters: [],
          labels: {},
          ready: true,
          updatedAt: 0,
        };
        sims.push(podSim(info, c, clock, Number.isFinite(k.ttftOffsetMs) ? Math.max(0, k.ttftOffsetMs) : 0));
      }
    }
    if (sims.length === 0) throw new RangeError(`model ${JSON.stringify(model)}: a calibrated fleet needs at least one pod`);
    // PodSet's order (by pod name): sim-10 sorts before sim-2, as on a real gateway.
    sims.sort((a, b) => (a.info.pod < b.info.pod ? -1 : a.info.pod > b.info.pod ? 1 : 0));
    fleets.set(model, {
      model,
      blockSize,
      totalBlocks,
      pods: sims.map((s) => s.info),
      byName: new Map(sims.map((s) => [s.info.pod, s])),
      sims,
    });
  }
  for (const r of trace) {
    const fleet = fleets.get(r.model) as Fleet;
    if (r.hashes.length > 0 && r.blockSize !== fleet.blockSize) {
      throw new RangeError(
        `request ${r.requestId}: hashed with block size ${r.blockSize}, but model ${JSON.stringify(r.model)} simulates blocks of ${fleet.blockSize} ` +
          "(prompts are rebuilt block by block from the router hashes, so the engine block size must be the router's)",
      );
    }
  }
  return fleets;
}

function checkConfig(c: EngineConfig, model: string): void {
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

function podSim(info: PodInfo, config: EngineConfig, clock: VirtualClock, ttftOffsetMs = 0): PodSim {
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
  return { info, engine, held, byEngineHash, hist, ttftOffsetMs };
}

/** Whether the pod's folded prefix view names exactly the rebuilt prompt blocks its engine caches. */
function prefixViewAgrees(sim: PodSim): boolean {
  const listed = new Set<string>();
  for (const b of sim.engine.cacheListing().blocks) {
    const key = decodeRouterHash(b.tokenIds, 0);
    if (key !== undefined) listed.add(key);
  }
  return listed.size === sim.held.size && sim.byEngineHash.size === sim.held.size && [...listed].every((k) => sim.held.has(k));
}

const finiteInt = (v: number, fallback: number): number => (Number.isFinite(v) ? Math.floor(v) : fallback);

/**
 * A request's router hashes as map keys (16 lower-case hex digits: hashToHex does not zero-pad,
 * a trace may) and as 32-bit halves. One pass of char codes: this runs for every block of every
 * arrival, where a regex plus string rebuilding showed up in profiles.
 */
function parseHashes(r: TraceRequest): { keys: string[]; hi: Uint32Array; lo: Uint32Array } {
  const n = r.hashes.length;
  const keys = new Array<string>(n);
  const hi = new Uint32Array(n);
  const lo = new Uint32Array(n);
  for (let b = 0; b < n; b++) {
    const hex = r.hashes[b] as string;
    const len = hex.length;
    if (len < 1 || len > 16) throw badHash(r, hex);
    let h = 0;
    let l = 0;
    let lower = true;
    for (let i = 0; i < len; i++) {
      const c = hex.charCodeAt(i);
      let d: number;
      if (c >= 48 && c <= 57) d = c - 48;
      else if (c >= 97 && c <= 102) d = c - 87;
      else if (c >= 65 && c <= 70) {
        d = c - 55;
        lower = false;
      } else throw badHash(r, hex);
      // Shift the 64-bit (h, l) left by one hex digit.
      h = ((h << 4) | (l >>> 28)) >>> 0;
      l = ((l << 4) | d) >>> 0;
    }
    hi[b] = h;
    lo[b] = l;
    keys[b] = len === 16 && lower ? hex : hex.toLowerCase().padStart(16, "0");
  }
  return { keys, hi, lo };
}

const badHash = (r: TraceRequest, hex: string): RangeError =>
  new RangeError(`request ${r.requestId}: block hash ${JSON.stringify(hex)} is not a 64-bit hex number`);

/** murmur3's 32-bit finaliser: a cheap, well-mixed stateless hash step. */
function mix32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}

/**
 * The rebuilt prompt: one block per router hash (the hash-carrying head, then filler drawn from
 * the hash, so equal hashes give equal blocks), then tokens drawn from the request id up to `len`
 * (unique to the request: nothing past the recorded hashes is known to be shared).
 */
function promptTokens(hi: Uint32Array, lo: Uint32Array, len: number, bs: number, requestId: string): number[] {
  const out = new Array<number>(len);
  for (let b = 0; b < hi.length; b++) {
    const h = hi[b] as number;
    const l = lo[b] as number;
    const o = b * bs;
    out[o] = VOCAB_BASE + (l & 0x3fff);
    out[o + 1] = VOCAB_BASE + ((l >>> 14) & 0x3fff);
    out[o + 2] = VOCAB_BASE + ((l >>> 28) | ((h & 0x3ff) << 4));
    out[o + 3] = VOCAB_BASE + ((h >>> 10) & 0x3fff);
    out[o + 4] = VOCAB_BASE + (h >>> 24);
    // The filler only has to be a function of the hash: the head already makes the block unique.
    const s = mix32(l ^ mix32(h));
    for (let j = HASH_TOKENS; j < bs; j++) out[o + j] = VOCAB_BASE + ((Math.imul(s ^ j, 0x9e3779b1) >>> 0) % (VOCAB_END - VOCAB_BASE));
  }
  const start = hi.length * bs;
  if (start < len) {
    const rest = highTokens(requestId, 0x707274, len - start);
    for (let i = start; i < len; i++) out[i] = rest[i - start] as number;
  }
  return out;
}

/** The router hash a rebuilt block's head carries, or undefined for a block of unhashed content. */
function decodeRouterHash(tokens: readonly number[], o: number): string | undefined {
  const t0 = (tokens[o] as number) - VOCAB_BASE;
  if (t0 < 0 || t0 >= 1 << 14) return undefined;
  const t1 = (tokens[o + 1] as number) - VOCAB_BASE;
  const t2 = (tokens[o + 2] as number) - VOCAB_BASE;
  const t3 = (tokens[o + 3] as number) - VOCAB_BASE;
  const t4 = (tokens[o + 4] as number) - VOCAB_BASE;
  const lo = (t0 | (t1 << 14) | ((t2 & 0xf) << 28)) >>> 0;
  const hi = ((t2 >>> 4) | (t3 << 10) | (t4 << 24)) >>> 0;
  return hi.toString(16).padStart(8, "0") + lo.toString(16).padStart(8, "0");
}

/** `n` tokens in [HIGH_TOKEN_BASE, VOCAB_END) drawn from (request id, purpose): never a hash-carrying head. */
function highTokens(requestId: string, purpose: number, n: number): number[] {
  // Two independent 32-bit FNV-1a variants: 64 bits of state, so distinct ids do not collide.
  let a = 0x811c9dc5 ^ purpose;
  let b = 0x01000193 ^ mix32(purpose);
  for (let i = 0; i < requestId.length; i++) {
    const c = requestId.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
  }
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) out[i] = HIGH_TOKEN_BASE + (mix32(mix32(a + Math.imul(i, 0x9e3779b9)) ^ b) % (VOCAB_END - HIGH_TOKEN_BASE));
  return out;
}
