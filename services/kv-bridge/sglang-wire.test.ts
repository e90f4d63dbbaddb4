/**
 * SGLang's KV event shapes (python/sglang/srt/disaggregation/kv_events.py, mem_cache/radix_cache.py),
 * from hand-assembled bytes: array-form events of every length SGLang has sent, the map form,
 * the 2- and 3-slot batch, signed int64 hashes, and the radix root's `hash(())` as "no parent".
 */
import { execFileSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { decodeBatch, type EngineBatch, parseReplayMessage, SGLANG_ROOT_PARENT, seqFrame } from "./wire.js";
import { bytes, mp } from "./msgpack-testing.js";

const page = (from: number) => bytes(mp.arr(4), ...Array.from({ length: 4 }, (_, i) => mp.uint(from + i)));
/** CPython's hash(()) as msgspec writes it (a positive int that needs 64 bits: msgspec picks uint64, Python msgpack int64; both decode). */
const ROOT = 5740354900026072187n;
const NEG = -3527539123456789012n;

function decode(payload: Buffer, dialect: "vllm" | "sglang" = "sglang"): EngineBatch {
  const r = decodeBatch(payload, dialect);
  if (!r.ok) throw new Error(r.reason);
  return r.value;
}

describe("kv-bridge wire - SGLang", () => {
  it("the root parent constant is CPython's hash(())", () => {
    const py = execFileSync("python3", ["-c", "print(hash(()) & (2**64 - 1))"]).toString().trim();
    expect(SGLANG_ROOT_PARENT).toBe(BigInt(py).toString(16));
    expect(BigInt(`0x${SGLANG_ROOT_PARENT}`)).toBe(ROOT);
  });

  it("oldest shape: 2-slot batch, 6-slot BlockStored, 2-slot BlockRemoved; root parent means none", () => {
    const stored = bytes(mp.arr(6), mp.str("BlockStored"), mp.arr(1), mp.i64(NEG), mp.i64(ROOT), page(10), mp.uint(4), mp.nil);
    const removed = bytes(mp.arr(2), mp.str("BlockRemoved"), mp.arr(1), mp.i64(NEG));
    const cleared = bytes(mp.arr(1), mp.str("AllBlocksCleared"));
    const b = decode(bytes(mp.arr(2), mp.f64(1.5), mp.arr(3), stored, removed, cleared));
    const negHex = BigInt.asUintN(64, NEG).toString(16);
    expect(b).toEqual({
      ts: 1.5,
      dpRank: undefined,
      invalid: [],
      unknownTags: [],
      events: [
        { kind: "stored", hashes: [negHex], parent: null, tokens: [10, 11, 12, 13], blockSize: 4, loraId: null, loraName: null, medium: null },
        { kind: "removed", hashes: [negHex], medium: null },
        { kind: "all-cleared" },
      ],
    });
    // Read as vLLM, the same bytes name a parent block that no engine ever stored.
    expect((decode(bytes(mp.arr(2), mp.f64(1.5), mp.arr(1), stored), "vllm").events[0] as { parent: string }).parent).toBe(SGLANG_ROOT_PARENT);
  });

  it("newer shape: attn_dp_rank, medium, then cache_salt/session_id where vLLM has lora_name", () => {
    const storedAs = (salt: number[] | Buffer) => bytes(mp.arr(9), mp.str("BlockStored"), mp.arr(1), mp.i64(7n), mp.i64(3n), page(20), mp.uint(4), mp.nil, mp.str("CPU_PINNED"), salt, mp.str("sess"));
    const removed = bytes(mp.arr(3), mp.str("BlockRemoved"), mp.arr(1), mp.i64(7n), mp.str("DISK"));
    const payload = bytes(mp.arr(3), mp.f64(2), mp.arr(2), storedAs(mp.nil), removed, mp.uint(1));
    const b = decode(payload);
    expect(b.dpRank).toBe(1);
    expect(b.events).toEqual([
      { kind: "stored", hashes: ["7"], parent: "3", tokens: [20, 21, 22, 23], blockSize: 4, loraId: null, loraName: null, medium: "CPU_PINNED" },
      { kind: "removed", hashes: ["7"], medium: "DISK" },
    ]);
    expect(b.salted).toBeUndefined();
    // The vLLM dialect would take the cache salt for a LoRA name and the session id for the extra
    // keys, which are not a list: the event is refused rather than keyed wrongly.
    const salted = bytes(mp.arr(3), mp.f64(2), mp.arr(2), storedAs(mp.str("salt")), removed, mp.uint(1));
    expect(decode(salted, "vllm").invalid).toEqual(["events[0]: extra_keys is not an array"]);
  });

  it("a BlockStored with a cache_salt is skipped and counted (array and map form); the rest of the batch stays", () => {
    const arrayForm = bytes(mp.arr(9), mp.str("BlockStored"), mp.arr(1), mp.i64(7n), mp.i64(3n), page(20), mp.uint(4), mp.nil, mp.str("GPU"), mp.str("tenant-a"), mp.nil);
    const mapForm = bytes(
      mp.map(6),
      mp.str("type"), mp.str("BlockStored"),
      mp.str("block_hashes"), mp.arr(1), mp.i64(8n),
      mp.str("parent_block_hash"), mp.i64(ROOT),
      mp.str("token_ids"), page(30),
      mp.str("block_size"), mp.uint(4),
      mp.str("cache_salt"), mp.str("tenant-b"),
    );
    const plain = bytes(mp.arr(6), mp.str("BlockStored"), mp.arr(1), mp.i64(9n), mp.i64(ROOT), page(40), mp.uint(4), mp.nil);
    const removed = bytes(mp.arr(2), mp.str("BlockRemoved"), mp.arr(1), mp.i64(7n));
    const b = decode(bytes(mp.arr(3), mp.f64(4), mp.arr(4), arrayForm, mapForm, plain, removed, mp.uint(0)));
    expect(b.salted).toBe(2);
    expect(b.invalid).toEqual([]);
    expect(b.events).toEqual([
      { kind: "stored", hashes: ["9"], parent: null, tokens: [40, 41, 42, 43], blockSize: 4, loraId: null, loraName: null, medium: null },
      { kind: "removed", hashes: ["7"], medium: null },
    ]);
  });

  it("map form (tagged maps, None fields omitted)", () => {
    const stored = bytes(
      mp.map(7),
      mp.str("type"), mp.str("BlockStored"),
      mp.str("block_hashes"), mp.arr(1), mp.i64(NEG),
      mp.str("parent_block_hash"), mp.i64(ROOT),
      mp.str("token_ids"), page(30),
      mp.str("block_size"), mp.uint(4),
      mp.str("lora_id"), mp.nil,
      mp.str("session_id"), mp.str("x"),
    );
    const b = decode(bytes(mp.arr(3), mp.f64(3), mp.arr(1), stored, mp.uint(0)));
    expect(b.events).toEqual([{ kind: "stored", hashes: [BigInt.asUintN(64, NEG).toString(16)], parent: null, tokens: [30, 31, 32, 33], blockSize: 4, loraId: null, loraName: null, medium: null }]);
    expect(b.dpRank).toBe(0);
  });

  it("replay replies in SGLang's layout: [seq8, payload], end [-1 as 8 bytes, empty]", () => {
    const payload = bytes(mp.arr(2), mp.f64(1), mp.arr(0));
    expect(parseReplayMessage([seqFrame(3), payload])).toEqual({ ok: true, value: { seq: 3, payload } });
    const minusOne = Buffer.alloc(8);
    minusOne.writeBigInt64BE(-1n);
    expect(parseReplayMessage([minusOne, Buffer.alloc(0)])).toEqual({ ok: true, value: "end" });
  });
});
