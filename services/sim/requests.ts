/**
 * Validation of OpenAI-style request bodies into what the engine needs, with vLLM's error
 * wording where a client (or the gateway) might match on it.
 */
import { type ChatMessage, tokenizeChat, tokenizePrompt, VOCAB_SIZE } from "../tokenizer/sim-tokenizer.js";
import { badRequest, modelNotFound } from "./errors.js";

/** OpenAI's default for completions; vLLM's chat default (the rest of the context) would make demo replies endless. */
export const DEFAULT_MAX_TOKENS = 16;

export interface ServedModel {
  name: string;
  maxModelLen: number;
  /** Ids at or above this are out of vocabulary (default: the built-in tokenizer's; a real tokenizer's with --tokenizer hf:). */
  vocabSize?: number;
}

export interface GenerationRequest {
  model: string;
  /** The LoRA adapter the request runs with (services/sim/lora.ts). */
  loraName?: string;
  promptTokens: number[];
  maxTokens: number;
  stream: boolean;
  includeUsage: boolean;
  seed: number | undefined;
  /** vLLM's per-request prefix-cache isolation key. */
  cacheSalt: string | undefined;
  /** The body's `priority` (both engines' field), absent when the body has none or null. */
  priority?: number;
}

type Body = Record<string, unknown>;

export function asObject(body: unknown): Body {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw badRequest("Request body must be a JSON object");
  return body as Body;
}

/** vLLM treats an absent `model` as the served model; a different name is a 404. */
export function checkModel(body: Body, served: ServedModel): string {
  const model = body.model;
  if (model === undefined || model === null) return served.name;
  if (typeof model !== "string") throw badRequest("model: Input should be a valid string", "model");
  if (model !== served.name) throw modelNotFound(model);
  return model;
}

export function parseMessages(body: Body): ChatMessage[] {
  const messages = body.messages;
  if (messages === undefined) throw badRequest("messages: Field required", "messages");
  if (!Array.isArray(messages) || messages.length === 0) {
    throw badRequest("messages: Input should be a non-empty list", "messages");
  }
  for (const [i, m] of messages.entries()) {
    if (typeof m !== "object" || m === null || typeof (m as Body).role !== "string") {
      throw badRequest(`messages.${i}.role: Field required`, "messages");
    }
    const content = (m as Body).content;
    if (content !== undefined && content !== null && typeof content !== "string" && !Array.isArray(content)) {
      throw badRequest(`messages.${i}.content: Input should be a valid string or list of parts`, "messages");
    }
    // As vLLM's request validation: every part an object with a string `type`, text parts with a string `text`.
    if (Array.isArray(content)) {
      for (const [j, part] of content.entries()) {
        const p = part as { type?: unknown; text?: unknown } | null;
        if (typeof p !== "object" || p === null || typeof p.type !== "string") {
          throw badRequest(`messages.${i}.content.${j}: Input should be a valid content part (an object with a type)`, "messages");
        }
        if (p.type === "text" && typeof p.text !== "string") throw badRequest(`messages.${i}.content.${j}.text: Input should be a valid string`, "messages");
      }
    }
  }
  return messages as ChatMessage[];
}

export function optionalBool(body: Body, key: string, fallback: boolean): boolean {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "boolean") throw badRequest(`${key}: Input should be a valid boolean`, key);
  return v;
}

function optionalInt(body: Body, key: string): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v)) throw badRequest(`${key}: Input should be a valid integer`, key);
  return v;
}

/** vLLM bounds `priority` to int64 (`ge=-(2**63)`, `le=2**63-1`); SGLang's `Optional[int]` is unbounded, JSON numbers are not. */
const PRIORITY_BOUND = 2 ** 63;

/** `priority`: an integer (both engines' request field; docs/engine-priority.md), or absent. */
export function parsePriority(body: Body): number | undefined {
  const v = optionalInt(body, "priority");
  if (v === undefined) return undefined;
  if (v < -PRIORITY_BOUND) throw badRequest("priority: Input should be greater than or equal to -9223372036854775808", "priority");
  if (v >= PRIORITY_BOUND) throw badRequest("priority: Input should be less than or equal to 9223372036854775807", "priority");
  return v;
}

export function tokenIds(value: unknown, param: string, vocabSize = VOCAB_SIZE): number[] | undefined {
  if (!Array.isArray(value) || !value.every((x) => typeof x === "number")) return undefined;
  for (const id of value as number[]) {
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) throw badRequest(`Token id ${id} is out of vocabulary`, param);
  }
  return value as number[];
}

