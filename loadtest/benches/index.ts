/**
 * `node --expose-gc dist/loadtest/bench.js index`: the prefix index (services/views/prefix-index.ts)
 * on one core, in process — no NATS, no JSON: batches are pre-built KvBatch objects, as the gateway
 * holds them after decoding a message, so the figures are the index's own cost.
 *
 * 1. bytes per (block, pod) entry, worst case: every block held by exactly one pod (no sharing to
 *    amortise the block's cost), index filled past its budget so it is full and evicting; heap +
 *    array-buffer delta after forced GCs (needs --expose-gc; without it the figure is flagged).
 * 2. ingest: a simulated fleet of `pods` engines with per-pod LRU caches serving multi-turn
 *    conversations over shared system prompts (sticky routing with spills). Each engine batch
 *    is one KvBatch with one event: a 16-block BlockStored, or a BlockRemoved of up to 16 blocks
 *    when the engine evicts. Rate = (stored + removed blocks) / apply time.
 * 3. longest match: 512-block prompts (a conversation's history plus new blocks) over all 32 pods
 *    of the state left by (2), as bigint[] like the gateway passes them (and as a prepared
 *    BigUint64Array), touching matched blocks as the gateway does; and a worst case where every pod
 *    holds the whole 512-block prompt on GPU. Each lookup is timed alone; 3 rounds, median round.
 * The async signature matches the other benches; nothing here awaits.
 */
import type { KvBatch } from "../../schemas/events.js";
import { PrefixIndex } from "../../services/views/prefix-index.js";
import { xorshift32 } from "../../services/shared/seeded-random.js";

export interface IndexBenchOptions {
  /** Simulated engines (pods) of one model. */
  pods?: number;
  /** Blocks per looked-up prompt. */
  promptBlocks?: number;
  /** Stored blocks to generate for the ingest run (removals come on top). */
  ingestBlocks?: number;
  /** Blocks each simulated engine caches before it evicts (LRU). */
  podCapacity?: number;
  /** Index budget (entries) for the ingest run. */
  maxEntries?: number;
  /** Entries for the bytes-per-entry fill (at least 1 M for a stable figure). */
  memEntries?: number;
  /** Measured lookups per case and round. */
  lookups?: number;
  /** Rounds per lookup case (the median round is reported). */
  rounds?: number;
  seed?: number;
}

const MODEL = "bench/model";
const BLOCKS_PER_EVENT = 16;

type Gc = () => void;
const gcFn = (globalThis as { gc?: Gc }).gc;

function settledMemory(): number {
  if (gcFn) for (let i = 0; i < 3; i++) gcFn();
  const m = process.memoryUsage();
  // Typed arrays live outside the JS heap: count their backing stores too.
  return m.heapUsed + m.arrayBuffers;
}


const hex64 = (hi: number, lo: number) => (hi === 0 ? lo.toString(16) : hi.toString(16) + lo.toString(16).padStart(8, "0"));
const big64 = (hi: number, lo: number) => (BigInt(hi) << 32n) | BigInt(lo);

function percentile(sorted: Float64Array, q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number;
}

const round = (x: number, digits = 2) => Number(x.toFixed(digits));

/**
 * Times `lookups` calls of `fn(prepare(i))` one by one (`prepare` untimed), after a warm-up, in `rounds` rounds; returns the
 * median round's p50/p99/mean in µs (each percentile's median over rounds) and every round's p99:
 * on a shared 2-core machine one round's tail can be another process's time slice.
 */
