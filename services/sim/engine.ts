/**
 * The behaviour model of one simulated engine: a discrete-event imitation of vLLM V1's scheduler.
 *
 * Every request has `numTokens` (prompt + generated so far) and `computed` (tokens whose KV exists).
 * An engine step gives each scheduled request `min(numTokens - computed, budget)` tokens of work; a
 * request whose work reaches `numTokens` samples one new token at the end of the step. Prefill is
 * therefore just a large chunk and decode a chunk of one, exactly as in V1 (chunked prefill on).
 * Running requests are scheduled first in admission order, then waiting ones FCFS while the batch
 * (`maxBatch`), the per-step token budget (`maxNumBatchedTokens`) and free KV blocks allow.
 *
 * Priority scheduling (`EngineConfig.scheduling`, absent = FCFS; facts and sources in
 * docs/engine-priority.md): the waiting queue is ordered by (urgency, arrival) instead, a preempted
 * request goes back into it by the same key, and the engine's own preemption rule applies:
 *   - vLLM (`--scheduling-policy priority`, lower `priority` = more urgent): when a running request
 *     cannot grow, the victim is the running request with the largest (priority, arrival), even one
 *     already scheduled in this step (its tokens go back to the budget). A full batch never
 *     preempts anything for a waiting request.
 *   - SGLang (`--enable-priority-scheduling`, higher = more urgent unless `lowValuesFirst`): when
 *     the batch is full, the most urgent waiting request preempts running ones, least urgent and
 *     latest first, each more urgent than it by more than `preemptionThreshold`, until their KV
 *     covers its whole request; KV exhaustion while running keeps the FCFS rule below.
 *
 * Step duration (simulated ms):
 *   decodeMsPerStep * (1 + decodeBatchSlope * (d - 1))   if d > 0 requests decode one token
 *   + p * prefillMsPerToken                               for the p prefill tokens in the step
 * so decode slows mildly as the batch grows and a long prefill stalls every decode sharing its step
 * (which is what makes a busy pod's inter-token latency worse, as on a GPU).
 *
 * KV: blocks of `blockSize` tokens out of floor(kvCapacityTokens / blockSize), allocated as tokens
 * are scheduled, from a prefix-caching block pool (`kv-cache.ts`). When a running request cannot
 * grow, the most recently admitted request is preempted (vLLM's recompute mode): it loses its
 * blocks and returns to the head of the queue (under priority scheduling: see above).
 *
 * Prefix cache, as in vLLM V1: on admission the longest run of the request's full blocks already
 * cached counts as computed (capped so at least one token is recomputed, which is what produces
 * logits), so prefill time is proportional to uncached tokens only. At the end of every step the
 * blocks that became full are registered (prompt and generated tokens alike) and announced; a
 * step's cache events (evictions from its allocations, then new blocks) form one batch.
 */
import type { SimClock } from "./clock.js";
import { BlockPool, blockHash, type CacheListing, type KvBlock, type KvCacheEvent } from "./kv-cache.js";

export type FinishReason = "stop" | "length" | "abort";

/**
 * Priority scheduling as an engine does it (docs/engine-priority.md). `flavour` picks the engine's
 * sign convention and preemption rule.
 */
export type PriorityScheduling =
  | { flavour: "vllm" }
  | {
      flavour: "sglang";
      /** `--schedule-low-priority-values-first`: lower values are more urgent (default: higher are). */
      lowValuesFirst?: boolean;
      /** False = `--disable-priority-preemption` (default true). */
      preemption?: boolean;
      /** `--priority-scheduling-preemption-threshold`: the urgency gap a preemption needs to exceed (default 10). */
      preemptionThreshold?: number;
    };

/** SGLang's default `--priority-scheduling-preemption-threshold`. */
export const SGLANG_PREEMPTION_THRESHOLD = 10;

export interface EngineConfig {
  maxBatch: number;
  maxNumBatchedTokens: number;
  prefillMsPerToken: number;
  decodeMsPerStep: number;
  decodeBatchSlope: number;
  kvCapacityTokens: number;
  blockSize: number;
  /** Absent: first come, first served (vLLM's default `--scheduling-policy fcfs`). */
  scheduling?: PriorityScheduling;
}

