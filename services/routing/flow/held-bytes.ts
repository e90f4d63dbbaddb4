/**
 * What a request held by flow control keeps in memory, as the queues count it (their byte bounds
 * and the replica's `--flow-max-held-bytes`). Pure.
 *
 * A held request keeps (measured by `npm run bench -- flow-held`, Node 20, 4 MiB bodies):
 * - the body Buffer Envoy sent: `bodyBytes`;
 * - the parsed JSON: its strings hold about the body's characters, one byte each when the body
 *   is ASCII (V8's one-byte strings), two when it holds characters beyond Latin-1; when the
 *   decoded text is shorter than the body (multi-byte UTF-8) two bytes per character are counted,
 *   an upper bound (Latin-1 text is in fact one byte per character);
 * - a salted or rewritten copy of the body, when the request has one: `upstreamBytes`;
 * - the prompt's token ids, when the strategy tokenized it: 4 bytes each (the router's ids are a
 *   Uint32Array);
 * - a completion prompt sent as token ids: the parsed body's JSON array of them, 8 bytes each (a
 *   packed array of small integers on 64-bit V8 without pointer compression), besides the typed
 *   copy the router reads;
 * - a fixed part (the request's context, its closures, its queue entry): HELD_OVERHEAD_BYTES.
 * The body decoded as one string (`text`, used while planning) is not kept while held: the gateway
 * drops it before holding (it is not needed at dispatch), which saves one more body-size string.
 *
 * Not counted: the per-node cost of a JSON body made of very many tiny values (a 4 MiB body of
 * 100,000 two-word messages costs more than its characters); the request's body while it is still
 * arriving (bounded by `--max-body-bytes` per stream, not held yet).
 */

/** The fixed part of a held request (request context, promise and closures, queue entry): 2,000 held 1 KiB requests retain 4,072 bytes each, 2,048 of them the body and its parse. */
export const HELD_OVERHEAD_BYTES = 2048;
/** Bytes per token id kept for a held request (prefix strategies: a Uint32Array). */
export const BYTES_PER_TOKEN = 4;
/** Bytes per token id of a prompt sent as ids, in the parsed body's JSON array. */
export const BYTES_PER_BODY_TOKEN_ID = 8;

export interface HeldParts {
  /** The body as received. */
  bodyBytes: number;
  /** Characters of the body decoded as UTF-8 (`parsed.text.length`), when known; else the body is taken as ASCII. */
  textChars?: number;
  /** A second body sent upstream instead of the client's (a tenant's cache salt, a rewrite), when there is one. */
  upstreamBytes?: number;
  /** Token ids kept for the prefix match at dispatch (the router's typed array). */
  tokens?: number;
  /** Token ids of a prompt sent as ids, held by the parsed body as a JS array. */
  bodyTokenIds?: number;
}

/** The bytes a held request retains, as flow control counts them. */
export function heldBytesOf(p: HeldParts): number {
  const chars = p.textChars ?? p.bodyBytes;
  const perChar = chars === p.bodyBytes ? 1 : 2;
  return HELD_OVERHEAD_BYTES + p.bodyBytes + perChar * chars + (p.upstreamBytes ?? 0) + BYTES_PER_TOKEN * (p.tokens ?? 0) + BYTES_PER_BODY_TOKEN_ID * (p.bodyTokenIds ?? 0);
}
