import { describe, expect, it } from "vitest";
import type { KvBatch, KvPodCleared, KvStored } from "../../schemas/events.js";
import { chainSeed, hashToHex, promptBlockHashes } from "./block-hash.js";
import { PrefixIndex, type PrefixIndexOptions, tierOf } from "./prefix-index.js";

const M = "m";
type Ev = KvBatch["events"][number];

/** Router hash of block i in chain c: distinct small values keep failures readable. */
const rh = (c: number, i: number): bigint => (BigInt(c) << 40n) | (BigInt(i) << 8n) | 0xabn;
/** The pod's engine hash for the same block: engines hash differently per process. */
const eh = (pod: string, c: number, i: number): string => `${pod.length}${pod.charCodeAt(pod.length - 1).toString(16)}${c.toString(16).padStart(4, "0")}${i.toString(16).padStart(6, "0")}`;
const chain = (c: number, from: number, to: number) => Array.from({ length: to - from }, (_, k) => rh(c, from + k));

function stored(pod: string, c: number, from: number, to: number, medium: string | null = "GPU"): KvStored {
  const idx = Array.from({ length: to - from }, (_, k) => from + k);
  return {
    kind: "stored",
    engineHashes: idx.map((i) => eh(pod, c, i)),
    routerHashes: idx.map((i) => hashToHex(rh(c, i))),
    parentEngineHash: from > 0 ? eh(pod, c, from - 1) : null,
    blockSize: 16,
    medium,
    lora: null,
  };
}
const removed = (pod: string, c: number, from: number, to: number, medium: string | null = null): Ev => ({
  kind: "removed",
  engineHashes: Array.from({ length: to - from }, (_, k) => eh(pod, c, from + k)),
  medium,
});

/** Feeds batches with increasing stream and engine sequences, like one bridge per pod would. */
class Feed {
  streamSeq = 0;
  private readonly engineSeq = new Map<string, number>();
  constructor(readonly index: PrefixIndex) {}
  batch(pod: string, events: Ev[], o: { epoch?: string; seq?: number; streamSeq?: number; model?: string } = {}) {
    const seq = o.seq ?? (this.engineSeq.get(pod) ?? -1) + 1;
    this.engineSeq.set(pod, seq);
    const b: KvBatch = { type: "kv", model: o.model ?? M, pod, epoch: o.epoch ?? "e1", seq, ts: 0, events };
    return this.index.apply(b, o.streamSeq ?? ++this.streamSeq);
  }
  cleared(pod: string, epoch = "e2", reason: KvPodCleared["reason"] = "engine-restart") {
    this.engineSeq.set(pod, -1);
    return this.index.applyCleared({ type: "kv-cleared", model: M, pod, epoch, reason, ts: 0 }, ++this.streamSeq);
  }
}

const setup = (opts?: PrefixIndexOptions) => {
  const index = new PrefixIndex(opts);
  return { index, feed: new Feed(index) };
};
/** Matched blocks per pod as a plain object (pods with 0 included). */
const match = (index: PrefixIndex, hashes: bigint[], candidates?: string[], touch = false) => {
  const r = index.longestMatch(M, hashes, candidates, { touch });
  return Object.fromEntries(r.pods.map((p, i) => [p, r.blocks[i]]));
};

