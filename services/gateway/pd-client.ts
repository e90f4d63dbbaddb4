/**
 * The gateway's HTTP client for P/D prefill legs and SGLang `/abort_request`: one keep-alive
 * undici Pool per pod address (connections reused across requests — a new TCP handshake per leg
 * would cost more than the routing), a deadline per call, answers read up to a byte bound.
 * Failures become `LegError`s the legs stage decides on (stages/pd-bodies.ts `retryPrefill`).
 */
import type { Readable } from "node:stream";
import { Agent, errors } from "undici";
import { declaredTooLarge } from "../shared/http-body.js";
import { LegError, type LegAnswer, type LegClient } from "../routing/mod.js";

export interface PdClientOptions {
  /** Largest answer read (a prefill answer is one token plus the transfer params). */
  maxAnswerBytes?: number;
  /** Keep-alive connections per pod. */
  connectionsPerPod?: number;
  /** Sent as `authorization: Bearer …` on every leg (engines started with an API key). */
  engineApiKey?: string;
}

export class PdHttpClient implements LegClient {
  private readonly agent: Agent;
  private readonly maxAnswer: number;
  private readonly auth: Readonly<Record<string, string>>;

  constructor(o: PdClientOptions = {}) {
    this.maxAnswer = o.maxAnswerBytes ?? 1024 * 1024;
    this.auth = o.engineApiKey ? { authorization: `Bearer ${o.engineApiKey}` } : {};
    // Below uvicorn's 5 s keep-alive (vLLM, SGLang): a request never lands on a socket the engine is closing.
    this.agent = new Agent({ connections: o.connectionsPerPod ?? 64, keepAliveTimeout: 4_000, keepAliveMaxTimeout: 4_000, pipelining: 1 });
  }

  async post(address: string, path: string, body: Buffer, headers: Readonly<Record<string, string>>, o: { signal?: AbortSignal; timeoutMs: number }): Promise<LegAnswer> {
    // One deadline for the whole attempt (queueing for a connection, connecting, headers and
    // body): a plain timer on the call's own controller, cleared when it ends, and the caller's
    // signal forwarded to it. (`AbortSignal.timeout` + `AbortSignal.any` per leg cost more than
    // the rest of the call's setup; undici's own header/body timeouts count neither the wait for
    // a socket nor a body that keeps trickling.)
    const call = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      call.abort();
    }, o.timeoutMs);
    const forward = () => call.abort();
    o.signal?.addEventListener("abort", forward, { once: true });
    if (o.signal?.aborted) call.abort();
    try {
      const res = await this.agent.request({
        origin: `http://${address}`,
        path,
        method: "POST",
        headers: { ...headers, ...this.auth, "content-length": String(body.length) },
        body,
        signal: call.signal,
      });
      // An answer declaring more than the bound is refused before a byte of it is read.
      if (declaredTooLarge(res.headers["content-length"], this.maxAnswer)) {
        // undici's body emits an AbortError when destroyed unread: heard here, not as an uncaught error.
        res.body.on("error", () => undefined).destroy();
        throw new LegError({ kind: "connect", code: "answer-too-large" });
      }
      return { status: res.statusCode, body: await readBounded(res.body, this.maxAnswer) };
    } catch (err) {
      if (err instanceof LegError) throw err;
      if (o.signal?.aborted) throw new LegError({ kind: "cancelled" });
      if (timedOut || err instanceof errors.HeadersTimeoutError || err instanceof errors.BodyTimeoutError) throw new LegError({ kind: "timeout" });
      const code = (err as NodeJS.ErrnoException).code ?? (err as Error).name ?? "error";
      throw new LegError({ kind: "connect", code: String(code).slice(0, 64) });
    } finally {
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", forward);
    }
  }

  /** Ends every leg still in flight (shutdown: nothing waits for a prefill whose request is over). */
  close(): Promise<void> {
    return this.agent.destroy();
  }
}

/** The answer's bytes, up to `max` (beyond: the body is dropped and the leg fails). Event listeners, not an async iterator: one leg, one promise. */
function readBounded(body: Readable, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    body.on("data", (c: Buffer) => {
      size += c.length;
      if (size > max) {
        body.destroy();
        reject(new LegError({ kind: "connect", code: "answer-too-large" }));
        return;
      }
      chunks.push(c);
    });
    body.once("end", () => resolve(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size)));
    body.once("error", reject);
  });
}
