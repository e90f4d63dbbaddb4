/**
 * Block hashes packed for decision records: big-endian uint64s, base64. Half the bytes of a hex
 * array (11 characters per block instead of 19), and a plain JSON string for the `nats` CLI.
 */

export function encodeBlockHashes(hashes: readonly bigint[], max: number): string {
  const n = Math.min(hashes.length, max);
  const buf = Buffer.allocUnsafe(n * 8);
  for (let i = 0; i < n; i++) buf.writeBigUInt64BE(BigInt.asUintN(64, hashes[i] as bigint), i * 8);
  return buf.toString("base64");
}

/** The hashes of `encodeBlockHashes`; throws on a length that is not a whole number of hashes. */
export function decodeBlockHashes(b64: string): bigint[] {
  const buf = Buffer.from(b64, "base64");
  if (buf.length % 8 !== 0) throw new Error(`packed block hashes are ${buf.length} bytes, not a multiple of 8`);
  const out = new Array<bigint>(buf.length / 8);
  for (let i = 0; i < out.length; i++) out[i] = buf.readBigUInt64BE(i * 8);
  return out;
}
