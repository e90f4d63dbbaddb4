/**
 * Prefix index: which pod holds which KV blocks, folded from the KV stream. Pure: no I/O.
 *
 * Keys are the router's own chained block hashes (services/views/block-hash.ts) that the kv-bridge
 * attaches to every stored block, so the index never hashes tokens and one index serves every
 * (model, LoRA, block size): those are part of the hash seed, so their blocks can never collide.
 * Removals carry only engine hashes; each (pod, engine hash) maps to the entry it created.
 *
 * Layout (why not Maps): 64-bit keys as BigInt or hex strings in a Map cost 45-55 bytes per key and
 * ~200-400 ns per insert once the key objects are counted (measured on Node 20, 1 M random keys);
 * the same keys split into two uint32 halves in an open-addressing table over typed arrays cost
 * ~16 bytes and ~35 ns, and keep the data off the GC's hands. So the index is records in two
 * Int32Arrays, each record's fields side by side (one cache line per step of a lookup: interleaved
 * records made the 512-block lookup ~1.4x faster than one array per field):
 *   block  = hi, lo, first holder entry, LRU prev, LRU next, holder mask,
 *            GPU-holder mask (over the model's first 32 pods), model id    32 bytes + block table slot
 *   entry  = one (block, pod): block, next holder of the block, prev/next
 *            entry of the pod, engine hash hi/lo, pod id | tier mask << 16  28 bytes + engine table slot
 * Two linear-probing tables (load <= 0.7, backward-shift deletion, no tombstones) map
 * (hi, lo, model) -> block and (pod, engine hash) -> entry. A block lives while some pod holds it.
 * All 32-bit halves are kept as signed int32 (what an Int32Array returns), so compares need no conversion.
 *
 * Lookup cost: the first 32 pods of each model get a slot, and each block carries a bitmask of the
 * slots holding it (and of those holding it on GPU). A lookup then costs O(1) bit operations per
 * block whatever the sharing (a system prompt held by all 32 pods is the common, expensive case:
 * walking its holder lists took ~5 ns x 32 per block); holder lists are walked only for pods beyond
 * the 32nd and for blocks held off-GPU. The model is part of a block's key (router hashes are seeded
 * by model anyway), so a block's holders are pods of one model and the model-local bits never alias.
 * (Resolving blocks in chunks ahead of the scan, to overlap their cache misses, measured slower in
 * an interleaved A/B than probing block by block: the CPU already overlaps the independent probes.)
 *
 * Ordering: each pod's messages apply in stream-sequence order; a message at or below the pod's
 * cursor is ignored, so a replayed store can never resurrect a block removed later. Within an engine
 * epoch a batch whose engine seq is not newer is a duplicate (two bridges, re-publication) and is
 * ignored too; a new epoch means a new engine incarnation with an empty cache, so the pod is cleared
 * even if the bridge's kv-cleared message was lost.
 *
 * Memory bound: at most `maxEntries` (block, pod) entries. Beyond it the least recently touched
 * block is evicted with all its entries. Engines evict LRU as well, and a block is "touched" when it
 * is stored and when a lookup matches it — the second matters because engines do not re-announce
 * prefix-cache hits, so a system prompt stored once and reused all day would otherwise age out
 * first. Touches order a chain root-first (the first block most recent), so eviction trims chains
 * from their tail, like vLLM frees a finished request's blocks tail-first; evicting a chain's root
 * would make every later block of the chain unmatchable (lookups stop at the first miss). A chain
 * stored or touched before lies in the LRU list as contiguous runs, and a lookup moves each run
 * with one splice, so touching costs O(runs), not O(blocks).
 * Lookup touches are per replica, so under budget pressure replicas may evict differently; a shell
 * wanting identical eviction everywhere sets `touchOnMatch: false` and calls `touch()` for the
 * routing decisions it reads back from a shared stream.
 * Engine removals are the primary deletion path; the budget is the backstop for lost removals and
 * for unbounded tiers (CPU, storage).
 *
 * Why one file of ~1,400 lines: it is one data structure. The record arrays, both hash tables, the
 * LRU list, the holder masks and the per-pod cursors share invariants that every mutation keeps
 * together (a store touches all of them in one pass); split across modules, each piece would have to
 * expose raw record offsets to the others. Its helpers (hex parsing, growth) are the only free code.
 */
import type { KvBatch, KvPodCleared } from "../../schemas/events.js";

/** Storage tiers, weakest match last. Unknown media count as `other`. */
export type TierName = "gpu" | "cpu" | "storage" | "other";
export type TierWeights = Readonly<Record<TierName, number>>;
export const TIER_NAMES: readonly TierName[] = ["gpu", "cpu", "storage", "other"];
/** A GPU block is used as is; CPU blocks must be copied back; storage/remote blocks must be read. */
/** The index bound a gateway folds with unless told otherwise, in (block, pod) entries. */
export const DEFAULT_PREFIX_MAX_ENTRIES = 4_000_000;

export const DEFAULT_TIER_WEIGHTS: TierWeights = Object.freeze({ gpu: 1, cpu: 0.5, storage: 0.25, other: 0.25 });

/** Tier index of an event's `medium` (null = GPU, as engines without tiers mean it). */
export function tierOf(medium: string | null | undefined): number {
  if (medium == null) return 0;
  switch (medium) {
    case "GPU":
      return 0;
    case "CPU":
    case "CPU_PINNED":
      return 1;
    // vLLM STORAGE (older FS, OBJ); SGLang DISK, EXTERNAL (remote stores such as 3FS, Mooncake).
    case "STORAGE":
    case "FS":
    case "OBJ":
    case "DISK":
    case "EXTERNAL":
      return 2;
  }
  const upper = medium.toUpperCase();
  return upper === medium ? 3 : tierOf(upper);
}

export interface PrefixIndexOptions {
  /** Bound on (block, pod) entries; least recently touched blocks are evicted beyond it. */
  maxEntries?: number;
  /** Alternative bound in bytes, converted with the worst-case layout cost (`WORST_BYTES_PER_ENTRY`). */
  maxBytes?: number;
  /** Weight of a matched block by the best tier the pod holds it in. */
  tierWeights?: Partial<TierWeights>;
  /** Whether `longestMatch` touches the blocks it matched (see the module comment). */
  touchOnMatch?: boolean;
  /** Removed pods whose stream cursor is remembered, so their old messages stay ignored. */
  maxTombstones?: number;
  /** Entries to allocate up front (avoids growth pauses when the working size is known). */
  initialEntries?: number;
}

/**
 * Result of `longestMatch`: parallel arrays, one slot per pod in `pods`. A pod's match is the run of
 * consecutive query blocks from the first that it holds in any tier; it ends at that pod's first miss.
 */
export interface PrefixMatch {
  /** Blocks in the query. */
  readonly queried: number;
  /** Blocks looked up before the scan stopped (no pod continued, or a block nobody holds). */
  readonly scanned: number;
  /** The candidates' names in the order given, or every pod of the model the index knows. */
  readonly pods: readonly string[];
  /** Matched blocks per pod. */
  readonly blocks: Int32Array;
  /** Of those, blocks the pod holds on GPU. */
  readonly gpuBlocks: Int32Array;
  /** Sum over the matched blocks of the best tier's weight (= `blocks` when all are on GPU). */
  readonly weighted: Float64Array;
  /** Largest `blocks`. */
  readonly best: number;
}

export type ApplyOutcome = "applied" | "stale" | "duplicate";

export interface PrefixIndexStats {
  entries: number;
  blocks: number;
  pods: number;
  maxEntries: number;
  /** Blocks (and their entries) dropped by the budget. */
  evictedBlocks: number;
  evictedEntries: number;
  /** Messages ignored: stream seq not newer than the pod's cursor. */
  stale: number;
  /** Batches ignored: engine seq not newer within the same epoch. */
  duplicates: number;
  /** Engine seq jumps within an epoch (applied; the bridge repairs gaps, this only counts them). */
  engineSeqGaps: number;
  /** Pods cleared because a batch came from a new engine epoch. */
  epochResets: number;
  /** all-cleared events and kv-cleared messages applied. */
  podClears: number;
  /** Removals of an engine hash the pod has no entry for (evicted, or stored before we started). */
  removeMisses: number;
  /** A stored engine hash that now names another block in the same pod (engine restart, hash reuse). */
  remapped: number;
  /** Hashes that are not hex (or router hashes wider than 64 bits): the block is skipped. */
  badHashes: number;
  /** Highest stream sequence applied. */
  lastSeq: number;
  /** Typed arrays plus an estimate for pod records. */
  bytes: number;
}

