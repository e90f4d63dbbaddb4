/**
 * The pure part of a paced pull reader (paced-pull.ts): what a JetStream delivery's reply subject
 * says, and when to ask the server for the next batch.
 *
 * Why pace: a consumer with a pull request outstanding is sent every message the moment it is
 * stored, so a replica folding its pool's charges wakes once per message (~100 µs of CPU per
 * wake-up on a 2-vCPU VM, against ~10 µs to fold the message). A paced reader keeps no request
 * outstanding while traffic flows: it asks for everything stored (`no_wait`) every `paceMs`, and
 * gets it in one burst handled in one tick. When a batch comes back empty it leaves a one-message
 * request ("doorbell") waiting, so the first message after a quiet spell is read at once; the
 * price is at most `paceMs` more lag for the messages that follow it within a busy spell.
 */

/** What a JetStream message's reply subject (`$JS.ACK.…`) carries. */
export interface Delivery {
  /** Stream sequence. */
  seq: number;
  /** Consumer (delivery) sequence: consecutive for one consumer, a gap means a lost message. */
  dseq: number;
  /** Server-assigned publish time, ms since the epoch. */
  serverTsMs: number;
  /** Messages left in the consumer after this one. */
  pending: number;
}

/**
 * Parses `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts ns>.<pending>` (9 tokens) and
 * the v2 form with domain and account hash (`$JS.ACK.<domain>.<hash>.<stream>.<consumer>.
 * <delivered>.<sseq>.<dseq>.<ts>.<pending>.<token>`, 12 tokens). Undefined for anything else.
 * One pass over the subject, no split (no array of strings per message).
 */
export function parseDelivery(reply: string | undefined): Delivery | undefined {
  if (reply === undefined || !reply.startsWith("$JS.ACK.")) return undefined;
  // Positions of the dots that end the tokens after `$JS.ACK` (the subject's end closes the last).
  const ends: number[] = [];
  for (let i = 8; i < reply.length; i++) if (reply.charCodeAt(i) === 46) ends.push(i);
  ends.push(reply.length);
  // ends.length = tokens after `$JS.ACK`: 7 (v1) or 10+ (v2, whose last token follows pending).
  const last = ends.length === 7 ? 6 : ends.length >= 10 ? 8 : -1;
  if (last < 0) return undefined;
  const token = (k: number): number => Number(reply.slice((ends[k - 1] as number) + 1, ends[k] as number));
  const pending = token(last);
  const tsNs = token(last - 1);
  const dseq = token(last - 2);
  const seq = token(last - 3);
  if (!Number.isInteger(seq) || !Number.isInteger(dseq) || !Number.isInteger(pending) || !Number.isFinite(tsNs)) return undefined;
  return { seq, dseq, serverTsMs: Math.floor(tsNs / 1_000_000), pending };
}

/** The next request for messages. */
export type NextPull =
  /** Ask for up to `batch` stored messages, without waiting for more, after `delayMs`. */
  | { kind: "batch"; delayMs: number }
  /** Leave a one-message request waiting: the next message is sent the moment it is stored. */
  | { kind: "doorbell" };

/**
 * What follows a finished request: `wasBatch` (a `no_wait` batch, else the doorbell), how many
 * messages it brought, whether it was filled (more are likely stored), and how long ago it was sent.
 * - a filled batch: more are waiting (catching up): ask again at once;
 * - the doorbell rang, or a batch brought some: traffic is flowing, ask again `paceMs` after the
 *   previous request went out (so a message waits at most ~`paceMs`);
 * - an empty batch: quiet, leave the doorbell.
 */
export function nextPull(o: { wasBatch: boolean; delivered: number; filled: boolean; sinceSentMs: number; paceMs: number }): NextPull {
  if (o.wasBatch && o.filled) return { kind: "batch", delayMs: 0 };
  if (o.delivered > 0) return { kind: "batch", delayMs: Math.max(0, o.paceMs - (o.wasBatch ? o.sinceSentMs : 0)) };
  return { kind: "doorbell" };
}
