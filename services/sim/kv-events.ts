/**
 * vLLM's KV cache event publisher, reproduced on the wire: a ZMQ PUB socket sending
 * `[topic, seq u64 BE, msgpack EventBatch]` per engine step, and a ZMQ ROUTER replay socket that
 * answers `[identity, "", start u64 BE]` with every buffered batch from `start` on, then an end
 * marker. Both event encodings and both replay layouts that vLLM has shipped are selectable, so a
 * router's decoder can be tested against each.
 *
 * Encodings (msgspec structs, see msgpack.ts for the byte-level choices):
 * - "map" (vLLM since PR 42892, v0.26): each event a map, tag under "type", fields whose value is
 *   their default (None) left out — msgspec's omit_defaults.
 * - "array" (vLLM <= 0.23): `[tag, field...]` with every field present, nil included: msgspec does
 *   not omit defaults from array_like structs.
 * The batch itself is always the positional `[ts float64, events, data_parallel_rank]`.
 *
 * Replay layouts (frames the ROUTER sends after the identity; a DEALER client sees all of them):
 * - "new" (vLLM >= 0.26): `["", topic, seq, payload]` per batch, end `["", "", 0xFF×8, ""]`.
 * - "old": `["", seq, payload]` per batch, end `["", 0xFF×8, ""]`.
 *
 * A third wire, "sglang", is SGLang's publisher (python/sglang/srt/disaggregation/kv_events.py,
 * events from mem_cache/radix_cache.py): same sockets and frames, "old" replay layout, array-form
 * events with one event per page — `["BlockStored", [hash], parent, page_tokens, page_size,
 * lora_id, medium]`, `["BlockRemoved", [hash], medium]`, `["AllBlocksCleared"]` — and the batch
 * `[ts, events, attn_dp_rank]`. Hashes are CPython's `hash(tuple(page_tokens))` (signed int64,
 * not chained: python-hash.ts); the first page's parent is `hash(())`, the radix tree's empty root.
 * A salted request's pages carry its `cache_salt` (slot 7), as SGLang's salted radix keys do.
 */
import { Publisher, Router } from "zeromq";
import type { Logger } from "../shared/log.js";
import type { KvCacheEvent } from "./kv-cache.js";
import { F64, type Msg, packMsg } from "./msgpack.js";
import { readExtraKeys } from "../views/block-hash.js";
import { pythonTupleHash } from "./python-hash.js";

export type KvEventEncoding = "map" | "array";
/** What a publisher speaks: one of vLLM's encodings, or SGLang's. */
export type KvEventWire = KvEventEncoding | "sglang";
export type ReplayLayout = "new" | "old";
export const KV_EVENT_ENCODINGS: readonly KvEventEncoding[] = ["map", "array"];
export const REPLAY_LAYOUTS: readonly ReplayLayout[] = ["new", "old"];

const MEDIUM_GPU = "GPU";
/** The only KV cache group a simulated (full-attention, single-group) model has. */
const GROUP_IDX = 0;
const SPEC_KIND = "full_attention";
const END_SEQ = Buffer.alloc(8, 0xff);
const EMPTY = Buffer.alloc(0);

function wireEvent(event: KvCacheEvent, encoding: KvEventEncoding): Msg {
  switch (event.type) {
    case "BlockStored": {
      // Declaration order of vLLM's BlockStored; lora_id is deprecated and the sim has no adapter ids.
      const fields: Array<[string, Msg]> = [
        ["block_hashes", event.blockHashes],
        ["parent_block_hash", event.parentBlockHash],
        ["token_ids", event.tokenIds],
        ["block_size", event.blockSize],
        ["lora_id", null],
        ["medium", MEDIUM_GPU],
        ["lora_name", event.loraName],
        ["extra_keys", event.extraKeys],
        ["group_idx", GROUP_IDX],
        ["kv_cache_spec_kind", SPEC_KIND],
        ["kv_cache_spec_sliding_window", null],
      ];
      // Fields from extra_keys on have a default of None: the map form omits them when None.
      return tagged("BlockStored", fields, 7, encoding);
    }
    case "BlockRemoved":
      return tagged(
        "BlockRemoved",
        [
          ["block_hashes", event.blockHashes],
          ["medium", MEDIUM_GPU],
          ["group_idx", GROUP_IDX],
        ],
        2,
        encoding,
      );
    case "AllBlocksCleared":
      return tagged("AllBlocksCleared", [], 0, encoding);
  }
}

/** A tagged msgspec struct; fields at index >= `firstDefaulted` are dropped from maps when null. */
function tagged(tag: string, fields: Array<[string, Msg]>, firstDefaulted: number, encoding: KvEventEncoding): Msg {
  if (encoding === "array") return [tag, ...fields.map(([, v]) => v)];
  const out: Record<string, Msg> = { type: tag };
  fields.forEach(([k, v], i) => {
    if (i < firstDefaulted || v !== null) out[k] = v;
  });
  return out;
}

