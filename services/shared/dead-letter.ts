/**
 * Dead-lettering: a message a consumer cannot use is recorded on `<prefix>.dlq.<family>` with
 * headers saying where it came from and why — never dropped silently, never allowed to stop the
 * consumer.
 *
 * What an entry keeps is a policy (`deadLetterBody`, pure): by default the envelope only — origin,
 * reason, size, event type when known, and a digest that tells identical payloads apart — and no
 * payload byte, since payloads may carry what the DLQ's readers should not see (an engine's KV
 * batch holds the prompt's token ids). A process started with `--dlq-payloads` keeps the payload,
 * or its first `maxPayloadBytes`, for debugging.
 *
 * A dead letter read from a stream carries `Nats-Msg-Id: dlq:<stream>:<seq>`, so the DLQ's
 * duplicate window (streams/definitions.ts) keeps one entry per bad stream message: a process that
 * reboots and re-reads it, or every replica reading it, adds none.
 *
 * Logging is rate-limited per process (`DeadLetterLog`, on the `LogRate` rule): a consumer
 * re-reading a stream full of bad messages at boot, or an engine spewing garbage, writes a bounded
 * number of lines; so are failed DLQ publishes (`deadLetterFailureLog`: a missing or full DLQ
 * stream fails every one of them). The counters (metrics) count every dead letter and every
 * failed publish.
 */
import { createHash } from "node:crypto";
import type { JetStreamClient } from "@nats-io/jetstream";
import { headers as natsHeaders, type MsgHdrs } from "@nats-io/transport-node";
import type { Family, Subjects } from "../../streams/subjects.js";
import type { Logger } from "./log.js";
import { LogRate } from "./log-rate.js";

export const DlqHeaders = {
  reason: "Jr-Dlq-Reason",
  subject: "Jr-Dlq-Subject",
  stream: "Jr-Dlq-Stream",
  seq: "Jr-Dlq-Seq",
  consumer: "Jr-Dlq-Consumer",
  /** The event type the payload claims (its `type` field), when it has one. */
  type: "Jr-Dlq-Type",
  /** The payload's size in bytes (all of it, whatever the entry keeps). */
  size: "Jr-Dlq-Size",
  /** The first 64 bits of the payload's SHA-256, hex: equal payloads, equal digests. */
  digest: "Jr-Dlq-Digest",
  /** What the entry's body is: `omitted` (empty body: the default), `whole`, or `prefix` (the first bytes). */
  payload: "Jr-Dlq-Payload",
} as const;

export interface DeadLetterPolicy {
  /** Keep the payload in the entry (`--dlq-payloads`); false: the envelope only. */
  keepPayloads: boolean;
  /** With `keepPayloads`: the most payload bytes one entry keeps (a longer payload keeps its prefix). */
  maxPayloadBytes: number;
}

export const DEAD_LETTER_DEFAULTS = {
  keepPayloads: false,
  maxPayloadBytes: 256 * 1024,
  /** The upper bound of `--dlq-payloads <bytes>`. */
  maxPayloadBytesLimit: 8 * 1024 * 1024,
  /** Per process: this many dead letters logged one line each per interval ... */
  logLinesPerInterval: 10,
  /** ... and the rest of the interval's counted in one summary line at its end. */
  logIntervalMs: 60_000,
} as const;

/**
 * The `Nats-Msg-Id` of a dead letter read from a stream: the same stream message, the same id,
 * whoever reads it and however often.
 */
export function deadLetterMsgId(stream: string, seq: number): string {
  return `dlq:${stream}:${seq}`;
}

/** Room left in a NATS message for the DLQ headers. */
export const DLQ_HEADER_ROOM = 4096;

export type PayloadKept = "omitted" | "whole" | "prefix";

export interface DeadLetterBody {
  /** The entry's body: empty unless the policy keeps payloads. */
  body: Uint8Array;
  /** Bytes of the payload (the frames together). */
  size: number;
  digest: string;
  kept: PayloadKept;
}

const EMPTY = new Uint8Array(0);

/**
 * What a dead letter keeps of a payload (its frames, concatenated). `roomBytes` bounds the body
 * further: the most a NATS message may carry, headers aside.
 */
