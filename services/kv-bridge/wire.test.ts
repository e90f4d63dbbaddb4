/**
 * Engine wire format, from hand-assembled bytes (not from our own encoder), for every shape in
 * engines.md §1-2.
 */
import { describe, expect, it } from "vitest";
import { decodeBatch, END_SEQ, type EngineBatch, parseLiveMessage, parseReplayMessage, seqFrame } from "./wire.js";
import { bytes, mp } from "./msgpack-testing.js";

const tokens100to131 = () => bytes(mp.arr(32), ...Array.from({ length: 32 }, (_, i) => mp.uint(100 + i)));

function decodeOk(payload: Buffer): EngineBatch {
  const r = decodeBatch(payload);
  if (!r.ok) throw new Error(r.reason);
  return r.value;
}

const workedStored = {
  kind: "stored",
  hashes: ["1", "2"],
  parent: null,
  tokens: Array.from({ length: 32 }, (_, i) => 100 + i),
  blockSize: 16,
  loraId: null,
  loraName: null,
  medium: "GPU",
};

describe("kv-bridge wire - EventBatch decoding", () => {
  it("decodes the worked example in map form", () => {
    const ev = bytes(
      mp.map(8),
      mp.str("type"), mp.str("BlockStored"),
      mp.str("block_hashes"), mp.arr(2), [1, 2],
      mp.str("parent_block_hash"), mp.nil,
      mp.str("token_ids"), [...tokens100to131()],
      mp.str("block_size"), [16],
      mp.str("lora_id"), mp.nil,
      mp.str("medium"), mp.str("GPU"),
      mp.str("lora_name"), mp.nil,
    );
    const b = decodeOk(bytes(mp.arr(3), mp.f64(1700000000.5), mp.arr(1), [...ev], [0]));
    expect(b.ts).toBe(1700000000.5);
    expect(b.dpRank).toBe(0);
    expect(b.events).toEqual([workedStored]);
    expect(b.invalid).toEqual([]);
  });

  it("decodes the worked example in array form, v0.26 trailing fields included", () => {
    const ev = bytes(
      mp.arr(12), mp.str("BlockStored"), mp.arr(2), [1, 2], mp.nil, [...tokens100to131()], [16], mp.nil, mp.str("GPU"), mp.nil,
      mp.arr(2), mp.nil, mp.nil, [0], mp.str("full_attention"), mp.nil,
    );
    const b = decodeOk(bytes(mp.arr(3), mp.f64(1700000000.5), mp.arr(1), [...ev], [0]));
    expect(b.events).toEqual([workedStored]);
  });

  it("map form: omitted nil fields default to null and unknown keys are ignored", () => {
    const ev = bytes(
      mp.map(7),
      mp.str("type"), mp.str("BlockStored"),
      mp.str("block_hashes"), mp.arr(1), [7],
      mp.str("token_ids"), mp.arr(2), [5, 6],
      mp.str("block_size"), [2],
      mp.str("extra_keys"), mp.arr(1), mp.nil,
      mp.str("kv_cache_spec_kind"), mp.str("full_attention"),
      mp.str("some_future_field"), mp.map(1), mp.str("x"), [1],
    );
    const b = decodeOk(bytes(mp.arr(3), mp.f64(1.5), mp.arr(1), [...ev], mp.nil));
    expect(b.dpRank).toBeNull();
    expect(b.events).toEqual([{ kind: "stored", hashes: ["7"], parent: null, tokens: [5, 6], blockSize: 2, loraId: null, loraName: null, medium: null }]);
  });

  it("short arrays from older engines: fields are read only where present", () => {
    const stored5 = bytes(mp.arr(5), mp.str("BlockStored"), mp.arr(1), [9], [3], mp.arr(2), [1, 2], [2]);
    const removed2 = bytes(mp.arr(2), mp.str("BlockRemoved"), mp.arr(1), [9]);
    const stored4 = bytes(mp.arr(4), mp.str("BlockStored"), mp.arr(1), [9], mp.nil, mp.arr(2), [1, 2]);
    const b = decodeOk(bytes(mp.arr(2), mp.f64(2), mp.arr(3), [...stored5], [...removed2], [...stored4]));
    expect(b.dpRank).toBeUndefined(); // EventBatch without its third slot
    expect(b.events).toEqual([
      { kind: "stored", hashes: ["9"], parent: "3", tokens: [1, 2], blockSize: 2, loraId: null, loraName: null, medium: null },
      { kind: "removed", hashes: ["9"], medium: null },
    ]);
    expect(b.invalid).toEqual(["events[2]: BlockStored array has 4 slots, expected >= 5"]);
  });

  it("extra_keys: one tuple or nil per block (array and map form); all-nil reads as none", () => {
    // Array form, v0.26 layout: a salted first block, the salt in its extra keys only.
    const arrayForm = bytes(
      mp.arr(12), mp.str("BlockStored"), mp.arr(2), [1, 2], mp.nil, [...tokens100to131()], [16], mp.nil, mp.str("GPU"), mp.nil,
      mp.arr(2), mp.arr(1), mp.str("tenant-a"), mp.nil, [0], mp.str("full_attention"), mp.nil,
    );
    const mapForm = bytes(
      mp.map(6),
      mp.str("type"), mp.str("BlockStored"),
      mp.str("block_hashes"), mp.arr(2), [3, 4],
      mp.str("token_ids"), [...tokens100to131()],
      mp.str("block_size"), [16],
      mp.str("lora_name"), mp.str("sql"),
      mp.str("extra_keys"), mp.arr(2), mp.arr(2), mp.str("sql"), mp.str("tenant-a"), mp.arr(1), mp.str("sql"),
    );
    const b = decodeOk(bytes(mp.arr(3), mp.f64(1), mp.arr(2), [...arrayForm], [...mapForm], [0]));
    expect(b.invalid).toEqual([]);
    expect(b.events[0]).toMatchObject({ hashes: ["1", "2"], extraKeys: [["tenant-a"], null] });
    expect(b.events[1]).toMatchObject({ hashes: ["3", "4"], loraName: "sql", extraKeys: [["sql", "tenant-a"], ["sql"]] });
    // The worked example's `[nil, nil]` carries nothing: no extraKeys at all (see the tests above).
  });

  it("extra_keys that cannot be lined up with the blocks make the event invalid (a salt on the wrong block would be a false hit)", () => {
    const withKeys = (keys: number[][]) =>
      bytes(mp.map(5), mp.str("type"), mp.str("BlockStored"), mp.str("block_hashes"), mp.arr(2), [1, 2], mp.str("token_ids"), mp.arr(2), [5, 6], mp.str("block_size"), [1], mp.str("extra_keys"), ...keys);
    const b = decodeOk(
      bytes(mp.arr(3), mp.f64(1), mp.arr(3), [...withKeys([mp.arr(1), mp.arr(1), mp.str("s")])], [...withKeys([mp.str("s")])], [...withKeys([mp.arr(2), mp.str("s"), mp.nil])], [0]),
    );
    expect(b.events).toEqual([]);
    expect(b.invalid).toEqual([
      "events[0]: extra_keys has 1 entries for 2 blocks",
      "events[1]: extra_keys is not an array",
      "events[2]: extra_keys[0] is not an array",
    ]);
  });

  it("keeps every bit of 64-bit hashes: uint64 above 2^63, SGLang's negative int64, digests", () => {
    const digest = Buffer.from(Array.from({ length: 32 }, (_, i) => i));
    const stored = bytes(
      mp.arr(7), mp.str("BlockStored"),
      mp.arr(3), mp.u64(0xfffffffffffffffen), mp.i64(-2n), [0xff],
      mp.i64(-(2n ** 63n)),
      mp.arr(3), [1, 2, 3], [1], mp.nil, mp.str("CPU_PINNED"),
    );
    const removed = bytes(mp.arr(3), mp.str("BlockRemoved"), mp.arr(1), mp.bin(digest), mp.str("GPU"));
    const b = decodeOk(bytes(mp.arr(3), mp.f64(3), mp.arr(2), [...stored], [...removed], [1]));
    expect(b.events[0]).toMatchObject({ hashes: ["fffffffffffffffe", "fffffffffffffffe", "ffffffffffffffff"], parent: "8000000000000000", medium: "CPU_PINNED" });
    expect(b.events[1]).toEqual({ kind: "removed", hashes: [digest.toString("hex")], medium: "GPU" });
    expect(b.dpRank).toBe(1);
  });

  it("AllBlocksCleared in both forms; unknown tags are reported, not fatal", () => {
    const b = decodeOk(
      bytes(mp.arr(3), mp.f64(4), mp.arr(3), mp.arr(1), mp.str("AllBlocksCleared"), mp.map(1), mp.str("type"), mp.str("AllBlocksCleared"), mp.arr(2), mp.str("BlockUpdated"), [1], [0]),
    );
    expect(b.events).toEqual([{ kind: "all-cleared" }, { kind: "all-cleared" }]);
    expect(b.unknownTags).toEqual(["BlockUpdated"]);
  });

  it("wrong field types make that event invalid, not the batch", () => {
    const evs = [
      bytes(mp.arr(5), mp.str("BlockStored"), mp.str("nope"), mp.nil, mp.arr(1), [1], [1]),
      bytes(mp.arr(5), mp.str("BlockStored"), mp.arr(1), [1], mp.nil, mp.arr(1), mp.str("x"), [1]),
      bytes(mp.arr(5), mp.str("BlockStored"), mp.arr(1), [1], mp.nil, mp.arr(3), [1, 2, 3], [2]),
      bytes(mp.arr(5), mp.str("BlockStored"), mp.arr(1), [1], mp.nil, mp.arr(0), [0]),
      bytes(mp.arr(3), mp.str("BlockRemoved"), mp.arr(1), [1], [5]),
      bytes(mp.arr(2), mp.str("BlockRemoved"), mp.arr(0)),
      bytes(mp.arr(5), mp.str("BlockStored"), mp.arr(1), mp.f64(1.5), mp.nil, mp.arr(1), [1], [1]),
      bytes([7]),
      bytes(mp.arr(1), [1]),
    ];
    const b = decodeOk(bytes(mp.arr(3), mp.f64(5), mp.arr(evs.length), ...evs.map((e) => [...e]), mp.str("zero")));
    expect(b.events).toEqual([]);
    expect(b.invalid).toEqual([
      "data_parallel_rank is not an integer",
      "events[0]: block_hashes is not an array",
      "events[1]: token_ids[0] is not a token id",
      "events[2]: token_ids has 3 ids for 1 blocks of 2",
      "events[3]: block_size is not a positive integer",
      "events[4]: medium is not a string",
      "events[5]: block_hashes is empty",
      "events[6]: block_hashes[0] is not a hash",
      "events[7]: event is neither a map nor an array",
      "events[8]: event has no string tag",
    ]);
  });

  it("rejects batches that are not EventBatches", () => {
    const reasons = [
      bytes([0xc1]),
      bytes(mp.arr(2), mp.f64(1)),
      bytes(mp.arr(2), mp.f64(1), mp.arr(0), [0]),
      bytes(mp.map(0)),
      bytes(mp.arr(1), mp.f64(1)),
      bytes(mp.arr(2), mp.str("t"), mp.arr(0)),
      bytes(mp.arr(2), mp.f64(1), mp.map(0)),
      Buffer.from("garbage that is not msgpack at all"),
    ].map((p) => {
      const r = decodeBatch(p);
      return r.ok ? "ok" : r.reason.replace(/:.*/, "");
    });
    expect(reasons).toEqual([
      "EventBatch is not an array",
      "msgpack",
      "msgpack",
      "EventBatch is not an array",
      "EventBatch has 1 slots, expected >= 2",
      "EventBatch ts is not a timestamp",
      "EventBatch events is not an array",
      "msgpack",
    ]);
  });
});

