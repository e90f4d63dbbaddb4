import { describe, expect, it } from "vitest";
import { chainBlocks, chainSeed, hashToHex, hexToHash, opaqueBlock, promptBlockHashes, readExtraKeys } from "./block-hash.js";

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

  it("the router's typed ids hash as the same ids in a plain array (an engine event's), from any offset and view", () => {
    const seed = chainSeed("m", null, 16);
    // Large ids too: a plain array's id is taken modulo 2^32, as a Uint32Array stores it.
    const plain = Array.from({ length: 200 }, (_, i) => (i % 3 === 0 ? 0xfffffff0 + (i % 16) : 151_000 + i));
    const typed = Uint32Array.from(plain);
    const expected = chainBlocks(seed, plain, 16);
    expect(chainBlocks(seed, typed, 16)).toEqual(expected);
    expect(chainBlocks(expected[2] as bigint, typed, 16, 48, 4)).toEqual(expected.slice(3, 7));
    // A view that starts inside its buffer.
    const view = new Uint32Array(typed.length + 5).subarray(5);
    view.set(typed);
    expect(chainBlocks(seed, view, 16)).toEqual(expected);
    expect(chainBlocks(seed, plain.map((x, i) => (i === 7 ? x + 2 ** 32 : x)), 16)).toEqual(expected);
    // One id changed: another chain from its block on.
    const other = typed.slice();
    other[40] = (other[40] as number) + 1;
    const changed = chainBlocks(seed, other, 16);
    expect(changed.slice(0, 2)).toEqual(expected.slice(0, 2));
    expect(changed[2]).not.toBe(expected[2]);
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

  it("an unsalted seed is the one decision records and snapshots were written with", () => {
    // Pinned: recorded hashes and saved prefix-index snapshots stay valid across this change.
    expect(hashToHex(chainSeed("org/Model", null, 16))).toBe("62fcb6d5b7db82d0");
    expect(chainSeed("org/Model", null, 16, null)).toBe(chainSeed("org/Model", null, 16));
    // vLLM ignores an empty salt (`if request.cache_salt`): so does the router.
    expect(chainSeed("org/Model", "sql", 32, "")).toBe(chainSeed("org/Model", "sql", 32));
  });

  it("cache_salt keys the first block and, through the chain, every later one", () => {
    const plain = promptBlockHashes(tokens, chainSeed("m", null, 16), 16);
    const a = promptBlockHashes(tokens, chainSeed("m", null, 16, "tenant-a"), 16);
    const b = promptBlockHashes(tokens, chainSeed("m", null, 16, "tenant-b"), 16);
    expect(promptBlockHashes(tokens, chainSeed("m", null, 16, "tenant-a"), 16)).toEqual(a);
    // No block of one salt is a block of another salt or of no salt.
    const all = [...plain, ...a, ...b].map(hashToHex);
    expect(new Set(all).size).toBe(all.length);
    // Like vLLM's extra key on block 0 only: later blocks take the salt from their parent alone.
    expect(chainBlocks(a[0] as bigint, tokens, 16, 16)).toEqual(a.slice(1));
    // Salted under an adapter is yet another space.
    expect(promptBlockHashes(tokens, chainSeed("m", "lora", 16, "tenant-a"), 16)[0]).not.toBe(a[0]);
  });
});

describe("block hash - vLLM extra keys", () => {
  const none = { loraName: null, loraId: null };
  it.each([
    ["no extra keys", null, none, true, { salt: null }],
    ["an empty tuple", [], none, true, { salt: null }],
    ["the salt on the first block", ["s1"], none, true, { salt: "s1" }],
    ["the LoRA name, then the salt", ["sql", "s1"], { loraName: "sql", loraId: null }, true, { salt: "s1" }],
    ["the LoRA name alone, on any block", ["sql"], { loraName: "sql", loraId: null }, false, { salt: null }],
    ["an old engine's numeric LoRA id, then the salt", [3, "s1"], { loraName: null, loraId: 3 }, true, { salt: "s1" }],
    ["a salt equal to the adapter's name", ["sql", "sql"], { loraName: "sql", loraId: null }, true, { salt: "sql" }],
    ["a string on a later block (vLLM salts only block 0)", ["s1"], none, false, "opaque"],
    ["a multimodal id and offset", [["img-3f2a", 0]], none, true, "opaque"],
    ["a salt plus a multimodal id", [["img-3f2a", 0], "s1"], none, true, "opaque"],
    ["a prompt-embedding digest", [Buffer.from("digest")], none, false, "opaque"],
    ["an empty string", [""], none, true, "opaque"],
  ] as const)("%s", (_name, keys, adapter, first, want) => {
    expect(readExtraKeys(keys as readonly unknown[] | null, adapter, first)).toEqual(want);
  });

  it("an opaque block's key is not its plain key", () => {
    const h = promptBlockHashes(tokens, chainSeed("m", null, 16), 16)[0] as bigint;
    expect(opaqueBlock(h)).not.toBe(h);
    expect(opaqueBlock(h)).toBe(opaqueBlock(h));
  });
});
