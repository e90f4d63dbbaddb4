/**
 * A paced pull reader of one JetStream stream (pacing: pull-pacing.ts): an ephemeral pull consumer
 * (no acks, in memory, one replica, removed by the server when left inactive), read through the
 * JetStream API's public wire protocol — `CONSUMER.MSG.NEXT` requests from one inbox subscription —
 * so that a burst of messages is handled in the subscription's callback, synchronously, one
 * message after the other in the tick that read them off the socket: no per-message promise,
 * iterator step or timer.
 *
 * It does what the client's ordered consumer does for a follower: messages in stream order, each
 * once; a gap in the consumer's delivery sequence (a message lost) or a consumer gone from the
 * server is reported through `onLost`, and the owner reopens it after the last sequence it handled.
 * At most one request is outstanding at a time, so a request's end (filled, or a 404/408 status
 * after what was stored) is never confused with another's.
 */
import { AckPolicy, type ConsumerConfig, type JetStreamManager } from "@nats-io/jetstream";
import { createInbox, type Msg, type NatsConnection, nanos, nuid, type Subscription } from "@nats-io/transport-node";
import { type Delivery, nextPull, parseDelivery } from "./pull-pacing.js";

export interface PacedPullOptions {
  nc: NatsConnection;
  jsm: JetStreamManager;
  /** The JetStream API prefix (`js.apiPrefix`). */
  apiPrefix: string;
  stream: string;
  filter?: string;
  /** Where the consumer starts: deliver_policy and its opt_start_* fields. */
  start: Partial<ConsumerConfig>;
  /** Time between batch requests while messages flow. */
  paceMs: number;
  /** Most messages per batch request (default 1,024). */
  batch?: number;
  /** How long the doorbell request waits before it is renewed (default 4 s). */
  doorbellMs?: number;
  onMessage(subject: string, data: Uint8Array, d: Delivery): void;
  /** The consumer cannot go on (gap, deleted, no responders): reopen after the last sequence handled. */
  onLost(why: string): void;
  now?: () => number;
}

const DEFAULT_BATCH = 1_024;

const DEFAULT_DOORBELL_MS = 4_000;
/** A `no_wait` batch is answered at once: this long without its end means the request was lost. */
const BATCH_ANSWER_MS = 2_000;

export class PacedPullReader {
  /** Requests sent (batches and doorbells), and messages delivered. */
  requests = 0;
  delivered = 0;
  private name = "";
  private sub?: Subscription;
  private nextSubject = "";
  private lastDseq = 0;
  /** The outstanding request: its kind, size, when it went out, what it brought so far. */
  private outstanding?: { batch: boolean; size: number; sentAt: number; got: number };
  private timer?: NodeJS.Timeout;
  private closed = false;
  private readonly now: () => number;
  private readonly batch: number;
  private readonly doorbellMs: number;
  private readonly batchRequest: Uint8Array;
  private readonly doorbellRequest: Uint8Array;

  constructor(private readonly o: PacedPullOptions) {
    this.now = o.now ?? Date.now;
    this.batch = o.batch ?? DEFAULT_BATCH;
    this.doorbellMs = o.doorbellMs ?? DEFAULT_DOORBELL_MS;
    const enc = new TextEncoder();
    this.batchRequest = enc.encode(JSON.stringify({ batch: this.batch, no_wait: true }));
    this.doorbellRequest = enc.encode(JSON.stringify({ batch: 1, expires: nanos(this.doorbellMs) }));
  }

  get consumerName(): string {
    return this.name;
  }

