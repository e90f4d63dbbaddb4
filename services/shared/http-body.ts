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
 * A response body as text, read as a stream up to `limit` bytes: past it, the stream is cancelled
 * (the connection closes) and `BodyTooLargeError` is thrown. `content-length` is checked first to
 * refuse early, but not trusted alone: chunked answers have none, and decoded bodies can be longer.
 */
export async function readBodyCapped(res: Response, limit: number, what: string): Promise<string> {
  const declared = Number(res.headers.get("content-length") ?? Number.NaN);
  if (declared > limit) {
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
