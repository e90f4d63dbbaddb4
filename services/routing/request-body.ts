/**
 * Reading what routing needs out of an OpenAI request body: the model, a prompt size, the output
 * bound. Pure. Everything here is client input, so it is checked before any of it reaches a
 * subject, a metric label, a log line or an event another replica must validate: a mistake
 * becomes a 400 whose message and `param` name the field.
 */
import { MAX_COUNT } from "../../schemas/events.js";
import { ApiShapeError, messagesToChat, renderedChars, responsesToChat } from "../tokenizer/api-messages.js";
import { type TokenIds, tokenIdsOf } from "../tokenizer/prompt-tokens.js";
import { isTokenId, MAX_TOKEN_ID } from "../tokenizer/token-id.js";
import { RouteError } from "./errors.js";

/**
 * The API a routed request speaks, by its path: OpenAI chat / completions / embeddings, the
 * Responses API (`/v1/responses`) or Anthropic's Messages API (`/v1/messages`). The last two are
 * rendered to the chat prompt the engine builds (services/tokenizer/api-messages.ts).
 */
export type RequestApi = "chat" | "completions" | "embeddings" | "responses" | "messages";

export interface ParsedRequest {
  model: string;
  /** The API by path (`apiOfPath`); absent = chat-shaped (chat, completions, embeddings bodies all parse alike). */
  api?: "responses" | "messages";
  /** Responses API: the response this one continues (checked: a printable string of at most MAX_RESPONSE_ID_LENGTH). */
  previousResponseId?: string;
  /** Responses API: `store` (default true; false = the response is kept nowhere). */
  store?: boolean;
  stream: boolean;
  /** Prompt size in tokens: exact for token-id prompts, else ≈ 4 characters per token until a tokenizer runs. */
  promptTokens: number;
  maxTokens?: number;
  /** The prompt as token ids, when the client sent them (`/v1/completions`): prefix matching uses them as they are (copied once into the router's typed array). */
  promptTokenIds?: TokenIds;
  /** Token ids the parsed body holds in its JSON arrays (a prompt or embeddings input sent as ids: every list of a batch), for flow control's held bytes. */
  bodyTokenIds?: number;
  /** vLLM's `cache_salt`: the engine shares cached blocks only between requests with the same salt, and so does the router's prefix matching. */
  cacheSalt?: string;
  body: Record<string, unknown>;
  /** The body's text as decoded for the parse (UTF-8), for scans of the raw JSON; describes `body` only as parsed from it. */
  text?: string;
}

/** Paths whose bodies name a model and may be routed. */
export const ROUTED_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"] as const;

/** The API of a request path (query string ignored; sub-paths such as `/v1/messages/count_tokens` are their API's, for the error shape). */
export function apiOfPath(path: string | undefined): RequestApi {
  const p = (path ?? "").split("?")[0] ?? "";
  if (p === "/v1/responses" || p.startsWith("/v1/responses/")) return "responses";
  if (p === "/v1/messages" || p.startsWith("/v1/messages/")) return "messages";
  if (p === "/v1/completions") return "completions";
  if (p === "/v1/embeddings") return "embeddings";
  return "chat";
}

/** Longest `previous_response_id` accepted (engine ids are ~37 characters; records and lookups carry it). */
export const MAX_RESPONSE_ID_LENGTH = 256;

/** Longest model name accepted (subjects escape it, so a long one would grow every subject). */
export const MAX_MODEL_LENGTH = 256;
/** Deepest nesting of arrays and objects accepted in a body. */
export const MAX_BODY_DEPTH = 64;
/** Longest `cache_salt` accepted (vLLM sets none; a tenant salt needs a few dozen characters). */
export const MAX_CACHE_SALT_LENGTH = 256;

/** A non-empty name of at most MAX_MODEL_LENGTH characters without control characters. */
export function isModelName(s: string): boolean {
  if (s.length === 0 || s.length > MAX_MODEL_LENGTH) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x7f) return false;
  }
  return true;
}
/** Message content part types with text (counted) and without (images, audio, files: no text to count). */
const TEXT_PARTS = new Set(["text", "input_text"]);
const OTHER_PARTS = new Set(["image_url", "input_audio", "file", "image", "audio", "video_url", "refusal"]);

const bad = (message: string, param: string | null = null): RouteError => new RouteError("invalidBody", message, param);

/** Deepest nesting of a parsed JSON value, walked without recursion (a client can nest thousands deep). */
function depthOf(v: unknown, limit: number): number {
  let max = 0;
  const stack: Array<[unknown, number]> = [[v, 1]];
  while (stack.length > 0) {
    const [x, d] = stack.pop() as [unknown, number];
    if (x === null || typeof x !== "object") continue;
    if (d > max) max = d;
    if (max > limit) return max;
    for (const c of Array.isArray(x) ? x : Object.values(x)) if (c !== null && typeof c === "object") stack.push([c, d + 1]);
  }
  return max;
}

