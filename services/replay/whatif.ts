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
 * Reading router hashes back out of cache events: sim-prompts.ts.
 *
 * The fleet is fixed (`--simulate`: the recorded size) or, with a `scaler` (`--autoscale`), sized
 * over time by it: pods start, become routable after a start-up delay and leave through the drain
 * handshake or without it (elastic-fleet.ts); a request that finds no routable pod waits for one
 * (flow control's waiting room), its TTFT counted from its arrival.
 *
 * Simplifications, each on purpose: one gateway (no peer charges, no tie order); cache events and
 * load samples reach the router without delay (samples on the scrape grid); no optimistic
 * "routed prefixes"; a request that cannot fit one pod's KV cache is refused, no other
 * max_model_len applies (the recorded fleet did serve these prompts); the summary names the
 * strategy by its canonical spec (Strategy.name).
 */
import { mulberry32 } from "../shared/seeded-random.js";
import type { EngineConfig } from "../sim/engine.js";
import { parseStrategy, type RoutingContext, type Strategy, featureVector, latencyFeaturesOf } from "../routing/mod.js";
import { ChargeLedger, type LedgerReader } from "../views/charge-ledger.js";
import { type LoadReader, LoadView } from "../views/load-view.js";
import type { PodInfo, PodSetReader } from "../views/pod-set.js";
import { ElasticFleet, type ElasticSettings, type ScaleEvent } from "./elastic-fleet.js";
import { checkConfig, type Fleet, loadSampleOf, type PodSim, podSim, type PodTemplate, prefixInfoOf, prefixViewAgrees } from "./sim-pods.js";
import { finiteInt, highTokens, parseHashes, promptTokens } from "./sim-prompts.js";
import type { Histogram, SimulationSummary } from "./report-types.js";
import { VirtualClock } from "./virtual-clock.js";
import { LatencyModel } from "../views/latency-model.js";

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
  /** Epoch ms of virtual time 0 (default: the first arrival). */
  startMs?: number;
  /** Epoch ms the run lasts to at least (a scaler keeps evaluating until then). Default: the last arrival. */
  endMs?: number;
  /** Size the scaler's model's fleet over time (`replay --autoscale`); the other models keep theirs. */
  scaler?: FleetScaler;
}

/** What a scaler reads of the simulated fleet, as the autoscaler reads the streams. */
export interface ScalerView {
  /** Routable pods (ready, not draining). */
  readonly pods: PodSetReader;
  readonly load: LoadReader;
  readonly ledger: LedgerReader;
  /** Requests waiting for a routable pod (a fleet at zero): flow control's waiting room. */
  held(model: string): { queued: number; oldest?: number };
}

/** A request's outcome as a scaler learns it (as DECISIONS records carry it: keyed by arrival). */
export interface ScalerOutcome {
  ts: number;
  ttftMs?: number;
  tpotMs?: number;
  promptTokens: number;
  completionTokens: number;
}

/** Sizes one model's fleet over time (`replay --autoscale`: an autoscale policy's evaluator). */
export interface FleetScaler extends ElasticSettings {
  readonly model: string;
  /** Evaluation interval (virtual ms). */
  readonly intervalMs: number;
  /** Pods at virtual 0 (ready then). */
  readonly initialPods: number;
  observe(model: string, o: ScalerOutcome): void;
  /** The desired pod count at `now`. */
  evaluate(now: number, view: ScalerView): number;
}