/** SGLang's parent hash for a sequence's first page: `hash(())` of the radix tree's root key. */
export const SGLANG_ROOT_HASH = pythonTupleHash([]);

/**
 * SGLang's view of the simulated cache: its block hashes are the pages' tuple hashes, so the
 * encoder keeps the simulator's hash -> SGLang hash of every stored block (bounded by the engine's
 * cache: entries leave with their BlockRemoved, all of them with AllBlocksCleared).
 */
export class SglangEventEncoder {
  private readonly hashes = new Map<bigint, bigint>();
  /** The `cache_salt` of every stored block of a salted request (SGLang names it on each page). */
  private readonly salts = new Map<bigint, string>();

  get tracked(): number {
    return this.hashes.size;
  }

  clear(): void {
    this.hashes.clear();
    this.salts.clear();
  }

  events(events: readonly KvCacheEvent[]): Msg[] {
    const out: Msg[] = [];
    for (const e of events) {
      if (e.type === "BlockStored") {
        let parent: bigint | null = e.parentBlockHash === null ? SGLANG_ROOT_HASH : (this.hashes.get(e.parentBlockHash) ?? null);
        const first = e.parentBlockHash === null ? readExtraKeys(e.extraKeys[0] ?? null, { loraName: e.loraName, loraId: null }, true) : "opaque";
        const salt = first !== "opaque" ? first.salt : e.parentBlockHash !== null ? this.salts.get(e.parentBlockHash) : undefined;
        for (let i = 0; i < e.blockHashes.length; i++) {
          const page = e.tokenIds.slice(i * e.blockSize, (i + 1) * e.blockSize);
          const h = pythonTupleHash(page);
          const sim = e.blockHashes[i] as bigint;
          this.hashes.set(sim, h);
          if (salt) this.salts.set(sim, salt);
          // SGLang's array form: `cache_salt` in slot 7, after medium, only when set.
          out.push(salt ? ["BlockStored", [h], parent, page, e.blockSize, null, MEDIUM_GPU, salt] : ["BlockStored", [h], parent, page, e.blockSize, null, MEDIUM_GPU]);
          parent = h;
        }
      } else if (e.type === "BlockRemoved") {
        for (const sim of e.blockHashes) {
          const h = this.hashes.get(sim);
          if (h === undefined) continue;
          this.hashes.delete(sim);
          this.salts.delete(sim);
          out.push(["BlockRemoved", [h], MEDIUM_GPU]);
        }
      } else {
        this.clear();
        out.push(["AllBlocksCleared"]);
      }
    }
    return out;
  }
}

/** One msgpack EventBatch as SGLang's publisher writes it: `[ts, events, attn_dp_rank]`. */
export function encodeSglangBatch(ts: number, events: readonly KvCacheEvent[], encoder: SglangEventEncoder, attnDpRank = 0): Buffer {
  return packMsg([new F64(ts), encoder.events(events), attnDpRank]);
}

/** One msgpack EventBatch exactly as vLLM's msgspec encoder writes it. */
export function encodeEventBatch(ts: number, events: readonly KvCacheEvent[], encoding: KvEventEncoding, dataParallelRank = 0): Buffer {
  return packMsg([new F64(ts), events.map((e) => wireEvent(e, encoding)), dataParallelRank]);
}

export function seqBytes(seq: number): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigUInt64BE(BigInt(seq));
  return b;
}

export interface KvEventPublisherOptions {
  /** Interface to bind; "0.0.0.0" binds every interface and advertises loopback. */
  host: string;
  /** 0 picks a free port. */
  port: number;
  replayPort: number;
  topic: string;
  encoding: KvEventWire;
  replayLayout: ReplayLayout;
  /** Batches kept for replay (vLLM's buffer_steps). */
  bufferSteps: number;
  logger?: Logger;
}

/** vLLM's PUB high-water mark default. */
const PUB_HWM = 100_000;

export class KvEventPublisher {
  private nextSeq = 0;
  /** Ring of the last `bufferSteps` batches: `buffer[(start + i) % bufferSteps]`. */
  private readonly buffer: Array<{ seq: number; payload: Buffer }> = [];
  private start = 0;
  private pubChain: Promise<void> = Promise.resolve();
  private replayChain: Promise<void> = Promise.resolve();
  private closed = false;
  private readonly topic: Buffer;
  private readonly sglang: SglangEventEncoder | undefined;

  private constructor(
    private readonly opts: KvEventPublisherOptions,
    private readonly pub: Publisher,
    private readonly router: Router,
    readonly endpoint: string,
    readonly replayEndpoint: string,
  ) {
    this.topic = Buffer.from(opts.topic, "utf8");
    this.sglang = opts.encoding === "sglang" ? new SglangEventEncoder() : undefined;
    void this.serveReplay();
  }

