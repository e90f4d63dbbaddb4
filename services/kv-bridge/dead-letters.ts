/**
 * Dead letters for engine input the bridge cannot use, on `<prefix>.dlq.kv`, with headers naming
 * the pod, the endpoint and the reason.
 *
 * An engine's KV batch carries the prompt's token ids, so by default an entry keeps no payload byte:
 * its size, digest and the frames' lengths only (the shared policy, services/shared/dead-letter.ts).
 * A bridge started with `--dlq-payloads` keeps the bytes (bounded), so an operator can run
 * `nats stream view` on the DLQ and reproduce the decode offline: multi-frame ZMQ messages travel
 * as the concatenation of their frames (`Jr-Dlq-Frames` lists each frame's length), and anything
 * larger than the bound (or the NATS payload limit) as a prefix (`Jr-Dlq-Payload: prefix`).
 *
 * A batch with an engine sequence carries `Nats-Msg-Id: dlq:kv:<model>:<pod>:<seq>:<digest>`: a
 * restarted bridge replays the engine from its last published batch and so reads the bad batch
 * again; the DLQ's duplicate window keeps the one entry. The digest is part of the id because an
 * engine that restarts counts its sequence from 0 again (a new batch under an old number is a new
 * entry).
 */
import type { JetStreamClient } from "@nats-io/jetstream";
import { headers as natsHeaders } from "@nats-io/transport-node";
import type { Subjects } from "../../streams/subjects.js";
import { type DeadLetterOptions, DlqHeaders, deadLetterBody, deadLetterFailureLog, deadLetterLog, deadLetterPolicy, headerText, payloadHeaders } from "../shared/dead-letter.js";
import type { Logger } from "../shared/log.js";

export const KvDlqHeaders = {
  ...DlqHeaders,
  pod: "Jr-Dlq-Pod",
  model: "Jr-Dlq-Model",
  endpoint: "Jr-Dlq-Endpoint",
  source: "Jr-Dlq-Source",
  engineSeq: "Jr-Dlq-Engine-Seq",
  frames: "Jr-Dlq-Frames",
} as const;

export interface KvDeadLetter {
  model: string;
  pod: string;
  endpoint: string;
  source: "live" | "replay";
  reason: string;
  /** The frames to keep: the payload alone when the envelope was fine, else all of them. */
  frames: readonly Uint8Array[];
  /** What the frames are, when known (`EventBatch`: an engine batch payload). */
  type?: string;
  engineSeq?: number;
}

/** The `Nats-Msg-Id` of an engine batch's dead letter (see above). */
export function kvDeadLetterMsgId(model: string, pod: string, engineSeq: number, digest: string): string {
  return `dlq:kv:${model}:${pod}:${engineSeq}:${digest}`;
}

export interface DeadLetterCounters {
  deadLetters: number;
  deadLetterErrors: number;
}

export class KvDeadLetters {
  constructor(
    private readonly counters: DeadLetterCounters,
    private readonly js: JetStreamClient,
    private readonly subjects: Subjects,
    private readonly consumer: string,
    private readonly log: Logger,
    /** Largest body a NATS message can carry beside the headers (the server's max_payload minus room). */
    private readonly roomBytes: () => number,
    private readonly o: DeadLetterOptions = {},
  ) {}

  send(dl: KvDeadLetter): void {
    const n = ++this.counters.deadLetters;
    const b = deadLetterBody(dl.frames, this.o.policy ?? deadLetterPolicy(), this.roomBytes());
    (this.o.log ?? deadLetterLog).warn(
      this.log,
      { pod: dl.pod, endpoint: dl.endpoint, source: dl.source, seq: dl.engineSeq, reason: dl.reason, size: b.size, digest: b.digest, deadLetters: n },
      "bad engine message dead-lettered",
    );
    const h = natsHeaders();
    h.set(KvDlqHeaders.reason, headerText(dl.reason, 1000));
    h.set(KvDlqHeaders.subject, this.subjects.kv(dl.model, dl.pod));
    h.set(KvDlqHeaders.consumer, this.consumer);
    h.set(KvDlqHeaders.pod, dl.pod);
    h.set(KvDlqHeaders.model, dl.model);
    h.set(KvDlqHeaders.endpoint, dl.endpoint);
    h.set(KvDlqHeaders.source, dl.source);
    h.set(KvDlqHeaders.frames, dl.frames.map((f) => f.length).join(","));
    if (dl.engineSeq !== undefined) h.set(KvDlqHeaders.engineSeq, String(dl.engineSeq));
    payloadHeaders(h, b, dl.type);
    const msgID = dl.engineSeq !== undefined ? kvDeadLetterMsgId(dl.model, dl.pod, dl.engineSeq, b.digest) : undefined;
    this.js.publish(this.subjects.deadLetter("kv"), b.body, { headers: h, ...(msgID ? { msgID } : {}) }).catch((err: unknown) => {
      const failed = ++this.counters.deadLetterErrors;
      (this.o.failureLog ?? deadLetterFailureLog).warn(this.log, { err, pod: dl.pod, failedPublishes: failed }, "dead-letter publish failed");
    });
  }
}
