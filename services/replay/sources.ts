/**
 * Where replay reads from: a live NATS (every stream a gateway folds, plus DECISIONS and the
 * config bucket's stream, merged in server-time order) or an export file written by `jetroute
 * export` (the same messages, already merged, gzip-compressed JSON lines), so yesterday's window
 * can be analysed on a laptop without the cluster.
 *
 * What is read for a window [from, to]:
 *   PODS, KV, config   from the stream's first message (a view is the fold of the whole stream)
 *   LOAD               from `from - 10 s` (a sample older than the staleness bound counts for nothing)
 *   CHARGES            from `from - 30 s` (heartbeats list every outstanding charge, so a few
 *                      heartbeat periods rebuild the ledger, as a booting gateway does)
 *   DECISIONS          from `from`
 * and every stream up to `to + tail` (decisions arrive when their requests end).
 */
import { BUCKET_MS, WINDOW_BUCKETS } from "../views/latency-model.js";
import { createReadStream, createWriteStream, mkdirSync } from "node:fs";
import path from "node:path";
import { StringDecoder } from "node:string_decoder";
import { createGunzip, createGzip } from "node:zlib";
import { DeliverPolicy, type JsMsg, type OrderedConsumerOptions } from "@nats-io/jetstream";
import { configBucketName, streamName } from "../../streams/definitions.js";
import type { NatsHandles } from "../shared/nats.js";
import type { ConfigEntry } from "../views/gateway-state.js";
import type { ReplayMessage, ReplayStream } from "./engine.js";

export const EXPORT_FORMAT = "jetroute-export";
export const EXPORT_VERSION = 1;

export interface ExportHeader {
  format: typeof EXPORT_FORMAT;
  version: number;
  prefix: string;
  window: { fromMs: number; toMs: number };
  createdAt: string;
  /** Per stream: the first and last sequence the export holds. */
  streams?: Partial<Record<ReplayStream, { first: number; last: number; count: number }>>;
}

export interface WindowRead {
  fromMs: number;
  toMs: number;
  /** How long after `toMs` messages are still read (decisions of requests routed in the window). Default 60 s. */
  tailMs?: number;
  /** Gateway pools: the base prefix whose config bucket a pool's namespace reads (default: `prefix`). */
  configPrefix?: string;
}

export interface MessageSource {
  describe: string;
  /** Messages expected in all (for a progress bar), when known. */
  total?: number;
  /** The messages in server-time order, in batches (one await per batch, not per message). */
  batches: AsyncIterable<readonly ReplayMessage[]>;
}

const decoder = new TextDecoder("utf-8", { fatal: true });

function parsePayload(data: Uint8Array): { data: unknown; invalid?: string } {
  try {
    return { data: JSON.parse(decoder.decode(data)) };
  } catch (err) {
    return { data: Buffer.from(data).toString("latin1").slice(0, 1024), invalid: `invalid JSON: ${(err as Error).message}` };
  }
}

interface StreamPlan {
  stream: ReplayStream;
  name: string;
  start: { kind: "all" } | { kind: "time"; ms: number };
  /** For the config bucket's stream: `$KV.<bucket>.` */
  kvPrefix?: string;
}

/** One stream read in order, up to `endTs` of server time or the last sequence present when reading began. */
class StreamReader {
  private batch: JsMsg[] = [];
  private i = 0;
  private done = false;
  private current: ReplayMessage | undefined;
  lastSeq = 0;
  pending = 0;
  private delivered = 0;
  constructor(
    private readonly nats: NatsHandles,
    private readonly plan: StreamPlan,
    private readonly endTs: number,
    private readonly stopSeq: number,
  ) {}

  private consumer?: Awaited<ReturnType<NatsHandles["js"]["consumers"]["get"]>>;