describe("PrefixIndex: store, remove, clear", () => {
  it.each([
    { name: "stored blocks match", events: [stored("a", 1, 0, 8)], want: 8, entries: 8 },
    { name: "two events extend the chain", events: [stored("a", 1, 0, 4), stored("a", 1, 4, 8)], want: 8, entries: 8 },
    { name: "a repeated store changes nothing", events: [stored("a", 1, 0, 8), stored("a", 1, 0, 8)], want: 8, entries: 8 },
    { name: "removal by engine hash cuts the run", events: [stored("a", 1, 0, 8), removed("a", 1, 5, 6)], want: 5, entries: 7 },
    { name: "removing the first block matches nothing", events: [stored("a", 1, 0, 8), removed("a", 1, 0, 1)], want: 0, entries: 7 },
    { name: "all-cleared drops everything", events: [stored("a", 1, 0, 8), { kind: "all-cleared" } as Ev], want: 0, entries: 0 },
    { name: "store after all-cleared counts", events: [stored("a", 1, 0, 8), { kind: "all-cleared" } as Ev, stored("a", 1, 0, 3)], want: 3, entries: 3 },
    { name: "unknown parent is accepted", events: [stored("a", 1, 4, 8), stored("a", 1, 0, 4)], want: 8, entries: 8 },
    { name: "removal of an unknown engine hash is a counted miss", events: [stored("a", 1, 0, 8), removed("a", 2, 0, 3)], want: 8, entries: 8, misses: 3 },
  ])("$name", ({ events, want, entries, misses }) => {
    const { index, feed } = setup();
    expect(feed.batch("a", events)).toBe("applied");
    expect(match(index, chain(1, 0, 8)).a).toBe(want);
    expect(index.stats()).toMatchObject({ entries, blocks: entries, removeMisses: misses ?? 0 });
    expect(index.podEntries(M, "a")).toBe(entries);
  });

  it("removal applies to the pod that sent it only, even when engine hashes coincide across pods", () => {
    const { index, feed } = setup();
    const same = (pod: string): Ev => ({ ...stored(pod, 1, 0, 4), engineHashes: ["1", "2", "3", "4"] });
    feed.batch("a", [same("a")]);
    feed.batch("b", [same("b")]);
    feed.batch("a", [{ kind: "removed", engineHashes: ["2"], medium: null }]);
    expect(match(index, chain(1, 0, 4))).toEqual({ a: 1, b: 4 });
    expect(index.stats()).toMatchObject({ entries: 7, blocks: 4, pods: 2 });
  });

  it("kv-cleared drops the pod's entries and keeps the others", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 6)]);
    feed.batch("b", [stored("b", 1, 0, 6)]);
    expect(feed.cleared("a")).toBe("applied");
    expect(match(index, chain(1, 0, 6))).toEqual({ a: 0, b: 6 });
    expect(index.podEntries(M, "a")).toBe(0);
    // The new epoch starts at engine seq 0 again.
    expect(feed.batch("a", [stored("a", 1, 0, 2)], { epoch: "e2", seq: 0 })).toBe("applied");
    expect(match(index, chain(1, 0, 6))).toEqual({ a: 2, b: 6 });
  });

  it("removePod drops the pod; blocks only it held are freed", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 6), stored("a", 2, 0, 3)]);
    feed.batch("b", [stored("b", 1, 0, 6)]);
    expect(index.removePod(M, "a")).toBe(true);
    expect(index.removePod(M, "a")).toBe(false);
    expect(index.stats()).toMatchObject({ entries: 6, blocks: 6, pods: 1 });
    expect(match(index, chain(1, 0, 6))).toEqual({ b: 6 });
    expect(index.longestMatch(M, chain(2, 0, 3)).best).toBe(0);
  });

  it("long engine digests (64 hex digits) are folded and still remove exactly", () => {
    const { index, feed } = setup();
    const digest = (i: number) => (i.toString(16).padStart(8, "0") + "ab").repeat(7).slice(0, 64);
    const ev: Ev = { ...stored("a", 1, 0, 4), engineHashes: [0, 1, 2, 3].map(digest) };
    feed.batch("a", [ev]);
    feed.batch("a", [{ kind: "removed", engineHashes: [digest(2)], medium: "GPU" }]);
    expect(match(index, chain(1, 0, 4)).a).toBe(2);
    expect(index.stats().removeMisses).toBe(0);
  });

  it("malformed hashes skip the block and are counted", () => {
    const { index, feed } = setup();
    const ev: Ev = { ...stored("a", 1, 0, 3), routerHashes: [hashToHex(rh(1, 0)), "zz", "1".repeat(17)] };
    feed.batch("a", [ev]);
    expect(index.stats()).toMatchObject({ entries: 1, badHashes: 2 });
  });
});

describe("PrefixIndex: hashes of other models, adapters and block sizes never match", () => {
  const tokens = Array.from({ length: 64 }, (_, i) => 1000 + i);
  const hashesFor = (model: string, lora: string | null, bs: number) => promptBlockHashes(tokens, chainSeed(model, lora, bs), bs);
  const storedOf = (hashes: bigint[], bs = 16): KvStored => ({
    kind: "stored",
    engineHashes: hashes.map((_, i) => (i + 1).toString(16)),
    routerHashes: hashes.map(hashToHex),
    parentEngineHash: null,
    blockSize: bs,
    medium: "GPU",
    lora: null,
  });
  it.each([
    { name: "same model, base", query: hashesFor(M, null, 16), want: 4 },
    { name: "same model, LoRA adapter", query: hashesFor(M, "adapter-a", 16), want: 0 },
    { name: "other model", query: hashesFor("other", null, 16), want: 0 },
    { name: "other block size", query: hashesFor(M, null, 8), want: 0 },
  ])("$name", ({ query, want }) => {
    const { index, feed } = setup();
    feed.batch("a", [storedOf(hashesFor(M, null, 16))]);
    feed.batch("b", [storedOf(hashesFor(M, "adapter-b", 16))]);
    expect(index.longestMatch(M, query).best).toBe(want);
  });

  it("full 64-bit hashes (above 2^63) round-trip through hex", () => {
    const { index, feed } = setup();
    const big = [0xffffffffffffffffn, 0x8000000000000000n, 0x1n, 0xfedcba9876543210n];
    feed.batch("a", [storedOf(big)]);
    expect(index.longestMatch(M, big).best).toBe(4);
    expect(index.longestMatch(M, BigUint64Array.from(big)).best).toBe(4);
    expect(index.holders(M, 0x8000000000000000n)).toEqual([{ pod: "a", tiers: ["gpu"] }]);
  });
});