/** A pod's position in the KV stream: what `apply` compares against. */
export interface PodCursor {
  /** Last applied stream sequence. */
  streamSeq: number;
  epoch: string | null;
  /** Last applied engine seq in `epoch` (-1: none yet). */
  engineSeq: number;
}

interface PodState extends PodCursor {
  readonly model: string;
  readonly pod: string;
  readonly id: number;
  /** Model id (blocks are keyed by model too). */
  readonly mid: number;
  /** Bit position in the blocks' holder masks, or -1 beyond the model's first SLOTS pods. */
  readonly slot: number;
  /** First entry of the pod's entry list (-1: none). */
  head: number;
  entries: number;
}

const NONE = -1;
const MAX_LOAD = 0.7;
const MIN_TABLE = 16;
/** Pod ids are stored as uint16; 0xffff is kept free. */
const MAX_PODS = 0xffff;
// Entry record (ES int32 words) and block record (BS words).
const ES = 7;
const E_BLOCK = 0;
/** Next holder of the same block; also the free-list link. */
const E_NEXT = 1;
const E_PPREV = 2;
const E_PNEXT = 3;
const E_EHI = 4;
const E_ELO = 5;
/** Pod id in the low 16 bits, tier mask above. */
const E_PT = 6;
const BS = 8;
const B_HI = 0;
const B_LO = 1;
const B_HEAD = 2;
const B_PREV = 3;
/** LRU next (towards the tail); also the free-list link. */
const B_NEXT = 4;
/** Holders among the model's first 32 pods (bit = the pod's slot), any tier / on GPU. */
const B_HOLD = 5;
const B_GPU = 6;
/** Model id: part of the key, so a hash stored under two models is two blocks (and the masks never mix models). */
const B_MODEL = 7;
/** Pods of one model with a mask slot; further pods are found by walking holder lists. */
const SLOTS = 32;
const ENTRY_BYTES = ES * 4;
const BLOCK_BYTES = BS * 4;

/** Layout cost of an entry whose block no other pod shares, tables just grown (load 0.35). */
export const WORST_BYTES_PER_ENTRY = Math.ceil(ENTRY_BYTES + BLOCK_BYTES + (2 * 4) / (MAX_LOAD / 2));
const POD_BYTES = 256;
const SNAPSHOT_MAGIC = 0x4950524a; // "JRPI"
const SNAPSHOT_VERSION = 1;

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
/** Offsets of the low and high 32-bit halves of a uint64 in an Int32Array view. */
const LO = LITTLE_ENDIAN ? 0 : 1;
const HI = LITTLE_ENDIAN ? 1 : 0;

const HEX = new Int8Array(128).fill(-1);
for (let i = 0; i < 10; i++) HEX[48 + i] = i;
for (let i = 0; i < 6; i++) HEX[97 + i] = HEX[65 + i] = 10 + i;

// Results of parseHex: module scratch instead of a returned object, so ingest allocates nothing.
let pHi = 0;
let pLo = 0;

/**
 * Parses a hex hash into (pHi, pLo). Up to 16 digits: the exact value. Longer (engine digests):
 * folded to 64 bits with two multiplicative mixes — the fold only has to keep a pod's engine hashes
 * apart, and digests are uniformly random. Returns false on a non-hex character or an empty string.
 */
function parseHex(s: string, allowFold: boolean): boolean {
  const n = s.length;
  if (n === 0) return false;
  if (n <= 16) {
    let hi = 0;
    let lo = 0;
    const split = n - 8;
    for (let i = 0; i < n; i++) {
      const c = s.charCodeAt(i);
      const v = c < 128 ? (HEX[c] as number) : -1;
      if (v < 0) return false;
      if (i < split) hi = (hi << 4) | v;
      else lo = (lo << 4) | v;
    }
    pHi = hi | 0;
    pLo = lo | 0;
    return true;
  }
  if (!allowFold) return false;
  let h1 = 0x811c9dc5;
  let h2 = 0x6a09e667;
  let w = 0;
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    const v = c < 128 ? (HEX[c] as number) : -1;
    if (v < 0) return false;
    w = (w << 4) | v;
    if ((i & 7) === 7 || i === n - 1) {
      h1 = Math.imul(h1 ^ w, 0x9e3779b1);
      h1 = (h1 << 13) | (h1 >>> 19);
      h2 = Math.imul(h2 ^ w, 0x85ebca6b);
      h2 = (h2 << 17) | (h2 >>> 15);
      w = 0;
    }
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16) ^ n, 0xc2b2ae35);
  h2 = Math.imul(h2 ^ (h2 >>> 13) ^ n, 0x27d4eb2f);
  pHi = h1 ^ (h1 >>> 15);
  pLo = h2 ^ (h2 >>> 16);
  return true;
}

// Fibonacci hashing on a mix of the halves: router hashes are already uniform (xxh64), but engine
// hashes and test keys may be small or sequential, and the mix costs two multiplications.
const blockHome = (hi: number, lo: number, mid: number, shift: number) => Math.imul(lo ^ Math.imul(hi, 0x85ebca6b) ^ mid, 0x9e3779b1) >>> shift;
const entryHome = (pod: number, hi: number, lo: number, shift: number) =>
  Math.imul(lo ^ Math.imul(hi, 0x85ebca6b) ^ Math.imul(pod + 1, 0xc2b2ae35), 0x9e3779b1) >>> shift;

const log2 = (n: number) => 31 - Math.clz32(n);
const tableCapFor = (n: number) => {
  let cap = MIN_TABLE;
  while (n > cap * MAX_LOAD) cap *= 2;
  return cap;
};

/** A prefix index's state as a snapshot is written from it (PrefixIndex.capture: copies). */
interface SnapshotSource {
  lastSeq: number;
  pods: ReadonlyArray<PodCursor & { model: string; pod: string; id: number }>;
  tombs: ReadonlyArray<{ model: string; pod: string; c: PodCursor }>;
  blockCount: number;
  entryCount: number;
  lruTail: number;
  E: Int32Array;
  B: Int32Array;
}

/** Blocks + entries encoded between two yields of `serializeSliced` (~1 ms of work). */
export const SNAPSHOT_SLICE_WORK = 4_096;

/** Encodes a snapshot, yielding after about every SNAPSHOT_SLICE_WORK blocks + entries; returns the bytes. */
function* writeSnapshot(src: SnapshotSource): Generator<void, Uint8Array, void> {
  const enc = new TextEncoder();
  const { pods, E, B } = src;
  const podIndex = new Map<number, number>();
  for (let i = 0; i < pods.length; i++) podIndex.set((pods[i] as SnapshotSource["pods"][number]).id, i);
  const strs = (c: { model: string; pod: string; epoch: string | null }) => [enc.encode(c.model), enc.encode(c.pod), c.epoch === null ? null : enc.encode(c.epoch)] as const;
  const podStrs = pods.map(strs);
  const tombs = src.tombs.map((t) => ({ c: t.c, s: strs({ model: t.model, pod: t.pod, epoch: t.c.epoch }) }));
  const strBytes = (s: readonly (Uint8Array | null)[]) => s.reduce((a, b) => a + 2 + (b ? b.length : 0), 0);
  let size = 4 + 2 + 2 + 8 + 4 + 4 + 4 + 4;
  for (const s of podStrs) size += strBytes(s) + 16;
  for (const t of tombs) size += strBytes(t.s) + 16;
  size += src.blockCount * 10 + src.entryCount * 11;

  const buf = new Uint8Array(size);
  const dv = new DataView(buf.buffer);
  let o = 0;
  const u8 = (v: number) => dv.setUint8(o++, v);
  const u16 = (v: number) => {
    dv.setUint16(o, v, true);
    o += 2;
  };
  const i32 = (v: number) => {
    dv.setInt32(o, v, true);
    o += 4;
  };
  const f64 = (v: number) => {
    dv.setFloat64(o, v, true);
    o += 8;
  };
  const str = (b: Uint8Array | null) => {
    if (!b) return u16(0xffff);
    u16(b.length);
    buf.set(b, o);
    o += b.length;
  };
  const cursor = (s: readonly (Uint8Array | null)[], c: PodCursor) => {
    for (const x of s) str(x);
    f64(c.streamSeq);
    f64(c.engineSeq);
  };
  i32(SNAPSHOT_MAGIC);
  u16(SNAPSHOT_VERSION);
  u16(0);
  f64(src.lastSeq);
  i32(pods.length);
  for (let i = 0; i < pods.length; i++) cursor(podStrs[i] as readonly (Uint8Array | null)[], pods[i] as PodCursor);
  i32(tombs.length);
  for (const t of tombs) cursor(t.s, t.c);
  i32(src.blockCount);
  i32(src.entryCount);
  let sliced = 0;
  for (let b = src.lruTail; b !== NONE; b = B[b * BS + B_PREV] as number) {
    i32(B[b * BS + B_HI] as number);
    i32(B[b * BS + B_LO] as number);
    let n = 0;
    for (let e = B[b * BS + B_HEAD] as number; e !== NONE; e = E[e * ES + E_NEXT] as number) n++;
    u16(n);
    for (let e = B[b * BS + B_HEAD] as number; e !== NONE; e = E[e * ES + E_NEXT] as number) {
      const pt = E[e * ES + E_PT] as number;
      u16(podIndex.get(pt & 0xffff) as number);
      u8(pt >>> 16);
      i32(E[e * ES + E_EHI] as number);
      i32(E[e * ES + E_ELO] as number);
    }
    // A slice's work is its blocks and their holders (a block every pod holds is a hundred entries).
    sliced += 1 + n;
    if (sliced >= SNAPSHOT_SLICE_WORK) {
      sliced = 0;
      yield;
    }
  }
  if (o !== size) throw new Error(`prefix index snapshot: wrote ${o} of ${size} bytes`);
  return buf;
}

