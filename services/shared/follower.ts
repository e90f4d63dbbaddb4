/**
 * A stream follower folds one JetStream stream into a view: an ordered consumer (no server-side
 * state to clean up, redelivers nothing, resumes at the right sequence after a reconnect), one
 * subject filter (nats-server 2.9 allows only one), each payload validated against its schema.
 *
 * Invalid payloads are dead-lettered (their envelope, and the payload only under `--dlq-payloads`:
 * dead-letter.ts) and counted; the follower keeps going. The handler is
 * synchronous on purpose: a view applies an event without awaiting anything, so events are
 * applied strictly in stream order.
 *
 * With `paceMs` the follower reads through a paced pull reader instead (paced-pull.ts): batches of
 * everything stored, `paceMs` apart while messages flow, one wake-up for many messages; the same
 * order, the same reopen-after-the-last-sequence on a loss.
 */
import { type Consumer, type ConsumerConfig, type ConsumerMessages, DeliverPolicy, type JsMsg, type OrderedConsumerOptions } from "@nats-io/jetstream";
import type { EventOf, EventType } from "../../schemas/events.js";
import { decodeEvent } from "../../schemas/validate.js";
import { isConsumerNotFound } from "../../streams/errors.js";
import type { Family, Subjects } from "../../streams/subjects.js";
import { type DeadLetterOptions, DeadLetterSink } from "./dead-letter.js";
import type { Logger } from "./log.js";
import type { NatsHandles } from "./nats.js";
import { PacedPullReader } from "./paced-pull.js";
import type { Delivery } from "./pull-pacing.js";

export type StartAt =
  | { kind: "all" }
  | { kind: "last-per-subject" }
  | { kind: "time"; sinceMs: number }
  | { kind: "sequence"; seq: number };

export interface MessageMeta {
  seq: number;
  subject: string;
  /** Server-assigned publish time (ms). */
  serverTs: number;
}

export interface FollowerOptions<T extends EventType> {
  nats: NatsHandles;
  subjects: Subjects;
  stream: string;
  /** One subject filter (2.9 allows one); omitted = every subject of the stream. */
  filter?: string;
  family: Family;
  types: readonly T[];
  startAt: StartAt;
  name: string;
  log: Logger;
  onEvent(event: EventOf<T>, meta: MessageMeta): void;
  /**
   * Cheap test on the raw bytes: true = the message needs no decoding (a gateway's own echoes).
   * Skipped messages still advance `lastSeq`.
   */
  skipRaw?(data: Uint8Array, subject: string): boolean;
  /** How often the server is asked whether the consumer still exists (default 3 s). */
  probeEveryMs?: number;
  /**
   * Sees every message's subject and sequence first, skipped or not (per-subject cursors).
   * `serverTs()` reads its server time (parsing the delivery info: call it only when needed).
   */
  onMessage?(subject: string, seq: number, serverTs: () => number): void;
  /** What dead letters keep and where they are logged; default: the process's (dead-letter.ts). */
  deadLetters?: DeadLetterOptions;
  /**
   * Read in paced batches (paced-pull.ts) instead of one delivery per message: while messages
   * flow, everything stored is fetched every `paceMs` and folded in one tick; the first message
   * after a quiet spell is still read at once. 0 or absent: the client's ordered consumer.
   */
  paceMs?: number;
}

/** nats-server's default max_payload, for a connection that has not said otherwise. */
const DEFAULT_MAX_PAYLOAD = 1024 * 1024;

export class StreamFollower<T extends EventType> {
  /** Stream sequence of the last message handled (applied or dead-lettered). */
  lastSeq = 0;
  /** Messages in the stream after the last one handled (own echoes sampled 1 in 16): 0 = caught up. */
  pending = 0;
  /** For the last parsed message: when it was handled minus when the server stored it (ms; clock skew between hosts shifts it). */
  delayMs = 0;
  applied = 0;
  /** Times the consumer had to be reopened (lost with its server, or closed under us). */
  reopens = 0;
  skipped = 0;
  readonly deadLetters: DeadLetterSink;
  private caughtUpFlag = false;
  private readonly caughtUpWaiters: Array<() => void> = [];
  private messages?: ConsumerMessages;
  private consumer?: Consumer;
  private reader?: PacedPullReader;
  private probeTimer?: NodeJS.Timeout;
  private stopped = false;

  constructor(private readonly opts: FollowerOptions<T>) {
    const nc = opts.nats.nc;
    this.deadLetters = new DeadLetterSink(opts.nats.js, opts.subjects, opts.name, opts.log, () => nc.info?.max_payload ?? DEFAULT_MAX_PAYLOAD, opts.deadLetters);
  }

  get caughtUp(): boolean {
    return this.caughtUpFlag;
  }