export interface FinishedRequest {
  reason: FinishReason;
  promptTokens: number;
  generationTokens: number;
  maxTokens: number;
  /** Arrival to first scheduling (ms); undefined if never scheduled. */
  queueMs: number | undefined;
  /** First scheduling to first token; undefined without a first token. */
  prefillMs: number | undefined;
  /** First token to last token. */
  decodeMs: number | undefined;
  /** First scheduling to finish. */
  inferenceMs: number | undefined;
  e2eMs: number;
}

/** Hooks for metrics; all times are simulated milliseconds. */
export interface EngineObserver {
  onFirstToken?(ttftMs: number): void;
  onInterToken?(gapMs: number): void;
  onStep?(endMs: number, scheduledTokens: number, sampledTokens: number): void;
  onFinished?(request: FinishedRequest): void;
}

export interface SubmitRequest {
  promptTokens: readonly number[];
  /** The tokens this request will sample, in order; its length is the request's max_tokens. */
  outputTokens: readonly number[];
  onToken(tokenId: number, index: number, atMs: number, finish: FinishReason | undefined): void;
  /** Called once, after the last onToken; for "abort" it is called from `abort()` itself. */
  onFinish(reason: FinishReason): void;
  /** vLLM's `cache_salt`: hashed into the first block only, so differently salted prompts share nothing. */
  cacheSalt?: string;
  /** Hashed into every block, as vLLM does with the LoRA name. */
  loraName?: string;
  /**
   * Prefill leg of prefill/decode disaggregation: when the request finishes, its blocks stay
   * allocated (and count as used KV) until `RequestHandle.releaseKv()`, as a vLLM prefill engine
   * holds them for the decode engine to read.
   */
  holdKv?: boolean;
  /**
   * Decode leg whose prompt KV was transferred from a prefill engine: admitted with every prompt
   * token but the last computed, and that last token (recomputed for its logits, as vLLM does)
   * counts as decode work, so the request puts no prefill tokens into any step. A preempted
   * request has lost the transferred KV and recomputes its prompt like any other.
   */
  prefilled?: boolean;
  /** When the request reached the pod (simulated ms), if earlier than `submit`; latency metrics start there. */
  arrivedAtMs?: number;
  /**
   * The body's `priority`, in the engine's own convention; absent = the engine's default (vLLM 0,
   * SGLang the least urgent value). Only read under priority scheduling.
   */
  priority?: number;
}

export interface KvCacheHooks {
  /** Root of the block hash chain (vLLM's NONE_HASH); differs per pod. */
  hashSeed?: bigint;
  /** Called once for every engine step that changed the cache, with that step's events in order. */
  onEvents?(events: KvCacheEvent[]): void;
}

export interface RequestHandle {
  abort(): void;
  /** Ids of the blocks the request holds (the prefill leg's `remote_block_ids`). */
  blockIds(): number[];
  /** Frees the blocks of a finished `holdKv` request; no-op otherwise or when already freed. */
  releaseKv(): void;
}

export interface EngineTotals {
  requests: number;
  finished: Record<FinishReason, number>;
  promptTokens: number;
  generationTokens: number;
  preemptions: number;
  prefixCacheQueries: number;
  prefixCacheHits: number;
}

export interface EngineSnapshot {
  nowMs: number;
  waiting: number;
  running: number;
  /** Blocks held by running requests. */
  usedBlocks: number;
  /** Blocks holding reusable (registered) content, in use or not. */
  cachedBlocks: number;
  totalBlocks: number;
  kvUsage: number;
  /** Finished `holdKv` requests whose blocks are still held. */
  heldRequests: number;
  totals: EngineTotals;
}

type State = "waiting" | "running" | "done";

