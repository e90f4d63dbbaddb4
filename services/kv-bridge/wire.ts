/**
 * The engines' KV event wire format (vLLM V1 and SGLang, see shared/reference/engines.md §1-2),
 * decoded defensively. Pure: no sockets, no NATS.
 *
 * Everything an engine sends is untrusted input: a decode never throws, it returns a reason that
 * ends up in a log line and a dead-letter header. The decoder accepts every shape seen in the field:
 * map and array event encodings, short arrays from older engines, an EventBatch without its third
 * slot, uint64 hashes above 2^63 (msgpack uint64), SGLang's signed int64 hashes, 32-byte digests,
 * and both replay reply layouts.
 *
 * The engine kind picks the dialect (README "SGLang"): SGLang's array-form BlockStored carries
 * `medium` at slot 6 and then its own optional fields (`cache_salt`, `session_id`) where vLLM has
 * `lora_name`, and SGLang names the radix tree's empty root, `hash(())`, as the parent of a
 * sequence's first page: that parent means "none".
 */
import { Unpackr } from "msgpackr";
import { isTokenId, MAX_TOKEN_ID } from "../tokenizer/token-id.js";

const MAX_TOKEN_ID_BIG = BigInt(MAX_TOKEN_ID);

/** Engine block hash as lower-case hex: uint64 values unpadded, digests byte for byte. */
export type EngineHash = string;

export interface EngineBlockStored {
  kind: "stored";
  hashes: EngineHash[];
  parent: EngineHash | null;
  tokens: number[];
  blockSize: number;
  loraId: number | null;
  loraName: string | null;
  medium: string | null;
  /**
   * vLLM's per-block `extra_keys` (LoRA name, multimodal ids, the first block's `cache_salt`), one
   * entry per block, null where a block has none; absent when no block has any.
   */
  extraKeys?: Array<readonly unknown[] | null>;
}

export interface EngineBlockRemoved {
  kind: "removed";
  hashes: EngineHash[];
  medium: string | null;
}

export type EngineEvent = EngineBlockStored | EngineBlockRemoved | { kind: "all-cleared" };

export interface EngineBatch {
  /** Engine timestamp, epoch seconds (a float64 on the wire). */
  ts: number;
  /** Absent (undefined) when the engine predates the third slot. */
  dpRank: number | null | undefined;
  events: EngineEvent[];
  /** Events whose tag this bridge does not know (newer engines): skipped, counted. */
  unknownTags: string[];
  /** Known events with missing or mistyped fields: skipped; the batch is dead-lettered once. */
  invalid: string[];
  /**
   * BlockStored events carrying a `cache_salt` (SGLang), skipped: their pages are only reusable
   * by requests with the same salt, and SGLang's page hash does not tell which salt a parent page
   * was stored under — published unsalted they would be false prefix hits for every unsalted
   * prompt (vLLM's salt, in the first block's extra keys, is keyed instead). Set when > 0.
   */
  salted?: number;
}

export type Result<T> = { ok: true; value: T } | { ok: false; reason: string };

/** Which engine's wire rules apply (PODS `engine`). */
export type EngineDialect = "vllm" | "sglang";

/**
 * SGLang's parent hash for the first page of a sequence: CPython's `hash(())` (the root key of its
 * radix tree is the empty tuple; tuple-of-int hashes are not salted by PYTHONHASHSEED), as hex of
 * the unsigned 64-bit pattern.
 */
export const SGLANG_ROOT_PARENT: EngineHash = (5740354900026072187n).toString(16);

/** The replay end marker's sequence frame. */
export const END_SEQ = Buffer.alloc(8, 0xff);

/**
 * int64AsType "bigint": msgpack uint64/int64 decode to BigInt, so hashes above 2^53 keep every bit.
 * Maps decode to `Map` (not objects) so a `__proto__` or `constructor` key from the wire is inert.
 */
const unpackr = new Unpackr({ int64AsType: "bigint", mapsAsObjects: false, useRecords: false });

const fail = (reason: string): { ok: false; reason: string } => ({ ok: false, reason });