/**
 * Arrays double up to the budget and stop there, so a full index carries no growth slack. Only a
 * snapshot larger than the budget grows past it (and is evicted down right after loading).
 */
const nextCap = (cap: number, max: number) => (cap < max ? Math.min(cap * 2, max) : cap * 2);

function grown(a: Int32Array, len: number): Int32Array {
  const b = new Int32Array(len);
  b.set(a);
  return b;
}

type Candidate = string | { readonly pod: string };

export class PrefixIndex {
  readonly maxEntries: number;
  readonly tierWeights: TierWeights;
  readonly touchOnMatch: boolean;
  readonly maxTombstones: number;
  /** Best tier weight for each tier mask: a pod may hold a block on GPU and CPU at once. */
  private readonly maskWeight = new Float64Array(16);

  /** Entry records, ES words each. */
  private E: Int32Array = new Int32Array(0);
  private eCap = 0;
  private eUsed = 0;
  private eFree = NONE;
  private entryCount = 0;
  /** (pod, engine hash) -> entry. */
  private eTab: Int32Array;
  private eShift: number;
  private eMask: number;

  /** Block records, BS words each. */
  private B: Int32Array = new Int32Array(0);
  private bCap = 0;
  private bUsed = 0;
  private bFree = NONE;
  private blockCount = 0;
  private lruHead = NONE;
  private lruTail = NONE;
  /** (hi, lo, model) -> block. */
  private bTab: Int32Array;
  private bShift: number;
  private bMask: number;

  private readonly models = new Map<string, Map<string, PodState>>();
  /** Bumped whenever a pod state is created or dropped (invalidates candCache). */
  private podsVersion = 0;
  private candCache:
    | { candidates: readonly Candidate[]; model: string; version: number; names: readonly string[]; states: readonly (PodState | undefined)[] }
    | undefined;
  private readonly modelIds = new Map<string, number>();
  /** Mask slots in use, per model. */
  private readonly slotsUsed = new Map<string, number>();
  private podById: (PodState | undefined)[] = [];
  private freePodIds: number[] = [];
  private podCount = 0;
  private readonly tombstones = new Map<string, PodCursor>();
  /** Candidate slot + 1 per pod id during a lookup; all zero between lookups. */
  private slotOf: Int32Array = new Int32Array(64);
  /** Candidate index per mask slot during a lookup. */
  private readonly slotCand = new Int32Array(SLOTS);
  private keyScratch: BigUint64Array = new BigUint64Array(0);
  private keyScratch32: Int32Array = new Int32Array(0);

  private readonly counters = {
    evictedBlocks: 0,
    evictedEntries: 0,
    stale: 0,
    duplicates: 0,
    engineSeqGaps: 0,
    epochResets: 0,
    podClears: 0,
    removeMisses: 0,
    remapped: 0,
    badHashes: 0,
  };
  lastSeq = 0;

  constructor(opts: PrefixIndexOptions = {}) {
    let max = opts.maxEntries ?? 2_000_000;
    if (opts.maxBytes !== undefined) max = Math.min(max, Math.floor(opts.maxBytes / WORST_BYTES_PER_ENTRY));
    if (!Number.isInteger(max) || max < 1) throw new RangeError(`maxEntries must be a positive integer, got ${max}`);
    this.maxEntries = max;
    this.tierWeights = Object.freeze({ ...DEFAULT_TIER_WEIGHTS, ...opts.tierWeights });
    this.touchOnMatch = opts.touchOnMatch ?? true;
    this.maxTombstones = opts.maxTombstones ?? 4096;
    const w = TIER_NAMES.map((t) => this.tierWeights[t]);
    // Lookups count GPU blocks at the GPU weight without reading their other tiers: GPU must be the best.
    for (const x of w) {
      if (!(x >= 0 && x <= this.tierWeights.gpu)) throw new RangeError(`tier weights must lie in [0, gpu weight], got ${JSON.stringify(this.tierWeights)}`);
    }
    for (let m = 1; m < 16; m++) {
      let best = 0;
      for (let t = 0; t < 4; t++) if (m & (1 << t)) best = Math.max(best, w[t] as number);
      this.maskWeight[m] = best;
    }
    const initial = Math.min(Math.max(opts.initialEntries ?? 1024, 16), max);
    this.growEntries(initial);
    this.growBlocks(initial);
    this.eTab = new Int32Array(tableCapFor(initial)).fill(NONE);
    this.eShift = 32 - log2(this.eTab.length);
    this.eMask = this.eTab.length - 1;
    this.bTab = new Int32Array(tableCapFor(initial)).fill(NONE);
    this.bShift = 32 - log2(this.bTab.length);
    this.bMask = this.bTab.length - 1;
  }

  // ---------------------------------------------------------------- stream input

  /** Applies one KV batch read at stream sequence `streamSeq` (>= 1). */
  apply(batch: KvBatch, streamSeq: number): ApplyOutcome {
    if (streamSeq > this.lastSeq) this.lastSeq = streamSeq;
    if (this.isStale(batch.model, batch.pod, streamSeq)) return "stale";
    const p = this.podFor(batch.model, batch.pod);
    if (p.epoch !== batch.epoch) {
      if (p.epoch !== null && p.head !== NONE) {
        this.clearPod(p);
        this.counters.epochResets++;
      }
      p.epoch = batch.epoch;
    } else if (batch.seq <= p.engineSeq) {
      // Consume the stream position anyway: a later copy of this batch is just as stale.
      p.streamSeq = streamSeq;
      this.counters.duplicates++;
      return "duplicate";
    } else if (p.engineSeq >= 0 && batch.seq > p.engineSeq + 1) this.counters.engineSeqGaps++;
    p.engineSeq = batch.seq;
    p.streamSeq = streamSeq;

    for (const ev of batch.events) {
      if (ev.kind === "stored") {
        const bit = 1 << tierOf(ev.medium);
        const rh = ev.routerHashes;
        const eh = ev.engineHashes;
        // Deepest block first, so the event's first block ends up most recently touched.
        for (let j = Math.min(rh.length, eh.length) - 1; j >= 0; j--) {
          if (!parseHex(eh[j] as string, true)) {
            this.counters.badHashes++;
            continue;
          }
          const ehi = pHi;
          const elo = pLo;
          if (!parseHex(rh[j] as string, false)) {
            this.counters.badHashes++;
            continue;
          }
          this.store(p, pHi, pLo, ehi, elo, bit);
        }
      } else if (ev.kind === "removed") {
        const bit = 1 << tierOf(ev.medium);
        for (const h of ev.engineHashes) {
          if (!parseHex(h, true)) {
            this.counters.badHashes++;
            continue;
          }
          const e = this.findEntry(p.id, pHi, pLo);
          if (e === NONE) {
            this.counters.removeMisses++;
            continue;
          }
          const t = ((this.E[e * ES + E_PT] as number) >>> 16) & ~bit;
          if (t === 0) this.removeEntry(e);
          else this.setTiers(e, t);
        }
      } else {
        this.clearPod(p);
        this.counters.podClears++;
      }
    }
    return "applied";
  }

