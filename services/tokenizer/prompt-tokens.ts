/**
 * Prompt token ids for prefix matching, in the two modes that need no engine: `local` (the
 * simulator's deterministic tokenizer and chat template — the same ids the simulated engines
 * compute) and `approximate` (fixed-size character chunks: no tokenizer at all, for engines that
 * publish no KV events; matches only other requests routed by the gateways). Pure. The other two
 * modes: `remote` (the engine's /tokenize) and `hf` (a real model's tokenizer, hf-tokenizer.ts).
 */
import { type ChatMessage, fnv1a32, tokenizeChat, tokenizePrompt } from "./sim-tokenizer.js";
import { rawToolJsonInexact, rawToolJsonScanNeeded } from "./tool-json.js";
import { messagesToChat, type RenderedChat, responsesToChat } from "./api-messages.js";

export type TokenizerMode = "remote" | "local" | "approximate" | "hf";

/**
 * The router's token ids: a prompt's ids as one typed array, from the tokenizer through the
 * routing core's prefix match and block hashing (4 bytes a token, copied as memory; no JS array
 * of a 100k-token prompt is built on the request path). Ids are unsigned 32-bit, as the router's
 * block hash reads them (block-hash.ts).
 */
export type TokenIds = Uint32Array;

/**
 * Ids given as numbers (an engine's answer, a body's prompt ids, checked with `isTokenId` of token-id.ts first)
 * as the router's type. Copied element by element: V8's `new Uint32Array(array)`
 * and `typed.set(array)` take a generic path (~5 ms and ~2 ms for 130k ids on this machine, where a
 * plain loop takes ~0.2 ms).
 */
export function tokenIdsOf(ids: ArrayLike<number>): TokenIds {
  if (ids instanceof Uint32Array) return ids;
  const out = new Uint32Array(ids.length);
  for (let i = 0; i < ids.length; i++) out[i] = ids[i] as number;
  return out;
}

/** Typed ids as a plain array (for JSON answers and events), element by element: `Array.from` of a typed array walks an iterator (~24 ms for 130k ids here, a loop ~4 ms). */
export function plainIds(ids: ArrayLike<number>): number[] {
  const out = new Array<number>(ids.length);
  for (let i = 0; i < ids.length; i++) out[i] = ids[i] as number;
  return out;
}

/** How a model's prompts are tokenized, as configured: a mode, or `hf:<dir>` (a Hugging Face tokenizer directory). */
export type TokenizerSetting = Exclude<TokenizerMode, "hf"> | `hf:${string}`;

/** The directory of an `hf:<dir>` setting, else undefined. */
export function hfTokenizerDir(setting: TokenizerSetting): string | undefined {
  return setting.startsWith("hf:") ? setting.slice(3) : undefined;
}

/** What a request body offers for tokenization (chat messages or a completion prompt). */
export interface PromptInput {
  messages?: readonly ChatMessage[];
  prompt?: string | readonly string[];
  /** Chat request fields that change the rendered prompt (vLLM): `tools`, `chat_template_kwargs`, `add_generation_prompt`, `add_special_tokens`, `continue_final_message`. */
  tools?: readonly unknown[];
  templateKwargs?: Readonly<Record<string, unknown>>;
  addGenerationPrompt?: boolean;
  addSpecialTokens?: boolean;
  continueFinalMessage?: boolean;
  /** Tool JSON in the raw request a JavaScript parse changes (tool-json.ts): `hf` falls back for it. */
  rawToolJsonProblem?: string;
}

/**
 * `rawBody`: the request's JSON text, when the caller has it; only then can `hf` mode see an
 * integer-valued float such as `20.0` in `tools` (parsed, it is `20`; Python prints `20.0`).
 */