/** Big-endian unsigned 8-byte sequence number. Sequences above 2^53 are rejected: no engine gets there. */
export function readSeq(frame: Uint8Array): Result<number> {
  if (frame.length !== 8) return fail(`sequence frame is ${frame.length} bytes, expected 8`);
  const v = Buffer.from(frame.buffer, frame.byteOffset, 8).readBigUInt64BE(0);
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) return fail(`sequence ${v} out of range`);
  return { ok: true, value: Number(v) };
}

export function seqFrame(seq: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(seq), 0);
  return b;
}

export interface Frame {
  seq: number;
  payload: Uint8Array;
}

/** A live PUB message: exactly `[topic, seq8, payload]`. */
export function parseLiveMessage(frames: readonly Uint8Array[]): Result<Frame> {
  if (frames.length !== 3) return fail(`live message has ${frames.length} frames, expected 3`);
  const seqBytes = frames[1] as Uint8Array;
  if (seqBytes.length === 8 && Buffer.compare(seqBytes, END_SEQ) === 0) return fail("replay end marker on the live socket");
  const seq = readSeq(seqBytes);
  if (!seq.ok) return seq;
  return { ok: true, value: { seq: seq.value, payload: frames[2] as Uint8Array } };
}

/**
 * One reply on the replay DEALER. Layouts, as the DEALER sees them:
 *   2 frames `[seq8, payload]`                 older vLLM / SGLang, delimiter already stripped
 *   3 frames `["", seq8, payload]`             older vLLM, ROUTER's empty delimiter kept
 *   3 frames `[topic, seq8, payload]`          vLLM >= 0.26
 *   4 frames `["", topic, seq8, payload]`      vLLM >= 0.26 with the delimiter
 * In every layout the sequence and payload are the last two frames, so the frame count only decides
 * whether the message is well-formed. The end marker is the all-ones sequence (an empty payload
 * ends the stream too: that is how the original example client detects it).
 */
export function parseReplayMessage(frames: readonly Uint8Array[]): Result<Frame | "end"> {
  const n = frames.length;
  if (n < 2 || n > 4) return fail(`replay reply has ${n} frames, expected 2-4`);
  if (n === 4 && (frames[0] as Uint8Array).length !== 0) return fail("4-frame replay reply without an empty delimiter");
  const seqBytes = frames[n - 2] as Uint8Array;
  const payload = frames[n - 1] as Uint8Array;
  if (seqBytes.length === 8 && Buffer.compare(seqBytes, END_SEQ) === 0) return { ok: true, value: "end" };
  const seq = readSeq(seqBytes);
  if (!seq.ok) return seq;
  if (payload.length === 0) return { ok: true, value: "end" };
  return { ok: true, value: { seq: seq.value, payload } };
}

const U64 = 64;

/** uint64, int64 (SGLang: possibly negative -> two's complement) or digest bytes, as hex. */
export function hashToHex(v: unknown): EngineHash | undefined {
  if (typeof v === "bigint") return BigInt.asUintN(U64, v).toString(16);
  if (typeof v === "number") {
    if (!Number.isInteger(v) || Math.abs(v) > 2 ** 64) return undefined;
    return BigInt.asUintN(U64, BigInt(v)).toString(16);
  }
  if (v instanceof Uint8Array) {
    if (v.length === 0 || v.length > 32) return undefined;
    return Buffer.from(v.buffer, v.byteOffset, v.length).toString("hex");
  }
  return undefined;
}

function hashList(v: unknown, field: string): Result<EngineHash[]> {
  if (!Array.isArray(v)) return fail(`${field} is not an array`);
  if (v.length === 0) return fail(`${field} is empty`);
  const out: EngineHash[] = new Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const h = hashToHex(v[i]);
    if (h === undefined) return fail(`${field}[${i}] is not a hash`);
    out[i] = h;
  }
  return { ok: true, value: out };
}

/** A non-negative integer below 2^31, whether it came as a msgpack int of any width. */
function smallUint(v: unknown): number | undefined {
  if (typeof v === "number") return Number.isInteger(v) && v >= 0 && v < 2 ** 31 ? v : undefined;
  if (typeof v === "bigint") return v >= 0n && v < 2n ** 31n ? Number(v) : undefined;
  return undefined;
}