  /** Applies a kv-cleared message: the bridge lost track of the pod's cache, forget all of it. */
  applyCleared(ev: KvPodCleared, streamSeq: number): ApplyOutcome {
    if (streamSeq > this.lastSeq) this.lastSeq = streamSeq;
    if (this.isStale(ev.model, ev.pod, streamSeq)) return "stale";
    const p = this.podFor(ev.model, ev.pod);
    p.streamSeq = streamSeq;
    this.clearPod(p);
    this.counters.podClears++;
    // The bridge restarts numbering (it may replay the engine's buffer from 0): accept any engine seq.
    p.epoch = ev.epoch;
    p.engineSeq = -1;
    return "applied";
  }

  /** Drops a pod that left the pod set. Its cursor is kept (bounded) so its old messages stay ignored. */
  removePod(model: string, pod: string): boolean {
    const pods = this.models.get(model);
    const p = pods?.get(pod);
    if (!pods || !p) return false;
    this.clearPod(p);
    pods.delete(pod);
    if (pods.size === 0) this.models.delete(model);
    this.podById[p.id] = undefined;
    this.freePodIds.push(p.id);
    this.podsVersion++;
    if (p.slot >= 0) this.slotsUsed.set(model, (this.slotsUsed.get(model) ?? 0) & ~(1 << p.slot));
    this.podCount--;
    this.tombstones.set(podKey(model, pod), { streamSeq: p.streamSeq, epoch: p.epoch, engineSeq: p.engineSeq });
    if (this.tombstones.size > this.maxTombstones) {
      const oldest = this.tombstones.keys().next().value as string;
      this.tombstones.delete(oldest);
    }
    return true;
  }

  // ---------------------------------------------------------------- lookups

  /**
   * Longest cached prefix of `hashes` (router hashes of the prompt's blocks, first block first) per
   * pod of `model` (the pod's model as on the KV subject, not a LoRA name; the hashes carry the LoRA).
   * `candidates`: pod names or PodInfo-like objects; default every pod of the model. Their
   * resolution is cached by array identity (readyPods arrays are replaced, never mutated, on a
   * change): do not mutate a candidates array in place between lookups.
   * Cost: one table probe and a few bit operations per block until no candidate continues (holder
   * lists are walked only for pods beyond a model's 32nd and for off-GPU holders); touching costs
   * one splice per run of blocks already contiguous in the LRU list. Allocations: the result arrays.
   * Pass a `BigUint64Array` to skip the copy of a bigint[] (e.g. when several strategies look up the same prompt).
   */
  longestMatch(model: string, hashes: readonly bigint[] | BigUint64Array, candidates?: readonly Candidate[], opts?: { touch?: boolean }): PrefixMatch {
    const { names, states } = this.resolveCandidates(model, candidates);
    const n = names.length;
    const blocks = new Int32Array(n);
    // For pods with a slot these two first accumulate only the off-GPU blocks (fixed up at the end).
    const gpuBlocks = new Int32Array(n);
    const weighted = new Float64Array(n);
    const m = hashes.length;
    // Alive pods: slotted ones as bits of `alive`; the others (beyond SLOTS) via slotOf, counted in `walkers`.
    let alive = 0;
    let walkers = 0;
    const slotOf = this.slotOf;
    const slotCand = this.slotCand;
    for (let i = 0; i < n; i++) {
      const s = states[i];
      if (!s) continue;
      if (s.slot >= 0) {
        alive |= 1 << s.slot;
        slotCand[s.slot] = i;
      } else {
        if (slotOf[s.id] === 0) walkers++;
        slotOf[s.id] = i + 1;
      }
    }
    let scanned = 0;
    let best = 0;
    if ((alive !== 0 || walkers > 0) && m > 0) {
      const mid = this.modelIds.get(model) as number;
      // A bigint[] is copied block by block, only as far as the scan goes.
      const copy = !(hashes instanceof BigUint64Array);
      const words = this.keyWords(hashes, !copy);
      const ks = this.keyScratch;
      const touch = opts?.touch ?? this.touchOnMatch;
      const E = this.E;
      const B = this.B;
      const maskWeight = this.maskWeight;
      // Touch bookkeeping: matched blocks that are already contiguous in the LRU list (a chain stored
      // or touched before) form a run, moved as one splice; `placed` ends what is already in front.
      let runStart = NONE;
      let runEnd = NONE;
      let placed = NONE;
      let prev = NONE;
      for (let i = 0; i < m; i++) {
        if (copy) ks[i] = (hashes as readonly bigint[])[i] as bigint;
        const hi = words[2 * i + HI] as number;
        const lo = words[2 * i + LO] as number;
        // A chain stored in one event lies in neighbouring records (see `nextInChain`): one compare
        // of the record beside the previous block's, usually in the same cache line, instead of a
        // table probe (a cache miss in a large index).
        let b = prev === NONE ? NONE : this.nextInChain(prev, hi, lo, mid);
        if (b === NONE) b = this.findBlock(hi, lo, mid);
        prev = b;
        scanned++;
        if (b === NONE) break;
        const bo = b * BS;
        const hold = B[bo + B_HOLD] as number;
        const next = alive & hold;
        // Slotted pods that miss this block stop here with i blocks.
        for (let d = alive & ~hold; d !== 0; d &= d - 1) blocks[slotCand[31 - Math.clz32(d & -d)] as number] = i;
        // Those that continue off-GPU: read their tier from the holder list (rare).
        for (let g = next & ~(B[bo + B_GPU] as number); g !== 0; g &= g - 1) {
          const c = slotCand[31 - Math.clz32(g & -g)] as number;
          const id = (states[c] as PodState).id;
          let e = B[bo + B_HEAD] as number;
          while (((E[e * ES + E_PT] as number) & 0xffff) !== id) e = E[e * ES + E_NEXT] as number;
          gpuBlocks[c] = (gpuBlocks[c] as number) + 1;
          weighted[c] = (weighted[c] as number) + (maskWeight[(E[e * ES + E_PT] as number) >>> 16] as number);
        }
        alive = next;
        if (walkers > 0) {
          let advanced = 0;
          for (let e = B[bo + B_HEAD] as number; e !== NONE; ) {
            const o = e * ES;
            const pt = E[o + E_PT] as number;
            const c = (slotOf[pt & 0xffff] as number) - 1;
            // A pod continues only if it held every earlier block: its count equals i.
            if (c >= 0 && blocks[c] === i) {
              blocks[c] = i + 1;
              const t = pt >>> 16;
              if (t & 1) gpuBlocks[c] = (gpuBlocks[c] as number) + 1;
              weighted[c] = (weighted[c] as number) + (maskWeight[t] as number);
              advanced++;
            }
            e = E[o + E_NEXT] as number;
          }
          walkers = advanced;
        }
        if (alive === 0 && walkers === 0) break;
        best = i + 1;
        if (touch) {
          if (runEnd !== NONE && B[bo + B_PREV] === runEnd && b !== placed) runEnd = b;
          else {
            if (runEnd !== NONE) this.lruSpliceAfter(runStart, runEnd, placed);
            if (runEnd !== NONE) placed = runEnd;
            // A block met again (a hash repeated in the prompt) is already in front.
            runStart = runEnd = b === placed ? NONE : b;
          }
        }
      }
      if (runEnd !== NONE) this.lruSpliceAfter(runStart, runEnd, placed);
    }
    // Slotted pods still alive matched every block scanned up to `best`.
    for (; alive !== 0; alive &= alive - 1) blocks[slotCand[31 - Math.clz32(alive & -alive)] as number] = best;
    const wGpu = this.tierWeights.gpu;
    for (let i = 0; i < n; i++) {
      const s = states[i];
      if (!s) continue;
      if (s.slot >= 0) {
        const offGpu = gpuBlocks[i] as number;
        const gpu = (blocks[i] as number) - offGpu;
        gpuBlocks[i] = gpu;
        weighted[i] = gpu * wGpu + (weighted[i] as number);
      } else slotOf[s.id] = 0;
    }
    return { queried: m, scanned, pods: names, blocks, gpuBlocks, weighted, best };
  }