describe("PrefixIndex: tiers", () => {
  it.each([
    [null, 0],
    ["GPU", 0],
    ["gpu", 0],
    ["CPU", 1],
    ["CPU_PINNED", 1],
    ["STORAGE", 2],
    ["FS", 2],
    ["OBJ", 2],
    ["DISK", 2],
    ["EXTERNAL", 2],
    ["NVME_OF_SOMETHING", 3],
  ] as const)("medium %s -> tier %i", (medium, tier) => {
    expect(tierOf(medium)).toBe(tier);
  });

  it("weights by the best tier, keeps GPU counts apart, and removes per tier", () => {
    const { index, feed } = setup({ tierWeights: { cpu: 0.5, storage: 0.1 } });
    feed.batch("g", [stored("g", 1, 0, 4, "GPU")]);
    feed.batch("c", [stored("c", 1, 0, 4, "CPU")]);
    feed.batch("s", [stored("s", 1, 0, 2, null), stored("s", 1, 2, 4, "STORAGE")]);
    const r = index.longestMatch(M, chain(1, 0, 4), ["g", "c", "s"]);
    expect([...r.blocks]).toEqual([4, 4, 4]);
    expect([...r.gpuBlocks]).toEqual([4, 0, 2]);
    expect([...r.weighted].map((x) => +x.toFixed(3))).toEqual([4, 2, 2.2]);

    // Offloaded to CPU while still on GPU: one entry, both tiers; evicting from GPU leaves the CPU copy.
    feed.batch("g", [stored("g", 1, 0, 4, "CPU")]);
    expect(index.holders(M, rh(1, 0)).find((h) => h.pod === "g")?.tiers).toEqual(["gpu", "cpu"]);
    feed.batch("g", [removed("g", 1, 0, 4, "GPU")]);
    const r2 = index.longestMatch(M, chain(1, 0, 4), ["g"]);
    expect([r2.blocks[0], r2.gpuBlocks[0], r2.weighted[0]]).toEqual([4, 0, 2]);
    feed.batch("g", [removed("g", 1, 0, 4, "CPU")]);
    expect(index.podEntries(M, "g")).toBe(0);
  });
});

describe("PrefixIndex: per-pod ordering", () => {
  it("a replayed store (stream seq not newer) does not resurrect a removed block", () => {
    const { index, feed } = setup();
    const store = stored("a", 1, 0, 4);
    feed.batch("a", [store], { streamSeq: 10, seq: 0 });
    feed.batch("a", [removed("a", 1, 2, 4)], { streamSeq: 11, seq: 1 });
    expect(feed.batch("a", [store], { streamSeq: 10, seq: 0 })).toBe("stale");
    expect(feed.batch("a", [store], { streamSeq: 11, seq: 0 })).toBe("stale");
    expect(match(index, chain(1, 0, 4)).a).toBe(2);
    expect(index.stats().stale).toBe(2);
    expect(index.cursor(M, "a")).toEqual({ streamSeq: 11, epoch: "e1", engineSeq: 1 });
  });

  it("cursors are per pod: another pod's lower stream seq still applies", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 2)], { streamSeq: 50 });
    expect(feed.batch("b", [stored("b", 1, 0, 2)], { streamSeq: 40 })).toBe("applied");
    expect(index.lastSeq).toBe(50);
  });

  it.each([
    { name: "same epoch, engine seq repeated: duplicate", second: { epoch: "e1", seq: 3 }, outcome: "duplicate", want: 4 },
    { name: "same epoch, engine seq older: duplicate", second: { epoch: "e1", seq: 1 }, outcome: "duplicate", want: 4 },
    { name: "same epoch, engine seq jumps: applied, gap counted", second: { epoch: "e1", seq: 9 }, outcome: "applied", want: 6 },
    { name: "new epoch: the engine restarted, old blocks dropped", second: { epoch: "e2", seq: 0 }, outcome: "applied", want: 0 },
  ])("$name", ({ second, outcome, want }) => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 4)], { epoch: "e1", seq: 3 });
    expect(feed.batch("a", [stored("a", 1, 4, 6), stored("a", 2, 0, 3)], second)).toBe(outcome);
    expect(match(index, chain(1, 0, 6)).a).toBe(want);
    const s = index.stats();
    expect(s.duplicates).toBe(outcome === "duplicate" ? 1 : 0);
    expect(s.engineSeqGaps).toBe(second.seq === 9 ? 1 : 0);
    expect(s.epochResets).toBe(second.epoch === "e2" ? 1 : 0);
  });

  it("messages older than a kv-cleared stay ignored; newer ones apply", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 4)], { streamSeq: 5 });
    index.applyCleared({ type: "kv-cleared", model: M, pod: "a", epoch: "e2", reason: "gap-unrepairable", ts: 0 }, 7);
    expect(feed.batch("a", [stored("a", 1, 0, 4)], { streamSeq: 6, seq: 1 })).toBe("stale");
    expect(index.applyCleared({ type: "kv-cleared", model: M, pod: "a", epoch: "e3", reason: "bridge-start", ts: 0 }, 7)).toBe("stale");
    expect(feed.batch("a", [stored("a", 1, 0, 1)], { streamSeq: 8, epoch: "e2", seq: 0 })).toBe("applied");
    expect(match(index, chain(1, 0, 4)).a).toBe(1);
  });

  it("a removed pod's old messages stay ignored; a newer one brings the pod back", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 4)], { streamSeq: 5, seq: 0 });
    index.removePod(M, "a");
    expect(index.cursor(M, "a")).toEqual({ streamSeq: 5, epoch: "e1", engineSeq: 0 });
    expect(feed.batch("a", [stored("a", 1, 0, 4)], { streamSeq: 5, seq: 0 })).toBe("stale");
    expect(index.stats().entries).toBe(0);
    expect(feed.batch("a", [stored("a", 1, 0, 2)], { streamSeq: 6, seq: 1 })).toBe("applied");
    expect(match(index, chain(1, 0, 4)).a).toBe(2);
  });
});