/** Characters of text in chat messages, checking each message's shape. */
function messagesText(messages: unknown): number {
  if (!Array.isArray(messages)) throw bad("`messages` must be an array of messages", "messages");
  let n = 0;
  messages.forEach((m, i) => {
    const at = `messages[${i}]`;
    if (!m || typeof m !== "object" || Array.isArray(m)) throw bad(`${at} must be an object`, at);
    const { role, content } = m as { role?: unknown; content?: unknown };
    if (typeof role !== "string" || role.length === 0) throw bad(`${at}.role must be a non-empty string`, `${at}.role`);
    if (typeof content === "string") n += content.length;
    else if (Array.isArray(content)) {
      content.forEach((p, j) => {
        const pat = `${at}.content[${j}]`;
        if (!p || typeof p !== "object" || Array.isArray(p)) throw bad(`${pat} must be a content part object (got ${p === null ? "null" : typeof p})`, pat);
        const { type, text } = p as { type?: unknown; text?: unknown };
        if (typeof type !== "string") throw bad(`${pat}.type must be a string`, `${pat}.type`);
        if (TEXT_PARTS.has(type)) {
          if (typeof text !== "string") throw bad(`${pat}.text must be a string`, `${pat}.text`);
          n += text.length;
        } else if (!OTHER_PARTS.has(type)) throw bad(`${pat}.type ${JSON.stringify(type.slice(0, 64))} is not a known content part type`, `${pat}.type`);
      });
    } else if (content !== null && content !== undefined) throw bad(`${at}.content must be a string, an array of content parts or null`, `${at}.content`);
  });
  return n;
}

/**
 * A completion `prompt`: a string, a list of strings, a list of token ids, or a list of token-id
 * lists (the batch forms count every prompt; only the first is used for prefix matching, and
 * `ids` is that first list as sent: the caller copies it into the router's type if it needs it).
 */
function promptOf(prompt: unknown): { chars: number; tokens: number; ids?: number[] } {
  if (typeof prompt === "string") return { chars: prompt.length, tokens: 0 };
  if (!Array.isArray(prompt)) throw bad("`prompt` must be a string, an array of strings, an array of token ids or an array of token-id arrays", "prompt");
  if (prompt.length === 0) return { chars: 0, tokens: 0 };
  if (prompt.every((p) => typeof p === "string")) return { chars: (prompt as string[]).reduce((a, p) => a + p.length, 0), tokens: 0 };
  if (prompt.every(isTokenId)) return { chars: 0, tokens: prompt.length, ids: prompt as number[] };
  if (prompt.every((p) => Array.isArray(p) && p.every(isTokenId))) {
    const lists = prompt as number[][];
    return { chars: 0, tokens: lists.reduce((a, p) => a + p.length, 0), ...(lists[0] ? { ids: lists[0] } : {}) };
  }
  throw bad(`\`prompt\` mixes strings, token ids and lists, or has ids that are not integers from 0 to ${MAX_TOKEN_ID}`, "prompt");
}

/** Characters of an embeddings `input` (a string, strings, or token ids — counted as tokens). */
function inputOf(input: unknown): { chars: number; tokens: number } {
  if (input === undefined || input === null) return { chars: 0, tokens: 0 };
  const p = promptOf(input);
  return { chars: p.chars, tokens: p.tokens };
}

/**
 * `cache_salt`: absent or null (no salt), else what vLLM accepts (a non-empty string), bounded here
 * and well-formed UTF-16 (the engine re-encodes it as UTF-8 in its KV events; a lone surrogate
 * would not survive that, and the router's key would differ from the engine's).
 */
// With the `u` flag a surrogate pair is one code point: only lone surrogates match.
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

function cacheSaltOf(b: Record<string, unknown>): string | undefined {
  const v = b.cache_salt;
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string" || v.length === 0) throw bad("`cache_salt` must be a non-empty string if provided", "cache_salt");
  if (v.length > MAX_CACHE_SALT_LENGTH) throw bad(`\`cache_salt\` is ${v.length} characters long; at most ${MAX_CACHE_SALT_LENGTH} are allowed`, "cache_salt");
  if (LONE_SURROGATE.test(v)) throw bad("`cache_salt` must be well-formed Unicode (it has a lone surrogate)", "cache_salt");
  return v;
}

function positiveInt(b: Record<string, unknown>, key: string): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1 || v > MAX_COUNT) throw bad(`\`${key}\` must be a positive integer of at most ${MAX_COUNT}, got ${JSON.stringify(v).slice(0, 32)}`, key);
  return v;
}

/** `previous_response_id`: absent/null, or a printable string of at most MAX_RESPONSE_ID_LENGTH. */
function previousResponseIdOf(b: Record<string, unknown>): string | undefined {
  const v = b.previous_response_id;
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string" || !isModelName(v) || v.length > MAX_RESPONSE_ID_LENGTH) {
    throw bad(`\`previous_response_id\` must be a non-empty printable string of at most ${MAX_RESPONSE_ID_LENGTH} characters`, "previous_response_id");
  }
  return v;
}