interface Req {
  readonly input: SubmitRequest;
  readonly arrivalMs: number;
  /** Order key under priority scheduling: lower = more urgent, whatever the engine's convention. */
  readonly rank: number;
  /** Submission order, the last tie-break. */
  readonly seq: number;
  /** Start of the request's latency metrics: `arrivedAtMs`, else `arrivalMs`. */
  readonly metricsStartMs: number;
  readonly maxTokens: number;
  state: State;
  generated: number;
  computed: number;
  blocks: KvBlock[];
  /** Chained hashes of the request's full blocks, computed as far as needed. */
  readonly hashes: bigint[];
  /** Leading entries of `blocks` already registered in (or taken from) the cache. */
  registered: number;
  preempted: boolean;
  firstScheduledMs: number | undefined;
  firstTokenMs: number | undefined;
  lastTokenMs: number | undefined;
}

interface Step {
  endMs: number;
  work: Array<{ req: Req; tokens: number }>;
}

/** Priority order: lower rank first, then earlier arrival, then submission order. */
function before(a: Req, b: Req): boolean {
  if (a.rank !== b.rank) return a.rank < b.rank;
  if (a.arrivalMs !== b.arrivalMs) return a.arrivalMs < b.arrivalMs;
  return a.seq < b.seq;
}

/** Catch-up steps run per wake-up before yielding, so a huge time scale cannot starve I/O. */
const MAX_STEPS_PER_PUMP = 2_000;

export class SimEngine {
  readonly totalBlocks: number;
  private readonly pool: BlockPool;
  private readonly hashSeed: bigint;
  private readonly waiting: Req[] = [];
  private readonly running: Req[] = [];
  private readonly held = new Set<Req>();
  private current: Step | undefined;
  private cursorMs = 0;
  private submitted = 0;
  private cancelTimer: (() => void) | undefined;
  private closed = false;
  private readonly totals: EngineTotals = {
    requests: 0,
    finished: { stop: 0, length: 0, abort: 0 },
    promptTokens: 0,
    generationTokens: 0,
    preemptions: 0,
    prefixCacheQueries: 0,
    prefixCacheHits: 0,
  };

  constructor(
    readonly config: EngineConfig,
    private readonly clock: SimClock,
    private readonly observer: EngineObserver = {},
    private readonly kv: KvCacheHooks = {},
  ) {
    this.totalBlocks = Math.floor(config.kvCapacityTokens / config.blockSize);
    this.pool = new BlockPool(this.totalBlocks, config.blockSize);
    this.hashSeed = kv.hashSeed ?? 0n;
  }

  now(): number {
    return this.clock.now();
  }

  submit(input: SubmitRequest): RequestHandle {
    if (this.closed) throw new Error("engine is closed");
    if (input.outputTokens.length < 1) throw new RangeError("a request must generate at least one token");
    // A request that cannot fit alone would be preempted forever; the API layer rejects it earlier
    // through max_model_len, this is the engine's own guarantee.
    const maxTokensHeld = input.promptTokens.length + input.outputTokens.length;
    if (this.blocksFor(maxTokensHeld) > this.totalBlocks) {
      throw new RangeError(`request needs ${maxTokensHeld} tokens of KV, capacity is ${this.totalBlocks * this.config.blockSize}`);
    }
    const now = this.clock.now();
    const req: Req = {
      input,
      arrivalMs: now,
      rank: this.rankOf(input.priority),
      seq: this.submitted++,
      metricsStartMs: Math.min(now, input.arrivedAtMs ?? now),
      maxTokens: input.outputTokens.length,
      state: "waiting",
      generated: 0,
      computed: 0,
      blocks: [],
      hashes: [],
      registered: 0,
      preempted: false,
      firstScheduledMs: undefined,
      firstTokenMs: undefined,
      lastTokenMs: undefined,
    };
    this.totals.requests++;
    if (this.config.scheduling) this.enqueue(req);
    else this.waiting.push(req);
    this.pump();
    return {
      abort: () => this.abort(req),
      blockIds: () => req.blocks.map((b) => b.id),
      releaseKv: () => this.releaseHeld(req),
    };
  }

