/**
 * Bridges one HTTP generation request to the engine: streams SSE chunks or buffers a JSON body,
 * and turns a client disconnect into an engine abort so the batch slot frees at once (the
 * gateway's release-on-cancel is only observable through `num_requests_running` because of this).
 *
 * The prefill/decode legs hook in at two points: `before` runs ahead of the engine (a decode's KV
 * read or bootstrap wait), `hold` keeps a finished prefill's blocks and decides when and with what
 * the answer goes out. A session can also be cancelled by `/abort_request`, which ends the
 * request cleanly with finish_reason "abort" (unlike an engine restart, which drops the connection).
 */
import type { ServerResponse } from "node:http";
import type { FinishReason, RequestHandle, SimEngine } from "./engine.js";
import { ApiError } from "./errors.js";
import type { GenerationRequest } from "./requests.js";
import {
  type ApiKind,
  fullResponse,
  type ResponseMeta,
  roleChunk,
  sse,
  tokenChunk,
  usage,
  usageChunk,
} from "./responses.js";
import type { GenerationVocab } from "./real-tokenizer.js";
import { outputTokensFor, tokenText } from "./textgen.js";

/** A finished request's blocks, kept until `release()`. */
export interface HeldBlocks {
  blockIds: number[];
  release(): void;
}

export interface GenerationHooks {
  /**
   * Runs before the engine sees the request; `signal` fires when the client leaves or the request
   * is cancelled. Resolves with whether the prompt's KV arrived from elsewhere (and, optionally,
   * where the request's latency metrics start instead of its arrival); rejects with an ApiError to
   * fail the request.
   */
  before?(signal: AbortSignal): Promise<{ prefilled: boolean; arrivedAtMs?: number }>;
  /**
   * Keep the request's blocks after it finishes. `after` gets them (it owns releasing them) and
   * resolves with extra top-level fields for the JSON answer, or rejects with an ApiError; the
   * answer waits for it. `signal` fires when the client leaves or the request is cancelled.
   */
  hold?: { after(kv: HeldBlocks, signal: AbortSignal): Promise<Record<string, unknown>> };
}

export interface GenerationSession {
  /** Ends the request (waiting, running or held) with finish_reason "abort", as SGLang's /abort_request does. */
  cancel(): void;
  /** Drops the connection, as a crashed engine would (a restart); the client-left path frees everything. */
  drop(): void;
  /** Resolves once the response is over, whichever way. */
  readonly done: Promise<void>;
}

export function serveGeneration(
  res: ServerResponse,
  engine: SimEngine,
  gen: GenerationRequest,
  kind: ApiKind,
  requestId: string,
  hooks: GenerationHooks = {},
  /** A real tokenizer's generation words (sim --tokenizer hf:); default: the built-in tokenizer's. */
  vocab?: GenerationVocab,
  /** The answer's shape when it is not chat or completions (the Responses and Messages APIs: stateful-apis.ts). */
  writer?: ResponseWriter,
): GenerationSession {
  const meta: ResponseMeta = {
    kind,
    id: `${kind === "chat" ? "chatcmpl" : "cmpl"}-${requestId}`,
    created: Math.floor(Date.now() / 1000),
    model: gen.model,
  };
  const arrivedAtMs = engine.now();
  const outputTokens = outputTokensFor(gen.promptTokens, gen.maxTokens, gen.seed, vocab?.ids);
  const stop = new AbortController();
  let handle: RequestHandle | undefined;
  let cancelled = false;
  let resolveDone: () => void = () => {};
  const done = new Promise<void>((r) => {
    resolveDone = r;
  });
  const out = writer ? writer(res, gen, requestId, vocab) : generationResponse(res, gen, meta, requestId, vocab);
  const fail = (err: unknown): void => (cancelled ? out.answer("abort") : out.error(err));

  const onFinish = (reason: FinishReason): void => {
    // The engine may finish a request inside submit() itself: on a loaded host its clock runs
    // ahead of the engine's steps between two readings. The handle is assigned once submit returns
    // (a microtask runs after it); if submit threw instead, the request failed there.
    if (handle === undefined) {
      queueMicrotask(() => {
        if (handle !== undefined) onFinish(reason);
      });
      return;
    }
    const h = handle;
    if (reason === "abort") {
      // An abort the client did not ask for (the engine restarted) drops the connection, as a
      // crashed engine would.
      if (cancelled) out.answer("abort");
      else if (!out.over()) res.destroy();
      return;
    }
    if (!hooks.hold) {
      out.answer("length");
      return;
    }
    const kv: HeldBlocks = { blockIds: h.blockIds(), release: () => h.releaseKv() };
    // The client left while the request ran its last step: nobody will read the KV.
    if (out.over() || stop.signal.aborted) {
      kv.release();
      return;
    }
    hooks.hold.after(kv, stop.signal).then((extra) => (cancelled ? out.answer("abort") : out.answer("length", extra)), fail);
  };

  const submit = (prefilled: boolean, startMs = arrivedAtMs): void => {
    handle = engine.submit({
      promptTokens: gen.promptTokens,
      outputTokens,
      cacheSalt: gen.cacheSalt,
      ...(gen.loraName ? { loraName: gen.loraName } : {}),
      ...(gen.priority !== undefined ? { priority: gen.priority } : {}),
      holdKv: hooks.hold !== undefined,
      prefilled,
      arrivedAtMs: startMs,
      onToken: (tokenId, index, _atMs, finish) => out.token(tokenId, index, finish),
      onFinish,
    });
  };

  res.on("close", () => {
    resolveDone();
    if (res.writableEnded) return;
    stop.abort();
    handle?.abort();
  });

  if (hooks.before) {
    hooks.before(stop.signal).then(
      ({ prefilled, arrivedAtMs: startMs }) => {
        if (stop.signal.aborted || out.over()) {
          if (cancelled) out.answer("abort");
          return;
        }
        try {
          submit(prefilled, startMs);
        } catch (err) {
          fail(err);
        }
      },
      (err: unknown) => fail(err),
    );
  } else {
    // Synchronous, so an engine refusal reaches the route's error handler as a plain HTTP error.
    submit(false);
  }

  return {
    done,
    drop: () => {
      if (!res.writableEnded) res.destroy();
    },
    cancel() {
      if (cancelled || out.over()) return;
      cancelled = true;
      stop.abort();
      if (handle) handle.abort();
    },
  };
}

