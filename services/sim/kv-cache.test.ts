import { describe, expect, it } from "vitest";
import { ManualClock } from "./clock.js";
import { type EngineConfig, SimEngine } from "./engine.js";
import { blockHash, type CacheListing, type KvCacheEvent } from "./kv-cache.js";

// Blocks of 4 tokens keep the expected chains short enough to write out.
const base: EngineConfig = {
  maxBatch: 4,
  maxNumBatchedTokens: 2048,
  prefillMsPerToken: 1,
  decodeMsPerStep: 10,
  decodeBatchSlope: 0,
  kvCapacityTokens: 4 * 64,
  blockSize: 4,
};
const SEED = 0x1234_5678_9abc_def0n;

type Stored = Extract<KvCacheEvent, { type: "BlockStored" }>;

function setup(config: Partial<EngineConfig> = {}) {
  const clock = new ManualClock();
  const batches: KvCacheEvent[][] = [];
  const engine = new SimEngine({ ...base, ...config }, clock, {}, { hashSeed: SEED, onEvents: (e) => batches.push(e) });
  /** Submits and returns the simulated TTFT once the clock has moved on. */
  const run = (prompt: number[], opts: { maxTokens?: number; cacheSalt?: string; advance?: number } = {}) => {
    const times: number[] = [];
    let finished = false;
    const start = clock.now();
    const handle = engine.submit({
      promptTokens: prompt,
      outputTokens: Array.from({ length: opts.maxTokens ?? 1 }, (_, i) => 900 + i),
      cacheSalt: opts.cacheSalt,
      onToken: (_id, _i, at) => times.push(at),
      onFinish: () => {
        finished = true;
      },
    });
    if (opts.advance !== 0) clock.advance(opts.advance ?? 10_000);
    return { ttft: () => (times[0] ?? Number.NaN) - start, finished: () => finished, abort: handle.abort };
  };
  const stored = (): Stored[] => batches.flat().filter((e): e is Stored => e.type === "BlockStored");
  return { clock, engine, batches, run, stored };
}

const seq = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i);

/** The cache as the events describe it: hash → token ids. */
function fold(batches: KvCacheEvent[][]): Map<string, number[]> {
  const set = new Map<string, number[]>();
  for (const e of batches.flat()) {
    if (e.type === "AllBlocksCleared") set.clear();
    else if (e.type === "BlockRemoved") {
      for (const h of e.blockHashes) {
        // A removal must name a block the events announced and did not remove yet.
        expect(set.has(h.toString()), `removed ${h} was not stored`).toBe(true);
        set.delete(h.toString());
      }
    } else {
      e.blockHashes.forEach((h, i) => {
        set.set(h.toString(), e.tokenIds.slice(i * e.blockSize, (i + 1) * e.blockSize));
      });
    }
  }
  return set;
}

const listed = (l: CacheListing): Map<string, number[]> => new Map(l.blocks.map((b) => [b.hash, b.tokenIds]));

