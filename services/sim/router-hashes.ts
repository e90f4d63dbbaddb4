/**
 * The router's hash of each block an engine has cached: what the prefix index keys that block on.
 * Tests and benchmarks compare an index with the engines' true caches through it. A block whose
 * parent is no longer listed (evicted) has no computable router hash and maps to null.
 */
import { chainBlocks, chainSeed } from "../views/block-hash.js";
import type { CacheListing } from "./kv-cache.js";

export function routerHashesOf(listing: Pick<CacheListing, "blocks">, model: string, blockSize: number): (engineHash: string) => bigint | null {
  const byHash = new Map(listing.blocks.map((b) => [b.hash, b]));
  const memo = new Map<string, bigint | null>();
  const routerHash = (h: string): bigint | null => {
    if (memo.has(h)) return memo.get(h) as bigint | null;
    const b = byHash.get(h);
    let out: bigint | null = null;
    if (b) {
      const parent = b.parentHash === null ? chainSeed(model, null, blockSize) : routerHash(b.parentHash);
      out = parent === null ? null : (chainBlocks(parent, b.tokenIds, blockSize)[0] as bigint);
    }
    memo.set(h, out);
    return out;
  };
  return routerHash;
}