export function deadLetterBody(frames: readonly Uint8Array[], policy: DeadLetterPolicy, roomBytes = Number.POSITIVE_INFINITY): DeadLetterBody {
  const hash = createHash("sha256");
  let size = 0;
  for (const f of frames) {
    hash.update(f);
    size += f.length;
  }
  const digest = hash.digest("hex").slice(0, 16);
  if (!policy.keepPayloads) return { body: EMPTY, size, digest, kept: "omitted" };
  const n = Math.max(0, Math.min(size, policy.maxPayloadBytes, roomBytes));
  const body = Buffer.allocUnsafe(n);
  let at = 0;
  for (const f of frames) {
    if (at >= n) break;
    const k = Math.min(f.length, n - at);
    body.set(f.subarray(0, k), at);
    at += k;
  }
  return { body, size, digest, kept: n === size ? "whole" : "prefix" };
}

/** A policy as given on the command line, checked. */
export function deadLetterPolicyError(p: DeadLetterPolicy): string | undefined {
  const max = DEAD_LETTER_DEFAULTS.maxPayloadBytesLimit;
  if (!Number.isInteger(p.maxPayloadBytes) || p.maxPayloadBytes < 1 || p.maxPayloadBytes > max) return `dead-letter payload bound must be an integer in [1, ${max}] bytes, got ${p.maxPayloadBytes}`;
  return undefined;
}

let processPolicy: DeadLetterPolicy = { keepPayloads: DEAD_LETTER_DEFAULTS.keepPayloads, maxPayloadBytes: DEAD_LETTER_DEFAULTS.maxPayloadBytes };

/** The policy of this process's dead letters (`--dlq-payloads`); sinks read it at every send. */
export function setDeadLetterPolicy(p: DeadLetterPolicy): void {
  const err = deadLetterPolicyError(p);
  if (err) throw new RangeError(err);
  processPolicy = { keepPayloads: p.keepPayloads, maxPayloadBytes: p.maxPayloadBytes };
}

export function deadLetterPolicy(): DeadLetterPolicy {
  return processPolicy;
}

/** A header value: one line, at most `max` characters. */
export function headerText(s: string, max: number): string {
  return s.replace(/[\r\n]+/g, " ").slice(0, max);
}

/** A short token from untrusted input (an event type): printable ASCII without spaces, at most 64 characters. */
function token(s: string): string {
  return s.replace(/[^\x21-\x7e]/g, "?").slice(0, 64);
}

/**
 * The log shell of dead letters: one per process (`deadLetterLog`), shared by every sink, on a
 * `LogRate`. Held-back letters are reported in one summary line when their interval ends (a timer
 * that does not keep the process alive), through the logger of the last one held back. Failed DLQ
 * publishes have their own (`deadLetterFailureLog`, at `error`).
 */
export class DeadLetterLog {
  /** Events seen, logged on a line of their own, held back into summaries. */
  seen = 0;
  logged = 0;
  held = 0;
  private readonly rate: LogRate;
  private readonly now: () => number;
  private readonly level: "warn" | "error";
  private readonly summaryMsg: string;
  private readonly countField: string;
  private timer?: NodeJS.Timeout;
  private summaryLog?: Logger;

  constructor(
    o: {
      linesPerInterval?: number;
      intervalMs?: number;
      now?: () => number;
      /** Level of every line, summaries included (default `warn`). */
      level?: "warn" | "error";
      /** The summary line's message, and the field that carries `seen` in it. */
      summary?: { msg: string; countField: string };
    } = {},
  ) {
    this.rate = new LogRate(o.linesPerInterval ?? DEAD_LETTER_DEFAULTS.logLinesPerInterval, o.intervalMs ?? DEAD_LETTER_DEFAULTS.logIntervalMs);
    this.now = o.now ?? Date.now;
    this.level = o.level ?? "warn";
    this.summaryMsg = o.summary?.msg ?? "dead letters beyond the log rate: counted, not logged one by one";
    this.countField = o.summary?.countField ?? "deadLetters";
  }

  warn(log: Logger, fields: Record<string, unknown>, msg: string): void {
    this.seen++;
    const d = this.rate.admit(this.now());
    if (d.summary > 0) this.summarize(d.summary);
    if (d.log) {
      this.logged++;
      log[this.level](fields, msg);
      return;
    }
    this.held++;
    this.summaryLog = log;
    this.arm();
  }

