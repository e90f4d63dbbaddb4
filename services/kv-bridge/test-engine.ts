/**
 * A scriptable stand-in for an engine's KV event sockets (PUB + replay ROUTER), for tests and
 * benchmarks of the bridge: it writes exactly the wire format of engines.md §1-2, in either event
 * encoding and any replay layout, and can also misbehave on purpose (skip live sends to make gaps,
 * forget its buffer, restart its sequence, answer replays late or never, send raw bad frames).
 */
import { Packr } from "msgpackr";
import { Publisher, Router } from "zeromq";
import { END_SEQ, seqFrame } from "./wire.js";

export type EventForm = "map" | "array";
/** DEALER-side layouts: "old" `[seq, payload]`, "old-delimited" `["", seq, payload]`, "new" `[topic, seq, payload]`, "new-delimited". */
export type ReplayLayout = "old" | "old-delimited" | "new" | "new-delimited";

export type Hash = bigint | number | Uint8Array;

export interface StoredSpec {
  hashes: Hash[];
  parent?: Hash | null;
  tokens: number[];
  blockSize: number;
  loraId?: number | null;
  medium?: string | null;
  loraName?: string | null;
}

export type EventSpec =
  | ({ type: "BlockStored" } & StoredSpec)
  | { type: "BlockRemoved"; hashes: Hash[]; medium?: string | null }
  | { type: "AllBlocksCleared" };

export interface TestEngineOptions {
  topic?: string;
  form?: EventForm;
  replay?: boolean;
  layout?: ReplayLayout;
  /** Replay buffer length (vLLM's `buffer_steps`). */
  bufferSteps?: number;
  /** Data-parallel rank in the batch's third slot; `"absent"` drops the slot (old engines). */
  dpRank?: number | null | "absent";
}

/** msgpack as Python's msgpack writes it for these shapes: float64 timestamps, 64-bit ints for bigints. */
const packr = new Packr({ useRecords: false, useFloat32: 0 });

export function encodeEvent(ev: EventSpec, form: EventForm): unknown {
  if (ev.type === "AllBlocksCleared") return form === "map" ? new Map([["type", ev.type]]) : [ev.type];
  if (ev.type === "BlockRemoved") {
    if (form === "map") return new Map<string, unknown>([["type", ev.type], ["block_hashes", ev.hashes], ["medium", ev.medium ?? "GPU"]]);
    return [ev.type, ev.hashes, ev.medium ?? "GPU"];
  }
  if (form === "map") {
    return new Map<string, unknown>([
      ["type", ev.type],
      ["block_hashes", ev.hashes],
      ["parent_block_hash", ev.parent ?? null],
      ["token_ids", ev.tokens],
      ["block_size", ev.blockSize],
      ["lora_id", ev.loraId ?? null],
      ["medium", ev.medium === undefined ? "GPU" : ev.medium],
      ["lora_name", ev.loraName ?? null],
    ]);
  }
  return [ev.type, ev.hashes, ev.parent ?? null, ev.tokens, ev.blockSize, ev.loraId ?? null, ev.medium === undefined ? "GPU" : ev.medium, ev.loraName ?? null];
}

export function encodeBatch(ts: number, events: unknown[], dpRank: number | null | "absent" = 0): Buffer {
  return packr.pack(dpRank === "absent" ? [ts, events] : [ts, events, dpRank]);
}

export class TestEngine {
  readonly pub = new Publisher({ linger: 0, sendHighWaterMark: 1_000_000 });
  readonly router?: Router;
  endpoint = "";
  replayEndpoint?: string;
  seq = 0;
  /** Timestamp (seconds) of the next batch; each incarnation starts at a fresh wall-clock time. */
  ts = Date.now() / 1000;
  readonly buffer: Array<{ seq: number; payload: Buffer }> = [];
  replayRequests: number[] = [];
  /** While true the ROUTER reads requests but never answers (a hung engine). */
  replayMuted = false;
  layout: ReplayLayout;
  form: EventForm;
  private closed = false;
  private serving?: Promise<void>;