describe("PrefixIndex: longest match", () => {
  it("stops at each pod's first miss, and the scan stops when no candidate continues", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 10)]);
    feed.batch("b", [stored("b", 1, 0, 4), stored("b", 1, 5, 10)]); // misses block 4
    feed.batch("c", [stored("c", 1, 1, 10)]); // misses block 0
    const r = index.longestMatch(M, chain(1, 0, 12));
    expect(Object.fromEntries(r.pods.map((p, i) => [p, r.blocks[i]]))).toEqual({ a: 10, b: 4, c: 0 });
    expect([r.best, r.queried, r.scanned]).toEqual([10, 12, 11]);
    // Only b as candidate: the scan ends after block 4, although a holds more.
    const rb = index.longestMatch(M, chain(1, 0, 12), ["b"]);
    expect([rb.blocks[0], rb.scanned]).toEqual([4, 5]);
  });

  it("neighbouring records of a chain: freed or reused ones never match, a chain in reverse records still does", () => {
    const { index, feed } = setup();
    // One event: blocks 0..7 of chain 1 get consecutive records (deepest first).
    feed.batch("a", [stored("a", 1, 0, 8)]);
    // Block 3's record is freed; block 3 comes back in another record, beside other blocks.
    feed.batch("a", [removed("a", 1, 3, 4)]);
    expect(match(index, chain(1, 0, 8)).a).toBe(3);
    feed.batch("b", [stored("b", 2, 0, 4)]); // takes the freed record
    feed.batch("a", [stored("a", 1, 3, 4)]);
    expect(match(index, chain(1, 0, 8))).toEqual({ a: 8, b: 0 });
    expect(match(index, chain(2, 0, 4))).toEqual({ a: 0, b: 4 });
    // A chain stored one block per event, root first: its records run the other way.
    for (let i = 0; i < 6; i++) feed.batch("c", [stored("c", 3, i, i + 1)]);
    expect(match(index, chain(3, 0, 6)).c).toBe(6);
    // A freed record keeps its hash: a lookup passing next to it must not count it.
    feed.batch("c", [removed("c", 3, 4, 5)]);
    expect(match(index, chain(3, 0, 6)).c).toBe(4);
    index.assertConsistent();
  });

  it("candidates: order kept, unknown pods 0, PodInfo-like objects accepted, other models invisible", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 3)]);
    feed.batch("b", [stored("b", 1, 0, 5)]);
    feed.batch("a", [stored("a", 1, 0, 5)], { model: "other" });
    const r = index.longestMatch(M, chain(1, 0, 5), [{ pod: "zz" }, { pod: "b" }, { pod: "a" }]);
    expect(r.pods).toEqual(["zz", "b", "a"]);
    expect([...r.blocks]).toEqual([0, 5, 3]);
    expect(index.longestMatch("nope", chain(1, 0, 5)).pods).toEqual([]);
    expect(index.longestMatch(M, []).best).toBe(0);
  });

  it("the same candidates array is re-resolved when pods come and go", () => {
    const { index, feed } = setup();
    const ready = [{ pod: "a" }, { pod: "b" }];
    feed.batch("a", [stored("a", 1, 0, 3)]);
    expect([...index.longestMatch(M, chain(1, 0, 3), ready).blocks]).toEqual([3, 0]);
    feed.batch("b", [stored("b", 1, 0, 2)]);
    expect([...index.longestMatch(M, chain(1, 0, 3), ready).blocks]).toEqual([3, 2]);
    index.removePod(M, "a");
    expect([...index.longestMatch(M, chain(1, 0, 3), ready).blocks]).toEqual([0, 2]);
  });

  it("a pod listed twice does not break the scan", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 3)]);
    const r = index.longestMatch(M, chain(1, 0, 3), ["a", "a"]);
    expect(r.best).toBe(3);
    // The scratch state is reset: a second lookup sees clean counters.
    expect(index.longestMatch(M, chain(1, 0, 3), ["a"]).blocks[0]).toBe(3);
  });
});

