/**
 * The simulated engine's KV block pool with prefix caching, modelled on vLLM V1's BlockPool.
 *
 * - A fixed number of blocks of `blockSize` tokens. A block held by running requests has a
 *   reference count above zero and is never evicted.
 * - Free blocks (reference count zero) wait in one queue in LRU order. Allocation takes the head;
 *   if that block still holds cached content, the content is evicted there and then (BlockRemoved).
 *   A finished request's blocks join the tail last-block-first, so the tail of a prompt is
 *   evicted before its (more shareable) head, as in vLLM.
 * - Only full blocks are cached, keyed by a chained hash of (parent hash, token ids, extra keys).
 *   A cache hit takes the blocks out of the free queue (reference count up) without copying.
 *
 * One deliberate difference from vLLM: vLLM can hold two physical blocks with the same hash (two
 * requests computing the same prefix in the same step) and announces both, so evicting one copy
 * announces a BlockRemoved for content the engine still has. Here the second copy is simply not
 * registered, which keeps the event stream a faithful set: folding BlockStored/BlockRemoved gives
 * exactly the cache listing.
 *
 * The engine hash is xxh64 over a layout of our own, seeded per pod: like vLLM's hash it is only
 * meaningful inside one engine process, and a router that keyed on it instead of hashing the
 * announced token ids itself would break across pods.
 */
import { xxh64 } from "@node-rs/xxhash";

/** Events in engine terms; `kv-events.ts` turns them into vLLM's wire shapes. */
export type KvCacheEvent =
  | {
      type: "BlockStored";
      blockHashes: bigint[];
      parentBlockHash: bigint | null;
      tokenIds: number[];
      blockSize: number;
      loraName: string | null;
      /** One entry per block: the extra keys hashed into it (LoRA name, cache salt), or null. */
      extraKeys: Array<string[] | null>;
    }
  | { type: "BlockRemoved"; blockHashes: bigint[] }
  | { type: "AllBlocksCleared" };

export interface KvBlock {
  readonly id: number;
  refCount: number;
  hash: bigint | undefined;
  parentHash: bigint | null;
  tokenIds: readonly number[];
  extraKeys: string[] | null;
  prev: KvBlock | undefined;
  next: KvBlock | undefined;
  inFreeQueue: boolean;
}

export interface CachedBlockInfo {
  blockId: number;
  /** uint64 as a decimal string: JSON numbers cannot hold it. */
  hash: string;
  parentHash: string | null;
  tokenIds: number[];
  extraKeys: string[] | null;
  refCount: number;
  /** Among cached blocks not in use, 0 is evicted first; null while a request holds the block. */
  lruPosition: number | null;
}

export interface CacheListing {
  blockSize: number;
  numGpuBlocks: number;
  usedBlocks: number;
  freeBlocks: number;
  /**
   * Cache events recorded but not yet published: those of the engine step in flight, which go out
   * as one batch when the step ends (as in vLLM). The listing matches the published events
   * exactly when this is 0, e.g. whenever the engine is idle.
   */
  pendingEvents: number;
  blocks: CachedBlockInfo[];
}

const SEED_SALT = 0x73696d2d656e6731n; // "sim-eng1"

/** The per-pod root of the hash chain, the role vLLM's NONE_HASH plays. */
export function engineHashSeed(podName: string): bigint {
  return xxh64(`jetroute-sim-engine\0${podName}`, SEED_SALT);
}

/**
 * Hash of one full block: xxh64 over [parent u64 BE][token ids u32 BE][extra keys, NUL-terminated
 * UTF-8], seeded with the pod seed. `tokenAt(i)` gives the i-th token of the block.
 */
export function blockHash(
  seed: bigint,
  parent: bigint,
  blockSize: number,
  tokenAt: (i: number) => number,
  extraKeys: readonly string[] | null,
): bigint {
  const extra = extraKeys ? Buffer.from(extraKeys.map((k) => `${k}\0`).join(""), "utf8") : undefined;
  const buf = Buffer.allocUnsafe(8 + 4 * blockSize + (extra?.length ?? 0));
  buf.writeBigUInt64BE(parent, 0);
  for (let i = 0; i < blockSize; i++) buf.writeUInt32BE(tokenAt(i) >>> 0, 8 + 4 * i);
  extra?.copy(buf, 8 + 4 * blockSize);
  return xxh64(buf, seed);
}

export class BlockPool {
  private readonly blocks: KvBlock[];
  private readonly byHash = new Map<bigint, KvBlock>();
  /** Sentinels of the free queue: head.next is evicted first. */
  private readonly head: KvBlock;
  private readonly tail: KvBlock;
  private numFree = 0;
  private events: KvCacheEvent[] = [];

  constructor(
    readonly numBlocks: number,
    readonly blockSize: number,
  ) {
    const mk = (id: number): KvBlock => ({
      id,
      refCount: 0,
      hash: undefined,
      parentHash: null,
      tokenIds: [],
      extraKeys: null,
      prev: undefined,
      next: undefined,
      inFreeQueue: false,
    });
    this.head = mk(-1);
    this.tail = mk(-2);
    this.head.next = this.tail;
    this.tail.prev = this.head;
    this.blocks = Array.from({ length: numBlocks }, (_, i) => mk(i));
    for (const b of this.blocks) this.append(b);
  }

