import { describe, expect, it } from "vitest";
import { chainBlocks, chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
import { BlockMap } from "./block-map.js";
import type { EngineBlockStored } from "./wire.js";

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