describe("PrefixIndex: budget", () => {
  it("never holds more than maxEntries; evicts least recently touched blocks and counts them", () => {
    const { index, feed } = setup({ maxEntries: 10 });
    for (let c = 0; c < 5; c++) feed.batch("a", [stored("a", c, 0, 4)]);
    const s = index.stats();
    expect(s.entries).toBeLessThanOrEqual(10);
    expect(s.evictedEntries).toBe(20 - s.entries);
    expect(s.evictedBlocks).toBe(s.evictedEntries);
    // The newest chain survives whole; the oldest is gone.
    expect(match(index, chain(4, 0, 4)).a).toBe(4);
    expect(match(index, chain(0, 0, 4)).a).toBe(0);
  });

  it("trims chains from the tail: the first blocks are the most recently touched", () => {
    const { index, feed } = setup({ maxEntries: 8 });
    feed.batch("a", [stored("a", 1, 0, 8)]);
    feed.batch("a", [stored("a", 2, 0, 3)]);
    expect(match(index, chain(1, 0, 8)).a).toBe(5);
    expect(match(index, chain(2, 0, 3)).a).toBe(3);
  });

  it("a lookup match keeps a chain alive (engines do not re-announce prefix hits)", () => {
    for (const touch of [true, false]) {
      const { index, feed } = setup({ maxEntries: 8 });
      feed.batch("a", [stored("a", 1, 0, 4)]);
      feed.batch("a", [stored("a", 2, 0, 4)]);
      index.longestMatch(M, chain(1, 0, 4), undefined, { touch });
      feed.batch("a", [stored("a", 3, 0, 4)]);
      expect(match(index, chain(1, 0, 4)).a).toBe(touch ? 4 : 0);
      expect(match(index, chain(2, 0, 4)).a).toBe(touch ? 0 : 4);
    }
  });

  it("touch() from routed prefixes (hex or bigint) keeps a chain alive without a lookup", () => {
    for (const form of ["hex", "bigint"] as const) {
      const { index, feed } = setup({ maxEntries: 8, touchOnMatch: false });
      feed.batch("a", [stored("a", 1, 0, 4)]);
      feed.batch("a", [stored("a", 2, 0, 4)]);
      index.longestMatch(M, chain(1, 0, 4)); // touchOnMatch off: no effect on eviction
      const q = form === "hex" ? chain(1, 0, 6).map(hashToHex) : chain(1, 0, 6);
      expect(index.touch(M, q)).toBe(4);
      expect(index.touch("unknown", q)).toBe(0);
      feed.batch("a", [stored("a", 3, 0, 4)]);
      expect(match(index, chain(1, 0, 4)).a).toBe(4);
      expect(match(index, chain(2, 0, 4)).a).toBe(0);
      index.assertConsistent();
    }
  });

  it("a shared block is evicted with all its holders; later removals of it are harmless misses", () => {
    const { index, feed } = setup({ maxEntries: 4 });
    feed.batch("a", [stored("a", 1, 0, 2)]);
    feed.batch("b", [stored("b", 1, 0, 2)]);
    feed.batch("c", [stored("c", 2, 0, 1)]);
    expect(index.stats()).toMatchObject({ entries: 3, blocks: 2, evictedBlocks: 1, evictedEntries: 2 });
    feed.batch("a", [removed("a", 1, 1, 2)]);
    expect(index.stats().removeMisses).toBe(1);
  });

  it("maxBytes converts to an entry bound", () => {
    const index = new PrefixIndex({ maxBytes: 1_000_000 });
    expect(index.maxEntries).toBeGreaterThan(1_000_000 / 100);
    expect(index.maxEntries).toBeLessThan(1_000_000 / 40);
    expect(() => new PrefixIndex({ maxEntries: 0 })).toThrow(RangeError);
  });
});