  /**
   * Candidate pod states, cached while the same candidates array (PodSet.readyPods returns a
   * stable array until the pod set changes) is passed for the same model and no pod came or went.
   */
  private resolveCandidates(model: string, candidates: readonly Candidate[] | undefined): { names: readonly string[]; states: readonly (PodState | undefined)[] } {
    const cc = this.candCache;
    if (cc && candidates && cc.candidates === candidates && cc.model === model && cc.version === this.podsVersion) return cc;
    const pods = this.models.get(model);
    let names: readonly string[];
    let states: (PodState | undefined)[];
    if (candidates) {
      states = new Array(candidates.length);
      let allStrings = true;
      for (let i = 0; i < candidates.length; i++) {
        const c = candidates[i] as Candidate;
        if (typeof c !== "string") allStrings = false;
        states[i] = pods?.get(typeof c === "string" ? c : c.pod);
      }
      names = allStrings ? (candidates as readonly string[]) : candidates.map((c) => (typeof c === "string" ? c : c.pod));
      this.candCache = { candidates, model, version: this.podsVersion, names, states };
    } else {
      states = pods ? [...pods.values()] : [];
      names = states.map((s) => (s as PodState).pod);
    }
    return { names, states };
  }

  /**
   * Touches the held prefix of `hashes` (root-first) without scoring: for a shell that feeds
   * routing decisions from a shared stream (e.g. kv-routed messages, whose hex hashes are accepted
   * as they are), which keeps every replica's eviction order identical (lookup touches are per
   * replica). Returns how many blocks were touched.
   */
  touch(model: string, hashes: readonly bigint[] | BigUint64Array | readonly string[]): number {
    const mid = this.modelIds.get(model);
    if (mid === undefined) return 0;
    const hex = hashes.length > 0 && typeof hashes[0] === "string";
    const words = hex ? this.keyScratch32 : this.keyWords(hashes as readonly bigint[] | BigUint64Array);
    let runStart = NONE;
    let runEnd = NONE;
    let placed = NONE;
    let i = 0;
    for (; i < hashes.length; i++) {
      let b: number;
      if (hex) {
        const h = hashes[i];
        b = typeof h === "string" && parseHex(h, false) ? this.findBlock(pHi, pLo, mid) : NONE;
      } else b = this.findBlock(words[2 * i + HI] as number, words[2 * i + LO] as number, mid);
      if (b === NONE) break;
      if (runEnd !== NONE && this.B[b * BS + B_PREV] === runEnd && b !== placed) runEnd = b;
      else {
        if (runEnd !== NONE) this.lruSpliceAfter(runStart, runEnd, placed);
        if (runEnd !== NONE) placed = runEnd;
        runStart = runEnd = b === placed ? NONE : b;
      }
    }
    if (runEnd !== NONE) this.lruSpliceAfter(runStart, runEnd, placed);
    return i;
  }

  /** Pods holding a block, with their tiers (for tests and /debug). */
  holders(model: string, hash: bigint): Array<{ pod: string; tiers: TierName[] }> {
    const mid = this.modelIds.get(model);
    const b = mid === undefined ? NONE : this.findBlock(Number(BigInt.asIntN(32, hash >> 32n)), Number(BigInt.asIntN(32, hash)), mid);
    const out: Array<{ pod: string; tiers: TierName[] }> = [];
    if (b === NONE) return out;
    for (let e = this.B[b * BS + B_HEAD] as number; e !== NONE; e = this.E[e * ES + E_NEXT] as number) {
      const pt = this.E[e * ES + E_PT] as number;
      const p = this.podById[pt & 0xffff] as PodState;
      out.push({ pod: p.pod, tiers: TIER_NAMES.filter((_, i) => (pt >>> 16) & (1 << i)) });
    }
    return out;
  }

  /** Entries held by one pod. */
  podEntries(model: string, pod: string): number {
    return this.models.get(model)?.get(pod)?.entries ?? 0;
  }

  /**
   * Entries of one pod whose block no other pod of the model holds: the cache a scale-down that
   * removes this pod would lose (the autoscaler's victim choice). O(the pod's entries).
   */
  uniqueEntries(model: string, pod: string): number {
    const p = this.models.get(model)?.get(pod);
    if (!p) return 0;
    let n = 0;
    for (let e = p.head; e !== NONE; e = this.E[e * ES + E_PNEXT] as number) {
      const first = this.B[(this.E[e * ES + E_BLOCK] as number) * BS + B_HEAD] as number;
      if (this.E[first * ES + E_NEXT] === NONE) n++;
    }
    return n;
  }

  /** The pod's stream cursor (also for removed pods still remembered). */
  cursor(model: string, pod: string): Readonly<PodCursor> | undefined {
    const p = this.models.get(model)?.get(pod);
    if (p) return { streamSeq: p.streamSeq, epoch: p.epoch, engineSeq: p.engineSeq };
    return this.tombstones.get(podKey(model, pod));
  }

  stats(): PrefixIndexStats {
    const bytes =
      this.E.byteLength +
      this.eTab.byteLength +
      this.B.byteLength +
      this.bTab.byteLength +
      this.slotOf.byteLength +
      this.keyScratch.byteLength +
      (this.podCount + this.tombstones.size) * POD_BYTES;
    return {
      entries: this.entryCount,
      blocks: this.blockCount,
      pods: this.podCount,
      maxEntries: this.maxEntries,
      ...this.counters,
      lastSeq: this.lastSeq,
      bytes,
    };
  }

  /**
   * Checks every internal link (tables, LRU list, holder and pod lists, masks, counts) and throws
   * on the first inconsistency. O(size): for tests and a /debug endpoint, never on a hot path.
   */
  assertConsistent(): void {
    const E = this.E;
    const B = this.B;
    const fail = (what: string) => {
      throw new Error(`prefix index inconsistent: ${what}`);
    };
    let blocks = 0;
    let entries = 0;
    const perPod = new Map<number, number>();
    for (let b = this.lruHead, prev = NONE; b !== NONE; prev = b, b = B[b * BS + B_NEXT] as number) {
      if (++blocks > this.blockCount) fail("LRU list longer than the block count (cycle?)");
      const o = b * BS;
      if (B[o + B_PREV] !== prev) fail(`LRU prev link of block ${b}`);
      if (this.findBlock(B[o + B_HI] as number, B[o + B_LO] as number, B[o + B_MODEL] as number) !== b) fail(`block ${b} not found by its key`);
      if (B[o + B_HEAD] === NONE) fail(`block ${b} has no holder`);
      let hold = 0;
      let gpu = 0;
      for (let e = B[o + B_HEAD] as number; e !== NONE; e = E[e * ES + E_NEXT] as number) {
        entries++;
        const pt = E[e * ES + E_PT] as number;
        const p = this.podById[pt & 0xffff];
        if (!p) fail(`entry ${e} of a dropped pod`);
        if (E[e * ES + E_BLOCK] !== b) fail(`entry ${e} points at another block`);
        if (pt >>> 16 === 0) fail(`entry ${e} without a tier`);
        if (this.findEntry(pt & 0xffff, E[e * ES + E_EHI] as number, E[e * ES + E_ELO] as number) !== e) fail(`entry ${e} not found by its engine hash`);
        const slot = (p as PodState).slot;
        if ((p as PodState).mid !== B[o + B_MODEL]) fail(`entry ${e} of another model than its block`);
        if (slot >= 0) {
          if (hold & (1 << slot)) fail(`two entries of one pod on block ${b}`);
          hold |= 1 << slot;
          if ((pt >>> 16) & 1) gpu |= 1 << slot;
        }
        perPod.set(pt & 0xffff, (perPod.get(pt & 0xffff) ?? 0) + 1);
      }
      if (B[o + B_HOLD] !== hold || B[o + B_GPU] !== gpu) fail(`masks of block ${b}`);
      if (b === this.lruTail && B[o + B_NEXT] !== NONE) fail("tail has a next");
    }
    if (blocks !== this.blockCount || entries !== this.entryCount) fail(`counts: ${blocks}/${this.blockCount} blocks, ${entries}/${this.entryCount} entries`);
    if (entries > this.maxEntries) fail("over budget");
    for (const p of this.podById) {
      if (!p) continue;
      let n = 0;
      for (let e = p.head, prev = NONE; e !== NONE; prev = e, e = E[e * ES + E_PNEXT] as number) {
        if (E[e * ES + E_PPREV] !== prev) fail(`pod list prev link of entry ${e}`);
        if (++n > p.entries) fail(`pod ${p.pod} list longer than its count`);
      }
      if (n !== p.entries || n !== (perPod.get(p.id) ?? 0)) fail(`entry count of pod ${p.pod}`);
    }
  }