  /** Writes the summary line when one is due (its timer calls this; so may a test on a fake clock). */
  flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    const n = this.rate.flush(this.now());
    if (n > 0) this.summarize(n);
    else this.arm();
  }

  private arm(): void {
    const due = this.rate.dueAt;
    if (this.timer || due === undefined) return;
    this.timer = setTimeout(() => this.flush(), Math.max(1, due - this.now()));
    this.timer.unref?.();
  }

  private summarize(n: number): void {
    this.summaryLog?.[this.level]({ notLogged: n, intervalMs: this.rate.intervalMs, [this.countField]: this.seen }, this.summaryMsg);
  }
}

/** Every sink of this process logs through this one (the rate is per process). */
export const deadLetterLog = new DeadLetterLog();

/**
 * Every sink's failed publishes (the DLQ stream missing, full, or NATS away): the same rate, apart
 * from the dead letters themselves, so a broken DLQ cannot flood the log either.
 */
export const deadLetterFailureLog = new DeadLetterLog({
  level: "error",
  summary: { msg: "dead-letter publishes failed beyond the log rate: counted, not logged one by one", countField: "failedPublishes" },
});

export interface DeadLetterOptions {
  /** Default: the process's (`setDeadLetterPolicy`), read at every send. */
  policy?: DeadLetterPolicy;
  /** Default: the process's `deadLetterLog`. */
  log?: DeadLetterLog;
  /** Default: the process's `deadLetterFailureLog`. */
  failureLog?: DeadLetterLog;
}

/** The headers every dead letter carries about its payload, and its body. */
export function payloadHeaders(h: MsgHdrs, b: DeadLetterBody, type: string | undefined): void {
  if (type) h.set(DlqHeaders.type, token(type));
  h.set(DlqHeaders.size, String(b.size));
  h.set(DlqHeaders.digest, b.digest);
  h.set(DlqHeaders.payload, b.kept);
}

export interface DeadLetter {
  family: Family;
  subject: string;
  stream?: string;
  seq?: number;
  reason: string;
  /** The event type the payload claims, when it names one. */
  type?: string;
  data: Uint8Array;
}

export class DeadLetterSink {
  count = 0;
  /** Publishes the DLQ stored, dropped as duplicates of an entry it holds (a re-read), failed. */
  stored = 0;
  duplicates = 0;
  failed = 0;

  constructor(
    private readonly js: JetStreamClient,
    private readonly subjects: Subjects,
    private readonly consumer: string,
    private readonly log: Logger,
    /** The most one NATS message may carry (the server's max_payload). */
    private readonly maxMessageBytes: () => number,
    private readonly o: DeadLetterOptions = {},
  ) {}

  send(dl: DeadLetter): void {
    this.count++;
    const b = deadLetterBody([dl.data], this.o.policy ?? deadLetterPolicy(), this.maxMessageBytes() - DLQ_HEADER_ROOM);
    (this.o.log ?? deadLetterLog).warn(
      this.log,
      { subject: dl.subject, seq: dl.seq, stream: dl.stream, reason: dl.reason, type: dl.type, size: b.size, digest: b.digest, deadLetters: this.count },
      "invalid message dead-lettered",
    );
    const h = natsHeaders();
    h.set(DlqHeaders.reason, headerText(dl.reason, 1000));
    h.set(DlqHeaders.subject, dl.subject);
    h.set(DlqHeaders.consumer, this.consumer);
    if (dl.stream) h.set(DlqHeaders.stream, dl.stream);
    if (dl.seq !== undefined) h.set(DlqHeaders.seq, String(dl.seq));
    payloadHeaders(h, b, dl.type);
    const msgID = dl.stream && dl.seq !== undefined ? deadLetterMsgId(dl.stream, dl.seq) : undefined;
    this.js.publish(this.subjects.deadLetter(dl.family), b.body, { headers: h, ...(msgID ? { msgID } : {}) }).then(
      (ack) => {
        if (ack.duplicate) this.duplicates++;
        else this.stored++;
      },
      (err: unknown) => {
        this.failed++;
        (this.o.failureLog ?? deadLetterFailureLog).warn(this.log, { err, subject: dl.subject, seq: dl.seq, failedPublishes: this.failed }, "dead-letter publish failed");
      },
    );
  }
}
