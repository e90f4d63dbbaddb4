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
 *
 * vLLM's `cache_salt` is an extra key of a prompt's first block only; every later block carries it
 * through the chain. Here it goes into the seed the first block chains from, which is the same
 * rule: a salted prompt shares no block with the same tokens unsalted or under another salt, and
 * an unsalted seed is the one it always was (`\0salt\0` is only appended when there is a salt;
 * model and adapter names carry no control characters and the block size is digits, so a salted
 * seed string never equals an unsalted one).
 */
import { xxh64 } from "@node-rs/xxhash";

const SEED = 0x6a6574726f757465n; // "jetroute"
const MASK = (1n << 64n) - 1n;

export type BlockHash = bigint;

export function chainSeed(model: string, lora: string | null | undefined, blockSize: number, cacheSalt?: string | null): BlockHash {
  const salt = cacheSalt ? `\0salt\0${cacheSalt}` : "";
  return xxh64(`jetroute-kv/v1\0${model}\0${lora ?? ""}\0${blockSize}${salt}`, SEED) & MASK;
}

/**
 * What a block's vLLM `extra_keys` (one tuple per block in BlockStored) mean for its router hash.
 * vLLM builds them as `lora name + multimodal ids + [cache_salt on the first block] + prompt
 * embeddings`. A gateway reproduces the LoRA name (in the seed) and the salt; anything else (an
 * image's id, a prompt-embedding digest, a salt on a later block) it cannot, so such a block is
 * `opaque`: keyed where no prompt's hash lands (a miss, never a false hit).
 *
 * `adapter` is what the event names the adapter by: `lora_name`, or the numeric `lora_id` that
 * older engines put in the extra keys instead of the name.
 */
export function readExtraKeys(keys: readonly unknown[] | null, adapter: { loraName: string | null; loraId: number | null }, firstBlock: boolean): { salt: string | null } | "opaque" {
  if (keys === null || keys.length === 0) return NO_SALT;
  const k0 = keys[0];
  const isAdapter = (adapter.loraName !== null && k0 === adapter.loraName) || (adapter.loraId !== null && k0 === adapter.loraId);
  const rest = isAdapter ? keys.slice(1) : keys;
  if (rest.length === 0) return NO_SALT;
  const only = rest[0];
  if (firstBlock && rest.length === 1 && typeof only === "string" && only !== "") return { salt: only };
  return "opaque";
}
const NO_SALT = { salt: null } as const;

const OPAQUE_SEED = 0x6f70617175656b65n; // "opaqueke"

/** The key a block with extra keys no gateway reproduces is stored under (its children chain from it). */
export function opaqueBlock(routerHash: BlockHash): BlockHash {
  const buf = Buffer.allocUnsafe(8);
  buf.writeBigUInt64LE(routerHash, 0);
  return xxh64(buf, OPAQUE_SEED);
}

/** Whether this machine stores a Uint32Array's elements little-endian (the hash's byte order). */
const LITTLE_ENDIAN = new Uint8Array(Uint32Array.of(1).buffer)[0] === 1;

/**
 * Hashes consecutive full blocks of `tokens` starting at `offset`, chained from `parent`. The
 * router's typed ids (a Uint32Array) are copied into the hashed buffer as memory on a little-endian
 * machine; other arrays are written id by id (each taken modulo 2^32, as a Uint32Array holds it).
 */
export function chainBlocks(parent: BlockHash, tokens: ArrayLike<number>, blockSize: number, offset = 0, maxBlocks = Number.POSITIVE_INFINITY): BlockHash[] {
  const n = Math.min(Math.floor((tokens.length - offset) / blockSize), maxBlocks);
  const out: BlockHash[] = new Array(n);
  const buf = Buffer.allocUnsafe(8 + 4 * blockSize);
  const bytes = LITTLE_ENDIAN && tokens instanceof Uint32Array ? Buffer.from(tokens.buffer, tokens.byteOffset, tokens.byteLength) : undefined;
  let h = parent;
  for (let b = 0; b < n; b++) {
    buf.writeBigUInt64LE(h, 0);
    const base = offset + b * blockSize;
    if (bytes) bytes.copy(buf, 8, 4 * base, 4 * (base + blockSize));
    else for (let i = 0; i < blockSize; i++) buf.writeUInt32LE((tokens[base + i] as number) >>> 0, 8 + 4 * i);
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