function optString(v: unknown, field: string): Result<string | null> {
  if (v === undefined || v === null) return { ok: true, value: null };
  return typeof v === "string" ? { ok: true, value: v } : fail(`${field} is not a string`);
}

/** Reads fields by name (map form) or by declaration order (array form: index 0 is the tag). */
type Fields = (name: string, index: number) => unknown;

/** A BlockStored event skipped for its cache salt (EngineBatch.salted). */
const SALTED = { ok: false as const, reason: "salted" };

/** The event's `cache_salt`: by name in map form; SGLang's array slot 7 (vLLM's array has no such slot). */
function cacheSalt(get: Fields, arrayLen: number | undefined, dialect: EngineDialect): unknown {
  if (arrayLen === undefined) return get("cache_salt", -1);
  return dialect === "sglang" ? get("", 7) : undefined;
}

function blockStored(get: Fields, arrayLen: number | undefined, dialect: EngineDialect): Result<EngineBlockStored> {
  // Array form must carry at least the five fields every engine version has sent.
  if (arrayLen !== undefined && arrayLen < 5) return fail(`BlockStored array has ${arrayLen} slots, expected >= 5`);
  const hashes = hashList(get("block_hashes", 1), "block_hashes");
  if (!hashes.ok) return hashes;
  const parentRaw = get("parent_block_hash", 2);
  let parent: EngineHash | null = null;
  if (parentRaw !== undefined && parentRaw !== null) {
    const p = hashToHex(parentRaw);
    if (p === undefined) return fail("parent_block_hash is not a hash");
    parent = dialect === "sglang" && p === SGLANG_ROOT_PARENT ? null : p;
  }
  const tokens = get("token_ids", 3);
  if (!Array.isArray(tokens)) return fail("token_ids is not an array");
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (isTokenId(t)) continue;
    // Fixed-width encoders send small ids as int64, which decode as BigInt: narrow them in place.
    if (typeof t === "bigint" && t >= 0n && t <= MAX_TOKEN_ID_BIG) tokens[i] = Number(t);
    else return fail(`token_ids[${i}] is not a token id`);
  }
  const blockSize = smallUint(get("block_size", 4));
  if (blockSize === undefined || blockSize === 0) return fail("block_size is not a positive integer");
  if (tokens.length !== hashes.value.length * blockSize) {
    return fail(`token_ids has ${tokens.length} ids for ${hashes.value.length} blocks of ${blockSize}`);
  }
  const loraIdRaw = get("lora_id", 5);
  const loraId = loraIdRaw === undefined || loraIdRaw === null ? null : smallUint(loraIdRaw);
  if (loraId === undefined) return fail("lora_id is not an integer");
  const medium = optString(get("medium", 6), "medium");
  if (!medium.ok) return medium;
  // SGLang has no lora_name; its array slot 7 is cache_salt. A map form names it (either engine).
  const salt = cacheSalt(get, arrayLen, dialect);
  if (salt !== undefined && salt !== null) return SALTED;
  const loraName = dialect === "sglang" && arrayLen !== undefined ? { ok: true as const, value: null } : optString(get("lora_name", 7), "lora_name");
  if (!loraName.ok) return loraName;
  // SGLang's array has no extra_keys (its slot 8 is session_id).
  const extraKeys = extraKeyList(dialect === "sglang" && arrayLen !== undefined ? undefined : get("extra_keys", 8), hashes.value.length);
  if (!extraKeys.ok) return extraKeys;
  return {
    ok: true,
    value: {
      kind: "stored",
      hashes: hashes.value,
      parent,
      tokens: tokens as number[],
      blockSize,
      loraId,
      loraName: loraName.value,
      medium: medium.value,
      ...(extraKeys.value ? { extraKeys: extraKeys.value } : {}),
    },
  };
}

/**
 * `extra_keys`: nil, or one entry (a tuple, or nil) per block. A list of another length cannot be
 * lined up with the blocks, and a salt put on the wrong block would be a false hit: invalid.
 */