/** A scaled run's figures. */
export interface ScalingResult {
  /** Provisioned pods integrated from virtual 0 to `endMs` (starting and draining pods count). */
  podSeconds: number;
  endMs: number;
  /** Pods provisioned at the end (a longer horizon adds these). */
  podsAtEnd: number;
  peakPods: number;
  /** Changes of the target size (the first MAX_SCALE_EVENTS of them) and how many there were. */
  events: ScaleEvent[];
  eventCount: number;
  evaluations: number;
  /** Pods removed once idle after draining, and at their grace deadline. */
  drainedIdle: number;
  drainedAtDeadline: number;
  /** Requests that waited for a routable pod. */
  held: number;
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
  /** Requests cut by a scale-down (a pod removed under them). */
  aborted: number;
  /** TTFTs (ms, from arrival) of the requests that completed (not cut), in completion order. */
  ttftsMs: readonly number[];
  /** The scaler's side (with `scaler`). */
  scaling?: ScalingResult;
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

/** `simulateWhatIf` with the end state exposed; internal to the replay command and its tests. */
export function runWhatIf(trace: readonly TraceRequest[], opts: WhatIfOptions): WhatIfRun {
  // First, so a bad spec fails before any work (StrategySpecError names the spec).
  const strategy = parseStrategy(opts.strategy);
  const settings = runSettings(opts);
  const sim = new Simulation(trace, opts, strategy, settings);

  const total = trace.length;
  const order = arrivalOrder(trace);
  const first = opts.startMs ?? (order.length > 0 ? (trace[order[0] as number] as TraceRequest).ts : 0);
  if (total > 0 || opts.scaler) sim.startScrapes();
  if (opts.scaler) sim.startScaler(opts.endMs !== undefined ? Math.max(0, (opts.endMs - first) / settings.speedup) : 0);
  let reportedPercent = 0;
  for (let k = 0; k < order.length; k++) {
    const index = order[k] as number;
    const r = trace[index] as TraceRequest;
    sim.advanceTo(Math.max(0, (r.ts - first) / settings.speedup));
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
  private readonly completedTtfts: number[] = [];
  private charged = 0;
  private released = 0;
  private rejected = 0;
  private completed = 0;
  private aborted = 0;
  private inFlight = 0;
  private lastFinishMs = 0;
  /** Virtual time of the next arrival (+Infinity once every request has arrived). */
  private nextArrivalMs = 0;
  private tickIndex = 0;
  private busySamples = 0;
  private podCounter = 0;
  /** Requests waiting for a routable pod, per model (FIFO). */
  private readonly waiting = new Map<string, Array<{ r: TraceRequest; index: number; arrivedAt: number }>>();
  private heldTotal = 0;
  private elastic: ElasticFleet | undefined;
  private scaling = false;
  private evaluations = 0;
  private lastTickMs = 0;
  private readonly view: ScalerView;

  constructor(
    trace: readonly TraceRequest[],
    private readonly opts: WhatIfOptions,
    private readonly strategy: Strategy,
    private readonly settings: RunSettings,
  ) {
    // Simulated scrapes never fail, so no sample should ever read as missing: the gateway's 2 s
    // staleness bound, widened when the interval itself is that long.
    this.load = new LoadView(Math.max(2_000, 2 * settings.scrapeIntervalMs));
    this.random = mulberry32(settings.seed);
    this.fleets = buildFleets(trace, opts, settings.defaultPods, (f, i, now, template) => this.newPod(f, i, now, template));
    this.view = { pods: fleetPods(this.fleets), load: this.load, ledger: this.ledger, held: (m) => this.held(m) };
  }

  startScrapes(): void {
    this.clock.at(0, this.scrape);
  }

  /** Evaluates the scaler every interval from virtual 0 until the arrivals are served and `horizonMs` passed. */
  startScaler(horizonMs: number): void {
    const s = this.opts.scaler as FleetScaler;
    const fleet = this.fleets.get(s.model);
    if (!fleet) throw new RangeError(`the scaler's model ${JSON.stringify(s.model)} has no request in the trace`);
    const elastic = new ElasticFleet(fleet, this.clock, s, {
      newPod: (f, now) => this.newPod(f, f.nextIndex++, now, f.template),
      inFlight: (x) => this.ledger.outstanding(x.info.model, x.info.pod).requests,
      uniqueBlocks: (x) => uniqueBlocks(fleet, x),
      routable: (f) => this.release(f),
    });
    this.elastic = elastic;
    this.scaling = true;
    const tick = (): void => {
      this.evaluations++;
      this.lastTickMs = this.clock.now();
      elastic.resize(s.evaluate(this.clock.now(), this.view));
      const next = this.clock.now() + s.intervalMs;
      if (Number.isFinite(this.nextArrivalMs) || this.inFlight > 0 || this.heldNow() > 0 || next <= horizonMs) this.clock.at(next, tick);
      else this.scaling = false;
    };
    this.clock.at(0, tick);
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

  private held(model: string): { queued: number; oldest?: number } {
    const q = this.waiting.get(model);
    return q && q.length > 0 ? { queued: q.length, oldest: (q[0] as { arrivedAt: number }).arrivedAt } : { queued: 0 };
  }

  private heldNow(): number {
    let n = 0;
    for (const q of this.waiting.values()) n += q.length;
    return n;
  }

  private newPod(fleet: Fleet, i: number, now: number, t: PodTemplate): PodSim {
    const g = this.podCounter++;
    const info: PodInfo = {
      model: fleet.model,
      pod: `sim-${i}`,
      address: `10.${(g >> 16) & 255}.${(g >> 8) & 255}.${g & 255}:8000`,
      engine: "vllm",
      role: "combined",
      ...(t.podClass !== "" ? { podClass: t.podClass } : {}),
      adapters: [],
      labels: {},
      ready: true,
      updatedAt: 0,
    };
    return podSim(info, t.config, this.clock, t.ttftOffsetMs, now);
  }

  /**
   * Scrapes run on a fixed grid (k × interval). While the whole fleet is idle nothing a scrape
   * reads can change, so the grid points up to the next arrival are skipped: the sample the
   * router then sees is the one the skipped scrapes would have produced. A scaler reads the
   * samples at every evaluation, so while it runs no point is skipped.
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
    if (idle && !Number.isFinite(this.nextArrivalMs) && !this.scaling) return;
    const interval = this.settings.scrapeIntervalMs;
    this.tickIndex = idle && !this.scaling ? Math.max(this.tickIndex + 1, Math.floor(this.nextArrivalMs / interval)) : this.tickIndex + 1;
    this.clock.at(this.tickIndex * interval, this.scrape);
  };

  /** Routes the requests held for `fleet` while it has a routable pod. */
  private release(fleet: Fleet): void {
    const q = this.waiting.get(fleet.model);
    while (q && q.length > 0 && fleet.pods.length > 0) {
      const w = q.shift() as { r: TraceRequest; index: number; arrivedAt: number };
      this.route(w.r, w.index, w.arrivedAt);
    }
  }

  /** Routes arrival `index` of the trace now and submits it to the picked pod's engine (TTFT counts from `arrivedAt`). */
  route(r: TraceRequest, index: number, arrivedAt = this.clock.now()): void {
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
    if (fleet.pods.length === 0) {
      // No routable pod (a scaled fleet at zero, or every pod still starting): it waits for one.
      const q = this.waiting.get(r.model) ?? [];
      this.waiting.set(r.model, q);
      q.push({ r, index, arrivedAt });
      this.heldTotal++;
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
        this.ttfts.push(atMs - arrivedAt + sim.ttftOffsetMs);
        this.ledger.markDecoding(GATEWAY, chargeId);
      },
      onFinish: (reason) => {
        const end = this.clock.now();
        if (this.ledger.release({ gateway: GATEWAY, id: chargeId })) this.released++;
        this.inFlight--;
        if (reason === "abort") {
          // Cut by a scale-down: no outcome, nothing learned.
          this.aborted++;
          return;
        }
        // The simulated fleet learns its own latency model, as a gateway would (predicted-latency*).
        const ttftMs = firstAt !== undefined ? firstAt - arrivedAt + sim.ttftOffsetMs : undefined;
        const tpotMs = firstAt !== undefined && outputLen > 1 ? (end - firstAt) / (outputLen - 1) : undefined;
        if (firstAt !== undefined) this.latency.learn(r.model, end, { x: sample, ...(picked.podClass ? { cls: picked.podClass } : {}), ttftMs: firstAt - now + sim.ttftOffsetMs, ...(tpotMs !== undefined ? { tpotMs } : {}) });
        this.completed++;
        if (ttftMs !== undefined) this.completedTtfts.push(ttftMs);
        this.lastFinishMs = Math.max(this.lastFinishMs, end);
        if (this.elastic?.fleet === fleet) {
          this.opts.scaler?.observe(r.model, { ts: arrivedAt, ...(ttftMs !== undefined ? { ttftMs } : {}), ...(tpotMs !== undefined ? { tpotMs } : {}), promptTokens: promptLen, completionTokens: outputLen });
          this.elastic.finished(sim);
        }
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
      }
      for (const sim of [...fleet.sims, ...fleet.retired]) {
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
      busyFraction: completed > 0 && podCount > 0 ? this.busySamples / (podCount * (Math.floor(lastFinishMs / this.settings.scrapeIntervalMs) + 1)) : 0,
      pods,
      prefixViewMismatches,
      aborted: this.aborted,
      ttftsMs: this.completedTtfts,
      ...(this.elastic ? { scaling: this.scalingResult(this.elastic) } : {}),
    };
  }

  private scalingResult(e: ElasticFleet): ScalingResult {
    // The last evaluation or the last finish (a trailing scrape is not the fleet's time).
    const endMs = Math.max(this.lastTickMs, this.lastFinishMs);
    return {
      podSeconds: e.podSeconds(endMs),
      endMs,
      podsAtEnd: e.provisioned,
      peakPods: e.peak,
      events: e.events,
      eventCount: e.eventCount,
      evaluations: this.evaluations,
      drainedIdle: e.drainedIdle,
      drainedAtDeadline: e.drainedAtDeadline,
      held: this.heldTotal,
    };
  }
}

/** The routable pods of every fleet, as a PodSet reader (what a scaler counts as ready). */
function fleetPods(fleets: ReadonlyMap<string, Fleet>): PodSetReader {
  const all = () => [...fleets.values()].flatMap((f) => f.pods);
  return {
    readyPods: (model) => fleets.get(model)?.pods ?? [],
    knows: (model) => fleets.has(model),
    get: (model, pod) => fleets.get(model)?.pods.find((p) => p.pod === pod),
    byAddress: (address) => all().find((p) => p.address === address),
    all,
  };
}

/** Cached router blocks only this pod of the fleet holds. */
function uniqueBlocks(fleet: Fleet, x: PodSim): number {
  let n = 0;
  for (const k of x.held) {
    let shared = false;
    for (const o of fleet.sims) {
      if (o !== x && o.held.has(k)) {
        shared = true;
        break;
      }
    }
    if (!shared) n++;
  }
  return n;
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
function buildFleets(trace: readonly TraceRequest[], opts: WhatIfOptions, defaultPods: number, newPod: (fleet: Fleet, i: number, now: number, template: PodTemplate) => PodSim): Map<string, Fleet> {
  // A model's block size: the engine override, else the first hashed request's (the router hashes
  // with the block size the engine reports, so one model has one).
  const blockSizes = new Map<string, number | undefined>();
  for (const r of trace) {
    const known = blockSizes.get(r.model);
    if (known === undefined) blockSizes.set(r.model, r.hashes.length > 0 ? r.blockSize : undefined);
  }
  const scaler = opts.scaler;
  if (scaler && !(Number.isInteger(scaler.initialPods) && scaler.initialPods >= 0)) throw new RangeError(`scaler.initialPods must be an integer >= 0, got ${scaler.initialPods}`);
  // A CLI passes unset flags as undefined: those must keep the default, not override it.
  const overrides = Object.fromEntries(Object.entries(opts.engine ?? {}).filter(([, v]) => v !== undefined)) as Partial<EngineConfig>;
  const fleets = new Map<string, Fleet>();
  for (const [model, traced] of blockSizes) {
    const blockSize = overrides.blockSize ?? traced ?? DEFAULT_BLOCK_SIZE;
    const config: EngineConfig = { ...WHATIF_ENGINE_DEFAULTS, ...overrides, blockSize };
    checkConfig(config, model);
    const n = (Object.hasOwn(opts.podsPerModel, model) ? opts.podsPerModel[model] : undefined) ?? defaultPods;
    if (!Number.isInteger(n) || n < 1) throw new RangeError(`podsPerModel[${JSON.stringify(model)}] must be an integer >= 1, got ${n}`);
    let classes: ReadonlyArray<SimClass> = (Object.hasOwn(opts.classes ?? {}, model) ? opts.classes?.[model] : undefined) ?? [{ podClass: "", pods: n, engine: {}, ttftOffsetMs: 0 }];
    // A scaled fleet: its first class is every pod's template, and it starts at the scaler's size.
    const scaled = scaler?.model === model;
    if (scaled && classes[0]) classes = [{ ...classes[0], pods: scaler.initialPods }];
    const templates = classes.map((k): PodTemplate => {
      const own = Object.fromEntries(Object.entries(k.engine).filter(([, v]) => v !== undefined)) as Partial<EngineConfig>;
      const c: EngineConfig = { ...config, ...own, blockSize };
      checkConfig(c, model);
      return { config: c, ttftOffsetMs: Number.isFinite(k.ttftOffsetMs) ? Math.max(0, k.ttftOffsetMs) : 0, podClass: k.podClass };
    });
    const template = templates[0];
    if (!template || (!scaled && classes.every((k) => k.pods <= 0))) throw new RangeError(`model ${JSON.stringify(model)}: a calibrated fleet needs at least one pod`);
    const fleet: Fleet = {
      model,
      blockSize,
      totalBlocks: Math.min(...templates.map((x) => Math.floor(x.config.kvCapacityTokens / blockSize))),
      pods: [],
      byName: new Map(),
      sims: [],
      retired: [],
      template,
      nextIndex: 0,
    };
    classes.forEach((k, c) => {
      for (let j = 0; j < k.pods; j++) fleet.sims.push(newPod(fleet, fleet.nextIndex++, 0, templates[c] as PodTemplate));
    });
    // PodSet's order (by pod name): sim-10 sorts before sim-2, as on a real gateway.
    fleet.sims.sort((a, b) => (a.info.pod < b.info.pod ? -1 : a.info.pod > b.info.pod ? 1 : 0));
    fleet.pods = fleet.sims.map((s) => s.info);
    for (const s of fleet.sims) fleet.byName.set(s.info.pod, s);
    fleets.set(model, fleet);
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
