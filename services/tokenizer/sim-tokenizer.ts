/**
 * Deterministic stand-in tokenizer shared by the engine simulator and the gateway's `local`
 * tokenization mode. Both sides must produce identical ids for identical text, so everything here
 * is a pure function of its input: no vocabulary file, no state, no I/O.
 *
 * Pieces: special markers, then runs of letters/digits (an optional single leading space is part of
 * the piece, as in byte-level BPE, and runs are capped at MAX_WORD_CHARS so a long unbroken string
 * still costs a realistic number of tokens), then single punctuation characters (also with an
 * optional leading space), then single whitespace characters. Because pieces never look ahead past
 * their own end, two texts that share a prefix share the token prefix up to the last piece boundary
 * inside it: the property prefix caching depends on.
 *
 * Ids: 32-bit FNV-1a over the piece's UTF-8 bytes, folded into [NUM_SPECIAL_IDS, VOCAB_SIZE).
 * Ids are hashes, so detokenize is not an inverse: see `detokenize`.
 */

export const VOCAB_SIZE = 32_000;
/** Ids below this are reserved for special tokens and never produced by hashing. */
export const NUM_SPECIAL_IDS = 16;
const MAX_WORD_CHARS = 12;

/** Llama-3 style markers, so the demo model name and the template look alike. */
export const SPECIAL_TOKENS = {
  "<|begin_of_text|>": 1,
  "<|end_of_text|>": 2,
  "<|start_header_id|>": 3,
  "<|end_header_id|>": 4,
  "<|eot_id|>": 5,
} as const satisfies Record<string, number>;

export const BOS_ID = SPECIAL_TOKENS["<|begin_of_text|>"];
export const EOS_ID = SPECIAL_TOKENS["<|end_of_text|>"];

const SPECIAL_BY_ID = new Map<number, string>(Object.entries(SPECIAL_TOKENS).map(([text, id]) => [id, text]));

const PIECE_RE = new RegExp(
  [
    ...Object.keys(SPECIAL_TOKENS).map((s) => s.replace(/[|]/g, "\\|")),
    ` ?[\\p{L}\\p{M}\\p{N}_]{1,${MAX_WORD_CHARS}}`,
    " ?[^\\s\\p{L}\\p{M}\\p{N}_]",
    "\\s",
  ].join("|"),
  "gu",
);

/** FNV-1a over the UTF-8 encoding of `text`, without allocating a byte buffer. */
export function fnv1a32(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  const mix = (byte: number): void => {
    h ^= byte;
    h = Math.imul(h, 0x01000193) >>> 0;
  };
  for (const ch of text) {
    const cp = ch.codePointAt(0) ?? 0;
    if (cp < 0x80) mix(cp);
    else if (cp < 0x800) {
      mix(0xc0 | (cp >> 6));
      mix(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      mix(0xe0 | (cp >> 12));
      mix(0x80 | ((cp >> 6) & 0x3f));
      mix(0x80 | (cp & 0x3f));
    } else {
      mix(0xf0 | (cp >> 18));
      mix(0x80 | ((cp >> 12) & 0x3f));
      mix(0x80 | ((cp >> 6) & 0x3f));
      mix(0x80 | (cp & 0x3f));
    }
  }
  return h;
}

export function pieceId(piece: string): number {
  const special = (SPECIAL_TOKENS as Record<string, number>)[piece];
  if (special !== undefined) return special;
  return NUM_SPECIAL_IDS + (fnv1a32(piece) % (VOCAB_SIZE - NUM_SPECIAL_IDS));
}

export function splitPieces(text: string): string[] {
  return text.match(PIECE_RE) ?? [];
}

export interface TokenizePromptOptions {
  /** Prepend BOS, as vLLM's completion `/tokenize` does by default. */
  addSpecialTokens?: boolean;
}

export function tokenizePrompt(text: string, options: TokenizePromptOptions = {}): number[] {
  const ids = splitPieces(text).map(pieceId);
  if (options.addSpecialTokens ?? true) ids.unshift(BOS_ID);
  return ids;
}

export type ContentPart = { type: string; text?: string };

export interface ChatMessage {
  role: string;
  content?: string | ContentPart[] | null;
  name?: string;
}

export interface ChatTemplateOptions {
  /** Open an assistant header so the model continues as the assistant (vLLM default: true). */
  addGenerationPrompt?: boolean;
}

/** OpenAI content may be a list of parts; only text parts contribute, joined by newlines. */
export function messageText(content: ChatMessage["content"]): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content
    .filter((p) => p.type === "text" && typeof p.text === "string")
    .map((p) => p.text)
    .join("\n");
}

/**
 * Llama-3 shaped template. BOS is part of the template text, which is why the chat form of
 * `/tokenize` defaults to `add_special_tokens: false` (adding it again would double it).
 */
export function applyChatTemplate(messages: readonly ChatMessage[], options: ChatTemplateOptions = {}): string {
  let out = "<|begin_of_text|>";
  for (const m of messages) {
    out += `<|start_header_id|>${m.role}<|end_header_id|>\n\n${messageText(m.content).trim()}<|eot_id|>`;
  }
  if (options.addGenerationPrompt ?? true) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

export interface TokenizeChatOptions extends ChatTemplateOptions, TokenizePromptOptions {}

export function tokenizeChat(messages: readonly ChatMessage[], options: TokenizeChatOptions = {}): number[] {
  return tokenizePrompt(applyChatTemplate(messages, options), { addSpecialTokens: options.addSpecialTokens ?? false });
}

/**
 * Words the simulator generates. Each is a single piece (leading space included), so generated
 * text re-tokenizes to exactly the ids the simulator "produced": a multi-turn conversation that
 * sends an assistant reply back gets the same ids the engine held in its KV cache.
 */
export const GENERATION_WORDS: readonly string[] = [
  " the", " a", " model", " token", " cache", " prefix", " route", " engine", " batch", " queue",
  " request", " latency", " stream", " block", " gateway", " pod", " is", " and", " of", " to",
  " fast", " warm", " cold", " hit", " miss", " decode", " prefill", " every", " one", " more",
  " time", " data", " graph", " node", " event", " state", " with", " from", " into", " over",
  " under", " while", " when", " then", " this", " that", " it", " we", " they", " run",
  " serve", " load", " share", " keep", " send", " view", " write", " wait", " free", " slot",
  ".", ",",
];

export const GENERATION_WORD_IDS: readonly number[] = GENERATION_WORDS.map(pieceId);

const WORD_BY_ID = new Map<number, string>();
for (const [i, id] of GENERATION_WORD_IDS.entries()) {
  if (!WORD_BY_ID.has(id)) WORD_BY_ID.set(id, GENERATION_WORDS[i] ?? "");
}

/**
 * Not an inverse of tokenization (ids are hashes). Deterministic rendering: special ids print as
 * their marker, ids of GENERATION_WORDS print as the word, any other id prints as `<#id>`.
 * Generated text therefore detokenizes exactly; prompt text does not.
 */
export function detokenize(ids: readonly number[]): string {
  let out = "";
  for (const id of ids) out += SPECIAL_BY_ID.get(id) ?? WORD_BY_ID.get(id) ?? `<#${id}>`;
  return out;
}
