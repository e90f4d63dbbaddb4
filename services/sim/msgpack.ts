/**
 * A small MessagePack encoder that picks the same formats as Python's msgspec, which is what vLLM
 * encodes its KV events with, so the simulator's payloads are byte-for-byte what an engine sends.
 *
 * Why not msgpackr: it writes a BigInt below 2^63 as int64 (0xd3), an integral Number above 2^32
 * as float64, and an integral float (a timestamp like 1700000001.0) as an int. msgspec writes any
 * non-negative int in the smallest unsigned form (so a 64-bit block hash is always uint64, 0xcf)
 * and a Python float always as float64 (0xcb). Decoders that read block hashes into a uint64 or
 * the timestamp into a float64 accept msgspec's choices; matching them removes the doubt.
 *
 * Value mapping: null → nil, boolean → bool, integral number or bigint → int (unsigned forms when
 * >= 0, signed otherwise), non-integral number or `F64` → float64, string → str (UTF-8), Uint8Array
 * → bin, array → array, plain object → map in key insertion order.
 */

/** Forces float64 for a value that may happen to be integral (msgspec encodes every Python float so). */
export class F64 {
  constructor(readonly value: number) {}
}

export type Msg = null | boolean | number | bigint | string | Uint8Array | F64 | readonly Msg[] | { readonly [key: string]: Msg };

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);

class Writer {
  private buf = Buffer.allocUnsafe(256);
  private pos = 0;

  private room(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.pos + n));
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }

  private byte(b: number): void {
    this.room(1);
    this.buf[this.pos++] = b;
  }

  /** A one-byte marker then an unsigned big-endian length/value of `size` bytes. */
  private head(marker: number, size: 1 | 2 | 4, value: number): void {
    this.room(1 + size);
    this.buf[this.pos++] = marker;
    this.buf.writeUIntBE(value, this.pos, size);
    this.pos += size;
  }

  /** Container/string header: a fix form when `n` is below `fixLimit`, else the 8/16/32-bit forms. */
  private sized(n: number, fixBase: number, fixLimit: number, m8: number | undefined, m16: number, m32: number): void {
    if (n < fixLimit) this.byte(fixBase | n);
    else if (m8 !== undefined && n <= 0xff) this.head(m8, 1, n);
    else if (n <= 0xffff) this.head(m16, 2, n);
    else this.head(m32, 4, n);
  }

  int(v: bigint): void {
    if (v > U64_MAX || v < I64_MIN) throw new RangeError(`integer ${v} does not fit in 64 bits`);
    if (v >= 0n && v < 0x80n) this.byte(Number(v));
    else if (v >= 0n && v <= 0xffn) this.head(0xcc, 1, Number(v));
    else if (v >= 0n && v <= 0xffffn) this.head(0xcd, 2, Number(v));
    else if (v >= 0n && v <= 0xffffffffn) this.head(0xce, 4, Number(v));
    else if (v >= 0n) {
      this.room(9);
      this.buf[this.pos++] = 0xcf;
      this.buf.writeBigUInt64BE(v, this.pos);
      this.pos += 8;
    } else if (v >= -32n) this.byte(0x100 + Number(v));
    else {
      const n = Number(v);
      this.room(9);
      if (v >= -0x80n) {
        this.buf[this.pos++] = 0xd0;
        this.buf.writeInt8(n, this.pos++);
      } else if (v >= -0x8000n) {
        this.buf[this.pos++] = 0xd1;
        this.buf.writeInt16BE(n, this.pos);
        this.pos += 2;
      } else if (v >= -0x80000000n) {
        this.buf[this.pos++] = 0xd2;
        this.buf.writeInt32BE(n, this.pos);
        this.pos += 4;
      } else {
        this.buf[this.pos++] = 0xd3;
        this.buf.writeBigInt64BE(v, this.pos);
        this.pos += 8;
      }
    }
  }

  float64(v: number): void {
    this.room(9);
    this.buf[this.pos++] = 0xcb;
    this.buf.writeDoubleBE(v, this.pos);
    this.pos += 8;
  }

  value(v: Msg): void {
    if (v === null) this.byte(0xc0);
    else if (typeof v === "boolean") this.byte(v ? 0xc3 : 0xc2);
    else if (typeof v === "bigint") this.int(v);
    else if (typeof v === "number") {
      if (!Number.isInteger(v)) this.float64(v);
      else if (Number.isSafeInteger(v)) this.int(BigInt(v));
      else throw new RangeError(`${v} is not a safe integer: pass a bigint`);
    } else if (typeof v === "string") {
      const bytes = Buffer.byteLength(v, "utf8");
      this.sized(bytes, 0xa0, 32, 0xd9, 0xda, 0xdb);
      this.room(bytes);
      this.pos += this.buf.write(v, this.pos, "utf8");
    } else if (v instanceof F64) this.float64(v.value);
    else if (v instanceof Uint8Array) {
      this.sized(v.length, 0, 0, 0xc4, 0xc5, 0xc6);
      this.room(v.length);
      this.buf.set(v, this.pos);
      this.pos += v.length;
    } else if (Array.isArray(v)) {
      this.sized(v.length, 0x90, 16, undefined, 0xdc, 0xdd);
      for (const item of v as readonly Msg[]) this.value(item);
    } else {
      const entries = Object.entries(v as { readonly [key: string]: Msg });
      this.sized(entries.length, 0x80, 16, undefined, 0xde, 0xdf);
      for (const [key, item] of entries) {
        this.value(key);
        this.value(item);
      }
    }
  }

  done(): Buffer {
    return this.buf.subarray(0, this.pos);
  }
}

export function packMsg(value: Msg): Buffer {
  const w = new Writer();
  w.value(value);
  return w.done();
}