  static async start(opts: KvEventPublisherOptions): Promise<KvEventPublisher> {
    const pub = new Publisher({ sendHighWaterMark: PUB_HWM, linger: 0 });
    // A full replay is bufferSteps + 1 messages; a ROUTER silently drops what exceeds its
    // high-water mark, so leave room for a whole replay per client.
    const router = new Router({ sendHighWaterMark: opts.bufferSteps + 16, linger: 0 });
    try {
      const endpoint = await bindEndpoint(pub, opts.host, opts.port);
      const replayEndpoint = await bindEndpoint(router, opts.host, opts.replayPort);
      return new KvEventPublisher(opts, pub, router, endpoint, replayEndpoint);
    } catch (err) {
      pub.close();
      router.close();
      throw err;
    }
  }

  get topicName(): string {
    return this.opts.topic;
  }

  get encoding(): KvEventWire {
    return this.opts.encoding;
  }

  get replayLayout(): ReplayLayout {
    return this.opts.replayLayout;
  }

  /** The sequence number the next batch will carry. */
  get sequence(): number {
    return this.nextSeq;
  }

  /** Encodes one engine step's events as a batch, sends it live and keeps it for replay. */
  publish(events: readonly KvCacheEvent[], ts = Date.now() / 1000): number {
    if (this.closed) return -1;
    const seq = this.nextSeq++;
    const payload = this.sglang ? encodeSglangBatch(ts, events, this.sglang) : encodeEventBatch(ts, events, this.opts.encoding as KvEventEncoding);
    const size = this.opts.bufferSteps;
    if (this.buffer.length < size) this.buffer.push({ seq, payload });
    else {
      this.buffer[this.start] = { seq, payload };
      this.start = (this.start + 1) % size;
    }
    const frames = [this.topic, seqBytes(seq), payload];
    this.pubChain = this.pubChain.then(() => this.pub.send(frames)).catch((err: unknown) => this.sendFailed("publish", err));
    return seq;
  }

  /** An engine restart: the sequence starts again at 0 and the replay buffer is empty. */
  reset(): void {
    this.sglang?.clear();
    this.nextSeq = 0;
    this.buffer.length = 0;
    this.start = 0;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all([this.pubChain, this.replayChain]);
    this.pub.close();
    this.router.close();
  }

  private buffered(): Array<{ seq: number; payload: Buffer }> {
    return [...this.buffer.slice(this.start), ...this.buffer.slice(0, this.start)];
  }

  private async serveReplay(): Promise<void> {
    try {
      for await (const frames of this.router) {
        // vLLM ignores anything but [identity, delimiter, start].
        const [identity, , startBytes] = frames;
        if (frames.length !== 3 || !identity || !startBytes || startBytes.length > 8) {
          this.opts.logger?.warn({ frames: frames.length }, "invalid kv-events replay request");
          continue;
        }
        // int.from_bytes(start, "big") in vLLM: any length up to 8 bytes, unsigned.
        const start = startBytes.length === 0 ? 0n : BigInt(`0x${startBytes.toString("hex")}`);
        const replies: Buffer[][] = [];
        const newLayout = this.opts.replayLayout === "new";
        for (const { seq, payload } of this.buffered()) {
          if (BigInt(seq) < start) continue;
          replies.push(newLayout ? [identity, EMPTY, this.topic, seqBytes(seq), payload] : [identity, EMPTY, seqBytes(seq), payload]);
        }
        replies.push(newLayout ? [identity, EMPTY, EMPTY, END_SEQ, EMPTY] : [identity, EMPTY, END_SEQ, EMPTY]);
        this.replayChain = this.replayChain
          .then(async () => {
            for (const r of replies) await this.router.send(r);
          })
          .catch((err: unknown) => this.sendFailed("replay", err));
      }
    } catch (err) {
      if (!this.closed) this.opts.logger?.error({ err }, "kv-events replay socket failed");
    }
  }

  private sendFailed(what: string, err: unknown): void {
    if (!this.closed) this.opts.logger?.warn({ err }, `kv-events ${what} send failed`);
  }
}

async function bindEndpoint(socket: Publisher | Router, host: string, port: number): Promise<string> {
  await socket.bind(`tcp://${host}:${port === 0 ? "*" : port}`);
  const bound = socket.lastEndpoint;
  if (!bound) throw new Error(`no endpoint bound on ${host}`);
  // A wildcard bind is reachable on loopback; advertising the wildcard itself would be useless.
  const advertised = host === "0.0.0.0" || host === "*" ? "127.0.0.1" : host;
  const boundPort = bound.slice(bound.lastIndexOf(":") + 1);
  return `tcp://${advertised}:${boundPort}`;
}
