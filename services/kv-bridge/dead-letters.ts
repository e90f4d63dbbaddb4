/**
 * Dead letters for engine input the bridge cannot use: copied to `<prefix>.dlq.kv` with the raw
 * bytes and headers naming the pod, the endpoint and the reason, so an operator can run
 * `nats stream view` on the DLQ and reproduce the decode offline.
 *
 * Multi-frame ZMQ messages travel as the concatenation of their frames plus a `Jr-Dlq-Frames`
 * header with each frame's length; anything larger than the NATS payload limit (or the bridge's
 * frame limit) travels as a prefix, with the original size in `Jr-Dlq-Truncated`.
 */
import type { JetStreamClient } from "@nats-io/jetstream";
import { headers as natsHeaders } from "@nats-io/transport-node";
import type { Subjects } from "../../streams/subjects.js";
import { DlqHeaders } from "../shared/dead-letter.js";
import type { Logger } from "../shared/log.js";

export const KvDlqHeaders = {
  ...DlqHeaders,
  pod: "Jr-Dlq-Pod",
  model: "Jr-Dlq-Model",
  endpoint: "Jr-Dlq-Endpoint",
  source: "Jr-Dlq-Source",
  engineSeq: "Jr-Dlq-Engine-Seq",
  frames: "Jr-Dlq-Frames",
  truncated: "Jr-Dlq-Truncated",
} as const;

export interface KvDeadLetter {
  model: string;
  pod: string;
  endpoint: string;
  source: "live" | "replay";
  reason: string;
  /** The frames to keep: the payload alone when the envelope was fine, else all of them. */
  frames: readonly Uint8Array[];
  engineSeq?: number;
}

export interface DeadLetterCounters {
  deadLetters: number;
  deadLetterErrors: number;
}

export class KvDeadLetters {
  private logged = 0;

  constructor(
    private readonly counters: DeadLetterCounters,
    private readonly js: JetStreamClient,
    private readonly subjects: Subjects,
    private readonly consumer: string,
    private readonly log: Logger,
    /** Largest body to copy (the server's max_payload minus room for headers). */
    private readonly maxBytes: () => number,
  ) {}

  send(dl: KvDeadLetter): void {
    const n = ++this.counters.deadLetters;
    // A garbage-spewing engine must not flood the log: the DLQ keeps every copy anyway.
    if (this.logged < 20 || n % 1000 === 0) {
      this.logged++;
      this.log.warn({ pod: dl.pod, endpoint: dl.endpoint, source: dl.source, seq: dl.engineSeq, reason: dl.reason, total: n }, "bad engine message dead-lettered");
    }
    const size = dl.frames.reduce((n, f) => n + f.length, 0);
    const limit = this.maxBytes();
    const body = Buffer.allocUnsafe(Math.min(size, limit));
    let at = 0;
    for (const f of dl.frames) {
      if (at >= body.length) break;
      const n = Math.min(f.length, body.length - at);
      body.set(f.subarray(0, n), at);
      at += n;
    }
    const h = natsHeaders();
    h.set(KvDlqHeaders.reason, dl.reason.replace(/[\r\n]+/g, " ").slice(0, 1000));
    h.set(KvDlqHeaders.subject, this.subjects.kv(dl.model, dl.pod));
    h.set(KvDlqHeaders.consumer, this.consumer);
    h.set(KvDlqHeaders.pod, dl.pod);
    h.set(KvDlqHeaders.model, dl.model);
    h.set(KvDlqHeaders.endpoint, dl.endpoint);
    h.set(KvDlqHeaders.source, dl.source);
    h.set(KvDlqHeaders.frames, dl.frames.map((f) => f.length).join(","));
    if (dl.engineSeq !== undefined) h.set(KvDlqHeaders.engineSeq, String(dl.engineSeq));
    if (size > body.length) h.set(KvDlqHeaders.truncated, String(size));
    this.js.publish(this.subjects.deadLetter("kv"), body, { headers: h }).catch((err: unknown) => {
      this.counters.deadLetterErrors++;
      this.log.error({ err, pod: dl.pod }, "dead-letter publish failed");
    });
  }
}
