/**
 * The what-if's rebuilt prompts (whatif.ts): a recorded request's router block hashes turned back
 * into token ids that carry them, and read back out of the engines' cache events. Pure.
 *
 * The first five tokens of a rebuilt block encode its 64-bit router hash (14 bits each, ids below
 * HIGH_TOKEN_BASE); every other token that can start a block (prompt remainder, generated tokens)
 * is drawn from HIGH_TOKEN_BASE up. A stored block therefore names its router hash itself, without
 * hashing every prompt a second time per pod to learn the engine's hashes in advance. This needs
 * blocks of at least five tokens and the engine's block size equal to the router's, which jetroute
 * always has (the gateway hashes with the block size the engine reports).
 */

/** Tokens at the head of a block that carry its router hash. */
export const HASH_TOKENS = 5;
const VOCAB_BASE = 100;
const VOCAB_END = 32_000;
/** Ids of hash-carrying head tokens are below this; tokens of unhashed content start here. */
const HIGH_TOKEN_BASE = VOCAB_BASE + (1 << 14);

export const finiteInt = (v: number, fallback: number): number => (Number.isFinite(v) ? Math.floor(v) : fallback);

/**
 * A request's router hashes as map keys (16 lower-case hex digits: hashToHex does not zero-pad,
 * a trace may) and as 32-bit halves. One pass of char codes: this runs for every block of every
 * arrival, where a regex plus string rebuilding showed up in profiles.
 */
export function parseHashes(r: HashedRequest): { keys: string[]; hi: Uint32Array; lo: Uint32Array } {
  const n = r.hashes.length;
  const keys = new Array<string>(n);
  const hi = new Uint32Array(n);
  const lo = new Uint32Array(n);
  for (let b = 0; b < n; b++) {
    const hex = r.hashes[b] as string;
    const len = hex.length;
    if (len < 1 || len > 16) throw badHash(r, hex);
    let h = 0;
    let l = 0;
    let lower = true;
    for (let i = 0; i < len; i++) {
      const c = hex.charCodeAt(i);
      let d: number;
      if (c >= 48 && c <= 57) d = c - 48;
      else if (c >= 97 && c <= 102) d = c - 87;
      else if (c >= 65 && c <= 70) {
        d = c - 55;
        lower = false;
      } else throw badHash(r, hex);
      // Shift the 64-bit (h, l) left by one hex digit.
      h = ((h << 4) | (l >>> 28)) >>> 0;
      l = ((l << 4) | d) >>> 0;
    }
    hi[b] = h;
    lo[b] = l;
    keys[b] = len === 16 && lower ? hex : hex.toLowerCase().padStart(16, "0");
  }
  return { keys, hi, lo };
}

const badHash = (r: HashedRequest, hex: string): RangeError =>
  new RangeError(`request ${r.requestId}: block hash ${JSON.stringify(hex)} is not a 64-bit hex number`);

/** murmur3's 32-bit finaliser: a cheap, well-mixed stateless hash step. */
function mix32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}

/**
 * The rebuilt prompt: one block per router hash (the hash-carrying head, then filler drawn from
 * the hash, so equal hashes give equal blocks), then tokens drawn from the request id up to `len`
 * (unique to the request: nothing past the recorded hashes is known to be shared).
 */
export function promptTokens(hi: Uint32Array, lo: Uint32Array, len: number, bs: number, requestId: string): number[] {
  const out = new Array<number>(len);
  for (let b = 0; b < hi.length; b++) {
    const h = hi[b] as number;
    const l = lo[b] as number;
    const o = b * bs;
    out[o] = VOCAB_BASE + (l & 0x3fff);
    out[o + 1] = VOCAB_BASE + ((l >>> 14) & 0x3fff);
    out[o + 2] = VOCAB_BASE + ((l >>> 28) | ((h & 0x3ff) << 4));
    out[o + 3] = VOCAB_BASE + ((h >>> 10) & 0x3fff);
    out[o + 4] = VOCAB_BASE + (h >>> 24);
    // The filler only has to be a function of the hash: the head already makes the block unique.
    const s = mix32(l ^ mix32(h));
    for (let j = HASH_TOKENS; j < bs; j++) out[o + j] = VOCAB_BASE + ((Math.imul(s ^ j, 0x9e3779b1) >>> 0) % (VOCAB_END - VOCAB_BASE));
  }
  const start = hi.length * bs;
  if (start < len) {
    const rest = highTokens(requestId, 0x707274, len - start);
    for (let i = start; i < len; i++) out[i] = rest[i - start] as number;
  }
  return out;
}

/** The router hash a rebuilt block's head carries, or undefined for a block of unhashed content. */
export function decodeRouterHash(tokens: readonly number[], o: number): string | undefined {
  const t0 = (tokens[o] as number) - VOCAB_BASE;
  if (t0 < 0 || t0 >= 1 << 14) return undefined;
  const t1 = (tokens[o + 1] as number) - VOCAB_BASE;
  const t2 = (tokens[o + 2] as number) - VOCAB_BASE;
  const t3 = (tokens[o + 3] as number) - VOCAB_BASE;
  const t4 = (tokens[o + 4] as number) - VOCAB_BASE;
  const lo = (t0 | (t1 << 14) | ((t2 & 0xf) << 28)) >>> 0;
  const hi = ((t2 >>> 4) | (t3 << 10) | (t4 << 24)) >>> 0;
  return hi.toString(16).padStart(8, "0") + lo.toString(16).padStart(8, "0");
}

/** `n` tokens in [HIGH_TOKEN_BASE, VOCAB_END) drawn from (request id, purpose): never a hash-carrying head. */
export function highTokens(requestId: string, purpose: number, n: number): number[] {
  // Two independent 32-bit FNV-1a variants: 64 bits of state, so distinct ids do not collide.
  let a = 0x811c9dc5 ^ purpose;
  let b = 0x01000193 ^ mix32(purpose);
  for (let i = 0; i < requestId.length; i++) {
    const c = requestId.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x5bd1e995);
  }
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) out[i] = HIGH_TOKEN_BASE + (mix32(mix32(a + Math.imul(i, 0x9e3779b9)) ^ b) % (VOCAB_END - HIGH_TOKEN_BASE));
  return out;
}

/** What parseHashes reads of a trace request. */
export interface HashedRequest {
  readonly requestId: string;
  readonly hashes: readonly string[];
}
