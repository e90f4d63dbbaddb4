/**
 * What a token id is, everywhere the router takes ids from outside: a client's prompt ids, an
 * engine's `/tokenize` answer, a KV event's `token_ids`. No imports: the KV bridge's wire parser
 * uses it without loading the tokenizers.
 */

/** The largest token id the router's type (a Uint32Array) and a KV event's wire form hold. */
export const MAX_TOKEN_ID = 0xffff_ffff;

/** An integer in 0..2^32-1: a larger id would wrap in the router's typed array and match another prompt's blocks. */
export function isTokenId(x: unknown): x is number {
  return typeof x === "number" && Number.isInteger(x) && x >= 0 && x <= MAX_TOKEN_ID;
}