  constructor(private readonly o: TestEngineOptions = {}) {
    this.layout = o.layout ?? "new";
    this.form = o.form ?? "map";
    if (o.replay !== false) this.router = new Router({ linger: 0, sendHighWaterMark: 1_000_000 });
  }

  get topic(): string {
    return this.o.topic ?? "kv-events";
  }

  /** Binds to fresh ports, or to `at` (a restarted engine on its old ports). */
  async start(at?: { endpoint: string; replayEndpoint?: string }): Promise<this> {
    await this.pub.bind(at?.endpoint ?? "tcp://127.0.0.1:0");
    this.endpoint = this.pub.lastEndpoint as string;
    if (this.router) {
      await this.router.bind(at?.replayEndpoint ?? "tcp://127.0.0.1:0");
      this.replayEndpoint = this.router.lastEndpoint as string;
      this.serving = this.serveReplay(this.router);
    }
    return this;
  }

  /** Encodes and publishes one batch; `live: false` buffers it without sending (a lost message). */
  async publish(events: EventSpec[], opts: { live?: boolean; ts?: number } = {}): Promise<number> {
    const ts = opts.ts ?? this.ts;
    this.ts = ts + 0.001;
    const payload = encodeBatch(ts, events.map((e) => encodeEvent(e, this.form)), this.o.dpRank ?? 0);
    return this.publishPayload(payload, opts.live ?? true);
  }

  /** Publishes a ready-made payload under the next sequence number. */
  async publishPayload(payload: Buffer, live = true): Promise<number> {
    const seq = this.seq++;
    this.buffer.push({ seq, payload });
    const max = this.o.bufferSteps ?? 10_000;
    if (this.buffer.length > max) this.buffer.splice(0, this.buffer.length - max);
    if (live) await this.pub.send([this.topic, seqFrame(seq), payload]);
    return seq;
  }

  /** Sends arbitrary frames on the live socket (malformed input tests). */
  async sendRaw(frames: Array<Buffer | string>): Promise<void> {
    await this.pub.send(frames);
  }

  /** A new engine process on the same sockets: sequence back to 0, empty buffer, later clock. */
  restart(): void {
    this.seq = 0;
    this.buffer.length = 0;
    this.ts = Date.now() / 1000 + 1;
  }

  /** Drops buffered batches older than `seq` (as a ring buffer that rolled past them would). */
  forgetBefore(seq: number): void {
    while (this.buffer.length > 0 && (this.buffer[0] as { seq: number }).seq < seq) this.buffer.shift();
  }

  private async serveReplay(router: Router): Promise<void> {
    try {
      for await (const frames of router) {
        if (this.closed) return;
        const [id, , start] = frames as [Buffer, Buffer, Buffer | undefined];
        if (start?.length !== 8) continue;
        const from = Number(start.readBigUInt64BE(0));
        this.replayRequests.push(from);
        if (this.replayMuted) continue;
        for (const b of this.buffer) if (b.seq >= from) await router.send([id, ...this.replayFrames(seqFrame(b.seq), b.payload)]);
        await router.send([id, ...this.replayFrames(END_SEQ, Buffer.alloc(0))]);
      }
    } catch {
      /* socket closed */
    }
  }

  private replayFrames(seq: Buffer, payload: Buffer): Buffer[] {
    const empty = Buffer.alloc(0);
    const topic = Buffer.from(payload.length === 0 ? "" : this.topic);
    switch (this.layout) {
      case "old":
        return [seq, payload];
      case "old-delimited":
        return [empty, seq, payload];
      case "new":
        return [topic, seq, payload];
      case "new-delimited":
        return [empty, topic, seq, payload];
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.pub.close();
    this.router?.close();
    await this.serving;
  }
}