  async open(): Promise<void> {
    const opts: Partial<OrderedConsumerOptions> =
      this.plan.start.kind === "all" ? { deliver_policy: DeliverPolicy.All } : { deliver_policy: DeliverPolicy.StartTime, opt_start_time: new Date(this.plan.start.ms).toISOString() };
    this.consumer = await this.nats.js.consumers.get(this.plan.name, opts);
    this.pending = (await this.consumer.info(true)).num_pending;
    if (this.pending === 0 || this.stopSeq === 0) this.done = true;
    await this.advance();
  }

  /** The next message, or undefined at the end. */
  get head(): ReplayMessage | undefined {
    return this.current;
  }

  /** True when `advance` can move on without waiting for the server. */
  get buffered(): boolean {
    return this.done || this.i < this.batch.length;
  }

  /** Moves `head` to the next message, pulling from the server only when the buffer is empty. */
  async advance(): Promise<void> {
    for (;;) {
      if (this.done) {
        this.current = undefined;
        return;
      }
      if (this.i < this.batch.length) {
        this.advanceSync();
        return;
      }
      const c = this.consumer;
      // Ask for no more than is left: a pull for more than the stream holds waits out its expiry.
      const left = this.pending - this.delivered;
      if (!c || left <= 0) {
        this.done = true;
        continue;
      }
      this.batch = [];
      this.i = 0;
      const iter = await c.fetch({ max_messages: Math.min(2_000, left), expires: 5_000 });
      for await (const m of iter) this.batch.push(m);
      if (this.batch.length === 0) this.done = true;
    }
  }

  /** Moves on without waiting (only when `buffered`). */
  advanceSync(): void {
    if (this.done || this.i >= this.batch.length) {
      this.current = undefined;
      return;
    }
    const m = this.batch[this.i++] as JsMsg;
    this.lastSeq = m.seq;
    this.delivered++;
    const serverTs = Math.floor(m.info.timestampNanos / 1_000_000);
    if (m.seq > this.stopSeq || serverTs > this.endTs) {
      this.done = true;
      this.current = undefined;
      return;
    }
    if (m.seq >= this.stopSeq) this.done = true;
    this.current = this.toMessage(m, serverTs);
  }

  private toMessage(m: JsMsg, serverTs: number): ReplayMessage {
    if (this.plan.kvPrefix !== undefined) {
      const op = m.headers?.get("KV-Operation");
      const entry: ConfigEntry = { type: "config-entry", key: m.subject.slice(this.plan.kvPrefix.length), operation: op === "DEL" ? "DEL" : op === "PURGE" ? "PURGE" : "PUT" };
      if (entry.operation === "PUT") {
        const p = parsePayload(m.data);
        if (p.invalid) entry.notJson = true;
        else entry.value = p.data;
      }
      return { stream: this.plan.stream, subject: m.subject, seq: m.seq, serverTs, data: entry };
    }
    const p = parsePayload(m.data);
    return { stream: this.plan.stream, subject: m.subject, seq: m.seq, serverTs, data: p.data, ...(p.invalid ? { invalid: p.invalid } : {}) };
  }
}

/** k-way merge of stream readers by server time (ties: the order of `readers`), in batches. */
async function* mergeByTime(readers: StreamReader[]): AsyncGenerator<readonly ReplayMessage[]> {
  let out: ReplayMessage[] = [];
  for (;;) {
    let best = -1;
    for (let i = 0; i < readers.length; i++) {
      const h = (readers[i] as StreamReader).head;
      if (h && (best < 0 || h.serverTs < ((readers[best] as StreamReader).head as ReplayMessage).serverTs)) best = i;
    }
    if (best < 0) break;
    const r = readers[best] as StreamReader;
    out.push(r.head as ReplayMessage);
    if (r.buffered) r.advanceSync();
    else {
      // The reader must wait for the server: hand over what is merged so far first.
      yield out;
      out = [];
      await r.advance();
    }
    if (out.length >= 1_024) {
      yield out;
      out = [];
    }
  }
  if (out.length > 0) yield out;
}