  get invalid(): number {
    return this.deadLetters.count;
  }

  /** Resolves once every message that existed when the follower started has been handled. */
  whenCaughtUp(): Promise<void> {
    if (this.caughtUpFlag) return Promise.resolve();
    return new Promise((resolve) => this.caughtUpWaiters.push(resolve));
  }

  /** Paced reading: requests for messages sent by the current reader (batches and doorbells). */
  get readRequests(): number {
    return this.reader?.requests ?? 0;
  }

  /** Paced reading: the current reader's consumer on the server ("" before it opens, or unpaced). */
  get consumerName(): string {
    return this.reader?.consumerName ?? "";
  }

  /** Paced reading: ask the server now rather than at the next paced time (a caller waits for a message). */
  readNow(): void {
    this.reader?.readNow();
  }

  async start(): Promise<void> {
    await this.open(this.opts.startAt);
  }

  private async open(startAt: StartAt): Promise<void> {
    const o = this.opts;
    if ((o.paceMs ?? 0) > 0) return this.openPaced(startAt);
    const consumerOpts: Partial<OrderedConsumerOptions> = o.filter ? { filter_subjects: o.filter } : {};
    switch (startAt.kind) {
      case "all":
        consumerOpts.deliver_policy = DeliverPolicy.All;
        break;
      case "last-per-subject":
        consumerOpts.deliver_policy = DeliverPolicy.LastPerSubject;
        break;
      case "time":
        consumerOpts.deliver_policy = DeliverPolicy.StartTime;
        consumerOpts.opt_start_time = new Date(startAt.sinceMs).toISOString();
        break;
      case "sequence":
        consumerOpts.deliver_policy = DeliverPolicy.StartSequence;
        consumerOpts.opt_start_seq = Math.max(1, startAt.seq);
        break;
    }
    const consumer = await o.nats.js.consumers.get(o.stream, consumerOpts);
    this.consumer = consumer;
    const info = await consumer.info(true);
    if (info.num_pending === 0) this.markCaughtUp();
    const messages = await consumer.consume({
      max_messages: 2048,
      // Short pulls and heartbeats, so a consumer lost with its server is noticed in seconds.
      expires: 4_000,
      idle_heartbeat: 1_000,
      callback: (m) => this.handleJs(m),
    });
    this.messages = messages;
    this.watch(messages);
  }

  private async openPaced(startAt: StartAt): Promise<void> {
    const o = this.opts;
    const start: Partial<ConsumerConfig> =
      startAt.kind === "all" ? { deliver_policy: DeliverPolicy.All }
      : startAt.kind === "last-per-subject" ? { deliver_policy: DeliverPolicy.LastPerSubject }
      : startAt.kind === "time" ? { deliver_policy: DeliverPolicy.StartTime, opt_start_time: new Date(startAt.sinceMs).toISOString() }
      : { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: Math.max(1, startAt.seq) };
    const reader: PacedPullReader = new PacedPullReader({
      nc: o.nats.nc, jsm: o.nats.jsm, apiPrefix: o.nats.js.apiPrefix, stream: o.stream, ...(o.filter ? { filter: o.filter } : {}), start, paceMs: o.paceMs as number,
      onMessage: (subject, data, d) => {
        // After a reopen the new consumer starts after `lastSeq`; anything older is a repeat.
        if (d.seq <= this.lastSeq) return;
        this.handle(subject, data, d.seq, d.pending, d);
      },
      onLost: (why) => this.reopenPaced(reader, why),
    });
    this.reader = reader;
    const { numPending } = await reader.open();
    // Stopped (or reopened) while the consumer was being created: no probe for it.
    if (this.stopped || this.reader !== reader) return;
    if (numPending === 0) this.markCaughtUp();
    clearInterval(this.probeTimer);
    this.probeTimer = setInterval(() => {
      if (this.stopped || this.reader !== reader) return;
      const stuck = reader.stuck();
      if (stuck) return this.reopenPaced(reader, stuck);
      o.nats.jsm.consumers.info(o.stream, reader.consumerName).then(
        () => undefined,
        (err: unknown) => this.reopenPaced(reader, isConsumerNotFound(err) ? "consumer not found on the server" : `consumer info failing: ${(err as Error).message}`),
      );
    }, o.probeEveryMs ?? 3_000);
    this.probeTimer.unref?.();
  }

  private reopenPaced(reader: PacedPullReader, why: string): void {
    if (this.stopped || this.reader !== reader) return;
    clearInterval(this.probeTimer);
    this.reader = undefined;
    this.reopens++;
    this.opts.log.warn({ stream: this.opts.stream, lastSeq: this.lastSeq, why }, "reopening stream consumer");
    void reader.close();
    void this.reopenWithBackoff();
  }