  snapshot(): EngineSnapshot {
    return {
      nowMs: this.clock.now(),
      waiting: this.waiting.length,
      running: this.running.length,
      usedBlocks: this.pool.usedBlocks,
      cachedBlocks: this.pool.cachedBlocks,
      totalBlocks: this.totalBlocks,
      kvUsage: this.totalBlocks > 0 ? this.pool.usedBlocks / this.totalBlocks : 0,
      heldRequests: this.held.size,
      totals: { ...this.totals, finished: { ...this.totals.finished } },
    };
  }

  /** Every cached block with its hash, parent, tokens, reference count and LRU position. */
  cacheListing(): CacheListing {
    return this.pool.listing();
  }

  /**
   * vLLM's `reset_prefix_cache`: forgets every cached block and announces AllBlocksCleared at
   * once. Refused (false) while requests hold blocks, as in vLLM.
   */
  resetPrefixCache(): boolean {
    const ok = this.pool.resetPrefixCache();
    this.flushEvents();
    return ok;
  }

  /** Aborts every queued and running request (each gets onFinish("abort")), then closes. */
  abortAll(): void {
    for (const req of [...this.running, ...this.waiting]) this.abort(req);
    for (const req of [...this.held]) this.releaseHeld(req);
    this.close();
  }

  /** Stops scheduling; in-flight requests never finish (their connections are torn down by the server). */
  close(): void {
    this.closed = true;
    this.cancelTimer?.();
    this.cancelTimer = undefined;
  }

  private abort(req: Req): void {
    if (req.state === "done") return;
    if (req.state === "waiting") this.waiting.splice(this.waiting.indexOf(req), 1);
    else this.release(req);
    this.finish(req, "abort", this.clock.now());
  }

  private pump(): void {
    if (this.closed) return;
    this.cancelTimer?.();
    this.cancelTimer = undefined;
    const now = this.clock.now();
    for (let steps = 0; ; steps++) {
      if (this.current) {
        if (this.current.endMs > now) {
          this.cancelTimer = this.clock.at(this.current.endMs, () => this.pump());
          return;
        }
        const step = this.current;
        this.current = undefined;
        this.cursorMs = step.endMs;
        this.complete(step);
      }
      if (this.running.length === 0 && this.waiting.length === 0) return;
      if (steps >= MAX_STEPS_PER_PUMP) {
        const immediate = setImmediate(() => this.pump());
        this.cancelTimer = () => clearImmediate(immediate);
        return;
      }
      // An idle engine starts its next step when the first waiting request arrived, not earlier.
      const head = this.config.scheduling ? this.earliestWaiting() : this.waiting[0];
      const startMs = this.running.length > 0 || !head ? this.cursorMs : Math.max(this.cursorMs, head.arrivalMs);
      this.current = this.plan(startMs);
      if (!this.current) {
        this.flushEvents();
        return;
      }
    }
  }