describe("prefix cache", () => {
  it("prefills only the uncached tail of a repeated prompt and does not re-announce reused blocks", () => {
    const { engine, batches, run, stored } = setup();
    const prompt = seq(100, 40); // 10 full blocks
    const cold = run(prompt);
    expect(cold.ttft()).toBe(40);
    expect(batches).toHaveLength(1);
    const [first] = stored();
    expect(first).toMatchObject({ parentBlockHash: null, tokenIds: prompt, blockSize: 4, loraName: null });
    expect(first?.blockHashes).toHaveLength(10);
    expect(first?.extraKeys).toEqual(Array(10).fill(null));

    // 9 blocks hit; the 10th is recomputed so the step has a token to sample from (vLLM caps the
    // hit at prompt length - 1), and it is content the cache already holds: nothing to announce.
    const warm = run(prompt);
    expect(warm.ttft()).toBe(4);
    expect(batches).toHaveLength(1);
    expect(engine.snapshot().totals).toMatchObject({ prefixCacheQueries: 80, prefixCacheHits: 36 });

    // A longer prompt extends the chain: only the two new blocks are announced, parented on the last cached one.
    const longer = run(seq(100, 48));
    expect(longer.ttft()).toBe(8);
    expect(batches).toHaveLength(2);
    const second = stored()[1];
    expect(second?.parentBlockHash).toBe(first?.blockHashes[9]);
    expect(second?.tokenIds).toEqual(seq(140, 8));
    expect(engine.snapshot().totals).toMatchObject({ prefixCacheQueries: 128, prefixCacheHits: 76 });
  });

  it("chains hashes over parent, tokens and extra keys, reproducibly", () => {
    const { run, stored } = setup();
    run(seq(7, 8));
    const at = (i: number) => (j: number) => 7 + 4 * i + j;
    const h0 = blockHash(SEED, SEED, 4, at(0), null);
    const h1 = blockHash(SEED, h0, 4, at(1), null);
    expect(stored()[0]?.blockHashes).toEqual([h0, h1]);
    expect(h1).not.toBe(blockHash(SEED, SEED, 4, at(1), null));
    expect(h0).not.toBe(blockHash(SEED, SEED, 4, at(0), ["salt"]));
    expect(h0).not.toBe(blockHash(SEED + 1n, SEED + 1n, 4, at(0), null));
  });

  it("caches blocks filled by generated tokens as they complete", () => {
    const { engine, batches, run } = setup();
    // 6 prompt + 7 generated tokens; the last sampled token is never computed, so 12 tokens = 3 blocks.
    run(seq(100, 6), { maxTokens: 7 });
    const blocks = batches.map((b) => b.map((e) => (e.type === "BlockStored" ? e.tokenIds : [])));
    expect(blocks).toEqual([[[100, 101, 102, 103]], [[104, 105, 900, 901]], [[902, 903, 904, 905]]]);
    expect(engine.cacheListing().blocks.map((b) => b.tokenIds)).toEqual([
      [100, 101, 102, 103],
      [104, 105, 900, 901],
      [902, 903, 904, 905],
    ]);
  });

  it("keeps cache_salt prompts apart and records the salt as the first block's extra key", () => {
    const { engine, run, stored } = setup();
    const prompt = seq(100, 12);
    run(prompt, { cacheSalt: "tenant-a" });
    expect(run(prompt, { cacheSalt: "tenant-b" }).ttft()).toBe(12);
    expect(run(prompt, { cacheSalt: "tenant-a" }).ttft()).toBe(4);
    expect(run(prompt).ttft()).toBe(12);
    const [a, b, none] = stored();
    expect(a?.extraKeys).toEqual([["tenant-a"], null, null]);
    // The salt is in the first block only, yet every later hash differs through the chain.
    for (let i = 0; i < 3; i++) {
      expect(new Set([a?.blockHashes[i], b?.blockHashes[i], none?.blockHashes[i]]).size).toBe(3);
    }
    expect(engine.cacheListing().blocks).toHaveLength(9);
  });

  it("evicts least recently used free blocks, tail blocks first, and announces exactly those", () => {
    // 12 blocks of 4 tokens; every prompt below is 3 full blocks.
    const { engine, batches, run, stored } = setup({ kvCapacityTokens: 48 });
    const prompts = [0, 1, 2, 3, 4, 5].map((p) => seq(1000 * (p + 1), 12));
    for (const p of prompts.slice(0, 4)) run(p);
    // 4 prompts × 3 blocks fill the pool exactly; nothing is evicted yet.
    expect(engine.cacheListing().blocks).toHaveLength(12);
    expect(batches.flat().some((e) => e.type === "BlockRemoved")).toBe(false);

    for (const p of prompts.slice(4)) {
      const before = engine.cacheListing().blocks;
      const n = batches.length;
      run(p);
      const removed = batches
        .slice(n)
        .flat()
        .flatMap((e) => (e.type === "BlockRemoved" ? e.blockHashes.map(String) : []));
      // The three blocks at the head of the LRU order go, and nothing else.
      const lru = before.filter((b) => b.lruPosition !== null).sort((x, y) => (x.lruPosition ?? 0) - (y.lruPosition ?? 0));
      expect(removed).toEqual(lru.slice(0, 3).map((b) => b.hash));
    }
    // The two oldest prompts were evicted whole; the oldest went tail block first.
    const removedInOrder = batches.flat().flatMap((e) => (e.type === "BlockRemoved" ? e.blockHashes.map(String) : []));
    const [firstChain, secondChain] = stored().map((e) => e.blockHashes.map(String));
    expect(removedInOrder).toEqual([...(firstChain ?? []).reverse(), ...(secondChain ?? []).reverse()]);
    expect(listed(engine.cacheListing())).toEqual(fold(batches));
  });

  it("never evicts blocks a running request holds, and shows them referenced", () => {
    // 12 blocks; the holder decodes for ~16 s simulated while six other prompts go through.
    const { clock, engine, batches, run } = setup({ kvCapacityTokens: 48, decodeMsPerStep: 1_000 });
    const holder = run(seq(1, 12), { maxTokens: 16, advance: 20 });
    const heldHashes = engine.cacheListing().blocks.map((b) => b.hash);
    expect(heldHashes).toHaveLength(3);
    expect(engine.cacheListing().blocks.every((b) => b.refCount === 1 && b.lruPosition === null)).toBe(true);
    // Churn through far more blocks than are free; only free ones are ever evicted.
    for (let p = 0; p < 6; p++) expect(run(seq(100 * (p + 1), 12), { advance: 2_100 }).finished()).toBe(true);
    expect(holder.finished()).toBe(false);
    const removed = new Set(batches.flat().flatMap((e) => (e.type === "BlockRemoved" ? e.blockHashes.map(String) : [])));
    expect(removed.size).toBeGreaterThan(0);
    for (const h of heldHashes) expect(removed.has(h)).toBe(false);
    holder.abort();
    clock.advance(1_000);
    expect(engine.cacheListing().pendingEvents).toBe(0);
    expect(listed(engine.cacheListing())).toEqual(fold(batches));
    // Released: still cached, now evictable.
    const after = engine.cacheListing().blocks.filter((b) => heldHashes.includes(b.hash));
    expect(after.map((b) => b.refCount)).toEqual([0, 0, 0]);
    expect(after.every((b) => b.lruPosition !== null)).toBe(true);
  });

  it("registers content computed twice in one step only once", () => {
    const { engine, batches, run } = setup();
    const prompt = seq(500, 16);
    run(prompt, { advance: 0 });
    run(prompt);
    expect(batches).toHaveLength(1);
    expect(batches[0]).toHaveLength(1);
    expect(engine.cacheListing().blocks).toHaveLength(4);
    expect(listed(engine.cacheListing())).toEqual(fold(batches));
  });

  it("refuses reset_prefix_cache while blocks are in use, then clears with AllBlocksCleared", () => {
    const { clock, engine, batches, run } = setup({ decodeMsPerStep: 1_000 });
    run(seq(1, 8));
    const busy = run(seq(50, 8), { maxTokens: 10, advance: 20 });
    expect(engine.resetPrefixCache()).toBe(false);
    expect(engine.cacheListing().blocks).toHaveLength(4);
    busy.abort();
    clock.advance(2_000); // let the step in flight end: the engine is idle
    expect(engine.resetPrefixCache()).toBe(true);
    expect(batches.at(-1)).toEqual([{ type: "AllBlocksCleared" }]);
    expect(engine.cacheListing().blocks).toEqual([]);
    expect(run(seq(1, 8)).ttft()).toBe(8);
  });
});
