/**
 * Acked JetStream publishing for one pod, in order, with a bounded window of acks in flight.
 *
 * Awaiting each ack serially caps a pod at ~7 k messages/s; pipelining keeps the order anyway,
 * because one connection delivers messages to the stream in the order they were written. When a
 * publish fails (server gone, stream leader moving) the window drains, the failed messages are
 * re-sent first, in their original order, with backoff, and only then does new work flow again.
 * Messages acked after a failed one keep their place, so a failure can reorder those few; their
 * `Nats-Msg-Id` keeps a retry from storing anything twice.
 */
import type { JetStreamClient, PubAck } from "@nats-io/jetstream";
import { headers as natsHeaders } from "@nats-io/transport-node";
import type { Logger } from "../shared/log.js";

export interface PublishCounters {
  acked: number;
  duplicates: number;
  publishErrors: number;
}

export interface OutMessage {
  subject: string;
  data: Uint8Array;
  msgId: string;
  schema: string;
}

interface Pending extends OutMessage {
  index: number;
}

export interface OrderedPublisherOptions {
  js: JetStreamClient;
  window: number;
  ackTimeoutMs?: number;
  log: Logger;
  counters: PublishCounters;
  onAck?(msg: OutMessage, ack: PubAck): void;
}

export class OrderedPublisher {
  private queue: Pending[] = [];
  private failed: Pending[] = [];
  private inflight = 0;

  /** Messages queued or awaiting their ack: 0 = everything sent so far is in the stream. */
  get unacked(): number {
    return this.queue.length + this.inflight;
  }
  private recovering = false;
  private backoffMs = 0;
  private nextIndex = 0;
  private spaceWaiters: Array<() => void> = [];
  private idleWaiters: Array<() => void> = [];
  private retryTimer?: NodeJS.Timeout;
  private closed = false;
  private scheduled = false;
  private readonly scheduledPump = () => {
    this.scheduled = false;
    this.pump();
  };

  constructor(private readonly o: OrderedPublisherOptions) {}

  get pending(): number {
    return this.queue.length + this.failed.length + this.inflight;
  }

  /** Queues a message; resolves once the window has room for more (not when it is acked). */
  send(m: OutMessage): Promise<void> {
    if (this.closed) return Promise.resolve();
    this.queue.push({ ...m, index: this.nextIndex++ });
    // Publishing on the next loop turn lets every message of this turn share one socket write
    // (the client flushes once per microtask checkpoint; one write per batch cost ~20% CPU).
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.scheduledPump);
    }
    if (this.pending < this.o.window) return Promise.resolve();
    return new Promise((resolve) => this.spaceWaiters.push(resolve));
  }

  /** Resolves when every queued message has been acked. */
  flush(): Promise<void> {
    if (this.pending === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.retryTimer);
    for (const w of this.spaceWaiters.splice(0)) w();
    for (const w of this.idleWaiters.splice(0)) w();
  }

  private pump(): void {
    while (!this.recovering && !this.closed && this.inflight < this.o.window && this.queue.length > 0) {
      const m = this.queue.shift() as Pending;
      this.inflight++;
      const h = natsHeaders();
      h.set("Jr-Schema", m.schema);
      this.o.js.publish(m.subject, m.data, { msgID: m.msgId, headers: h, timeout: this.o.ackTimeoutMs ?? 5_000 }).then(
        (ack) => {
          this.o.counters.acked++;
          if (ack.duplicate) this.o.counters.duplicates++;
          this.backoffMs = 0;
          this.o.onAck?.(m, ack);
          this.settled();
        },
        (err: unknown) => {
          this.o.counters.publishErrors++;
          if (this.o.counters.publishErrors % 100 === 1) this.o.log.warn({ err, subject: m.subject, msgId: m.msgId }, "KV publish failed; will retry in order");
          this.recovering = true;
          this.failed.push(m);
          this.settled();
        },
      );
    }
  }

  private settled(): void {
    this.inflight--;
    if (this.recovering && this.inflight === 0 && !this.retryTimer) {
      this.failed.sort((a, b) => a.index - b.index);
      this.queue = [...this.failed, ...this.queue];
      this.failed = [];
      this.backoffMs = Math.min(Math.max(this.backoffMs * 2, 100), 5_000);
      this.retryTimer = setTimeout(() => {
        this.retryTimer = undefined;
        this.recovering = false;
        this.pump();
      }, this.backoffMs);
    }
    this.pump();
    if (this.pending < this.o.window) for (const w of this.spaceWaiters.splice(0)) w();
    if (this.pending === 0) for (const w of this.idleWaiters.splice(0)) w();
  }
}