  private plan(startMs: number): Step | undefined {
    const work: Step["work"] = [];
    let budget = this.config.maxNumBatchedTokens;
    let preempted = false;

    for (const req of [...this.running]) {
      if (budget <= 0) break;
      if (req.state !== "running") continue;
      const tokens = Math.min(this.numTokens(req) - req.computed, budget);
      while (!this.tryAllocate(req, tokens)) {
        const victim = this.config.scheduling?.flavour === "vllm" ? this.leastUrgentRunning() : this.running[this.running.length - 1];
        if (!victim) break;
        // vLLM hands back the step's tokens of a victim it had already scheduled.
        if (this.config.scheduling) budget += this.unschedule(work, victim);
        this.preempt(victim);
        preempted = true;
        if (victim === req) break;
      }
      if (req.state !== "running") continue;
      work.push({ req, tokens });
      budget -= tokens;
    }

    // Like vLLM, admit nothing in a step that had to preempt: memory is the bottleneck.
    const admitted = new Set<Req>();
    while (!preempted && budget > 0) {
      let at = this.config.scheduling ? this.nextWaiting(startMs) : 0;
      const req = this.waiting[at];
      if (!req || req.arrivalMs > startMs) break;
      if (this.running.length >= this.config.maxBatch) {
        if (!this.preemptForWaiting(req, work, admitted)) break;
        // The victims' tokens for this step went back to the budget; they rejoined the queue.
        budget = this.config.maxNumBatchedTokens - work.reduce((sum, w) => sum + w.tokens, 0);
        at = this.waiting.indexOf(req);
        if (budget <= 0) break;
      }
      const hit = this.cacheHit(req);
      const computed = this.isTransferred(req)
        ? Math.max(hit.length * this.config.blockSize, req.input.promptTokens.length - 1)
        : hit.length * this.config.blockSize;
      const tokens = Math.min(this.numTokens(req) - computed, budget);
      const needed = this.blocksFor(computed + tokens) - hit.length;
      if (!this.pool.canAllocate(needed, hit)) break;
      this.waiting.splice(at, 1);
      // vLLM keeps a preempted request's second lookup out of these counters.
      if (!req.preempted) {
        this.totals.prefixCacheQueries += this.numTokens(req);
        this.totals.prefixCacheHits += computed;
      }
      this.pool.touch(hit);
      req.blocks = [...hit, ...this.pool.allocate(needed)];
      req.registered = hit.length;
      req.state = "running";
      req.computed = computed;
      req.firstScheduledMs ??= startMs;
      this.running.push(req);
      if (this.config.scheduling) admitted.add(req);
      work.push({ req, tokens });
      budget -= tokens;
    }

    if (work.length === 0) return undefined;
    let decoding = 0;
    let prefill = 0;
    for (const w of work) {
      if (w.tokens === 1 && (w.req.generated > 0 || this.isTransferred(w.req))) decoding++;
      else prefill += w.tokens;
    }
    const { decodeMsPerStep, decodeBatchSlope, prefillMsPerToken } = this.config;
    const decodeMs = decoding > 0 ? decodeMsPerStep * (1 + decodeBatchSlope * (decoding - 1)) : 0;
    return { endMs: startMs + decodeMs + prefill * prefillMsPerToken, work };
  }

  private complete(step: Step): void {
    let scheduled = 0;
    let sampled = 0;
    const due: Req[] = [];
    for (const { req, tokens } of step.work) {
      if (req.state !== "running") continue;
      scheduled += tokens;
      req.computed += tokens;
      this.registerFullBlocks(req);
      if (req.computed >= this.numTokens(req)) due.push(req);
    }
    // The step's batch goes out before its tokens do, so a client that has seen a token can
    // rely on the matching BlockStored having been published.
    this.flushEvents();
    for (const req of due) {
      if (req.state !== "running") continue;
      this.sample(req, step.endMs);
      sampled++;
    }
    this.observer.onStep?.(step.endMs, scheduled, sampled);
  }

  private flushEvents(): void {
    const events = this.pool.takeEvents();
    if (events.length > 0) this.kv.onEvents?.(events);
  }

  /** The longest cached run of the request's leading full blocks, leaving >= 1 token to compute. */
  private cacheHit(req: Req): KvBlock[] {
    const maxBlocks = Math.floor((this.numTokens(req) - 1) / this.config.blockSize);
    const hit: KvBlock[] = [];
    for (let i = 0; i < maxBlocks; i++) {
      const block = this.pool.find(this.hashAt(req, i));
      if (!block) break;
      hit.push(block);
    }
    return hit;
  }

  /** Registers the blocks that the last step filled; each run of new blocks is one BlockStored. */
  private registerFullBlocks(req: Req): void {
    const bs = this.config.blockSize;
    const full = Math.min(Math.floor(req.computed / bs), req.blocks.length);
    let run: Extract<KvCacheEvent, { type: "BlockStored" }> | undefined;
    for (let i = req.registered; i < full; i++) {
      const hash = this.hashAt(req, i);
      const parent = i === 0 ? null : this.hashAt(req, i - 1);
      const tokenIds = Array.from({ length: bs }, (_, j) => this.tokenAt(req, i * bs + j));
      const extraKeys = this.extraKeys(req, i);
      if (this.pool.register(req.blocks[i] as KvBlock, hash, parent, tokenIds, extraKeys)) {
        run ??= {
          type: "BlockStored",
          blockHashes: [],
          parentBlockHash: parent,
          tokenIds: [],
          blockSize: bs,
          loraName: req.input.loraName ?? null,
          extraKeys: [],
        };
        run.blockHashes.push(hash);
        run.tokenIds.push(...tokenIds);
        run.extraKeys.push(extraKeys);
      } else if (run) {
        // Another request registered this content first: the run breaks, the next one gets its own parent.
        this.pool.emit(run);
        run = undefined;
      }
    }
    if (run) this.pool.emit(run);
    req.registered = Math.max(req.registered, full);
  }