  /**
   * The client recreates an ordered consumer by itself in most cases, but not all: seen on a
   * 3-node cluster, a consumer hosted on a killed node stayed silent for good. So: if the message
   * loop ends, or heartbeats keep going missing, reopen from the next sequence ourselves.
   */
  private watch(messages: ConsumerMessages): void {
    const reopen = (why: string) => {
      if (this.stopped || this.messages !== messages) return;
      clearInterval(this.probeTimer);
      this.messages = undefined;
      this.reopens++;
      this.opts.log.warn({ stream: this.opts.stream, lastSeq: this.lastSeq, why }, "reopening stream consumer");
      void messages.close().catch(() => undefined);
      void this.reopenWithBackoff();
    };
    void (async () => {
      for await (const st of messages.status()) {
        if (st.type === "heartbeats_missed" && st.count >= 3) return reopen(`${st.count} heartbeats missed`);
      }
    })().catch(() => undefined);
    void messages.closed().then((err) => reopen(err ? `closed: ${(err as Error).message}` : "closed"));
    // Also ask the server, every few seconds, whether the consumer still exists: a consumer whose
    // server died can stay silent without any heartbeat notification reaching us.
    clearInterval(this.probeTimer);
    this.probeTimer = setInterval(() => {
      const c = this.consumer;
      if (!c || this.stopped) return;
      c.info(false).then(
        () => {
              },
        (err: unknown) => {
          // Reopening is cheap and safe (an ordered consumer is ephemeral; we resume at lastSeq + 1),
          // so one failed probe is enough: waiting for more only prolongs a blind spell.
          reopen(isConsumerNotFound(err) ? "consumer not found on the server" : `consumer info failing: ${(err as Error).message}`);
        },
      );
    }, this.opts.probeEveryMs ?? 3_000);
    this.probeTimer.unref?.();
  }

  private async reopenWithBackoff(): Promise<void> {
    for (let delay = 250; !this.stopped; delay = Math.min(delay * 2, 4_000)) {
      try {
        await this.open(this.lastSeq > 0 ? { kind: "sequence", seq: this.lastSeq + 1 } : this.opts.startAt);
        return;
      } catch (err) {
        this.opts.log.warn({ stream: this.opts.stream, err: (err as Error).message }, "stream consumer reopen failed; retrying");
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  private handleJs(m: JsMsg): void {
    this.handle(m.subject, m.data, m.seq, -1, m);
  }

  /**
   * One message, from either reader. `pending` < 0: read it from `info` (the client's delivery
   * info, parsed on first use), else `info` is already parsed.
   */
  private handle(subject: string, data: Uint8Array, seq: number, pending: number, info: { readonly info: JsMsg["info"] } | Delivery): void {
    const o = this.opts;
    this.lastSeq = seq;
    const serverTsOf = () => (pending >= 0 ? (info as Delivery).serverTsMs : Math.floor((info as JsMsg).info.timestampNanos / 1_000_000));
    o.onMessage?.(subject, seq, serverTsOf);
    const pendingOf = () => (pending >= 0 ? pending : (info as JsMsg).info.pending);
    if (o.skipRaw?.(data, subject)) {
      this.skipped++;
      // A lone replica's CHARGES view sees only its own echoes: sample the lag from them too
      // (parsing the delivery info of every echo costs ~0.5% of a busy gateway's CPU).
      if ((this.skipped & 15) === 0) this.pending = pendingOf();
      if (!this.caughtUpFlag && pendingOf() === 0) this.markCaughtUp();
      return;
    }
    const decoded = decodeEvent(data, o.types);
    // The delivery info is parsed here anyway (for the server timestamp): keep the view's lag.
    const serverTs = serverTsOf();
    this.pending = pendingOf();
    this.delayMs = Date.now() - serverTs;
    if (decoded.ok) {
      try {
        o.onEvent(decoded.event, { seq, subject, serverTs });
        this.applied++;
      } catch (err) {
        // A view that throws on a schema-valid event is a bug, but the consumer must survive it.
        this.deadLetters.send({ family: o.family, subject, stream: o.stream, seq, reason: `apply failed: ${(err as Error).message}`, type: decoded.event.type, data });
      }
    } else {
      this.deadLetters.send({ family: o.family, subject, stream: o.stream, seq, reason: decoded.reason, ...(decoded.type ? { type: decoded.type } : {}), data });
    }
    if (!this.caughtUpFlag && this.pending === 0) this.markCaughtUp();
  }

  private markCaughtUp(): void {
    this.caughtUpFlag = true;
    for (const w of this.caughtUpWaiters.splice(0)) w();
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.probeTimer);
    await this.messages?.close().catch(() => undefined);
    await this.reader?.close();
  }
}
