/**
 * Publishing events as JSON. Two ways, chosen per event family:
 * - `fire`: a core NATS publish onto a subject a stream captures. No ack round trip, so it costs
 *   the hot path almost nothing; used for charges, releases, heartbeats, load samples and
 *   decision records, which are either short-lived or re-sent continuously.
 * - `acked`: a JetStream publish awaiting the stream's ack, with `Nats-Msg-Id` for dedupe;
 *   used where losing one message matters (pod readiness).
 */
import type { JetStreamClient, PubAck } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { MAX_RELEASE_BATCH, type ReleaseBatch, type ReleaseEvent, type ReleaseItem } from "../../schemas/events.js";

const encoder = new TextEncoder();

export function encodeEvent(ev: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(ev));
}

export function fire(nc: NatsConnection, subject: string, ev: unknown): void {
  nc.publish(subject, encodeEvent(ev));
}

export function acked(js: JetStreamClient, subject: string, ev: unknown, msgId?: string): Promise<PubAck> {
  return js.publish(subject, encodeEvent(ev), msgId ? { msgID: msgId } : undefined);
}

/**
 * Coalesces fire-and-forget publishes into one socket write per event-loop turn.
 *
 * The client flushes its buffer once per microtask checkpoint, so a gateway publishing a charge
 * while handling one request and a release while handling another pays one `write(2)` for each
 * — measured at ~20% of a busy gateway's CPU. Queuing them to `setImmediate` lets every publish
 * of a loop turn share one write, at the cost of at most one loop turn of delay.
 *
 * Nothing here throws. A message the client refuses is dropped alone and counted by reason — one
 * oversized message (the server's `max_payload`) must not take the rest of the turn's charges,
 * releases and heartbeats with it; the counters are exported as a metric.
 */
export class Outbox {
  private queue: Array<{ subject: string; data: Uint8Array }> = [];
  private scheduled = false;
  published = 0;

  constructor(private readonly nc: NatsConnection) {}

  /** Every event not published, whatever the reason (the sum of the counters below). */
  dropped = 0;
  /** Offered while the connection drained or after it closed (shutdown). */
  droppedClosed = 0;
  /** Larger than the server's `max_payload`: the server would refuse it. */
  droppedTooLarge = 0;
  /** Refused by the client for another reason (e.g. an invalid subject). */
  droppedFailed = 0;

  /** The counters, for metrics (label `reason`). */
  drops(): { closed: number; tooLarge: number; failed: number } {
    return { closed: this.droppedClosed, tooLarge: this.droppedTooLarge, failed: this.droppedFailed };
  }

  /** Draining (on the way to closed) refuses publishes too. */
  private get closing(): boolean {
    return this.nc.isClosed() || this.nc.isDraining();
  }

  /** The server's bound on a message, once connected (`undefined` before the first INFO). */
  private get maxPayload(): number | undefined {
    return this.nc.info?.max_payload;
  }

  private drop(reason: "closed" | "tooLarge" | "failed", n = 1): void {
    this.dropped += n;
    if (reason === "closed") this.droppedClosed += n;
    else if (reason === "tooLarge") this.droppedTooLarge += n;
    else this.droppedFailed += n;
  }

  fire(subject: string, ev: unknown): void {
    if (this.closing) {
      this.drop("closed");
      return;
    }
    const data = encodeEvent(ev);
    // Refused here rather than at flush: the caller's turn is where the oversized event came from.
    const max = this.maxPayload;
    if (max !== undefined && max > 0 && data.length > max) {
      this.drop("tooLarge");
      return;
    }
    this.queue.push({ subject, data });
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.flush);
    }
  }

  readonly flush = (): void => {
    this.scheduled = false;
    const q = this.queue;
    this.queue = [];
    if (this.closing) {
      this.drop("closed", q.length);
      return;
    }
    for (const [i, m] of q.entries()) {
      try {
        this.nc.publish(m.subject, m.data);
      } catch {
        if (this.closing) {
          // Closed or draining between the check and here: what is left cannot be sent.
          this.drop("closed", q.length - i);
          return;
        }
        // Only this message is refused (the server's max_payload may have shrunk after a
        // reconnect to another server, or the subject is invalid): the rest still goes.
        const max = this.maxPayload;
        this.drop(max !== undefined && m.data.length > max ? "tooLarge" : "failed");
        continue;
      }
      this.published++;
    }
  };
}

