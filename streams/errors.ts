/**
 * JetStream API errors every caller tells apart the same way: one predicate per failure, each
 * matching the client's `JetStreamApiError` by the server's `err_code` (nats-server's
 * errors.json), never by its description.
 */
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";

/**
 * The server's `err_code`s jetroute reacts to (nats-server 2.9.10 sends all but 10164). Not here:
 * 10037 "no message found", which the client's `streams.getMessage` and KV `get` resolve as null.
 */
export const ApiErrorCode = {
  /** `JSConsumerNotFoundErr`: "consumer not found". */
  ConsumerNotFound: JetStreamApiCodes.ConsumerNotFound,
  /** `JSStreamNotFoundErr`: "stream not found". */
  StreamNotFound: JetStreamApiCodes.StreamNotFound,
  /** `JSStreamWrongLastSequenceErrF`: "wrong last sequence: {seq}", the subject's current last sequence. */
  StreamWrongLastSequence: JetStreamApiCodes.StreamWrongLastSequence,
  /**
   * `JSStreamWrongLastSequenceConstantErr`: "wrong last sequence", naming none. Newer servers
   * (not 2.9) send it when another expected-sequence write to the subject is still in flight.
   */
  StreamWrongLastSequenceConstant: JetStreamApiCodes.StreamWrongLastSequenceUnknown,
} as const;
export type ApiErrorCode = (typeof ApiErrorCode)[keyof typeof ApiErrorCode];

const hasCode = (err: unknown, code: number): err is JetStreamApiError => err instanceof JetStreamApiError && err.code === code;

/** The stream (or the bucket behind it) does not exist: never created, not a failed call. */
export function isStreamNotFound(err: unknown): err is JetStreamApiError {
  return hasCode(err, ApiErrorCode.StreamNotFound);
}

/** The consumer is gone from the server (deleted, or its inactivity threshold passed). */
export function isConsumerNotFound(err: unknown): err is JetStreamApiError {
  return hasCode(err, ApiErrorCode.ConsumerNotFound);
}

/**
 * A compare-and-set lost: a publish with `Nats-Expected-Last-Subject-Sequence` (the KV's
 * `create` when the key exists, `update` or a `delete` with `previousSeq` against a stale
 * revision) found the subject at another sequence.
 */
export function isWrongLastSequence(err: unknown): err is JetStreamApiError {
  return hasCode(err, ApiErrorCode.StreamWrongLastSequence) || hasCode(err, ApiErrorCode.StreamWrongLastSequenceConstant);
}

const NAMED_SEQUENCE = /(\d+)\s*$/;

/**
 * The subject's current last sequence, as named by a 10071 refusal (0 if it names none), else
 * undefined. The server puts the number in the description only, so it is read from there once
 * the code has said what the error is; 10164 names no sequence and gets undefined.
 */
export function currentSubjectSequence(err: unknown): number | undefined {
  if (!hasCode(err, ApiErrorCode.StreamWrongLastSequence)) return undefined;
  const m = NAMED_SEQUENCE.exec(err.apiError().description ?? "");
  return m ? Number(m[1]) : 0;
}