export function promptInputOf(body: Record<string, unknown>, rawBody?: string | Uint8Array, api?: "responses" | "messages"): PromptInput {
  if (api) return renderedInput(body, rawBody, api);
  const out: PromptInput = {};
  if (Array.isArray(body.messages)) {
    // The raw text is walked again only when the parse may have hidden a literal there (tool-json.ts).
    if (rawBody !== undefined && (Array.isArray(body.tools) || body.messages.some((m) => m && typeof m === "object" && (m as { tool_calls?: unknown }).tool_calls != null)) && rawToolJsonScanNeeded(body.tools, body.messages)) {
      const problem = rawToolJsonInexact(typeof rawBody === "string" ? rawBody : new TextDecoder().decode(rawBody));
      if (problem) out.rawToolJsonProblem = problem;
    }
    out.messages = body.messages as ChatMessage[];
    if (Array.isArray(body.tools) && body.tools.length > 0) out.tools = body.tools;
    const kw = body.chat_template_kwargs;
    if (kw && typeof kw === "object" && !Array.isArray(kw)) out.templateKwargs = kw as Record<string, unknown>;
    if (typeof body.add_generation_prompt === "boolean") out.addGenerationPrompt = body.add_generation_prompt;
    if (typeof body.continue_final_message === "boolean") out.continueFinalMessage = body.continue_final_message;
  }
  // Chat (default false) and completion (default true) requests both take it.
  if (typeof body.add_special_tokens === "boolean") out.addSpecialTokens = body.add_special_tokens;
  if (typeof body.prompt === "string" || (Array.isArray(body.prompt) && body.prompt.every((p) => typeof p === "string"))) {
    out.prompt = body.prompt as string | string[];
  }
  return out;
}

/**
 * A Responses or Messages body as the chat prompt the engine renders from it (instructions or
 * `system` first, then the input items or messages; tools): tokenized as chat, so its prefix
 * matches the engine's blocks. A body that does not render (its parse refused it already) gives an
 * empty input. `previous_response_id`'s chain is not known here: the rendered prompt is the
 * instructions and this request's input.
 */
function renderedInput(body: Record<string, unknown>, rawBody: string | Uint8Array | undefined, api: "responses" | "messages"): PromptInput {
  let chat: RenderedChat;
  try {
    chat = api === "responses" ? responsesToChat(body) : messagesToChat(body);
  } catch {
    return { messages: [] };
  }
  const out: PromptInput = { messages: chat.messages };
  if (chat.tools) out.tools = chat.tools;
  // Tool schemas and tool-call arguments (Anthropic's `input` objects are printed by the engine) come from the raw JSON.
  if (rawBody !== undefined && (chat.tools || chat.messages.some((m) => m.tool_calls))) {
    const problem = rawToolJsonInexact(typeof rawBody === "string" ? rawBody : new TextDecoder().decode(rawBody));
    if (problem) out.rawToolJsonProblem = problem;
  }
  return out;
}

/**
 * A completion prompt that is one text: a string, or a list of one string. A longer list is a
 * batch (one engine request per prompt, each with its own blocks): undefined.
 */
export function singlePrompt(p: PromptInput["prompt"]): string | undefined {
  if (typeof p === "string") return p;
  return p && p.length === 1 ? p[0] : undefined;
}

function promptText(p: PromptInput["prompt"]): string {
  return typeof p === "string" ? p : (p ?? []).join("");
}

export function localTokens(input: PromptInput): number[] {
  if (input.messages) return tokenizeChat(input.messages, { addGenerationPrompt: input.addGenerationPrompt ?? true, addSpecialTokens: input.addSpecialTokens ?? false });
  // Completions always with special tokens here: the simulator's local mode ignores the field too.
  return tokenizePrompt(promptText(input.prompt), { addSpecialTokens: true });
}

/** Characters per pseudo-token in approximate mode (≈ one token of English text). */
export const APPROX_CHARS_PER_TOKEN = 4;

/** The text approximate mode chunks: message roles and contents in order, or the prompt. */
export function approximateText(input: PromptInput): string {
  if (input.messages) {
    let s = "";
    for (const m of input.messages) {
      const c = m.content;
      const text = typeof c === "string" ? c : Array.isArray(c) ? c.map((p) => p.text ?? "").join("") : "";
      s += `\u0000${m.role}\u0000${text}`;
    }
    return s;
  }
  return promptText(input.prompt);
}

export function approximateTokens(input: PromptInput): TokenIds {
  const text = approximateText(input);
  const n = Math.ceil(text.length / APPROX_CHARS_PER_TOKEN);
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = fnv1a32(text.slice(i * APPROX_CHARS_PER_TOKEN, (i + 1) * APPROX_CHARS_PER_TOKEN));
  return out;
}