  /** Hash of the request's i-th full block; the chain is extended lazily and kept across preemption. */
  private hashAt(req: Req, i: number): bigint {
    const bs = this.config.blockSize;
    while (req.hashes.length <= i) {
      const b = req.hashes.length;
      const parent = b === 0 ? this.hashSeed : (req.hashes[b - 1] as bigint);
      req.hashes.push(blockHash(this.hashSeed, parent, bs, (j) => this.tokenAt(req, b * bs + j), this.extraKeys(req, b)));
    }
    return req.hashes[i] as bigint;
  }

  /** vLLM's per-block extra keys: the LoRA name on every block, the cache salt on the first only. */
  private extraKeys(req: Req, block: number): string[] | null {
    const keys: string[] = [];
    if (req.input.loraName) keys.push(req.input.loraName);
    if (block === 0 && req.input.cacheSalt) keys.push(req.input.cacheSalt);
    return keys.length > 0 ? keys : null;
  }

  private tokenAt(req: Req, i: number): number {
    const prompt = req.input.promptTokens;
    return (i < prompt.length ? prompt[i] : req.input.outputTokens[i - prompt.length]) ?? 0;
  }

  private sample(req: Req, atMs: number): void {
    const index = req.generated;
    const token = req.input.outputTokens[index] ?? 0;
    req.generated++;
    this.totals.generationTokens++;
    if (req.firstTokenMs === undefined) {
      req.firstTokenMs = atMs;
      this.totals.promptTokens += req.input.promptTokens.length;
      this.observer.onFirstToken?.(atMs - req.metricsStartMs);
    } else if (req.lastTokenMs !== undefined) {
      this.observer.onInterToken?.(atMs - req.lastTokenMs);
    }
    req.lastTokenMs = atMs;
    const done = req.generated >= req.maxTokens;
    if (done && req.input.holdKv) {
      this.running.splice(this.running.indexOf(req), 1);
      this.held.add(req);
    } else if (done) this.release(req);
    req.input.onToken(token, index, atMs, done ? "length" : undefined);
    if (done && req.state !== "done") this.finish(req, "length", atMs);
  }

  private finish(req: Req, reason: FinishReason, atMs: number): void {
    req.state = "done";
    this.totals.finished[reason]++;
    const first = req.firstScheduledMs;
    this.observer.onFinished?.({
      reason,
      promptTokens: req.input.promptTokens.length,
      generationTokens: req.generated,
      maxTokens: req.maxTokens,
      queueMs: first === undefined ? undefined : first - req.metricsStartMs,
      prefillMs: first === undefined || req.firstTokenMs === undefined ? undefined : req.firstTokenMs - first,
      decodeMs:
        req.firstTokenMs === undefined || req.lastTokenMs === undefined ? undefined : req.lastTokenMs - req.firstTokenMs,
      inferenceMs: first === undefined ? undefined : atMs - first,
      e2eMs: atMs - req.metricsStartMs,
    });
    req.input.onFinish(reason);
  }

  private preempt(req: Req): void {
    this.release(req);
    req.state = "waiting";
    req.preempted = true;
    req.computed = 0;
    if (this.config.scheduling) this.enqueue(req);
    else this.waiting.unshift(req);
    this.totals.preemptions++;
  }

  /** A request's order key: lower = more urgent. A request without a priority gets the engine's default. */
  private rankOf(priority: number | undefined): number {
    const s = this.config.scheduling;
    if (!s || s.flavour === "vllm") return priority ?? 0;
    // SGLang gives a request without a priority the least urgent value there is.
    if (priority === undefined) return Number.POSITIVE_INFINITY;
    return s.lowValuesFirst ? priority : -priority;
  }

