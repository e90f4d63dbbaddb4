/**
 * Reading what routing needs out of an OpenAI request body: the model and a prompt size.
 * Pure; the parse error becomes a 400 with a message naming what is wrong.
 */
import { RouteError } from "./errors.js";

export interface ParsedRequest {
  model: string;
  stream: boolean;
  /** Rough prompt size in tokens (≈ 4 characters per token) until a tokenizer is wired in. */
  promptTokens: number;
  maxTokens?: number;
  body: Record<string, unknown>;
}

/** Paths whose bodies name a model and may be routed. */
export const ROUTED_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"] as const;

function textLength(v: unknown): number {
  if (typeof v === "string") return v.length;
  if (Array.isArray(v)) return v.reduce((n: number, x) => n + textLength(x), 0);
  if (v && typeof v === "object") {
    const o = v as Record<string, unknown>;
    return textLength(o.content) + textLength(o.text);
  }
  return 0;
}

export function parseRequestBody(raw: Uint8Array): ParsedRequest {
  let body: unknown;
  try {
    body = JSON.parse(Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString("utf8"));
  } catch (err) {
    throw new RouteError("invalidJson", `request body is not valid JSON: ${(err as Error).message}`);
  }
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new RouteError("invalidBody", "request body must be a JSON object");
  }
  const b = body as Record<string, unknown>;
  if (typeof b.model !== "string" || b.model.length === 0) {
    throw new RouteError("missingModel", "the request body has no `model` (a non-empty string is required)", "model");
  }
  const chars = textLength(b.messages) + textLength(b.prompt) + textLength(b.input);
  const maxTokens = typeof b.max_completion_tokens === "number" ? b.max_completion_tokens : typeof b.max_tokens === "number" ? b.max_tokens : undefined;
  return { model: b.model, stream: b.stream === true, promptTokens: Math.ceil(chars / 4), maxTokens, body: b };
}
