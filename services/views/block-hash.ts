/**
 * The router's own chained block hash, shared by the kv-bridge (which hashes the token ids carried
 * in BlockStored events) and the gateway (which hashes a request's prompt tokens). Pure.
 *
 * Why our own hash and not the engine's: vLLM's default block hash is sha256 over pickle with a
 * per-process random seed — not reproducible outside that process. Keying on a hash recomputed
 * from token ids makes the index independent of the engine's hashing scheme.
 *
 *   seed     = xxh64("jetroute-kv/v1\0" + model + "\0" + (lora ?? "") + "\0" + blockSize)
 *   hash(b0) = xxh64(seed_le64 ++ tokens(b0) as u32 LE, SEED)
 *   hash(bi) = xxh64(hash(b(i-1))_le64 ++ tokens(bi) as u32 LE, SEED)
 *
 * LoRA name and block size are part of the seed: the same tokens under another adapter or block
 * size are another block (a block-size mismatch would otherwise silently match nothing or wrongly).
 */
import { xxh64 } from "@node-rs/xxhash";

const SEED = 0x6a6574726f757465n; // "jetroute"
const MASK = (1n << 64n) - 1n;

export type BlockHash = bigint;

export function chainSeed(model: string, lora: string | null | undefined, blockSize: number): BlockHash {
  return xxh64(`jetroute-kv/v1\0${model}\0${lora ?? ""}\0${blockSize}`, SEED) & MASK;
}

/** Hashes consecutive full blocks of `tokens` starting at `offset`, chained from `parent`. */
export function chainBlocks(parent: BlockHash, tokens: ArrayLike<number>, blockSize: number, offset = 0, maxBlocks = Number.POSITIVE_INFINITY): BlockHash[] {
  const n = Math.min(Math.floor((tokens.length - offset) / blockSize), maxBlocks);
  const out: BlockHash[] = new Array(n);
  const buf = Buffer.allocUnsafe(8 + 4 * blockSize);
  let h = parent;
  for (let b = 0; b < n; b++) {
    buf.writeBigUInt64LE(h, 0);
    const base = offset + b * blockSize;
    for (let i = 0; i < blockSize; i++) buf.writeUInt32LE((tokens[base + i] as number) >>> 0, 8 + 4 * i);
    h = xxh64(buf, SEED);
    out[b] = h;
  }
  return out;
}

/** Router hashes of every full block of a prompt. */
export function promptBlockHashes(tokens: ArrayLike<number>, seed: BlockHash, blockSize: number, maxBlocks?: number): BlockHash[] {
  return chainBlocks(seed, tokens, blockSize, 0, maxBlocks);
}

export const hashToHex = (h: BlockHash): string => h.toString(16);
export const hexToHash = (s: string): BlockHash => BigInt(`0x${s}`);
