/**
 * The router's hash of each block an engine has cached: what the prefix index keys that block on.
 * Tests and benchmarks compare an index with the engines' true caches through it. A block whose
 * parent is no longer listed (evicted) has no computable router hash and maps to null.
 *
 * The block's extra keys are read as the kv-bridge reads them from BlockStored: a first block's
 * `cache_salt` seeds the chain; extra keys a gateway cannot reproduce make the block opaque.
 */
import { chainBlocks, chainSeed, opaqueBlock, readExtraKeys } from "../views/block-hash.js";
import type { CacheListing } from "./kv-cache.js";

export function routerHashesOf(listing: Pick<CacheListing, "blocks">, model: string, blockSize: number, lora: string | null = null): (engineHash: string) => bigint | null {
  const byHash = new Map(listing.blocks.map((b) => [b.hash, b]));
  const memo = new Map<string, bigint | null>();
  const adapter = { loraName: lora, loraId: null };
  const routerHash = (h: string): bigint | null => {
    if (memo.has(h)) return memo.get(h) as bigint | null;
    const b = byHash.get(h);
    let out: bigint | null = null;
    if (b) {
      const first = b.parentHash === null;
      const keys = readExtraKeys(b.extraKeys, adapter, first);
      const salt = keys === "opaque" ? null : keys.salt;
      const parent = first ? chainSeed(model, lora, blockSize, salt) : routerHash(b.parentHash as string);
      out = parent === null ? null : (chainBlocks(parent, b.tokenIds, blockSize)[0] as bigint);
      if (out !== null && keys === "opaque") out = opaqueBlock(out);
    }
    memo.set(h, out);
    return out;
  };
  return routerHash;
}
