import { describe, expect, it } from "vitest";
import { chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
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
});
