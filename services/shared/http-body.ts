/**
 * Reading an HTTP response body with a cap: engines' `/tokenize` and `/metrics` answers are input
 * from outside the gateway, and a broken or hostile endpoint must not make it buffer without bound.
 */

export class BodyTooLargeError extends Error {
  override name = "BodyTooLargeError";
  constructor(
    readonly what: string,
    readonly limit: number,
  ) {
    super(`${what} is larger than ${limit} bytes`);
  }
}

/**
 * The body cap rule, the pure part: is an answer refused before its body is read? Yes when its
 * `content-length` declares more than `limit` bytes. A missing or unreadable header refuses
 * nothing (chunked answers have none): the reader still counts every byte it takes, and stops at
 * `limit` whatever was declared (a decoded body can be longer than its header said).
 */
export function declaredTooLarge(contentLength: string | readonly string[] | null | undefined, limit: number): boolean {
  const v = Array.isArray(contentLength) ? contentLength[0] : contentLength;
  if (typeof v !== "string" || !/^\s*\d+\s*$/.test(v)) return false;
  return Number(v) > limit;
}

/** Drops an answer's body unread (an engine's error body: its status is all a caller uses), closing the connection if it was still coming. */
export async function discardBody(res: Response): Promise<void> {
  await res.body?.cancel().catch(() => undefined);
}

/**
 * A response body as text, read as a stream up to `limit` bytes: past it, the stream is cancelled
 * (the connection closes) and `BodyTooLargeError` is thrown. `content-length` is checked first to
 * refuse early (declaredTooLarge), but not trusted alone.
 */
export async function readBodyCapped(res: Response, limit: number, what: string): Promise<string> {
  if (declaredTooLarge(res.headers.get("content-length"), limit)) {
    await res.body?.cancel().catch(() => undefined);
    throw new BodyTooLargeError(what, limit);
  }
  if (!res.body) return "";
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > limit) {
      await reader.cancel().catch(() => undefined);
      throw new BodyTooLargeError(what, limit);
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks, total).toString("utf8");
}