  // ---------------------------------------------------------------- snapshots

  /**
   * Compact binary snapshot (little-endian): header, pods with cursors, tombstones, then blocks from
   * least to most recently touched (so a restore rebuilds the same eviction order), each with its
   * holders (pod, tier mask, engine hash). ~10 bytes per block + 11 per entry.
   * The budget and weights are configuration, not state: pass them to `deserialize`.
   */
  serialize(): Uint8Array {
    const steps = writeSnapshot(this.capture(this.scratch));
    for (let r = steps.next(); ; r = steps.next()) if (r.done) return r.value;
  }

  /**
   * `serialize()` without holding the caller's event loop for the whole encoding: the index is
   * copied at once (its record arrays are typed arrays: a memory copy of a few MB, ~1 ms), so the
   * bytes reflect exactly the messages applied up to this call, then encoded from the copy in
   * slices of about `SNAPSHOT_SLICE_WORK` blocks + entries with `yieldTurn()` between them (the gateway: a
   * setImmediate, so requests run between slices). The index may change meanwhile; the copy does not.
   */
  async serializeSliced(yieldTurn: () => Promise<void>): Promise<Uint8Array> {
    // The copy goes into arrays kept from the previous snapshot: fresh memory costs a page fault per
    // 4 KB (~10 ms for the 5 MB of 100k entries on a small VM), a copy into mapped memory ~0.3 ms.
    const scratch = this.scratch;
    this.scratch = undefined;
    const src = this.capture(scratch);
    try {
      const steps = writeSnapshot(src);
      for (let r = steps.next(); ; r = steps.next()) {
        if (r.done) return r.value;
        await yieldTurn();
      }
    } finally {
      this.scratch = { E: src.scratchE, B: src.scratchB };
    }
  }

  /**
   * The record arrays of the last sliced snapshot's copy, reused by the next (held between
   * snapshots: as many bytes as the index's used records, 60 bytes a block + entry at most).
   */
  private scratch: { E: Int32Array; B: Int32Array } | undefined;

  /** What a snapshot is written from: the live state's records copied (so it may change after). */
  private capture(scratch?: { E: Int32Array; B: Int32Array }): SnapshotSource & { scratchE: Int32Array; scratchB: Int32Array } {
    const pods: Array<PodCursor & { model: string; pod: string; id: number }> = [];
    for (const p of this.podById) if (p) pods.push({ model: p.model, pod: p.pod, id: p.id, epoch: p.epoch, streamSeq: p.streamSeq, engineSeq: p.engineSeq });
    const tombs = [...this.tombstones].map(([k, c]) => {
      const [model, pod] = splitPodKey(k);
      return { model, pod, c: { ...c } };
    });
    const copy = (from: Int32Array, n: number, into: Int32Array | undefined) => {
      // Room to grow by a quarter before the next snapshot needs fresh memory again.
      const out = into && into.length >= n ? into : new Int32Array(Math.ceil(n * 1.25));
      out.set(from.subarray(0, n));
      return out;
    };
    const scratchE = copy(this.E, this.eUsed * ES, scratch?.E);
    const scratchB = copy(this.B, this.bUsed * BS, scratch?.B);
    return { lastSeq: this.lastSeq, pods, tombs, blockCount: this.blockCount, entryCount: this.entryCount, lruTail: this.lruTail, E: scratchE, B: scratchB, scratchE, scratchB };
  }

  /** Rebuilds an index from `serialize()` output; evicts down to the new budget if it is smaller. */
  static deserialize(bytes: Uint8Array, opts: PrefixIndexOptions = {}): PrefixIndex {
    const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const dec = new TextDecoder("utf-8", { fatal: true });
    let o = 0;
    const u8 = () => dv.getUint8(o++);
    const u16 = () => {
      const v = dv.getUint16(o, true);
      o += 2;
      return v;
    };
    const i32 = () => {
      const v = dv.getInt32(o, true);
      o += 4;
      return v;
    };
    const f64 = () => {
      const v = dv.getFloat64(o, true);
      o += 8;
      return v;
    };
    const str = (): string | null => {
      const n = u16();
      if (n === 0xffff) return null;
      if (o + n > bytes.byteLength) throw new RangeError("prefix index snapshot: truncated");
      const s = dec.decode(bytes.subarray(o, o + n));
      o += n;
      return s;
    };
    const cursor = () => {
      const model = str();
      const pod = str();
      const epoch = str();
      if (model === null || pod === null) throw new Error("prefix index snapshot: corrupt pod record");
      return { model, pod, epoch, streamSeq: f64(), engineSeq: f64() };
    };
    const count = () => {
      const n = i32();
      if (n < 0) throw new Error("prefix index snapshot: corrupt count");
      return n;
    };
    if (bytes.byteLength < 8 || i32() !== SNAPSHOT_MAGIC) throw new Error("not a prefix index snapshot");
    const version = u16();
    if (version !== SNAPSHOT_VERSION) throw new Error(`prefix index snapshot version ${version} is not supported`);
    u16();
    const lastSeq = f64();
    const pods = Array.from({ length: count() }, cursor);
    const tombs = Array.from({ length: count() }, cursor);
    const nBlocks = count();
    const nEntries = count();
    const idx = new PrefixIndex({ ...opts, initialEntries: Math.max(opts.initialEntries ?? 0, Math.min(nEntries, opts.maxEntries ?? nEntries)) });
    idx.lastSeq = lastSeq;
    for (const t of tombs) idx.tombstones.set(podKey(t.model, t.pod), { streamSeq: t.streamSeq, epoch: t.epoch, engineSeq: t.engineSeq });
    const states = pods.map((c) => {
      const p = idx.podFor(c.model, c.pod);
      p.streamSeq = c.streamSeq;
      p.epoch = c.epoch;
      p.engineSeq = c.engineSeq;
      return p;
    });
    for (let i = 0; i < nBlocks; i++) {
      const hi = i32();
      const lo = i32();
      const n = u16();
      let b = NONE;
      for (let k = 0; k < n; k++) {
        const p = states[u16()];
        const tiers = u8();
        const ehi = i32();
        const elo = i32();
        if (!p || tiers === 0 || tiers > 15 || idx.findEntry(p.id, ehi, elo) !== NONE) throw new Error("prefix index snapshot: corrupt entry");
        // The block's model is its holders' model.
        if (k === 0) {
          if (idx.findBlock(hi, lo, p.mid) !== NONE) throw new Error("prefix index snapshot: corrupt block");
          b = idx.newBlock(hi, lo, p.mid);
        } else if (idx.B[b * BS + B_MODEL] !== p.mid) throw new Error("prefix index snapshot: corrupt block");
        idx.addEntry(p, b, ehi, elo, tiers);
      }
      if (b === NONE) throw new Error("prefix index snapshot: corrupt block");
      idx.reverseHolders(b);
    }
    if (idx.entryCount !== nEntries || o !== bytes.byteLength) throw new Error("prefix index snapshot: length mismatch");
    while (idx.entryCount > idx.maxEntries) idx.evictBlock(idx.lruTail);
    return idx;
  }

  // ---------------------------------------------------------------- internals: pods

  /** Checked before creating state: a stale message for a removed pod must not bring it back. */
  private isStale(model: string, pod: string, streamSeq: number): boolean {
    const last = this.models.get(model)?.get(pod)?.streamSeq ?? (this.tombstones.size > 0 ? this.tombstones.get(podKey(model, pod))?.streamSeq : undefined) ?? 0;
    if (streamSeq > last) return false;
    this.counters.stale++;
    return true;
  }

