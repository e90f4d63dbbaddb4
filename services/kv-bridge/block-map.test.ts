import { describe, expect, it } from "vitest";
import { ManualClock } from "../sim/clock.js";
import { SimEngine } from "../sim/engine.js";
import type { KvCacheEvent } from "../sim/kv-cache.js";
import { encodeEventBatch, encodeSglangBatch, SglangEventEncoder } from "../sim/kv-events.js";
import { routerHashesOf } from "../sim/router-hashes.js";
import { chainBlocks, chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
import { BlockMap } from "./block-map.js";
import { decodeBatch, type EngineBlockStored } from "./wire.js";

const MODEL = "org/Model";
const tokens = Array.from({ length: 64 }, (_, i) => 1000 + i);
const stored = (over: Partial<EngineBlockStored>): EngineBlockStored => ({
  kind: "stored", hashes: ["a1", "a2"], parent: null, tokens: tokens.slice(0, 32), blockSize: 16, loraId: null, loraName: null, medium: "GPU", ...over,
});
const prompt = (lora: string | null = null) => promptBlockHashes(tokens, chainSeed(MODEL, lora, 16), 16).map(hashToHex);

describe("kv-bridge block map - router hashes from engine events", () => {
  it("root and child events give exactly the gateway's prompt hashes", () => {
    const m = new BlockMap(MODEL);
    const root = m.stored(stored({}));
    const child = m.stored(stored({ hashes: ["a3", "a4"], parent: "a2", tokens: tokens.slice(32, 64) }));
    expect([...root.routerHashes, ...child.routerHashes]).toEqual(prompt());
    expect(child).toMatchObject({ kind: "stored", engineHashes: ["a3", "a4"], parentEngineHash: "a2", blockSize: 16, medium: "GPU", lora: null });
    expect(m.counters.unknownParents).toBe(0);
  });

  it("an unknown parent is counted and chains deterministically to keys no prompt produces", () => {
    const a = new BlockMap(MODEL);
    const b = new BlockMap(MODEL);
    const ev = stored({ hashes: ["a3", "a4"], parent: "a2", tokens: tokens.slice(32, 64) });
    const x = a.stored(ev);
    expect(b.stored(ev).routerHashes).toEqual(x.routerHashes);
    expect(a.counters.unknownParents).toBe(1);
    expect(x.routerHashes.some((h) => prompt().includes(h))).toBe(false);
    // Its children still chain from it, so removals and later stores stay consistent.
    expect(a.routerHash("a4")).toBeDefined();
  });

  it("LoRA name seeds the chain; a bare lora_id gets a key no gateway reproduces", () => {
    const m = new BlockMap(MODEL);
    expect(m.stored(stored({ loraName: "sql-lora", loraId: 3 })).routerHashes).toEqual(prompt("sql-lora").slice(0, 2));
    const byId = m.stored(stored({ hashes: ["b1", "b2"], loraId: 3 }));
    expect(byId.lora).toBe("lora-id:3");
    expect(byId.routerHashes).not.toEqual(prompt().slice(0, 2));
  });

  it("a block stays known until removed from every tier it was stored in", () => {
    const m = new BlockMap(MODEL);
    m.stored(stored({}));
    m.stored(stored({ medium: "CPU" }));
    expect(m.removed({ kind: "removed", hashes: ["a1", "a2"], medium: "GPU" })).toEqual({ kind: "removed", engineHashes: ["a1", "a2"], medium: "GPU" });
    expect(m.routerHash("a2")).toBeDefined();
    m.removed({ kind: "removed", hashes: ["a1", "a2"], medium: "cpu" });
    expect(m.routerHash("a2")).toBeUndefined();
    // null medium is the GPU tier
    m.stored(stored({ medium: null }));
    m.removed({ kind: "removed", hashes: ["a1"], medium: "GPU" });
    expect(m.routerHash("a1")).toBeUndefined();
  });

  it("is bounded: the least recently used entries go first", () => {
    const m = new BlockMap(MODEL, 4);
    m.stored(stored({}));
    m.stored(stored({ hashes: ["b1", "b2"] }));
    m.routerHash("a1");
    m.stored(stored({ hashes: ["c1", "c2"] }));
    expect(m.size).toBe(4);
    expect(m.counters.evicted).toBe(2);
    expect(m.routerHash("a1")).toBeDefined();
    expect(m.routerHash("a2")).toBeUndefined();
    expect(m.routerHash("b1")).toBeUndefined();
  });

  it("SGLang: one page stored under two parents makes its children misses, never the other copy's chain", () => {
    const page = (base: number) => Array.from({ length: 16 }, (_, i) => base + i);
    const one = (hash: string, parent: string | null, toks: number[]): EngineBlockStored => stored({ hashes: [hash], parent, tokens: toks });
    for (const dialect of ["sglang", "vllm"] as const) {
      const m = new BlockMap(MODEL, 1024, undefined, dialect);
      // Parents A and B, then the same page P (one engine hash: hash(tuple(page))) under each.
      m.stored(one("A", null, page(100)));
      m.stored(one("B", null, page(200)));
      const firstCopy = m.stored(one("P", "A", page(300)));
      const secondCopy = m.stored(one("P", "B", page(300)));
      expect(firstCopy.routerHashes).not.toEqual(secondCopy.routerHashes);
      // A child C of the first copy (the prompt A, P, C).
      const child = m.stored(one("C", "P", page(400)));
      const wrong = hashToHex(chainBlocks(BigInt(`0x${secondCopy.routerHashes[0]}`), page(400), 16)[0] as bigint);
      const right = hashToHex(chainBlocks(BigInt(`0x${firstCopy.routerHashes[0]}`), page(400), 16)[0] as bigint);
      if (dialect === "sglang") {
        expect(child.routerHashes[0]).not.toBe(wrong);
        expect(child.routerHashes[0]).not.toBe(right);
        expect(m.counters.ambiguousParents).toBe(1);
        expect(m.ambiguousHashes).toBe(1);
        m.clear();
        expect(m.ambiguousHashes).toBe(0);
      } else {
        // vLLM hashes are chained: one engine hash is one chain, so the map is trusted.
        expect(child.routerHashes[0]).toBe(wrong);
        expect(m.counters.ambiguousParents).toBe(0);
      }
    }
  });

  it("SGLang: the ambiguous-hash memory is bounded", () => {
    const m = new BlockMap(MODEL, 1024, undefined, "sglang");
    const toks = Array.from({ length: 16 }, (_, i) => i);
    for (let i = 0; i < 3000; i++) {
      m.stored(stored({ hashes: [`p${i}`], parent: null, tokens: toks }));
      m.stored(stored({ hashes: [`p${i}`], parent: "unknown-x", tokens: toks }));
    }
    expect(m.ambiguousHashes).toBe(1024);
  });
});

describe("kv-bridge block map - cache_salt", () => {
  const salted = (salt: string, lora: string | null = null) => promptBlockHashes(tokens, chainSeed(MODEL, lora, 16, salt), 16).map(hashToHex);

  it("a salted first block (extra_keys [[salt], ...]) chains from the salted seed, as the gateway's salted prompt does", () => {
    const m = new BlockMap(MODEL);
    const root = m.stored(stored({ extraKeys: [["tenant-a"], null] }));
    const child = m.stored(stored({ hashes: ["a3", "a4"], parent: "a2", tokens: tokens.slice(32, 64) }));
    expect([...root.routerHashes, ...child.routerHashes]).toEqual(salted("tenant-a"));
    // Never an unsalted prompt's block, nor another salt's.
    const other = [...prompt(), ...salted("tenant-b")];
    expect([...root.routerHashes, ...child.routerHashes].some((h) => other.includes(h))).toBe(false);
    // The same tokens unsalted, stored on the same pod, are the unsalted prompt's blocks.
    expect(m.stored(stored({ hashes: ["b1", "b2"] })).routerHashes).toEqual(prompt().slice(0, 2));
  });

  it("LoRA name before the salt, and an old engine's numeric LoRA id, are read as the adapter", () => {
    const m = new BlockMap(MODEL);
    expect(m.stored(stored({ loraName: "sql-lora", extraKeys: [["sql-lora", "tenant-a"], ["sql-lora"]] })).routerHashes).toEqual(salted("tenant-a", "sql-lora").slice(0, 2));
    const byId = m.stored(stored({ hashes: ["b1", "b2"], loraId: 3, extraKeys: [[3, "tenant-a"], [3]] }));
    expect(byId.routerHashes).toEqual(salted("tenant-a", "lora-id:3").slice(0, 2));
    expect(m.counters.opaqueBlocks).toBe(0);
  });

  it("extra keys no gateway reproduces make the block and its descendants opaque (counted): misses, never hits", () => {
    const m = new BlockMap(MODEL);
    // A multimodal id on block 1: block 0 is the plain prompt's, block 1 on is opaque.
    const mm = m.stored(stored({ extraKeys: [null, [["img-3f2a", 0]]] }));
    expect(mm.routerHashes[0]).toBe(prompt()[0]);
    expect(mm.routerHashes[1]).not.toBe(prompt()[1]);
    const child = m.stored(stored({ hashes: ["a3", "a4"], parent: "a2", tokens: tokens.slice(32, 64) }));
    expect(child.routerHashes.some((h) => prompt().includes(h))).toBe(false);
    // A salt on a block that has a parent is not vLLM's rule: opaque too.
    const late = m.stored(stored({ hashes: ["c3", "c4"], parent: "a2", tokens: tokens.slice(32, 64), extraKeys: [["tenant-a"], null] }));
    expect(late.routerHashes.some((h) => [...prompt(), ...salted("tenant-a")].includes(h))).toBe(false);
    expect(m.counters.opaqueBlocks).toBe(2);
  });

  /** A simulated vLLM engine (blocks of 16) that ran `prompts`, and the events it published. */
  function engineRun(prompts: Array<{ salt?: string; lora?: string }>) {
    const clock = new ManualClock();
    const events: KvCacheEvent[] = [];
    const engine = new SimEngine(
      { maxBatch: 4, maxNumBatchedTokens: 2048, prefillMsPerToken: 1, decodeMsPerStep: 10, decodeBatchSlope: 0, kvCapacityTokens: 16 * 64, blockSize: 16 },
      clock,
      {},
      { hashSeed: 42n, onEvents: (e) => events.push(...e) },
    );
    for (const p of prompts) {
      engine.submit({ promptTokens: tokens, outputTokens: [1], cacheSalt: p.salt, ...(p.lora ? { loraName: p.lora } : {}), onToken: () => undefined, onFinish: () => undefined });
      clock.advance(10_000);
    }
    return { engine, events };
  }

  it.each(["map", "array"] as const)("the simulated engine's salted events (%s form) give the gateway's salted prompt hashes", (encoding) => {
    const runs = [{ salt: "tenant-a" }, { salt: "tenant-b" }, {}, { salt: "tenant-a", lora: "sql-lora" }];
    const { engine, events } = engineRun(runs);
    const decoded = decodeBatch(encodeEventBatch(1.5, events, encoding));
    if (!decoded.ok) throw new Error(decoded.reason);
    expect(decoded.value.invalid).toEqual([]);
    const m = new BlockMap(MODEL);
    const byRun = decoded.value.events.filter((e): e is EngineBlockStored => e.kind === "stored").map((e) => m.stored(e).routerHashes);
    // One BlockStored of the prompt's 4 blocks per run.
    expect(byRun).toEqual(runs.map((r) => promptBlockHashes(tokens, chainSeed(MODEL, r.lora ?? null, 16, r.salt), 16).map(hashToHex)));
    // The simulator's own router-hash helper (tests and benchmarks compare indexes with it) agrees.
    const listing = engine.cacheListing();
    const loraLess = routerHashesOf(listing, MODEL, 16);
    const held = new Set(listing.blocks.map((b) => loraLess(b.hash)).filter((h) => h !== null).map((h) => hashToHex(h as bigint)));
    for (const hashes of byRun.slice(0, 3)) for (const h of hashes) expect(held.has(h)).toBe(true);
  });

  it("SGLang: the simulator names a salted request's cache_salt on every page, and the bridge skips those pages", () => {
    const { events } = engineRun([{ salt: "tenant-a" }, {}]);
    const decoded = decodeBatch(encodeSglangBatch(1.5, events, new SglangEventEncoder()), "sglang");
    if (!decoded.ok) throw new Error(decoded.reason);
    expect(decoded.value.salted).toBe(4);
    const m = new BlockMap(MODEL, 1024, undefined, "sglang");
    const pages = decoded.value.events.filter((e): e is EngineBlockStored => e.kind === "stored").flatMap((e) => m.stored(e).routerHashes);
    expect(pages).toEqual(prompt());
  });
});

