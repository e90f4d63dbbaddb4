import { describe, expect, it } from "vitest";
import { chainBlocks, chainSeed, hashToHex, hexToHash, promptBlockHashes } from "./block-hash.js";

const tokens = Array.from({ length: 64 }, (_, i) => 100 + i);

describe("block hash - router's chained hash", () => {
  it("is deterministic and chains: a suffix hashed from its parent equals the prompt's hashes", () => {
    const seed = chainSeed("m", null, 16);
    const all = promptBlockHashes(tokens, seed, 16);
    expect(all).toHaveLength(4);
    expect(promptBlockHashes(tokens, seed, 16)).toEqual(all);
    // An engine event for blocks 2..3 whose parent is block 1 must produce the same keys.
    expect(chainBlocks(all[1] as bigint, tokens, 16, 32)).toEqual(all.slice(2));
  });

  it("separates models, LoRA adapters and block sizes", () => {
    const seeds = [chainSeed("m", null, 16), chainSeed("m2", null, 16), chainSeed("m", "lora-a", 16), chainSeed("m", null, 32)];
    expect(new Set(seeds.map(hashToHex)).size).toBe(4);
    expect(new Set(seeds.map((s) => hashToHex(promptBlockHashes(tokens, s, 16)[0] as bigint))).size).toBe(4);
  });

  it("a different token anywhere in a block changes that block and every later one", () => {
    const seed = chainSeed("m", null, 16);
    const a = promptBlockHashes(tokens, seed, 16);
    const t2 = [...tokens];
    t2[20] = 7;
    const b = promptBlockHashes(t2, seed, 16);
    expect(b[0]).toBe(a[0]);
    expect(b.slice(1).every((h, i) => h !== a[i + 1])).toBe(true);
  });

  it("ignores a trailing partial block and round-trips through hex", () => {
    const seed = chainSeed("m", null, 16);
    expect(promptBlockHashes(tokens.slice(0, 40), seed, 16)).toHaveLength(2);
    const h = promptBlockHashes(tokens, seed, 16)[3] as bigint;
    expect(hexToHash(hashToHex(h))).toBe(h);
    expect(h < 1n << 64n).toBe(true);
  });
});