  private podFor(model: string, pod: string): PodState {
    let pods = this.models.get(model);
    const found = pods?.get(pod);
    if (found) return found;
    if (!pods) this.models.set(model, (pods = new Map()));
    const id = this.freePodIds.pop() ?? this.podById.length;
    if (id >= MAX_PODS) throw new RangeError(`prefix index: more than ${MAX_PODS} pods`);
    const key = podKey(model, pod);
    const c = this.tombstones.get(key);
    this.tombstones.delete(key);
    const used = this.slotsUsed.get(model) ?? 0;
    const free = ~used & (used + 1); // lowest clear bit; 0 when all SLOTS are taken
    const slot = free === 0 ? -1 : 31 - Math.clz32(free);
    if (slot >= 0) this.slotsUsed.set(model, used | free);
    let mid = this.modelIds.get(model);
    if (mid === undefined) this.modelIds.set(model, (mid = this.modelIds.size));
    const p: PodState = { model, pod, id, mid, slot, head: NONE, entries: 0, streamSeq: c?.streamSeq ?? 0, epoch: c?.epoch ?? null, engineSeq: c?.engineSeq ?? -1 };
    pods.set(pod, p);
    this.podById[id] = p;
    this.podsVersion++;
    this.podCount++;
    if (id >= this.slotOf.length) {
      const s = new Int32Array(Math.min(MAX_PODS, this.slotOf.length * 2));
      s.set(this.slotOf);
      this.slotOf = s;
    }
    return p;
  }

  private clearPod(p: PodState): void {
    for (let e = p.head; e !== NONE; ) {
      const next = this.E[e * ES + E_PNEXT] as number;
      this.removeEntry(e);
      e = next;
    }
  }

  // ---------------------------------------------------------------- internals: store and remove

  private store(p: PodState, hi: number, lo: number, ehi: number, elo: number, bit: number): void {
    const E = this.E;
    const e = this.findEntry(p.id, ehi, elo);
    if (e !== NONE) {
      const eb = E[e * ES + E_BLOCK] as number;
      if (this.B[eb * BS + B_HI] === hi && this.B[eb * BS + B_LO] === lo) {
        // Same block again, maybe in another tier (offloaded to CPU while still on GPU).
        this.setTiers(e, ((E[e * ES + E_PT] as number) >>> 16) | bit);
        this.lruToHead(eb);
        return;
      }
      // The engine hash now names another block: the old mapping is stale.
      this.removeEntry(e);
      this.counters.remapped++;
    }
    let b = this.findBlock(hi, lo, p.mid);
    // With a slot, the holder mask says whether the pod already holds the block: no walk needed.
    if (b !== NONE && (p.slot < 0 || ((this.B[b * BS + B_HOLD] as number) >>> p.slot) & 1)) {
      for (let x = this.B[b * BS + B_HEAD] as number; x !== NONE; x = E[x * ES + E_NEXT] as number) {
        if (((E[x * ES + E_PT] as number) & 0xffff) !== p.id) continue;
        // The pod already holds this block under another engine hash: the newest mapping wins
        // (a removal of the old engine hash then finds nothing, which is counted, not harmful).
        this.eTabDelete(x);
        E[x * ES + E_EHI] = ehi;
        E[x * ES + E_ELO] = elo;
        this.eTabInsert(x);
        this.setTiers(x, ((E[x * ES + E_PT] as number) >>> 16) | bit);
        this.lruToHead(b);
        return;
      }
    }
    if (this.entryCount >= this.maxEntries) {
      while (this.entryCount >= this.maxEntries) this.evictBlock(this.lruTail);
      // The eviction may have taken this very block.
      b = this.findBlock(hi, lo, p.mid);
    }
    if (b === NONE) b = this.newBlock(hi, lo, p.mid);
    else this.lruToHead(b);
    this.addEntry(p, b, ehi, elo, bit);
  }

  private addEntry(p: PodState, b: number, ehi: number, elo: number, tiers: number): void {
    let e = this.eFree;
    if (e !== NONE) this.eFree = this.E[e * ES + E_NEXT] as number;
    else {
      if (this.eUsed === this.eCap) this.growEntries(nextCap(this.eCap, this.maxEntries));
      e = this.eUsed++;
    }
    const E = this.E;
    const o = e * ES;
    E[o + E_BLOCK] = b;
    E[o + E_NEXT] = this.B[b * BS + B_HEAD] as number;
    this.B[b * BS + B_HEAD] = e;
    E[o + E_PPREV] = NONE;
    E[o + E_PNEXT] = p.head;
    if (p.head !== NONE) E[p.head * ES + E_PPREV] = e;
    p.head = e;
    E[o + E_EHI] = ehi;
    E[o + E_ELO] = elo;
    E[o + E_PT] = p.id | (tiers << 16);
    if (p.slot >= 0) {
      const bo = b * BS;
      this.B[bo + B_HOLD] = (this.B[bo + B_HOLD] as number) | (1 << p.slot);
      if (tiers & 1) this.B[bo + B_GPU] = (this.B[bo + B_GPU] as number) | (1 << p.slot);
    }
    p.entries++;
    this.entryCount++;
    if (this.entryCount > this.eTab.length * MAX_LOAD) this.rehashEntries(this.eTab.length * 2);
    this.eTabInsert(e);
  }

  /** Removes one entry; frees its block when no pod holds it any more. */
  private removeEntry(e: number): void {
    const E = this.E;
    const B = this.B;
    const o = e * ES;
    const b = E[o + E_BLOCK] as number;
    const next = E[o + E_NEXT] as number;
    let x = B[b * BS + B_HEAD] as number;
    if (x === e) B[b * BS + B_HEAD] = next;
    else {
      // Holder lists are short (at most the pods sharing a block).
      while (E[x * ES + E_NEXT] !== e) x = E[x * ES + E_NEXT] as number;
      E[x * ES + E_NEXT] = next;
    }
    const p = this.podById[(E[o + E_PT] as number) & 0xffff] as PodState;
    if (p.slot >= 0) {
      const bo = b * BS;
      B[bo + B_HOLD] = (B[bo + B_HOLD] as number) & ~(1 << p.slot);
      B[bo + B_GPU] = (B[bo + B_GPU] as number) & ~(1 << p.slot);
    }
    const pp = E[o + E_PPREV] as number;
    const pn = E[o + E_PNEXT] as number;
    if (pp !== NONE) E[pp * ES + E_PNEXT] = pn;
    else p.head = pn;
    if (pn !== NONE) E[pn * ES + E_PPREV] = pp;
    p.entries--;
    this.eTabDelete(e);
    E[o + E_NEXT] = this.eFree;
    this.eFree = e;
    this.entryCount--;
    if (B[b * BS + B_HEAD] === NONE) this.freeBlock(b);
  }

  /** Sets an entry's tier mask (non-zero) and keeps its block's GPU mask in step. */
  private setTiers(e: number, tiers: number): void {
    const E = this.E;
    const o = e * ES;
    const pt = E[o + E_PT] as number;
    E[o + E_PT] = (pt & 0xffff) | (tiers << 16);
    const slot = (this.podById[pt & 0xffff] as PodState).slot;
    if (slot < 0) return;
    const go = (E[o + E_BLOCK] as number) * BS + B_GPU;
    if (tiers & 1) this.B[go] = (this.B[go] as number) | (1 << slot);
    else this.B[go] = (this.B[go] as number) & ~(1 << slot);
  }

  private evictBlock(b: number): void {
    let n = 0;
    // Removing the last holder frees the block itself (its head is then NONE).
    while (this.B[b * BS + B_HEAD] !== NONE) {
      this.removeEntry(this.B[b * BS + B_HEAD] as number);
      n++;
    }
    this.counters.evictedBlocks++;
    this.counters.evictedEntries += n;
  }

  private newBlock(hi: number, lo: number, mid: number): number {
    let b = this.bFree;
    if (b !== NONE) this.bFree = this.B[b * BS + B_NEXT] as number;
    else {
      if (this.bUsed === this.bCap) this.growBlocks(nextCap(this.bCap, this.maxEntries));
      b = this.bUsed++;
    }
    const o = b * BS;
    this.B[o + B_HI] = hi;
    this.B[o + B_LO] = lo;
    this.B[o + B_HEAD] = NONE;
    this.B[o + B_HOLD] = 0;
    this.B[o + B_GPU] = 0;
    this.B[o + B_MODEL] = mid;
    this.blockCount++;
    if (this.blockCount > this.bTab.length * MAX_LOAD) this.rehashBlocks(this.bTab.length * 2);
    this.bTabInsert(b);
    this.lruPushHead(b);
    return b;
  }

  private freeBlock(b: number): void {
    this.bTabDelete(b);
    this.lruUnlink(b);
    this.B[b * BS + B_NEXT] = this.bFree;
    this.bFree = b;
    this.blockCount--;
  }

  private reverseHolders(b: number): void {
    let prev = NONE;
    let e = this.B[b * BS + B_HEAD] as number;
    while (e !== NONE) {
      const next = this.E[e * ES + E_NEXT] as number;
      this.E[e * ES + E_NEXT] = prev;
      prev = e;
      e = next;
    }
    this.B[b * BS + B_HEAD] = prev;
  }

