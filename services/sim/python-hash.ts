/**
 * CPython's `hash(tuple_of_ints)` on a 64-bit build (3.8+), which is what SGLang's radix cache
 * announces as a block hash (`hash(tuple(page_tokens))`): a signed 64-bit value, a function of the
 * page's token ids alone (not chained to the parent), independent of PYTHONHASHSEED (only str and
 * bytes hashing is salted). Reproduced here so the simulator's SGLang mode sends the hashes a real
 * SGLang would. The algorithm is CPython's tuplehash (an xxHash-style lane mix) over
 * `hash(int) = int mod (2^61 - 1)`.
 */
const MASK = (1n << 64n) - 1n;
const MODULUS = (1n << 61n) - 1n;
const PRIME_1 = 11400714785074694791n;
const PRIME_2 = 14029467366897019727n;
const PRIME_5 = 2870177450012600261n;
const LEN_MIX = PRIME_5 ^ 3527539n;

/** `hash(int)` for a non-negative int. */
function intHash(v: number): bigint {
  return BigInt(v) % MODULUS;
}

export function pythonTupleHash(items: readonly number[]): bigint {
  let acc = PRIME_5;
  for (const item of items) {
    acc = (acc + intHash(item) * PRIME_2) & MASK;
    acc = ((acc << 31n) | (acc >> 33n)) & MASK;
    acc = (acc * PRIME_1) & MASK;
  }
  acc = (acc + (BigInt(items.length) ^ LEN_MIX)) & MASK;
  // -1 is reserved for errors in CPython's C API.
  if (acc === MASK) return 1546275796n;
  return BigInt.asIntN(64, acc);
}