describe("PrefixIndex: snapshots", () => {
  const populated = () => {
    const { index, feed } = setup({ maxEntries: 1000 });
    feed.batch("a", [stored("a", 1, 0, 8), stored("a", 2, 0, 3, "CPU")]);
    feed.batch("b", [stored("b", 1, 0, 5)], { epoch: "eb" });
    feed.batch("c", [stored("c", 3, 0, 2)]);
    index.removePod(M, "c");
    feed.batch("d", [stored("d", 1, 0, 2, "STORAGE")], { model: "other model ✓" });
    return { index, feed };
  };

  it("round-trips entries, tiers, cursors, tombstones and engine-hash mappings", () => {
    const { index } = populated();
    const bytes = index.serialize();
    const copy = PrefixIndex.deserialize(bytes, { maxEntries: 1000 });
    const { evictedBlocks, evictedEntries, ...same } = index.stats();
    expect(copy.stats()).toMatchObject({ ...same, bytes: copy.stats().bytes });
    expect(copy.serialize()).toEqual(bytes);
    for (const q of [chain(1, 0, 8), chain(2, 0, 3)]) {
      const x = index.longestMatch(M, q, undefined, { touch: false });
      const y = copy.longestMatch(M, q, undefined, { touch: false });
      expect(y).toEqual(x);
    }
    expect(copy.longestMatch("other model ✓", chain(1, 0, 2)).weighted[0]).toBe(0.5);
    for (const pod of ["a", "b", "c"]) expect(copy.cursor(M, pod)).toEqual(index.cursor(M, pod));
    // Cursors hold after the restore: a replay is ignored, removal by engine hash works.
    const feed = new Feed(copy);
    expect(feed.batch("a", [stored("a", 9, 0, 4)], { streamSeq: 1, seq: 5 })).toBe("stale");
    expect(feed.batch("c", [stored("c", 3, 0, 2)], { streamSeq: 3, seq: 5 })).toBe("stale");
    expect(feed.batch("b", [removed("b", 1, 2, 3)], { streamSeq: 100, epoch: "eb", seq: 1 })).toBe("applied");
    expect(match(copy, chain(1, 0, 8))).toEqual({ a: 8, b: 2 });
  });

  it("keeps the eviction order, and evicts down to a smaller budget on load", () => {
    const { index, feed } = setup();
    for (let c = 0; c < 4; c++) feed.batch("a", [stored("a", c, 0, 2)]);
    index.longestMatch(M, chain(0, 0, 2)); // chain 0 becomes the most recent
    const copy = PrefixIndex.deserialize(index.serialize(), { maxEntries: 4 });
    expect(copy.stats()).toMatchObject({ entries: 4, evictedEntries: 4 });
    expect(match(copy, chain(0, 0, 2)).a).toBe(2);
    expect(match(copy, chain(3, 0, 2)).a).toBe(2);
    expect(match(copy, chain(1, 0, 2)).a).toBe(0);
  });

  it("sliced: the bytes of the index as it was when asked, while the index changes between slices", async () => {
    const { index, feed } = setup({ maxEntries: 100_000 });
    // More blocks than one slice holds (SNAPSHOT_SLICE_WORK), so the encoding yields.
    for (let c = 0; c < 6; c++) feed.batch(`p${c}`, [stored(`p${c}`, c, 0, 3_000)]);
    const expected = index.serialize();
    let yields = 0;
    const sliced = index.serializeSliced(async () => {
      yields++;
      // Between slices the index moves on: new blocks, a removed pod, a cleared one.
      feed.batch("p0", [stored("p0", 40 + yields, 0, 50)]);
      index.removePod(M, "p1");
      feed.cleared("p2");
    });
    const bytes = await sliced;
    expect(yields).toBeGreaterThanOrEqual(2);
    expect(bytes).toEqual(expected);
    expect(PrefixIndex.deserialize(bytes, { maxEntries: 100_000 }).stats().entries).toBe(18_000);
    expect(index.serialize()).not.toEqual(expected);
  });

  it("rejects foreign and truncated bytes", () => {
    const bytes = populated().index.serialize();
    expect(() => PrefixIndex.deserialize(new Uint8Array(16))).toThrow(/not a prefix index snapshot/);
    expect(() => PrefixIndex.deserialize(bytes.subarray(0, bytes.length - 3))).toThrow();
    const empty = new PrefixIndex().serialize();
    expect(PrefixIndex.deserialize(empty).stats()).toMatchObject({ entries: 0, pods: 0 });
  });
});

