/**
 * Dead-lettering: a message a consumer cannot use is copied, byte for byte, to
 * `<prefix>.dlq.<family>` with headers saying where it came from and why — never dropped silently,
 * never allowed to stop the consumer.
 */
import type { JetStreamClient } from "@nats-io/jetstream";
import { headers as natsHeaders } from "@nats-io/transport-node";
import type { Family, Subjects } from "../../streams/subjects.js";
import type { Logger } from "./log.js";

export const DlqHeaders = {
  reason: "Jr-Dlq-Reason",
  subject: "Jr-Dlq-Subject",
  stream: "Jr-Dlq-Stream",
  seq: "Jr-Dlq-Seq",
  consumer: "Jr-Dlq-Consumer",
} as const;

export interface DeadLetter {
  family: Family;
  subject: string;
  stream?: string;
  seq?: number;
  reason: string;
  data: Uint8Array;
}

export class DeadLetterSink {
  count = 0;
  failed = 0;

  constructor(
    private readonly js: JetStreamClient,
    private readonly subjects: Subjects,
    private readonly consumer: string,
    private readonly log: Logger,
  ) {}

  send(dl: DeadLetter): void {
    this.count++;
    this.log.warn({ subject: dl.subject, seq: dl.seq, stream: dl.stream, reason: dl.reason }, "invalid message dead-lettered");
    const h = natsHeaders();
    // Header values must be single-line.
    h.set(DlqHeaders.reason, dl.reason.replace(/[\r\n]+/g, " ").slice(0, 1000));
    h.set(DlqHeaders.subject, dl.subject);
    h.set(DlqHeaders.consumer, this.consumer);
    if (dl.stream) h.set(DlqHeaders.stream, dl.stream);
    if (dl.seq !== undefined) h.set(DlqHeaders.seq, String(dl.seq));
    this.js.publish(this.subjects.deadLetter(dl.family), dl.data, { headers: h }).catch((err: unknown) => {
      this.failed++;
      this.log.error({ err, subject: dl.subject, seq: dl.seq }, "dead-letter publish failed");
    });
  }
}