/** Makes the HTTP side of one generation in another API's shape. */
export type ResponseWriter = (res: ServerResponse, gen: GenerationRequest, requestId: string, vocab: GenerationVocab | undefined) => GenerationResponse;

/** The HTTP side of one generation, whatever the engine and the P/D legs do. */
export interface GenerationResponse {
  /** The response is finished or its connection gone: nothing more can be written. */
  over(): boolean;
  /** One generated token: an SSE chunk now (after the role chunk, for chat), or text kept for the JSON body. */
  token(tokenId: number, index: number, finish: FinishReason | undefined): void;
  /** The request's end: the stream's last events, or the JSON body (with `extra`'s top-level fields). */
  answer(finish: "length" | "abort", extra?: Record<string, unknown>): void;
  /** A failure: a JSON error, or once a stream answered 200, an error event that ends it. */
  error(err: unknown): void;
}

/** Streams SSE (headers sent at once) or buffers the text for one JSON body. */
function generationResponse(
  res: ServerResponse,
  gen: GenerationRequest,
  meta: ResponseMeta,
  requestId: string,
  vocab: GenerationVocab | undefined,
): GenerationResponse {
  const promptCount = gen.promptTokens.length;
  let text = "";
  let generated = 0;
  const over = (): boolean => res.writableEnded || res.destroyed;

  if (gen.stream) {
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-request-id": requestId });
    res.flushHeaders();
  }

  return {
    over,
    token(tokenId, index, finish) {
      generated = index + 1;
      const piece = vocab ? vocab.text(tokenId) : tokenText(tokenId);
      if (!gen.stream) {
        text += piece;
        return;
      }
      if (index === 0 && meta.kind === "chat") res.write(sse(roleChunk(meta)));
      res.write(sse(tokenChunk(meta, piece, finish)));
    },
    answer(finish, extra = {}) {
      if (over()) return;
      const u = usage(promptCount, generated);
      if (gen.stream) {
        if (finish === "abort") res.write(sse(tokenChunk(meta, "", "abort")));
        if (gen.includeUsage) res.write(sse(usageChunk(meta, u)));
        res.end(sse("[DONE]"));
        return;
      }
      const body = JSON.stringify({ ...fullResponse(meta, text, finish, u), ...extra });
      res.writeHead(200, { "content-type": "application/json", "x-request-id": requestId }).end(body);
    },
    error(err) {
      if (over()) return;
      const e = err instanceof ApiError ? err : new ApiError(500, "InternalServerError", String((err as Error)?.message ?? err));
      // A stream already answered 200: the error goes out as an event, then the stream ends.
      if (res.headersSent) {
        res.end(sse(e.body()) + sse("[DONE]"));
        return;
      }
      res.writeHead(e.status, { "content-type": "application/json", "x-request-id": requestId }).end(JSON.stringify(e.body()));
    },
  };
}
