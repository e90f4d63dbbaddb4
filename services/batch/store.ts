/**
 * The Batch API's NATS shell: the job-events stream (BATCH) and the results stream's headers
 * (BATCH_RESULTS) folded into a BatchView; publishing job events with compare-and-set on the
 * batch's subject (exactly one replica wins each transition); the files object store; the work
 * queue (BATCH_WORK). Shared by batch-api, batch-worker and `jetroute batch status`.
 */
import { AckPolicy, type Consumer, DeliverPolicy, type JsMsg } from "@nats-io/jetstream";
import { type ObjectStore, Objm } from "@nats-io/obj";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { filesBucketName, streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { DeadLetterSink } from "../shared/dead-letter.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { batchHex, type InputLine, type JobEvent, type ResultEvent, resultOk } from "./model.js";
import { BatchView, type FileEvent } from "./view.js";

export const WORKER_CONSUMER = "batch-workers";
export const RESULT_LINE_HEADER = "Jr-Batch-Line";
export const RESULT_OK_HEADER = "Jr-Batch-Ok";

/** A work-queue item: one request line of one batch. */
export interface WorkItem {
  batch: string;
  line: number;
  custom_id: string;
  url: string;
  /** The input line's text; its `body` is what is sent. */
  raw: string;
}

export interface BatchStoreOptions {
  nats: NatsHandles;
  prefix?: string;
  log: Logger;
  /** Names this process in dead letters. */
  name: string;
  view?: BatchView;
}

const decoder = new TextDecoder();
const encoder = new TextEncoder();

function isJobEvent(v: unknown): v is JobEvent {
  if (!v || typeof v !== "object") return false;
  const o = v as Record<string, unknown>;
  if (o.type !== "batch" || typeof o.event !== "string" || typeof o.at !== "number") return false;
  if (o.event === "created") {
    const b = o.batch as Record<string, unknown> | undefined;
    return !!b && typeof b.id === "string" && typeof b.owner === "string" && typeof b.total === "number" && Number.isInteger(b.total) && b.total >= 0 && b.total <= 50_000 && typeof b.expires_at === "number" && typeof b.created_at === "number" && (b.owner_key === undefined || (typeof b.owner_key === "string" && /^[0-9a-f]{64}$/.test(b.owner_key)));
  }
  return ["queued", "rejected", "finalizing", "expiring", "cancelling", "completed", "expired", "cancelled"].includes(o.event);
}

function isFileEvent(v: unknown): v is FileEvent {
  if (!v || typeof v !== "object") return false;
  const o = v as Record<string, unknown>;
  const f = o.file as Record<string, unknown> | undefined;
  return o.type === "file" && (o.action === "created" || o.action === "deleted") && !!f && typeof f.id === "string" && typeof f.owner === "string" && typeof f.bytes === "number";
}

export class BatchStore {
  readonly subjects: Subjects;
  readonly view: BatchView;
  readonly streams: { batch: string; work: string; results: string };
  private files?: ObjectStore;
  private readonly stops: Array<() => void> = [];
  private readonly waiters: Array<{ seq: number; resolve: () => void }> = [];
  private readonly dlq: DeadLetterSink;
  /** Resolved when the fold caught up with what the streams held when it started. */
  private ready?: Promise<void>;

  constructor(private readonly o: BatchStoreOptions) {
    this.subjects = new Subjects(o.prefix);
    this.view = o.view ?? new BatchView();
    const p = this.subjects.prefix;
    this.streams = { batch: streamName(p, "BATCH"), work: streamName(p, "BATCH_WORK"), results: streamName(p, "BATCH_RESULTS") };
    this.dlq = new DeadLetterSink(o.nats.js, this.subjects, o.name, o.log, () => o.nats.nc.info?.max_payload ?? 1024 * 1024);
  }

  get nats(): NatsHandles {
    return this.o.nats;
  }

  async objects(): Promise<ObjectStore> {
    this.files ??= await new Objm(this.o.nats.nc).open(filesBucketName(this.subjects.prefix));
    return this.files;
  }

  /** Starts folding; resolves once the view holds everything stored before the call. */
  start(): Promise<void> {
    this.ready ??= this.follow();
    return this.ready;
  }

  private async follow(): Promise<void> {
    const { jsm } = this.o.nats;
    const jobInfo = await jsm.streams.info(this.streams.batch);
    const jobLast = jobInfo.state.last_seq;
    let jobsCaughtUp: () => void = () => {};
    const jobsDone = new Promise<void>((r) => {
      jobsCaughtUp = r;
    });
    if (jobLast === 0 || jobInfo.state.messages === 0) jobsCaughtUp();
    await this.fold(this.streams.batch, {}, (m) => {
      this.applyJob(m);
      if (m.seq >= jobLast || m.info.pending === 0) jobsCaughtUp();
      this.wake();
    });
    // The job stream is replayed to its end before any result is read: every batch a stored result
    // names is then known (or finished and forgotten), so no result of a restart's replay waits in
    // the view's small early buffer, or is dropped from it and its item run again.
    await jobsDone;
    const resInfo = await jsm.streams.info(this.streams.results);
    const resLast = resInfo.state.last_seq;
    let resultsCaughtUp: () => void = () => {};
    const resultsDone = new Promise<void>((r) => {
      resultsCaughtUp = r;
    });
    if (resLast === 0 || resInfo.state.messages === 0) resultsCaughtUp();
    await this.fold(this.streams.results, { headers_only: true }, (m) => {
      const id = m.subject.slice(this.subjects.prefix.length + "batchres.".length + 1);
      const line = Number(m.headers?.get(RESULT_LINE_HEADER));
      if (!Number.isInteger(line)) {
        this.view.stats.invalid++;
      } else this.view.applyResult(`batch_${id}`, line, m.headers?.get(RESULT_OK_HEADER) === "1");
      if (m.seq >= resLast || m.info.pending === 0) resultsCaughtUp();
    });
    await resultsDone;
  }

  /** Times a fold's consumer was reopened (lost with its server, or silent): both streams. */
  foldReopens = 0;

  /**
   * Folds `stream` from its start through an ordered consumer, in stream order, and keeps it
   * folding across the loss of the node that hosts the consumer: the client recreates an ordered
   * consumer by itself in most cases but not all (on a 3-node cluster a consumer on a killed node
   * can stay silent for good, see services/shared/follower.ts), so the fold is reopened from the
   * next sequence when heartbeats go missing, the message loop ends, or the server no longer
   * knows the consumer.
   */
  private async fold(stream: string, extra: { headers_only?: boolean }, apply: (m: JsMsg) => void): Promise<void> {
    const { js } = this.o.nats;
    let lastSeq = 0;
    let stopped = false;
    let current: { stop(): void } | undefined;
    let probe: NodeJS.Timeout | undefined;
    const open = async (): Promise<void> => {
      const c = await js.consumers.get(stream, lastSeq > 0 ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: lastSeq + 1, ...extra } : { deliver_policy: DeliverPolicy.All, ...extra });
      const messages = await c.consume({
        expires: 4_000,
        idle_heartbeat: 1_000,
        callback: (m) => {
          // After a reopen the client may still hand over a message of the old consumer.
          if (m.seq <= lastSeq) return;
          lastSeq = m.seq;
          apply(m);
        },
      });
      let reopened = false;
      const reopen = (why: string) => {
        if (stopped || reopened) return;
        reopened = true;
        clearInterval(probe);
        this.foldReopens++;
        this.o.log.warn({ stream, lastSeq, why }, "batch fold: reopening its consumer");
        void messages.close().catch(() => undefined);
        void (async () => {
          for (let delay = 250; !stopped; delay = Math.min(delay * 2, 4_000)) {
            try {
              await open();
              return;
            } catch (err) {
              this.o.log.warn({ stream, err: (err as Error).message }, "batch fold: reopen failed; retrying");
              await new Promise((r) => setTimeout(r, delay));
            }
          }
        })();
      };
      current = { stop: () => void messages.close().catch(() => undefined) };
      // Stopped while this (re)open was under way: nothing else will close what it just made.
      if (stopped) {
        current.stop();
        return;
      }
      void (async () => {
        for await (const st of messages.status()) if (st.type === "heartbeats_missed" && st.count >= 3) return reopen(`${st.count} heartbeats missed`);
      })().catch(() => undefined);
      void messages.closed().then((err) => reopen(err ? `closed: ${(err as Error).message}` : "closed"));
      clearInterval(probe);
      probe = setInterval(() => {
        if (stopped) return;
        c.info(false).then(
          () => undefined,
          (err: unknown) => reopen(`consumer info failing: ${(err as Error).message}`),
        );
      }, 3_000);
      probe.unref?.();
    };
    await open();
    this.stops.push(() => {
      stopped = true;
      clearInterval(probe);
      current?.stop();
    });
  }

  private applyJob(m: JsMsg): void {
    let v: unknown;
    try {
      v = JSON.parse(decoder.decode(m.data));
    } catch {
      v = undefined;
    }
    const parsed = this.subjects.parse(m.subject);
    const kind = parsed?.names[0];
    if (kind === "file" && isFileEvent(v)) {
      this.view.applyFileEvent(v, m.seq);
      return;
    }
    if (kind === "job" && isJobEvent(v) && parsed?.names[1]) {
      const why = this.view.applyJobEvent(`batch_${parsed.names[1]}`, v, m.seq);
      if (why) this.o.log.debug({ subject: m.subject, seq: m.seq, why }, "job event out of order; ignored");
      return;
    }
    this.view.stats.invalid++;
    this.dlq.send({ family: "batch", subject: m.subject, stream: this.streams.batch, seq: m.seq, reason: "not a batch file or job event", data: m.data });
  }

  private wake(): void {
    for (let i = this.waiters.length - 1; i >= 0; i--) {
      const w = this.waiters[i] as { seq: number; resolve: () => void };
      if (this.view.jobSeq >= w.seq) {
        this.waiters.splice(i, 1);
        w.resolve();
      }
    }
  }

  /** Resolves once the view folded job-stream sequence `seq` (read your own writes). */
  waitFor(seq: number, timeoutMs = 5_000): Promise<void> {
    if (this.view.jobSeq >= seq) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`the view did not reach sequence ${seq} within ${timeoutMs} ms`)), timeoutMs);
      this.waiters.push({
        seq,
        resolve: () => {
          clearTimeout(t);
          resolve();
        },
      });
    });
  }

  async publishFile(ev: FileEvent): Promise<number> {
    const ack = await this.o.nats.js.publish(this.subjects.batchFile(ev.file.id), encoder.encode(JSON.stringify(ev)));
    await this.waitFor(ack.seq);
    return ack.seq;
  }

  /**
   * Publishes a job event if the batch's last event is still `expectSeq` (0: none yet). Returns
   * the new sequence (folded into the view), or undefined when another replica got there first.
   */
  async publishJob(batchId: string, ev: JobEvent, expectSeq: number): Promise<number | undefined> {
    try {
      const ack = await this.o.nats.js.publish(this.subjects.batchJob(batchHex(batchId)), encoder.encode(JSON.stringify(ev)), { expect: { lastSubjectSequence: expectSeq } });
      await this.waitFor(ack.seq);
      return ack.seq;
    } catch (err) {
      if (/wrong last sequence/i.test((err as Error).message)) return undefined;
      throw err;
    }
  }

  /** Queues a batch's items (idempotent within the duplicate window: Msg-Id batch.line). */
  async enqueue(batchId: string, lines: readonly InputLine[]): Promise<void> {
    const subject = this.subjects.batchWork(batchHex(batchId));
    const hex = batchHex(batchId);
    const WINDOW = 256;
    for (let i = 0; i < lines.length; i += WINDOW) {
      await Promise.all(
        lines.slice(i, i + WINDOW).map((l) => {
          const item: WorkItem = { batch: batchId, line: l.line, custom_id: l.custom_id, url: l.url, raw: l.raw };
          return this.o.nats.js.publish(subject, encoder.encode(JSON.stringify(item)), { msgID: `${hex}.${l.line}` });
        }),
      );
    }
  }

  /** Drops a batch's queued items (cancel, expiry): nothing more of it is dispatched. */
  async purgeWork(batchId: string): Promise<number> {
    const r = await this.o.nats.jsm.streams.purge(this.streams.work, { filter: this.subjects.batchWork(batchHex(batchId)) });
    return r.purged;
  }

  /** Records one executed item. Duplicates within the window are dropped by the server; later ones when the output is assembled. */
  async publishResult(r: ResultEvent): Promise<void> {
    const h = natsHeaders();
    h.set(RESULT_LINE_HEADER, String(r.line));
    h.set(RESULT_OK_HEADER, resultOk(r) ? "1" : "0");
    const hex = batchHex(r.batch);
    await this.o.nats.js.publish(this.subjects.batchResult(hex), encoder.encode(JSON.stringify(r)), { headers: h, msgID: `${hex}.${r.line}` });
  }

  /** Every result recorded for a batch, in stream order (duplicates included). */
  async readResults(batchId: string): Promise<ResultEvent[]> {
    const c = await this.o.nats.js.consumers.get(this.streams.results, { filter_subjects: this.subjects.batchResult(batchHex(batchId)), deliver_policy: DeliverPolicy.All });
    const info = await c.info(true);
    const out: ResultEvent[] = [];
    let pending = info.num_pending;
    while (pending > 0) {
      const m = await c.next({ expires: 5_000 });
      if (!m) break;
      pending = m.info.pending;
      try {
        out.push(JSON.parse(decoder.decode(m.data)) as ResultEvent);
      } catch {
        this.view.stats.invalid++;
        this.dlq.send({ family: "batchres", subject: m.subject, stream: this.streams.results, seq: m.seq, reason: "result is not JSON", data: m.data });
      }
    }
    await c.delete().catch(() => {});
    return out;
  }

  /** The shared durable pull consumer the workers take items from. */
  async workConsumer(ackWaitMs: number): Promise<Consumer> {
    const { js, jsm } = this.o.nats;
    const cfg = { durable_name: WORKER_CONSUMER, ack_policy: AckPolicy.Explicit, ack_wait: ackWaitMs * 1_000_000, max_ack_pending: 10_000, max_deliver: -1 };
    try {
      await jsm.consumers.add(this.streams.work, cfg);
    } catch (err) {
      // Another worker created it with another ack wait: use it as it is.
      this.o.log.debug({ err: (err as Error).message }, "work consumer exists");
    }
    return await js.consumers.get(this.streams.work, WORKER_CONSUMER);
  }

  async putFile(id: string, data: Uint8Array): Promise<void> {
    await (await this.objects()).putBlob({ name: id }, data);
  }

  async getFile(id: string): Promise<Uint8Array | null> {
    return await (await this.objects()).getBlob(id);
  }

  /**
   * Deletes a file's object; an object already gone is not an error. Any other failure (no
   * leader, a timeout) is thrown: the caller must not publish the record's deletion, or the object
   * would stay stored with nothing pointing at it.
   */
  async deleteFile(id: string): Promise<void> {
    const os = await this.objects();
    const info = await os.info(id);
    if (info === null || info.deleted) return;
    await os.delete(id);
  }

  close(): void {
    for (const s of this.stops) s();
    this.stops.length = 0;
  }
}
