/**
 * Bridges one HTTP generation request to the engine: streams SSE chunks or buffers a JSON body,
 * and turns a client disconnect into an engine abort so the batch slot frees at once (the
 * gateway's release-on-cancel is only observable through `num_requests_running` because of this).
 */
import type { ServerResponse } from "node:http";
import type { SimEngine } from "./engine.js";
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

export function serveGeneration(
  res: ServerResponse,
  engine: SimEngine,
  gen: GenerationRequest,
  kind: ApiKind,
  requestId: string,
  /** A real tokenizer's generation words (sim --tokenizer hf:); default: the built-in tokenizer's. */
  vocab?: GenerationVocab,
): void {
  const meta: ResponseMeta = {
    kind,
    id: `${kind === "chat" ? "chatcmpl" : "cmpl"}-${requestId}`,
    created: Math.floor(Date.now() / 1000),
    model: gen.model,
  };
  const outputTokens = outputTokensFor(gen.promptTokens, gen.maxTokens, gen.seed, vocab?.ids);
  const promptCount = gen.promptTokens.length;
  let text = "";
  let generated = 0;

  if (gen.stream) {
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-request-id": requestId });
    res.flushHeaders();
  }

  const handle = engine.submit({
    promptTokens: gen.promptTokens,
    outputTokens,
    cacheSalt: gen.cacheSalt,
    onToken(tokenId, index, _atMs, finish) {
      generated = index + 1;
      const piece = vocab ? vocab.text(tokenId) : tokenText(tokenId);
      if (!gen.stream) {
        text += piece;
        return;
      }
      if (index === 0 && kind === "chat") res.write(sse(roleChunk(meta)));
      res.write(sse(tokenChunk(meta, piece, finish)));
    },
    onFinish(reason) {
      if (res.writableEnded || res.destroyed) return;
      // An abort the client did not cause (the engine restarted) drops the connection, as a
      // crashed engine would.
      if (reason === "abort") {
        res.destroy();
        return;
      }
      const u = usage(promptCount, generated);
      if (gen.stream) {
        if (gen.includeUsage) res.write(sse(usageChunk(meta, u)));
        res.end(sse("[DONE]"));
        return;
      }
      const body = JSON.stringify(fullResponse(meta, text, reason, u));
      res.writeHead(200, { "content-type": "application/json", "x-request-id": requestId }).end(body);
    },
  });

  res.on("close", () => {
    if (!res.writableEnded) handle.abort();
  });
}