  // ---------------------------------------------------------------- internals: LRU

  private lruUnlink(b: number): void {
    const B = this.B;
    const p = B[b * BS + B_PREV] as number;
    const n = B[b * BS + B_NEXT] as number;
    if (p !== NONE) B[p * BS + B_NEXT] = n;
    else this.lruHead = n;
    if (n !== NONE) B[n * BS + B_PREV] = p;
    else this.lruTail = p;
  }

  private lruPushHead(b: number): void {
    const B = this.B;
    B[b * BS + B_PREV] = NONE;
    B[b * BS + B_NEXT] = this.lruHead;
    if (this.lruHead !== NONE) B[this.lruHead * BS + B_PREV] = b;
    else this.lruTail = b;
    this.lruHead = b;
  }

  private lruToHead(b: number): void {
    if (this.lruHead === b) return;
    this.lruUnlink(b);
    this.lruPushHead(b);
  }

  /**
   * Moves the list segment s..e (s nearer the head) right behind `a` (towards the tail), or to the
   * head when `a` is NONE: touches a matched chain root-first in O(runs), not O(blocks).
   * `a` must not lie inside the segment (the callers never extend a run over it).
   */
  private lruSpliceAfter(s: number, e: number, a: number): void {
    const B = this.B;
    if (a === NONE ? this.lruHead === s : B[a * BS + B_NEXT] === s) return;
    const p = B[s * BS + B_PREV] as number;
    const n = B[e * BS + B_NEXT] as number;
    if (p !== NONE) B[p * BS + B_NEXT] = n;
    else this.lruHead = n;
    if (n !== NONE) B[n * BS + B_PREV] = p;
    else this.lruTail = p;
    const after = a === NONE ? this.lruHead : (B[a * BS + B_NEXT] as number);
    B[s * BS + B_PREV] = a;
    if (a === NONE) this.lruHead = s;
    else B[a * BS + B_NEXT] = s;
    B[e * BS + B_NEXT] = after;
    if (after !== NONE) B[after * BS + B_PREV] = e;
    else this.lruTail = e;
  }

  // ---------------------------------------------------------------- internals: tables

  private findBlock(hi: number, lo: number, mid: number): number {
    const tab = this.bTab;
    const mask = this.bMask;
    const B = this.B;
    let i = blockHome(hi, lo, mid, this.bShift);
    for (;;) {
      const b = tab[i] as number;
      if (b === NONE) return b;
      const o = b * BS;
      if (B[o + B_LO] === lo && B[o + B_HI] === hi && B[o + B_MODEL] === mid) return b;
      i = (i + 1) & mask;
    }
  }

  /**
   * The block (hi, lo, mid) when it is the record just before or after block `b`, else NONE. A
   * store applies an event's blocks deepest first, so the blocks of a chain stored in one event
   * get consecutive records, each one record before its predecessor in the chain. Exact: (hi, lo,
   * model) names at most one live block, and a freed record has no holder.
   */
  private nextInChain(b: number, hi: number, lo: number, mid: number): number {
    const B = this.B;
    if (b > 0) {
      const o = (b - 1) * BS;
      if (B[o + B_LO] === lo && B[o + B_HI] === hi && B[o + B_MODEL] === mid && B[o + B_HEAD] !== NONE) return b - 1;
    }
    if (b + 1 < this.bUsed) {
      const o = (b + 1) * BS;
      if (B[o + B_LO] === lo && B[o + B_HI] === hi && B[o + B_MODEL] === mid && B[o + B_HEAD] !== NONE) return b + 1;
    }
    return NONE;
  }

  private blockHomeOf(b: number): number {
    const o = b * BS;
    return blockHome(this.B[o + B_HI] as number, this.B[o + B_LO] as number, this.B[o + B_MODEL] as number, this.bShift);
  }

  private bTabInsert(b: number): void {
    const tab = this.bTab;
    const mask = this.bMask;
    let i = this.blockHomeOf(b);
    while (tab[i] !== NONE) i = (i + 1) & mask;
    tab[i] = b;
  }

  /** Linear-probing delete with backward shift: later members of the probe run move up, no tombstones. */
  private bTabDelete(b: number): void {
    const tab = this.bTab;
    const mask = this.bMask;
    let i = this.blockHomeOf(b);
    while (tab[i] !== b) i = (i + 1) & mask;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const x = tab[j] as number;
      if (x === NONE) break;
      const k = this.blockHomeOf(x);
      // x may move into the hole at i unless its home lies cyclically in (i, j].
      if (j > i ? k <= i || k > j : k <= i && k > j) {
        tab[i] = x;
        i = j;
      }
    }
    tab[i] = NONE;
  }

  private rehashBlocks(cap: number): void {
    const old = this.bTab;
    this.bTab = new Int32Array(cap).fill(NONE);
    this.bShift = 32 - log2(cap);
    this.bMask = cap - 1;
    for (let i = 0; i < old.length; i++) {
      const b = old[i] as number;
      if (b !== NONE) this.bTabInsert(b);
    }
  }

  private findEntry(pod: number, hi: number, lo: number): number {
    const tab = this.eTab;
    const mask = this.eMask;
    const E = this.E;
    let i = entryHome(pod, hi, lo, this.eShift);
    for (;;) {
      const e = tab[i] as number;
      if (e === NONE) return e;
      const o = e * ES;
      if (E[o + E_ELO] === lo && E[o + E_EHI] === hi && ((E[o + E_PT] as number) & 0xffff) === pod) return e;
      i = (i + 1) & mask;
    }
  }

  private entryHomeOf(e: number): number {
    const o = e * ES;
    return entryHome((this.E[o + E_PT] as number) & 0xffff, this.E[o + E_EHI] as number, this.E[o + E_ELO] as number, this.eShift);
  }

  private eTabInsert(e: number): void {
    const tab = this.eTab;
    const mask = this.eMask;
    let i = this.entryHomeOf(e);
    while (tab[i] !== NONE) i = (i + 1) & mask;
    tab[i] = e;
  }

  private eTabDelete(e: number): void {
    const tab = this.eTab;
    const mask = this.eMask;
    let i = this.entryHomeOf(e);
    while (tab[i] !== e) i = (i + 1) & mask;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const x = tab[j] as number;
      if (x === NONE) break;
      const k = this.entryHomeOf(x);
      if (j > i ? k <= i || k > j : k <= i && k > j) {
        tab[i] = x;
        i = j;
      }
    }
    tab[i] = NONE;
  }

  private rehashEntries(cap: number): void {
    const old = this.eTab;
    this.eTab = new Int32Array(cap).fill(NONE);
    this.eShift = 32 - log2(cap);
    this.eMask = cap - 1;
    for (let i = 0; i < old.length; i++) {
      const e = old[i] as number;
      if (e !== NONE) this.eTabInsert(e);
    }
  }

  // ---------------------------------------------------------------- internals: arrays

  private growEntries(cap: number): void {
    this.E = grown(this.E, cap * ES);
    this.eCap = cap;
  }

  private growBlocks(cap: number): void {
    this.B = grown(this.B, cap * BS);
    this.bCap = cap;
  }

  /**
   * 32-bit halves (as int32) of the query hashes, without per-hash allocation: a view of a
   * BigUint64Array, or the scratch buffer, filled here unless the caller fills it as it goes.
   * Storing into a BigUint64Array truncates to 64 bits (ToBigUint64): negative or wider values wrap.
   */
  private keyWords(hashes: readonly bigint[] | BigUint64Array, fill = true): Int32Array {
    if (hashes instanceof BigUint64Array) return new Int32Array(hashes.buffer, hashes.byteOffset, hashes.length * 2);
    const m = hashes.length;
    if (this.keyScratch.length < m) {
      let cap = Math.max(64, this.keyScratch.length);
      while (cap < m) cap *= 2;
      this.keyScratch = new BigUint64Array(cap);
      this.keyScratch32 = new Int32Array(this.keyScratch.buffer);
    }
    if (fill) {
      const ks = this.keyScratch;
      for (let i = 0; i < m; i++) ks[i] = hashes[i] as bigint;
    }
    return this.keyScratch32;
  }
}

const podKey = (model: string, pod: string) => `${model}\u0000${pod}`;
function splitPodKey(k: string): [string, string] {
  const i = k.indexOf("\u0000");
  return [k.slice(0, i), k.slice(i + 1)];
}