function completionPrompt(body: Body, served: ServedModel, realTokens: number[] | undefined): number[] {
  let prompt = body.prompt;
  if (prompt === undefined || prompt === null) throw badRequest("prompt: Field required", "prompt");
  // A batch of one is common in clients; larger batches are outside what the simulator models.
  if (Array.isArray(prompt) && prompt.length === 1 && (typeof prompt[0] === "string" || Array.isArray(prompt[0]))) {
    prompt = prompt[0];
  }
  if (typeof prompt === "string") return realTokens ?? tokenizePrompt(prompt, { addSpecialTokens: true });
  const ids = tokenIds(prompt, "prompt", served.vocabSize);
  if (ids && ids.length > 0) return ids;
  throw badRequest("prompt: a single string or a single list of token ids is supported", "prompt");
}

/**
 * The fields every generation API shares (stream, `cache_salt`, `priority`, `seed`, the context
 * bound). `maxKeys`: the body fields naming the output bound, first found wins.
 */
const CHAT_MAX_KEYS = ["max_completion_tokens", "max_tokens"] as const;

export function generationFields(body: Body, served: ServedModel, model: string, promptTokens: number[], maxKeys: readonly string[] = CHAT_MAX_KEYS): GenerationRequest {
  let maxTokens = DEFAULT_MAX_TOKENS;
  let maxKey = maxKeys[maxKeys.length - 1] ?? "max_tokens";
  for (const k of maxKeys) {
    const v = optionalInt(body, k);
    if (v !== undefined) {
      maxTokens = v;
      maxKey = k;
      break;
    }
  }
  // Chat and completions name `max_tokens` whichever of the two was sent, as vLLM does.
  if (maxKeys === CHAT_MAX_KEYS) maxKey = "max_tokens";
  if (maxTokens < 1) throw badRequest(`${maxKey} must be at least 1, got ${maxTokens}.`, maxKey);
  const n = optionalInt(body, "n") ?? 1;
  if (n !== 1) throw badRequest("n: only n=1 is supported by the simulator", "n");
  const stream = optionalBool(body, "stream", false);
  const options = body.stream_options;
  if (options !== undefined && options !== null) {
    if (!stream) throw badRequest("Stream options can only be defined when `stream=True`.", "stream_options");
    if (typeof options !== "object") throw badRequest("stream_options: Input should be an object", "stream_options");
  }
  const includeUsage = optionalBool((options ?? {}) as Body, "include_usage", false);
  const total = promptTokens.length + maxTokens;
  if (total > served.maxModelLen) {
    throw badRequest(
      `This model's maximum context length is ${served.maxModelLen} tokens. However, you requested ${total} tokens ` +
        `(${promptTokens.length} in the messages, ${maxTokens} in the completion). ` +
        "Please reduce the length of the messages or completion.",
    );
  }
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null && (typeof salt !== "string" || salt === "")) {
    throw badRequest("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt");
  }
  const cacheSalt = typeof salt === "string" ? salt : undefined;
  const priority = parsePriority(body);
  return { model, promptTokens, maxTokens, stream, includeUsage, seed: optionalInt(body, "seed"), cacheSalt, ...(priority !== undefined ? { priority } : {}) };
}

/** `realTokens`: the prompt's ids from a real tokenizer (sim --tokenizer hf:), instead of the built-in one. */
export function parseChatRequest(raw: unknown, served: ServedModel, realTokens?: number[]): GenerationRequest {
  const body = asObject(raw);
  const model = checkModel(body, served);
  const messages = parseMessages(body);
  const promptTokens =
    realTokens ??
    tokenizeChat(messages, {
      addGenerationPrompt: optionalBool(body, "add_generation_prompt", true),
      addSpecialTokens: optionalBool(body, "add_special_tokens", false),
    });
  return generationFields(body, served, model, promptTokens);
}

export function parseCompletionRequest(raw: unknown, served: ServedModel, realTokens?: number[]): GenerationRequest {
  const body = asObject(raw);
  const model = checkModel(body, served);
  return generationFields(body, served, model, completionPrompt(body, served, realTokens));
}

/** `/tokenize` in both of vLLM's forms: `{prompt, add_special_tokens=true}` or `{messages, add_generation_prompt=true}`. */
export function parseTokenizeRequest(raw: unknown, served: ServedModel): number[] {
  const body = asObject(raw);
  checkModel(body, served);
  if (body.messages !== undefined) {
    return tokenizeChat(parseMessages(body), {
      addGenerationPrompt: optionalBool(body, "add_generation_prompt", true),
      addSpecialTokens: optionalBool(body, "add_special_tokens", false),
    });
  }
  if (typeof body.prompt !== "string") throw badRequest("prompt: Field required", "prompt");
  return tokenizePrompt(body.prompt, { addSpecialTokens: optionalBool(body, "add_special_tokens", true) });
}

export function parseDetokenizeRequest(raw: unknown, served: ServedModel): number[] {
  const body = asObject(raw);
  checkModel(body, served);
  const ids = tokenIds(body.tokens, "tokens", served.vocabSize);
  if (!ids) throw badRequest("tokens: Input should be a valid list of integers", "tokens");
  return ids;
}