function timeLookups<T>(lookups: number, rounds: number, prepare: (i: number) => T, fn: (input: T) => void) {
  for (let i = 0; i < Math.min(2_000, lookups); i++) fn(prepare(i));
  const p50s: number[] = [];
  const p99s: number[] = [];
  const means: number[] = [];
  const d = new Float64Array(lookups);
  for (let r = 0; r < rounds; r++) {
    for (let i = 0; i < lookups; i++) {
      const input = prepare(i);
      const t0 = performance.now();
      fn(input);
      d[i] = (performance.now() - t0) * 1000;
    }
    d.sort();
    let sum = 0;
    for (const x of d) sum += x;
    p50s.push(percentile(d, 0.5));
    p99s.push(percentile(d, 0.99));
    means.push(sum / lookups);
  }
  const med = (xs: number[]) => round([...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number);
  return { p50: med(p50s), p99: med(p99s), mean: med(means), p99Rounds: p99s.map((x) => round(x)) };
}

/** Block universe: random 64-bit router hashes, and their hex form made once per block. */
class Blocks {
  hi = new Uint32Array(1 << 16);
  lo = new Uint32Array(1 << 16);
  hex: string[] = [];
  n = 0;
  constructor(private readonly rand: () => number) {}
  add(): number {
    if (this.n === this.hi.length) {
      const hi = new Uint32Array(this.n * 2);
      hi.set(this.hi);
      this.hi = hi;
      const lo = new Uint32Array(this.n * 2);
      lo.set(this.lo);
      this.lo = lo;
    }
    const id = this.n++;
    this.hi[id] = (this.rand() * 2 ** 32) >>> 0;
    this.lo[id] = (this.rand() * 2 ** 32) >>> 0;
    this.hex.push(hex64(this.hi[id] as number, this.lo[id] as number));
    return id;
  }
  big(id: number): bigint {
    return big64(this.hi[id] as number, this.lo[id] as number);
  }
}

interface Conversation {
  chain: number[];
  /** Blocks that exist so far (history). */
  depth: number;
  pod: number;
}

/** Engine-side view of the simulated fleet; produces the batches the bridge would publish. */
class Fleet {
  readonly batches: KvBatch[] = [];
  stored = 0;
  removed = 0;
  private readonly caches: Map<number, true>[];
  private readonly salt: number[];
  private readonly seq: number[];
  private readonly names: string[];

  constructor(
    readonly pods: number,
    private readonly capacity: number,
    private readonly blocks: Blocks,
    rand: () => number,
  ) {
    this.caches = Array.from({ length: pods }, () => new Map());
    // Engines hash differently from the router (and from each other, with per-process seeds).
    this.salt = Array.from({ length: pods }, () => (rand() * 2 ** 32) >>> 0);
    this.seq = new Array(pods).fill(0);
    this.names = Array.from({ length: pods }, (_, i) => `pod-${i}`);
  }

  private engineHex(pod: number, id: number): string {
    return hex64(((this.blocks.hi[id] as number) ^ (this.salt[pod] as number)) >>> 0, ((this.blocks.lo[id] as number) ^ 0x5bd1e995) >>> 0);
  }

  private emit(pod: number, ev: KvBatch["events"][number]): void {
    const seq = this.seq[pod] as number;
    this.seq[pod] = seq + 1;
    this.batches.push({ type: "kv", model: MODEL, pod: this.names[pod] as string, epoch: "e1", seq, ts: 0, events: [ev] });
  }

  /** Pod `pod` runs a request over `chain[0..depth)`: hits are touched, misses stored, LRU evicted. */
  serve(pod: number, chain: readonly number[], depth: number): void {
    const cache = this.caches[pod] as Map<number, true>;
    let run: number[] = [];
    const flush = (parent: number | null) => {
      if (run.length === 0) return;
      this.emit(pod, {
        kind: "stored",
        engineHashes: run.map((id) => this.engineHex(pod, id)),
        routerHashes: run.map((id) => this.blocks.hex[id] as string),
        parentEngineHash: parent === null ? null : this.engineHex(pod, parent),
        blockSize: 16,
        medium: "GPU",
        lora: null,
      });
      this.stored += run.length;
      run = [];
    };
    let runParent: number | null = null;
    for (let k = 0; k < depth; k++) {
      const id = chain[k] as number;
      if (cache.has(id)) {
        flush(runParent);
        continue;
      }
      if (run.length === 0) runParent = k > 0 ? (chain[k - 1] as number) : null;
      run.push(id);
      if (run.length === BLOCKS_PER_EVENT) flush(runParent);
    }
    flush(runParent);
    // Touch root last so it is the most recent (engines free a request's blocks tail first).
    for (let k = depth - 1; k >= 0; k--) {
      const id = chain[k] as number;
      cache.delete(id);
      cache.set(id, true);
    }
    let evicted: string[] = [];
    for (const id of cache.keys()) {
      if (cache.size <= this.capacity) break;
      cache.delete(id);
      evicted.push(this.engineHex(pod, id));
      if (evicted.length === BLOCKS_PER_EVENT) {
        this.emit(pod, { kind: "removed", engineHashes: evicted, medium: "GPU" });
        this.removed += evicted.length;
        evicted = [];
      }
    }
    if (evicted.length) {
      this.emit(pod, { kind: "removed", engineHashes: evicted, medium: "GPU" });
      this.removed += evicted.length;
    }
  }
}

function bytesPerEntryWorstCase(entries: number, pods: number): Record<string, number | boolean> {
  const m0 = settledMemory();
  const index = new PrefixIndex({ maxEntries: entries });
  const rand = xorshift32(7);
  const total = Math.ceil((entries * 1.1) / BLOCKS_PER_EVENT) * BLOCKS_PER_EVENT;
  let applyMs = 0;
  let seq = 0;
  for (let done = 0; done < total; done += BLOCKS_PER_EVENT) {
    const rh: string[] = new Array(BLOCKS_PER_EVENT);
    const eh: string[] = new Array(BLOCKS_PER_EVENT);
    for (let k = 0; k < BLOCKS_PER_EVENT; k++) {
      rh[k] = hex64((rand() * 2 ** 32) >>> 0, (rand() * 2 ** 32) >>> 0);
      eh[k] = hex64((rand() * 2 ** 32) >>> 0, (rand() * 2 ** 32) >>> 0);
    }
    const pod = seq % pods;
    const batch: KvBatch = {
      type: "kv",
      model: MODEL,
      pod: `pod-${pod}`,
      epoch: "e1",
      seq: Math.floor(seq / pods),
      ts: 0,
      events: [{ kind: "stored", engineHashes: eh, routerHashes: rh, parentEngineHash: null, blockSize: 16, medium: "GPU", lora: null }],
    };
    const t0 = performance.now();
    index.apply(batch, ++seq);
    applyMs += performance.now() - t0;
  }
  const m1 = settledMemory();
  const s = index.stats();
  return {
    bytes_per_entry: round((m1 - m0) / s.entries, 1),
    worst_entries: s.entries,
    worst_stats_bytes_per_entry: round(s.bytes / s.entries, 1),
    worst_evicted_entries: s.evictedEntries,
    worst_ingest_blocks_per_s: Math.round(total / (applyMs / 1000)),
    gc: gcFn !== undefined,
  };
}

export async function runIndexBench(opts: IndexBenchOptions = {}): Promise<Record<string, unknown>> {
  const o = {
    pods: opts.pods ?? 32,
    promptBlocks: opts.promptBlocks ?? 512,
    ingestBlocks: opts.ingestBlocks ?? 1_200_000,
    podCapacity: opts.podCapacity ?? 24_000,
    maxEntries: opts.maxEntries ?? 1_000_000,
    memEntries: opts.memEntries ?? 1_000_000,
    lookups: opts.lookups ?? 20_000,
    rounds: opts.rounds ?? 3,
    seed: opts.seed ?? 42,
  };
  if (!gcFn) console.error("index bench: no global.gc (run node with --expose-gc): memory figures are unreliable");

  console.error(`index bench: filling ${o.memEntries} unshared entries for bytes/entry ...`);
  const mem = bytesPerEntryWorstCase(o.memEntries, o.pods);
  console.error(`  ${mem.bytes_per_entry} bytes per entry (heap + array buffers), ${mem.worst_stats_bytes_per_entry} by the index's own count`);

  // ---- workload
  console.error(`index bench: simulating ${o.pods} engines (capacity ${o.podCapacity} blocks each) until ${o.ingestBlocks} blocks are stored ...`);
  const rand = xorshift32(o.seed);
  const blocks = new Blocks(rand);
  const fleet = new Fleet(o.pods, o.podCapacity, blocks, rand);
  const families = Array.from({ length: 48 }, () => Array.from({ length: 8 + Math.floor(rand() * 120) }, () => blocks.add()));
  const maxDepth = o.promptBlocks + 128;
  const newConversation = (): Conversation => {
    // Popular system prompts are reused most (square skew towards low indices).
    const fam = families[Math.floor(rand() ** 2 * families.length)] as number[];
    return { chain: [...fam], depth: fam.length, pod: Math.floor(rand() * o.pods) };
  };
  const active = Array.from({ length: 2_000 }, newConversation);
  let requests = 0;
  while (fleet.stored < o.ingestBlocks) {
    const slot = Math.floor(rand() ** 2 * active.length);
    let c = active[slot] as Conversation;
    if (c.depth >= maxDepth) active[slot] = c = newConversation();
    // A turn: the new user message and the previous reply (8-64 blocks of 16 tokens).
    const grow = Math.min(8 + Math.floor(rand() * 57), maxDepth - c.depth);
    for (let k = 0; k < grow; k++) c.chain.push(blocks.add());
    c.depth += grow;
    // Prefix-aware routing is sticky, with spills to other pods under load.
    const pod = rand() < 0.85 ? c.pod : Math.floor(rand() * o.pods);
    fleet.serve(pod, c.chain, c.depth);
    requests++;
  }
  const batches = fleet.batches;
  console.error(`  ${requests} requests, ${batches.length} batches: ${fleet.stored} blocks stored, ${fleet.removed} removed`);

  // ---- ingest
  {
    const warm = new PrefixIndex({ maxEntries: o.maxEntries });
    const n = Math.min(batches.length, 100_000);
    for (let i = 0; i < n; i++) warm.apply(batches[i] as KvBatch, i + 1);
  }
  const m0 = settledMemory();
  const index = new PrefixIndex({ maxEntries: o.maxEntries });
  const t0 = performance.now();
  for (let i = 0; i < batches.length; i++) index.apply(batches[i] as KvBatch, i + 1);
  const ingestMs = performance.now() - t0;
  const m1 = settledMemory();
  const st = index.stats();
  const events = fleet.stored + fleet.removed;
  const ingestRate = Math.round(events / (ingestMs / 1000));
  console.error(
    `  ingest: ${ingestRate} block events/s (${ingestMs.toFixed(0)} ms); index ${st.entries} entries over ${st.blocks} blocks, ${round((m1 - m0) / st.entries, 1)} bytes/entry, ${st.evictedEntries} evicted by budget`,
  );

  // ---- longest match over the resulting state
  const prompts: bigint[][] = [];
  const promptMatches: number[] = [];
  for (let q = 0; q < 1_000; q++) {
    const c = active[Math.floor(rand() ** 2 * active.length)] as Conversation;
    const have = Math.min(c.depth, o.promptBlocks);
    const p: bigint[] = new Array(o.promptBlocks);
    for (let k = 0; k < have; k++) p[k] = blocks.big(c.chain[k] as number);
    // The rest of the prompt is new text: blocks nobody holds.
    for (let k = have; k < o.promptBlocks; k++) p[k] = big64((rand() * 2 ** 32) >>> 0, (rand() * 2 ** 32) >>> 0);
    prompts.push(p);
  }
  const candidates = Array.from({ length: o.pods }, (_, i) => ({ pod: `pod-${i}` }));
  let sink = 0;
  for (const p of prompts) promptMatches.push(index.longestMatch(MODEL, p, candidates, { touch: false }).best);
  const sortedMatches = Float64Array.from(promptMatches).sort();
  // The gateway hashes a prompt right before the lookup, so its bigints are new and cache-hot;
  // re-reading 1000 stored prompts' BigInt objects from old space would time cache misses on
  // the BigInts themselves. So each lookup gets fresh copies (made untimed).
  const fresh = (i: number) => (prompts[i % prompts.length] as bigint[]).map((h) => h + 0n);
  const real = timeLookups(o.lookups, o.rounds, fresh, (p) => {
    sink += index.longestMatch(MODEL, p, candidates).best;
  });
  const prepared = prompts.map((p) => BigUint64Array.from(p));
  const realPrepared = timeLookups(
    o.lookups,
    o.rounds,
    (i) => prepared[i % prepared.length] as BigUint64Array,
    (p) => {
      sink += index.longestMatch(MODEL, p, candidates).best;
    },
  );
  console.error(`  match (realistic, median best ${percentile(sortedMatches, 0.5)} blocks): p50 ${real.p50} us, p99 ${real.p99} us; prepared keys p99 ${realPrepared.p99} us`);

  // ---- worst case: every pod holds the whole prompt
  const worst = new PrefixIndex({ maxEntries: o.pods * o.promptBlocks });
  const chain = Array.from({ length: o.promptBlocks }, () => blocks.add());
  let wseq = 0;
  for (let pod = 0; pod < o.pods; pod++) {
    for (let k = 0; k < o.promptBlocks; k += BLOCKS_PER_EVENT) {
      const ids = chain.slice(k, k + BLOCKS_PER_EVENT);
      worst.apply(
        {
          type: "kv",
          model: MODEL,
          pod: `pod-${pod}`,
          epoch: "e1",
          seq: k / BLOCKS_PER_EVENT,
          ts: 0,
          events: [{ kind: "stored", engineHashes: ids.map((id) => blocks.hex[id] as string), routerHashes: ids.map((id) => blocks.hex[id] as string), parentEngineHash: null, blockSize: 16, medium: "GPU", lora: null }],
        },
        ++wseq,
      );
    }
  }
  const worstPrompt = chain.map((id) => blocks.big(id));
  const w = timeLookups(
    o.lookups,
    o.rounds,
    () => worstPrompt.map((h) => h + 0n),
    (p) => {
      sink += worst.longestMatch(MODEL, p, candidates).best;
    },
  );
  console.error(`  match (worst: ${o.pods} pods x ${o.promptBlocks} blocks all held): p50 ${w.p50} us, p99 ${w.p99} us`);
  if (sink < 0) console.error(sink);

  return {
    bench: "index",
    ingest_blocks_per_s: ingestRate,
    match_p50_us: real.p50,
    match_p99_us: real.p99,
    bytes_per_entry: mem.bytes_per_entry,
    pods: o.pods,
    prompt_blocks: o.promptBlocks,
    ingest_stored_blocks: fleet.stored,
    ingest_removed_blocks: fleet.removed,
    ingest_batches: batches.length,
    ingest_note: "pre-built KvBatch objects, one event (16-block store or <=16-block removal) each; JSON parsing excluded",
    index_entries: st.entries,
    index_blocks: st.blocks,
    index_evicted_entries: st.evictedEntries,
    bytes_per_entry_realistic: round((m1 - m0) / st.entries, 1),
    match_mean_us: real.mean,
    match_median_best_blocks: percentile(sortedMatches, 0.5),
    match_p99_rounds_us: real.p99Rounds,
    match_prepared_p50_us: realPrepared.p50,
    match_prepared_p99_us: realPrepared.p99,
    match_worst_p50_us: w.p50,
    match_worst_p99_us: w.p99,
    ...mem,
  };
}