  /** Inserts into the priority-ordered waiting queue after every request with a key <= its own. */
  private enqueue(req: Req): void {
    let lo = 0;
    let hi = this.waiting.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (before(this.waiting[mid] as Req, req)) lo = mid + 1;
      else hi = mid;
    }
    this.waiting.splice(lo, 0, req);
  }

  /** Index of the most urgent waiting request that has arrived by `startMs` (-1: none). */
  private nextWaiting(startMs: number): number {
    return this.waiting.findIndex((r) => r.arrivalMs <= startMs);
  }

  private earliestWaiting(): Req | undefined {
    let first: Req | undefined;
    for (const r of this.waiting) if (!first || r.arrivalMs < first.arrivalMs) first = r;
    return first;
  }

  /** vLLM's victim under priority scheduling: the running request with the largest (priority, arrival). */
  private leastUrgentRunning(): Req | undefined {
    let victim: Req | undefined;
    for (const r of this.running) if (!victim || before(victim, r)) victim = r;
    return victim;
  }

  /** Takes a request out of the step being planned; returns the tokens it had been given. */
  private unschedule(work: Step["work"], req: Req): number {
    const i = work.findIndex((w) => w.req === req);
    if (i < 0) return 0;
    const [w] = work.splice(i, 1);
    return w?.tokens ?? 0;
  }

  /**
   * SGLang's preempt_to_schedule, for a waiting request facing a full batch: running requests,
   * least urgent and latest first, each more urgent than the candidate by more than the threshold,
   * until their blocks (with the free ones) cover the candidate's whole request. Preempts them and
   * returns true, or changes nothing and returns false. vLLM never does this.
   */
  private preemptForWaiting(cand: Req, work: Step["work"], admitted: ReadonlySet<Req>): boolean {
    const s = this.config.scheduling;
    if (s?.flavour !== "sglang" || s.preemption === false) return false;
    const threshold = s.preemptionThreshold ?? SGLANG_PREEMPTION_THRESHOLD;
    const hit = this.cacheHit(cand);
    const needed = this.blocksFor(cand.input.promptTokens.length + cand.maxTokens) - hit.length;
    let free = this.pool.freeBlocks - hit.filter((b) => b.refCount === 0).length;
    // As SGLang, requests admitted in this same pass are not candidates.
    const order = this.running.filter((r) => !admitted.has(r)).sort((a, b) => b.rank - a.rank || b.arrivalMs - a.arrivalMs || b.seq - a.seq);
    const victims: Req[] = [];
    for (const r of order) {
      if (!(r.rank - cand.rank > threshold)) break;
      victims.push(r);
      free += r.blocks.filter((b) => b.refCount === 1).length;
      if (free >= needed) break;
    }
    if (victims.length === 0 || free < needed) return false;
    for (const v of victims) {
      this.unschedule(work, v);
      this.preempt(v);
    }
    return true;
  }

  /** A transferred prompt counts as computed until a preemption throws its KV away. */
  private isTransferred(req: Req): boolean {
    return req.input.prefilled === true && !req.preempted;
  }

  private releaseHeld(req: Req): void {
    if (!this.held.delete(req)) return;
    this.pool.free(req.blocks);
    req.blocks = [];
    req.registered = 0;
  }

  private release(req: Req): void {
    const i = this.running.indexOf(req);
    if (i >= 0) this.running.splice(i, 1);
    this.pool.free(req.blocks);
    req.blocks = [];
    req.registered = 0;
  }

  private tryAllocate(req: Req, tokens: number): boolean {
    const needed = this.blocksFor(req.computed + tokens) - req.blocks.length;
    if (needed <= 0) return true;
    if (!this.pool.canAllocate(needed)) return false;
    req.blocks.push(...this.pool.allocate(needed));
    return true;
  }

  private numTokens(req: Req): number {
    return req.input.promptTokens.length + req.generated;
  }

  private blocksFor(tokens: number): number {
    return Math.ceil(tokens / this.config.blockSize);
  }
}