function extraKeyList(v: unknown, blocks: number): Result<Array<readonly unknown[] | null> | null> {
  if (v === undefined || v === null) return { ok: true, value: null };
  if (!Array.isArray(v)) return fail("extra_keys is not an array");
  if (v.length !== blocks) return fail(`extra_keys has ${v.length} entries for ${blocks} blocks`);
  let any = false;
  for (let i = 0; i < v.length; i++) {
    const k = v[i];
    if (k === null) continue;
    if (!Array.isArray(k)) return fail(`extra_keys[${i}] is not an array`);
    any = true;
  }
  return { ok: true, value: any ? (v as Array<readonly unknown[] | null>) : null };
}

function blockRemoved(get: Fields, arrayLen: number | undefined): Result<EngineBlockRemoved> {
  if (arrayLen !== undefined && arrayLen < 2) return fail(`BlockRemoved array has ${arrayLen} slots, expected >= 2`);
  const hashes = hashList(get("block_hashes", 1), "block_hashes");
  if (!hashes.ok) return hashes;
  const medium = optString(get("medium", 2), "medium");
  if (!medium.ok) return medium;
  return { ok: true, value: { kind: "removed", hashes: hashes.value, medium: medium.value } };
}

type EventResult = { ok: true; value: EngineEvent } | { ok: false; reason: string } | { ok: "unknown"; tag: string } | { ok: "salted" };

export function decodeEvent(raw: unknown, dialect: EngineDialect = "vllm"): EventResult {
  let tag: unknown;
  let get: Fields;
  let arrayLen: number | undefined;
  if (raw instanceof Map) {
    tag = raw.get("type");
    get = (name) => raw.get(name);
  } else if (Array.isArray(raw)) {
    tag = raw[0];
    arrayLen = raw.length;
    get = (_name, index) => raw[index];
  } else {
    return fail("event is neither a map nor an array");
  }
  if (typeof tag !== "string") return fail("event has no string tag");
  switch (tag) {
    case "BlockStored": {
      const r = blockStored(get, arrayLen, dialect);
      return r === SALTED ? { ok: "salted" } : r;
    }
    case "BlockRemoved":
      return blockRemoved(get, arrayLen);
    case "AllBlocksCleared":
      return { ok: true, value: { kind: "all-cleared" } };
    default:
      return { ok: "unknown", tag };
  }
}

/** Decodes one msgpack `EventBatch` payload: `[ts, events, dp_rank?]` (SGLang: `attn_dp_rank`). */
export function decodeBatch(payload: Uint8Array, dialect: EngineDialect = "vllm"): Result<EngineBatch> {
  let raw: unknown;
  try {
    raw = unpackr.unpack(payload);
  } catch (err) {
    return fail(`msgpack: ${(err as Error).message.slice(0, 200)}`);
  }
  if (!Array.isArray(raw)) return fail("EventBatch is not an array");
  if (raw.length < 2) return fail(`EventBatch has ${raw.length} slots, expected >= 2`);
  const [ts, events, rank] = raw as [unknown, unknown, unknown];
  if (typeof ts !== "number" || !Number.isFinite(ts) || ts < 0) return fail("EventBatch ts is not a timestamp");
  if (!Array.isArray(events)) return fail("EventBatch events is not an array");
  const batch: EngineBatch = { ts, dpRank: undefined, events: [], unknownTags: [], invalid: [] };
  if (raw.length >= 3) {
    const r = rank === null ? null : smallUint(rank);
    batch.dpRank = r ?? null;
    if (r === undefined) batch.invalid.push("data_parallel_rank is not an integer");
  }
  for (let i = 0; i < events.length; i++) {
    const ev = decodeEvent(events[i], dialect);
    if (ev.ok === true) batch.events.push(ev.value);
    else if (ev.ok === "unknown") batch.unknownTags.push(ev.tag);
    else if (ev.ok === "salted") batch.salted = (batch.salted ?? 0) + 1;
    else batch.invalid.push(`events[${i}]: ${ev.reason}`);
  }
  return { ok: true, value: batch };
}
