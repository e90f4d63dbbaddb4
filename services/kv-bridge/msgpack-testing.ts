/**
 * Hand-written msgpack bytes for the wire tests: the exact bytes Python's msgpack (vLLM) and msgspec
 * (SGLang) emit for the values the engines send, written out by hand rather than by our own encoder.
 */
export const mp = {
  arr: (n: number) => (n < 16 ? [0x90 | n] : [0xdc, n >> 8, n & 0xff]),
  map: (n: number) => [0x80 | n],
  str: (s: string) => {
    const b = [...Buffer.from(s)];
    return b.length < 32 ? [0xa0 | b.length, ...b] : [0xd9, b.length, ...b];
  },
  nil: [0xc0],
  f64: (x: number) => {
    const b = Buffer.alloc(9);
    b[0] = 0xcb;
    b.writeDoubleBE(x, 1);
    return [...b];
  },
  u64: (x: bigint) => {
    const b = Buffer.alloc(9);
    b[0] = 0xcf;
    b.writeBigUInt64BE(x, 1);
    return [...b];
  },
  i64: (x: bigint) => {
    const b = Buffer.alloc(9);
    b[0] = 0xd3;
    b.writeBigInt64BE(x, 1);
    return [...b];
  },
  uint: (n: number) => (n < 128 ? [n] : n < 256 ? [0xcc, n] : [0xcd, n >> 8, n & 0xff]),
  bin: (b: Buffer) => [0xc4, b.length, ...b],
};
/** Concatenates byte runs (number arrays or Buffers). */
export const bytes = (...parts: Array<number[] | Buffer>): Buffer => Buffer.concat(parts.map((p) => Buffer.from(p)));