describe("kv-bridge wire - frames", () => {
  const payload = Buffer.from([0x92, 0x01, 0x90]);
  it("live messages are exactly [topic, seq8, payload]", () => {
    expect(parseLiveMessage([Buffer.from("kv-events"), seqFrame(42), payload])).toEqual({ ok: true, value: { seq: 42, payload } });
    expect(parseLiveMessage([seqFrame(1), payload])).toMatchObject({ ok: false, reason: "live message has 2 frames, expected 3" });
    expect(parseLiveMessage([Buffer.from("t"), Buffer.alloc(7), payload])).toMatchObject({ ok: false, reason: "sequence frame is 7 bytes, expected 8" });
    expect(parseLiveMessage([Buffer.from("t"), END_SEQ, payload])).toMatchObject({ ok: false });
    expect(parseLiveMessage([Buffer.from("t"), Buffer.from([0x80, 0, 0, 0, 0, 0, 0, 0]), payload])).toMatchObject({ ok: false });
  });

  it("replay replies in every layout, and their end markers", () => {
    const e = Buffer.alloc(0);
    const topic = Buffer.from("kv-events");
    const layouts = [
      [[seqFrame(7), payload], [END_SEQ, e]],
      [[e, seqFrame(7), payload], [e, END_SEQ, e]],
      [[topic, seqFrame(7), payload], [e, END_SEQ, e]],
      [[e, topic, seqFrame(7), payload], [e, e, END_SEQ, e]],
    ];
    for (const [msg, end] of layouts) {
      expect(parseReplayMessage(msg as Buffer[])).toEqual({ ok: true, value: { seq: 7, payload } });
      expect(parseReplayMessage(end as Buffer[])).toEqual({ ok: true, value: "end" });
    }
    expect(parseReplayMessage([topic, topic, seqFrame(1), payload])).toMatchObject({ ok: false });
    expect(parseReplayMessage([payload])).toMatchObject({ ok: false });
    expect(parseReplayMessage([e, e, e, seqFrame(1), payload])).toMatchObject({ ok: false });
    expect(parseReplayMessage([topic, Buffer.alloc(3), payload])).toMatchObject({ ok: false, reason: "sequence frame is 3 bytes, expected 8" });
  });
});