  get freeBlocks(): number {
    return this.numFree;
  }

  get usedBlocks(): number {
    return this.numBlocks - this.numFree;
  }

  get cachedBlocks(): number {
    return this.byHash.size;
  }

  /** The cached block holding `hash`, if any. */
  find(hash: bigint): KvBlock | undefined {
    return this.byHash.get(hash);
  }

  /** Whether `n` new blocks fit once the cache-hit blocks `hit` have left the free queue. */
  canAllocate(n: number, hit: readonly KvBlock[] = []): boolean {
    const hitFree = hit.reduce((sum, b) => sum + (b.refCount === 0 ? 1 : 0), 0);
    return n <= this.numFree - hitFree;
  }

  /** Takes a reference on cache-hit blocks. */
  touch(blocks: readonly KvBlock[]): void {
    for (const b of blocks) {
      if (b.refCount === 0) this.unlink(b);
      b.refCount++;
    }
  }

  /** Takes `n` blocks from the head of the free queue, evicting any cached content they hold. */
  allocate(n: number): KvBlock[] {
    if (n > this.numFree) throw new RangeError(`cannot allocate ${n} blocks, ${this.numFree} free`);
    const out: KvBlock[] = [];
    for (let i = 0; i < n; i++) {
      const b = this.head.next as KvBlock;
      this.unlink(b);
      if (b.hash !== undefined) {
        this.byHash.delete(b.hash);
        // One event per evicted block, as vLLM's BlockPool emits them.
        this.events.push({ type: "BlockRemoved", blockHashes: [b.hash] });
        this.forget(b);
      }
      b.refCount = 1;
      out.push(b);
    }
    return out;
  }

  /** Drops one reference on each block; blocks reaching zero join the free queue, last block first. */
  free(blocks: readonly KvBlock[]): void {
    for (let i = blocks.length - 1; i >= 0; i--) {
      const b = blocks[i] as KvBlock;
      if (b.refCount <= 0) throw new Error(`block ${b.id} freed more often than taken`);
      b.refCount--;
      if (b.refCount === 0) {
        this.append(b);
      }
    }
  }

  /**
   * Registers a full block under `hash`. Returns false (and leaves the block unregistered) when
   * another block already holds that content.
   */
  register(block: KvBlock, hash: bigint, parentHash: bigint | null, tokenIds: number[], extraKeys: string[] | null): boolean {
    if (block.hash !== undefined) throw new Error(`block ${block.id} is already registered`);
    if (this.byHash.has(hash)) return false;
    block.hash = hash;
    block.parentHash = parentHash;
    block.tokenIds = tokenIds;
    block.extraKeys = extraKeys;
    this.byHash.set(hash, block);
    return true;
  }

  emit(event: KvCacheEvent): void {
    this.events.push(event);
  }

  /** Events since the last call, oldest first. */
  takeEvents(): KvCacheEvent[] {
    const out = this.events;
    this.events = [];
    return out;
  }

  /**
   * vLLM's reset_prefix_cache: refused (false) while any block is in use, otherwise forgets every
   * cached block and records AllBlocksCleared.
   */
  resetPrefixCache(): boolean {
    if (this.numFree !== this.numBlocks) return false;
    for (const b of this.byHash.values()) this.forget(b);
    this.byHash.clear();
    this.events.push({ type: "AllBlocksCleared" });
    return true;
  }

  listing(): CacheListing {
    const lru = new Map<KvBlock, number>();
    for (let b = this.head.next; b && b !== this.tail; b = b.next) if (b.hash !== undefined) lru.set(b, lru.size);
    const blocks: CachedBlockInfo[] = [];
    for (const b of this.blocks) {
      if (b.hash === undefined) continue;
      blocks.push({
        blockId: b.id,
        hash: b.hash.toString(),
        parentHash: b.parentHash === null ? null : b.parentHash.toString(),
        tokenIds: [...b.tokenIds],
        extraKeys: b.extraKeys ? [...b.extraKeys] : null,
        refCount: b.refCount,
        lruPosition: lru.get(b) ?? null,
      });
    }
    return {
      blockSize: this.blockSize,
      numGpuBlocks: this.numBlocks,
      usedBlocks: this.usedBlocks,
      freeBlocks: this.numFree,
      pendingEvents: this.events.length,
      blocks,
    };
  }

  private forget(b: KvBlock): void {
    b.hash = undefined;
    b.parentHash = null;
    b.tokenIds = [];
    b.extraKeys = null;
  }

  private append(b: KvBlock): void {
    const last = this.tail.prev as KvBlock;
    last.next = b;
    b.prev = last;
    b.next = this.tail;
    this.tail.prev = b;
    b.inFreeQueue = true;
    this.numFree++;
  }

  private unlink(b: KvBlock): void {
    if (!b.inFreeQueue) throw new Error(`block ${b.id} is not in the free queue`);
    (b.prev as KvBlock).next = b.next;
    (b.next as KvBlock).prev = b.prev;
    b.prev = undefined;
    b.next = undefined;
    b.inFreeQueue = false;
    this.numFree--;
  }
}