/** Reads a window of every stream from NATS, merged by server time. */
export async function natsSource(nats: NatsHandles, prefix: string, w: WindowRead): Promise<MessageSource> {
  const tail = w.tailMs ?? 60_000;
  const bucket = configBucketName(w.configPrefix ?? prefix);
  const plans: StreamPlan[] = [
    { stream: "config", name: `KV_${bucket}`, start: { kind: "all" }, kvPrefix: `$KV.${bucket}.` },
    { stream: "pods", name: streamName(prefix, "PODS"), start: { kind: "all" } },
    { stream: "load", name: streamName(prefix, "LOAD"), start: { kind: "time", ms: w.fromMs - 10_000 } },
    // Releases as far back as the latency model's window reaches (its buckets are aligned: one more).
    { stream: "charges", name: streamName(prefix, "CHARGES"), start: { kind: "time", ms: w.fromMs - Math.max(30_000, (WINDOW_BUCKETS + 1) * BUCKET_MS) } },
    { stream: "kv", name: streamName(prefix, "KV"), start: { kind: "all" } },
    { stream: "decisions", name: streamName(prefix, "DECISIONS"), start: { kind: "time", ms: w.fromMs } },
  ];
  const readers: StreamReader[] = [];
  let total = 0;
  for (const plan of plans) {
    let last: number;
    try {
      last = (await nats.jsm.streams.info(plan.name)).state.last_seq;
    } catch (err) {
      throw new Error(`cannot read stream ${plan.name}: ${(err as Error).message} (run \`jetroute streams apply\`, or check --prefix)`);
    }
    const r = new StreamReader(nats, plan, w.toMs + tail, last);
    await r.open();
    total += Math.min(r.pending, last);
    readers.push(r);
  }
  return { describe: `nats (prefix ${prefix})`, total, batches: mergeByTime(readers) };
}

/** Writes messages (already merged) as a gzip JSON-lines export; returns the count per stream. */
export async function writeExport(file: string, header: ExportHeader, batches: AsyncIterable<readonly ReplayMessage[]>, onMessage?: (m: ReplayMessage) => void): Promise<ExportHeader["streams"]> {
  mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  const gz = createGzip();
  const out = createWriteStream(file);
  const done = new Promise<void>((resolve, reject) => {
    out.on("finish", resolve);
    out.on("error", reject);
    gz.on("error", reject);
  });
  gz.pipe(out);
  const write = (line: string) => (gz.write(`${line}\n`) ? Promise.resolve() : new Promise<void>((r) => gz.once("drain", () => r())));
  await write(JSON.stringify(header));
  const streams: NonNullable<ExportHeader["streams"]> = {};
  for await (const batch of batches) {
    let text = "";
    for (const m of batch) {
      const st = (streams[m.stream] ??= { first: m.seq, last: m.seq, count: 0 });
      st.last = m.seq;
      st.count++;
      text += `${JSON.stringify(m.invalid ? { s: m.stream, q: m.seq, t: m.serverTs, j: m.subject, x: m.data } : { s: m.stream, q: m.seq, t: m.serverTs, j: m.subject, d: m.data })}\n`;
      onMessage?.(m);
    }
    if (text) await (gz.write(text) ? Promise.resolve() : new Promise<void>((r) => gz.once("drain", () => r())));
  }
  // The counts go last too (the header was written before they were known).
  await write(JSON.stringify({ end: true, streams }));
  gz.end();
  await done;
  return streams;
}

/**
 * The lines of a byte stream (UTF-8; a trailing \r dropped), split by hand and handed out a
 * chunk's worth at a time: node:readline costs several µs a line (an event and a string per line,
 * a regex split), as much as parsing the line; one await per line costs a microtask turn each.
 */
async function* lineBatches(stream: AsyncIterable<Buffer | string>): AsyncGenerator<string[], void, undefined> {
  const utf8 = new StringDecoder("utf8");
  let rest = "";
  for await (const chunk of stream) {
    const text = rest + (typeof chunk === "string" ? chunk : utf8.write(chunk));
    const lines: string[] = [];
    let from = 0;
    for (let nl = text.indexOf("\n"); nl >= 0; nl = text.indexOf("\n", from)) {
      lines.push(lineAt(text, from, nl));
      from = nl + 1;
    }
    rest = text.slice(from);
    if (lines.length > 0) yield lines;
  }
  rest += utf8.end();
  if (rest.length > 0) yield [lineAt(rest, 0, rest.length)];
}