/**
 * A Responses or Messages body: its shape checked by rendering it as the engine will (a mistake is
 * a 400 naming the field), the prompt size from the rendered text, the output bound from
 * `max_output_tokens` (Responses) or the required `max_tokens` (Messages).
 */
function statefulApiFields(b: Record<string, unknown>, api: "responses" | "messages"): { chars: number; maxTokens?: number; extra: Partial<ParsedRequest> } {
  let chars: number;
  try {
    chars = renderedChars(api === "responses" ? responsesToChat(b) : messagesToChat(b));
  } catch (err) {
    if (err instanceof ApiShapeError) throw bad(err.message, err.param);
    throw err;
  }
  if (api === "messages") {
    if (b.max_tokens === undefined || b.max_tokens === null) throw bad("`max_tokens` is required", "max_tokens");
    return { chars, ...optional("maxTokens", positiveInt(b, "max_tokens")), extra: { api } };
  }
  if (b.store !== undefined && b.store !== null && typeof b.store !== "boolean") throw bad("`store` must be a boolean", "store");
  const previousResponseId = previousResponseIdOf(b);
  return {
    chars,
    ...optional("maxTokens", positiveInt(b, "max_output_tokens")),
    extra: { api, ...(previousResponseId !== undefined ? { previousResponseId } : {}), ...(typeof b.store === "boolean" ? { store: b.store } : {}) },
  };
}

const optional = <K extends string, V>(k: K, v: V | undefined): Partial<Record<K, V>> => (v === undefined ? {} : ({ [k]: v } as Record<K, V>));

/** `api`: the request's API by path (`apiOfPath`); the default parses chat, completions and embeddings bodies. */
export function parseRequestBody(raw: Uint8Array, api: RequestApi = "chat"): ParsedRequest {
  let body: unknown;
  let text: string;
  try {
    text = Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString("utf8");
    body = JSON.parse(text);
  } catch (err) {
    throw new RouteError("invalidJson", `request body is not valid JSON: ${(err as Error).message.slice(0, 200)}`);
  }
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new RouteError("invalidBody", "request body must be a JSON object");
  }
  if (depthOf(body, MAX_BODY_DEPTH) > MAX_BODY_DEPTH) throw bad(`request body nests deeper than ${MAX_BODY_DEPTH} levels`);
  const b = body as Record<string, unknown>;
  if (typeof b.model !== "string" || b.model.length === 0) {
    throw new RouteError("missingModel", "the request body has no `model` (a non-empty string is required)", "model");
  }
  if (!isModelName(b.model)) {
    throw bad(`\`model\` must be at most ${MAX_MODEL_LENGTH} printable characters`, "model");
  }
  const cacheSalt0 = cacheSaltOf(b);
  if (api === "responses" || api === "messages") {
    const f = statefulApiFields(b, api);
    return {
      model: b.model,
      stream: b.stream === true,
      promptTokens: Math.ceil(f.chars / 4),
      ...(f.maxTokens !== undefined ? { maxTokens: f.maxTokens } : {}),
      ...(cacheSalt0 !== undefined ? { cacheSalt: cacheSalt0 } : {}),
      ...f.extra,
      body: b,
      text,
    };
  }
  let chars = 0;
  let tokens = 0;
  let promptTokenIds: TokenIds | undefined;
  if (b.messages !== undefined) chars += messagesText(b.messages);
  if (b.prompt !== undefined) {
    const p = promptOf(b.prompt);
    chars += p.chars;
    tokens += p.tokens;
    if (p.ids) promptTokenIds = tokenIdsOf(p.ids);
  }
  if (b.input !== undefined) {
    const p = inputOf(b.input);
    chars += p.chars;
    tokens += p.tokens;
  }
  const maxCompletion = positiveInt(b, "max_completion_tokens");
  const max = positiveInt(b, "max_tokens");
  positiveInt(b, "n");
  const maxTokens = maxCompletion ?? max;
  const cacheSalt = cacheSalt0;
  return {
    model: b.model,
    stream: b.stream === true,
    promptTokens: tokens + Math.ceil(chars / 4),
    ...(maxTokens !== undefined ? { maxTokens } : {}),
    ...(promptTokenIds ? { promptTokenIds } : {}),
    ...(tokens > 0 ? { bodyTokenIds: tokens } : {}),
    ...(cacheSalt !== undefined ? { cacheSalt } : {}),
    body: b,
    text,
  };
}

/** Longest `user` header accepted (the charge and decision schemas' bound). */
export const MAX_USER_LENGTH = 256;
/** Longest `x-request-id` accepted (decision records carry it as their id). */
export const MAX_REQUEST_ID_LENGTH = 253;