  /** Creates the consumer and asks for its first batch; resolves to the messages it holds. */
  async open(): Promise<{ numPending: number }> {
    const o = this.o;
    const info = await o.jsm.consumers.add(o.stream, {
      ...o.start,
      // Named, so the client sends the `CONSUMER.CREATE.<stream>.<name>[.<filter>]` form: the
      // deployed NATS permissions refuse the unnamed `CONSUMER.CREATE.<stream>` to gateways.
      name: `jr_paced_${nuid.next()}`,
      ack_policy: AckPolicy.None,
      mem_storage: true,
      num_replicas: 1,
      // Removed by the server once nobody has asked for messages this long (a reader that died).
      inactive_threshold: nanos(Math.max(15_000, 3 * this.doorbellMs)),
      ...(o.filter ? { filter_subject: o.filter } : {}),
    });
    if (this.closed) {
      await o.jsm.consumers.delete(o.stream, info.name).catch(() => undefined);
      return { numPending: info.num_pending };
    }
    this.name = info.name;
    this.nextSubject = `${o.apiPrefix}.CONSUMER.MSG.NEXT.${o.stream}.${info.name}`;
    const inbox = createInbox();
    this.sub = o.nc.subscribe(inbox, { callback: (err, msg) => (err ? this.lost(`subscription: ${err.message}`) : this.receive(msg)) });
    this.request(true);
    return { numPending: info.num_pending };
  }

  /**
   * Ask now instead of at the paced time (someone waits for a message: strict mode's catch-up).
   * Nothing to do while a request is outstanding: it is answered at once, or the doorbell rings.
   */
  readNow(): void {
    if (this.closed || this.outstanding !== undefined || this.timer === undefined) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.request(true);
  }

  /** The watchdog, for the owner's periodic probe: why the reader is stuck, or undefined. */
  stuck(): string | undefined {
    const r = this.outstanding;
    if (this.closed || r === undefined) return undefined;
    const limit = r.batch ? BATCH_ANSWER_MS : this.doorbellMs + BATCH_ANSWER_MS;
    const waited = this.now() - r.sentAt;
    return waited > limit ? `no answer to a ${r.batch ? "batch" : "doorbell"} request in ${waited} ms` : undefined;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.timer);
    this.sub?.unsubscribe();
    if (this.name) await this.o.jsm.consumers.delete(this.o.stream, this.name).catch(() => undefined);
  }

  private request(batch: boolean): void {
    if (this.closed) return;
    this.outstanding = { batch, size: batch ? this.batch : 1, sentAt: this.now(), got: 0 };
    this.requests++;
    this.o.nc.publish(this.nextSubject, batch ? this.batchRequest : this.doorbellRequest, { reply: this.sub?.getSubject() as string });
  }

  private lost(why: string): void {
    if (this.closed) return;
    void this.close();
    this.o.onLost(why);
  }

  private receive(msg: Msg): void {
    if (this.closed) return;
    const d = parseDelivery(msg.reply);
    if (d === undefined) {
      this.status();
      return;
    }
    if (d.dseq !== this.lastDseq + 1) {
      this.lost(`delivery sequence ${d.dseq} after ${this.lastDseq}`);
      return;
    }
    this.lastDseq = d.dseq;
    this.delivered++;
    const r = this.outstanding;
    this.o.onMessage(msg.subject, msg.data, d);
    if (r === undefined || this.closed) return;
    if (++r.got >= r.size) this.finished(r);
  }

  /**
   * A message without a delivery reply subject is a status: 404 (no messages), 408 (request
   * timeout: the rest of a `no_wait` batch, or the doorbell expired), 409 (leadership change,
   * consumer deleted), 503. Every one ends the outstanding request, and none is told apart here:
   * decoding its headers would cost more than the rest of a paced cycle. A consumer that is gone
   * shows at the next request (no answer: `stuck`) or the owner's info probe.
   */
  private status(): void {
    const r = this.outstanding;
    if (r !== undefined) this.finished(r);
  }

  private finished(r: NonNullable<PacedPullReader["outstanding"]>): void {
    this.after(r, nextPull({ wasBatch: r.batch, delivered: r.got, filled: r.got >= r.size, sinceSentMs: this.now() - r.sentAt, paceMs: this.o.paceMs }));
  }

  private after(r: NonNullable<PacedPullReader["outstanding"]>, next: ReturnType<typeof nextPull>): void {
    if (this.outstanding !== r) return;
    this.outstanding = undefined;
    if (next.kind === "doorbell") {
      this.request(false);
      return;
    }
    if (next.delayMs <= 0) {
      this.request(true);
      return;
    }
    // The only timer on this path: one per paced request, not per message.
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.request(true);
    }, next.delayMs);
  }
}