const lineAt = (text: string, from: number, end: number) => text.slice(from, end > from && text.charCodeAt(end - 1) === 13 ? end - 1 : end);

/** One line at a time over `lineBatches`, awaiting only when a chunk is used up. */
class LineReader {
  private lines: string[] = [];
  private i = 0;
  constructor(private readonly batches: AsyncGenerator<string[], void, undefined>) {}
  /** The next line without waiting, if one is buffered. */
  take(): string | undefined {
    return this.i < this.lines.length ? this.lines[this.i++] : undefined;
  }
  /** Waits for the next chunk's lines; false at the end. */
  async fill(): Promise<boolean> {
    const r = await this.batches.next();
    if (r.done) return false;
    this.lines = r.value;
    this.i = 0;
    return true;
  }
  async next(): Promise<string | undefined> {
    for (;;) {
      const line = this.take();
      if (line !== undefined) return line;
      if (!(await this.fill())) return undefined;
    }
  }
}

const STREAMS = new Set<ReplayStream>(["pods", "load", "charges", "kv", "config", "decisions"]);

/** Reads an export file. Throws a clear error for a file that is not an export or of another version. */
export async function fileSource(file: string): Promise<MessageSource & { header: ExportHeader; skipped: () => number }> {
  // Large chunks: gunzip's default 16 KiB output chunks made reading a 4.6 MB export 4-15x slower (per-chunk stream overhead).
  const input = createReadStream(file, { highWaterMark: 1 << 20 });
  const opened = new Promise<void>((resolve, reject) => {
    input.once("open", () => resolve());
    input.once("error", (err) => reject(new Error(`cannot read ${file}: ${err.message}`)));
  });
  await opened;
  const stream = file.endsWith(".gz") ? input.pipe(createGunzip({ chunkSize: 1 << 18 })) : input;
  const lines = new LineReader(lineBatches(stream));
  const first = await lines.next().catch((err: Error) => {
    throw new Error(`${file} is not a readable export (${err.message})`);
  });
  let header: ExportHeader;
  try {
    header = JSON.parse(first ?? "") as ExportHeader;
  } catch {
    throw new Error(`${file} is not a jetroute export (its first line is not JSON)`);
  }
  if (header?.format !== EXPORT_FORMAT) throw new Error(`${file} is not a jetroute export (format ${JSON.stringify(header?.format)})`);
  if (header.version !== EXPORT_VERSION) throw new Error(`${file} is export format version ${header.version}; this jetroute reads version ${EXPORT_VERSION}`);
  let skipped = 0;
  async function* batches(): AsyncGenerator<readonly ReplayMessage[]> {
    let out: ReplayMessage[] = [];
    for (;;) {
      if (out.length >= 1_024) {
        yield out;
        out = [];
      }
      const line = lines.take() ?? (await lines.next());
      if (line === undefined) break;
      let o: { s?: unknown; q?: unknown; t?: unknown; j?: unknown; d?: unknown; x?: unknown; end?: unknown };
      try {
        o = JSON.parse(line) as typeof o;
      } catch {
        skipped++;
        continue;
      }
      if (o.end === true) break;
      if (typeof o.s !== "string" || !STREAMS.has(o.s as ReplayStream) || typeof o.q !== "number" || typeof o.t !== "number" || typeof o.j !== "string") {
        skipped++;
        continue;
      }
      out.push({ stream: o.s as ReplayStream, seq: o.q, serverTs: o.t, subject: o.j, data: o.x ?? o.d, ...(o.x !== undefined ? { invalid: "invalid JSON (as exported)" } : {}) });
    }
    if (out.length > 0) yield out;
  }
  return { describe: file, header, batches: batches(), skipped: () => skipped };
}