describe("PrefixIndex: randomized against a naive model", () => {
  // xorshift32: deterministic, so a failure reproduces.
  const rng = (seed: number) => () => {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return (seed >>> 0) / 2 ** 32;
  };

  // 40 pods: the first 32 are found through the blocks' holder masks, the rest by walking holder lists.
  it.each([
    { pods: 5, seed: 12345 },
    { pods: 40, seed: 777 },
  ])("matches a Map-based model through stores, removals, clears and pod removals ($pods pods)", ({ pods: nPods, seed }) => {
    const rand = rng(seed);
    const { index, feed } = setup({ initialEntries: 16 }); // small start: exercises every growth and rehash
    const pods = Array.from({ length: nPods }, (_, i) => `p${i}`);
    // model: pod -> Map<"c:i", tier mask>
    const model = new Map<string, Map<string, number>>(pods.map((p) => [p, new Map()]));
    const matchedPods = new Set<string>();
    const bits: Record<string, number> = { GPU: 1, CPU: 2 };
    for (let step = 0; step < 4000; step++) {
      const pod = pods[Math.floor(rand() * pods.length)] as string;
      const held = model.get(pod) as Map<string, number>;
      // Few chains, so that many pods share blocks.
      const c = Math.floor(rand() * (nPods > 8 ? 6 : 30));
      const from = Math.floor(rand() * 20);
      const to = from + 1 + Math.floor(rand() * 16);
      const medium = rand() < 0.8 ? "GPU" : "CPU";
      const r = rand();
      if (r < 0.6) {
        feed.batch(pod, [stored(pod, c, from, to, medium)]);
        for (let i = from; i < to; i++) held.set(`${c}:${i}`, (held.get(`${c}:${i}`) ?? 0) | (bits[medium] as number));
      } else if (r < 0.95) {
        feed.batch(pod, [removed(pod, c, from, to, medium)]);
        for (let i = from; i < to; i++) {
          const t = (held.get(`${c}:${i}`) ?? 0) & ~(bits[medium] as number);
          if (t) held.set(`${c}:${i}`, t);
          else held.delete(`${c}:${i}`);
        }
      } else if (r < 0.98) {
        feed.batch(pod, [{ kind: "all-cleared" }]);
        held.clear();
      } else {
        index.removePod(M, pod);
        held.clear();
      }
      if (step % 50 === 0 || step > 3950) {
        const qc = Math.floor(rand() * (nPods > 8 ? 6 : 30));
        const r2 = index.longestMatch(M, chain(qc, 0, 40), pods);
        pods.forEach((p, k) => {
          const h = model.get(p) as Map<string, number>;
          let n = 0;
          let gpu = 0;
          while (h.has(`${qc}:${n}`)) {
            if ((h.get(`${qc}:${n}`) as number) & 1) gpu++;
            n++;
          }
          expect([p, r2.blocks[k], r2.gpuBlocks[k], r2.weighted[k]]).toEqual([p, n, gpu, gpu + (n - gpu) * 0.5]);
          if (n > 0) matchedPods.add(p);
        });
      }
    }
    // The check is only worth something if pods on both paths (mask slots, list walk) matched.
    expect(matchedPods.size).toBeGreaterThanOrEqual(Math.min(nPods, 32) / 2);
    if (nPods > 32) expect(pods.slice(32).some((p) => matchedPods.has(p))).toBe(true);
    let total = 0;
    for (const [p, h] of model) {
      total += h.size;
      expect(index.podEntries(M, p)).toBe(h.size);
    }
    expect(index.stats().entries).toBe(total);
    index.assertConsistent();
    const copy = PrefixIndex.deserialize(index.serialize());
    copy.assertConsistent();
    expect(copy.serialize()).toEqual(index.serialize());
  });

  /** Exact LRU over block keys with the index's documented touch rules and whole-block eviction. */
  class RefLru {
    readonly blocks = new Map<string, Map<string, number>>();
    order: string[] = []; // most recent first
    entries = 0;
    constructor(readonly max: number) {}
    /** Moves `keys` to the front in that order; a key listed twice ends at its last place. */
    private front(keys: string[]) {
      const set = new Set(keys);
      const last = keys.filter((k, i) => keys.lastIndexOf(k) === i);
      this.order = [...last, ...this.order.filter((k) => !set.has(k))];
    }
    private drop(k: string) {
      this.blocks.delete(k);
      this.order = this.order.filter((x) => x !== k);
    }
    store(pod: string, keys: string[], bit: number) {
      for (let j = keys.length - 1; j >= 0; j--) {
        const k = keys[j] as string;
        const h = this.blocks.get(k);
        if (h?.has(pod)) {
          h.set(pod, (h.get(pod) as number) | bit);
          this.front([k]);
          continue;
        }
        while (this.entries >= this.max) {
          const tail = this.order.at(-1) as string;
          this.entries -= (this.blocks.get(tail) as Map<string, number>).size;
          this.drop(tail);
        }
        const h2 = this.blocks.get(k) ?? new Map<string, number>();
        this.blocks.set(k, h2);
        h2.set(pod, bit);
        this.entries++;
        this.front([k]);
      }
    }
    remove(pod: string, keys: string[], bit: number) {
      for (const k of keys) {
        const h = this.blocks.get(k);
        if (!h?.has(pod)) continue;
        const t = (h.get(pod) as number) & ~bit;
        if (t) h.set(pod, t);
        else {
          h.delete(pod);
          this.entries--;
          if (h.size === 0) this.drop(k);
        }
      }
    }
    clear(pod: string) {
      for (const [k, h] of [...this.blocks]) {
        if (!h.delete(pod)) continue;
        this.entries--;
        if (h.size === 0) this.drop(k);
      }
    }
    held(pod: string, keys: string[]): number {
      let n = 0;
      while (n < keys.length && this.blocks.get(keys[n] as string)?.has(pod)) n++;
      return n;
    }
    lookup(pods: string[], keys: string[]): number {
      const best = Math.max(0, ...pods.map((p) => this.held(p, keys)));
      this.front(keys.slice(0, best));
      return best;
    }
  }

  it.each([
    { pods: 5, max: 60, seed: 99 },
    { pods: 36, max: 150, seed: 4242 },
  ])("evicts exactly like a reference LRU with lookup touches ($pods pods, budget $max)", ({ pods: nPods, max, seed }) => {
    const rand = rng(seed);
    const { index, feed } = setup({ maxEntries: max, initialEntries: 16 });
    const ref = new RefLru(max);
    const pods = Array.from({ length: nPods }, (_, i) => `p${i}`);
    const keys = (c: number, from: number, to: number) => Array.from({ length: to - from }, (_, k) => `${c}:${from + k}`);
    const bits: Record<string, number> = { GPU: 1, CPU: 2 };
    for (let step = 0; step < 3000; step++) {
      const pod = pods[Math.floor(rand() * pods.length)] as string;
      const c = Math.floor(rand() * 8);
      const from = rand() < 0.5 ? 0 : Math.floor(rand() * 12);
      const to = from + 1 + Math.floor(rand() * 16);
      const medium = rand() < 0.8 ? "GPU" : "CPU";
      const r = rand();
      if (r < 0.45) {
        feed.batch(pod, [stored(pod, c, from, to, medium)]);
        ref.store(pod, keys(c, from, to), bits[medium] as number);
      } else if (r < 0.6) {
        feed.batch(pod, [removed(pod, c, from, to, medium)]);
        ref.remove(pod, keys(c, from, to), bits[medium] as number);
      } else if (r < 0.62) {
        feed.batch(pod, [{ kind: "all-cleared" }]);
        ref.clear(pod);
      } else if (r < 0.63) {
        index.removePod(M, pod);
        ref.clear(pod);
      } else {
        // A routing lookup (touches), sometimes over a subset of pods, sometimes repeating a block.
        const cands = rand() < 0.5 ? pods : pods.filter(() => rand() < 0.3);
        const q = chain(c, 0, 20);
        const qk = keys(c, 0, 20);
        if (rand() < 0.1) {
          q.splice(3, 0, q[1] as bigint);
          qk.splice(3, 0, qk[1] as string);
        }
        const got = index.longestMatch(M, q, cands).best;
        expect(got).toBe(ref.lookup(cands, qk));
      }
      if (step % 25 === 0) index.assertConsistent();
      if (step % 100 === 0 || step > 2980) {
        expect(index.stats().entries).toBe(ref.entries);
        for (let qc = 0; qc < 8; qc++) {
          const r2 = index.longestMatch(M, chain(qc, 0, 30), pods, { touch: false });
          const want = pods.map((p) => ref.held(p, keys(qc, 0, 30)));
          expect([qc, ...r2.blocks]).toEqual([qc, ...want]);
        }
      }
    }
    expect(index.stats().evictedEntries).toBeGreaterThan(0);
    index.assertConsistent();
  });
});

describe("PrefixIndex: unique entries (what removing a pod loses)", () => {
  it("counts a pod's blocks no other pod holds, and follows removals", () => {
    const { index, feed } = setup();
    feed.batch("a", [stored("a", 1, 0, 8)]);
    feed.batch("b", [stored("b", 1, 0, 5), stored("b", 2, 0, 3)]);
    // a: blocks 5-7 of chain 1 are its own; b: chain 2's three blocks
    expect([index.uniqueEntries(M, "a"), index.uniqueEntries(M, "b")]).toEqual([3, 3]);
    feed.batch("b", [removed("b", 1, 0, 5)]);
    expect(index.uniqueEntries(M, "a")).toBe(8);
    expect(index.uniqueEntries(M, "nobody")).toBe(0);
    expect(index.uniqueEntries("other-model", "a")).toBe(0);
  });
});