/**
 * The gateways' default release batch window (`--release-batch-ms`): 5 ms cut the CHARGES
 * messages per request from 2.0 to ~1.15 at load (docs/benchmarks.md, fold-live) and delays a
 * release's effect on peers by at most that; 0 turns batching off.
 */
export const DEFAULT_RELEASE_BATCH_MS = 5;

/** A release as the batcher needs it (services/gateway's `ReleaseEvent`). */
type Release = ReleaseEvent;

/**
 * Batches a gateway's releases per pod over a short window: every other replica folds one
 * `releases` message for all the releases one pod saw in that window, instead of one message per
 * request (per-message costs — the NATS client's delivery, the follower, JSON and schema — are
 * most of what folding a foreign request costs). A window holding a single release sends it as a
 * plain `release`, so a quiet gateway's stream reads as before.
 *
 * A release waits at most `windowMs` (or less: `flush()` is called before every heartbeat, so a
 * heartbeat never overtakes a release made before it, and on shutdown). Charges are not delayed:
 * peers must see load at once; seeing its end a few ms late only errs on the safe side.
 */
export class ReleaseBatcher {
  private readonly open = new Map<string, Release[]>();
  private timer: NodeJS.Timeout | undefined;
  /** `releases` messages sent, and the releases they carried (metrics, benchmarks). */
  batches = 0;
  batched = 0;

  constructor(
    private readonly out: { fire(subject: string, ev: unknown): void },
    private readonly subjectOf: (model: string, pod: string) => string,
    /** 0 = no batching: each release is fired at once. */
    private readonly windowMs: number,
    /** The gateway's count of charges made so far: stamped on each release as `afterCharge` (replay's ordering). */
    private readonly chargesMade: () => number,
    private readonly maxBatch = MAX_RELEASE_BATCH,
    /** The server's bound on a message (`max_payload`), when known: a batch past 90% of it is split. */
    private readonly maxBytes: () => number | undefined = () => undefined,
  ) {}

  add(ev: Release): void {
    const subject = this.subjectOf(ev.model, ev.pod);
    if (this.windowMs <= 0) {
      this.out.fire(subject, ev);
      return;
    }
    ev.afterCharge = this.chargesMade();
    let list = this.open.get(subject);
    if (!list) {
      list = [];
      this.open.set(subject, list);
    }
    list.push(ev);
    if (list.length >= this.maxBatch) {
      this.open.delete(subject);
      this.send(subject, list);
    }
    if (this.timer === undefined && this.open.size > 0) this.timer = setTimeout(this.flush, this.windowMs);
  }

  /** Sends every open batch now. */
  readonly flush = (): void => {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    for (const [subject, list] of this.open) this.send(subject, list);
    this.open.clear();
  };

  private send(subject: string, list: Release[]): void {
    const first = list[0] as Release;
    if (list.length === 1) {
      this.out.fire(subject, first);
      return;
    }
    // `gateway` right after `type`: the byte run a gateway spots its own echoes by.
    const batch: ReleaseBatch = { type: "releases", gateway: first.gateway, model: first.model, pod: first.pod, releases: list.map(itemOf) };
    // A small batch is far below any usable max_payload (a release is at most ~700 bytes); a large
    // one is measured, and halved until it fits, so the outbox never drops a batch as too large.
    const max = this.maxBytes();
    if (list.length >= SIZE_CHECK_FROM && max !== undefined && max > 0 && Buffer.byteLength(JSON.stringify(batch)) > max * 0.9) {
      const half = Math.ceil(list.length / 2);
      this.send(subject, list.slice(0, half));
      this.send(subject, list.slice(half));
      return;
    }
    this.batches++;
    this.batched += list.length;
    this.out.fire(subject, batch);
  }
}

/** Batches of this many releases or more are measured against `max_payload` before they go. */
const SIZE_CHECK_FROM = 16;

function itemOf(r: Release): ReleaseItem {
  const { type: _t, gateway: _g, model: _m, pod: _p, ...item } = r;
  return item;
}
