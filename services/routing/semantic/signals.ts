/**
 * Measuring a request's signals (pure). Every text signal reads a bounded prefix of its text
 * (`maxClassifiedChars`, default 4096 characters; a regex, its own `maxChars`, default 1024): an oversized message is classified on its
 * start, never refused for its size. Language detection reads the first MAX_LANGUAGE_CHARS.
 */
import { languageDetector } from "./lazy-libs.js";
import type { CompiledRules, CompiledSignal, Scope } from "./rules.js";

/** Characters the language detector reads (its accuracy does not improve much past a paragraph). */
export const MAX_LANGUAGE_CHARS = 1024;

/** A signal's value as decided, and what it was decided from (recorded for replay). */
export interface SignalValue {
  value: boolean;
  /** The measure a threshold or list judged: prompt tokens, a language code, a similarity score. */
  measure?: number | string;
  /** Similarity only: scored on embeddings, or by the lexical fallback. */
  via?: "embedding" | "lexical";
  /** The signal's measurement hash (rules.ts signalDef). */
  def: string;
}

/** What the signals read besides the body. */
export interface SignalInput {
  /** Text per scope, already bounded (textsOf). */
  texts: Readonly<Partial<Record<Scope, string>>>;
  promptTokens: number;
  headers: Readonly<Record<string, string>>;
  user?: string;
  keyClass?: string;
  /** Embeddings by text (the request's texts and the examples); absent or missing a text: the lexical fallback. */
  embeddings?: ReadonlyMap<string, ArrayLike<number>>;
}

/** Text of a message's content (a string or text parts), appended to `out` up to `max` characters. */
function appendContent(content: unknown, out: string[], room: { left: number }): void {
  const push = (s: string) => {
    if (room.left <= 0) return;
    const t = s.length > room.left ? s.slice(0, room.left) : s;
    out.push(t);
    room.left -= t.length;
  };
  if (typeof content === "string") push(content);
  else if (Array.isArray(content)) {
    for (const p of content) {
      const text = (p as { text?: unknown }).text;
      if (typeof text === "string") push(text);
    }
  }
}

/** The texts the rules read, each cut to `max` characters: the last user message, and the whole conversation. */
export function textsOf(body: Record<string, unknown>, scopes: ReadonlySet<Scope>, max: number): Partial<Record<Scope, string>> {
  const out: Partial<Record<Scope, string>> = {};
  // Chat and Anthropic messages, or a Responses `input` list (its message items: role and content).
  const items = Array.isArray(body.messages) ? body.messages : Array.isArray(body.input) && body.input.some((m) => m && typeof m === "object" && typeof (m as { role?: unknown }).role === "string") ? body.input : undefined;
  const messages = items as Array<{ role?: unknown; content?: unknown }> | undefined;
  const prompt = typeof body.prompt === "string" ? body.prompt : Array.isArray(body.prompt) && typeof body.prompt[0] === "string" ? (body.prompt[0] as string) : typeof body.input === "string" ? body.input : undefined;
  if (scopes.has("last-user")) {
    if (messages) {
      const parts: string[] = [];
      for (let i = messages.length - 1; i >= 0; i--) {
        if (messages[i]?.role === "user") {
          appendContent(messages[i]?.content, parts, { left: max });
          break;
        }
      }
      out["last-user"] = parts.join("\n");
    } else out["last-user"] = (prompt ?? "").slice(0, max);
  }
  if (scopes.has("conversation")) {
    if (messages) {
      const parts: string[] = [];
      const room = { left: max };
      for (const m of messages) appendContent(m?.content, parts, room);
      out.conversation = parts.join("\n");
    } else out.conversation = (prompt ?? "").slice(0, max);
  }
  return out;
}

const STOP = new Set(
  "a an and are as at be but by can could do does for from had has have how i if in into is it its me my of on or our please so that the their them then there these this to was we what when where which who why will with would you your".split(" "),
);

/** A text's content words (lower-case letters and digits, stop words dropped), for the lexical fallback. */
export function wordsOf(text: string): Set<string> {
  const out = new Set<string>();
  for (const w of text.toLowerCase().split(/[^\p{L}\p{N}]+/u)) if (w.length > 1 && !STOP.has(w)) out.add(w);
  return out;
}

/** Cosine of two word sets (0..1): shared words over the geometric mean of their sizes. */
export function wordCosine(a: ReadonlySet<string>, b: ReadonlySet<string>): number {
  if (a.size === 0 || b.size === 0) return 0;
  let shared = 0;
  const [small, large] = a.size <= b.size ? [a, b] : [b, a];
  for (const w of small) if (large.has(w)) shared++;
  return shared / Math.sqrt(a.size * b.size);
}

export function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = Math.min(a.length, b.length);
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < n; i++) {
    const x = a[i] as number;
    const y = b[i] as number;
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  return na > 0 && nb > 0 ? dot / Math.sqrt(na * nb) : 0;
}

/** ISO 639-1 code of the text's language, or "" when the detector cannot tell. */
export function detectLanguage(text: string): string {
  return languageDetector().detect(text.length > MAX_LANGUAGE_CHARS ? text.slice(0, MAX_LANGUAGE_CHARS) : text).language;
}

/** Example word sets per similarity signal (computed once per compiled signal). */
const EXAMPLE_WORDS = new WeakMap<CompiledSignal, Array<Set<string>>>();

function exampleWords(s: Extract<CompiledSignal, { kind: "similarity" }>): Array<Set<string>> {
  let w = EXAMPLE_WORDS.get(s);
  if (!w) {
    w = s.examples.map(wordsOf);
    EXAMPLE_WORDS.set(s, w);
  }
  return w;
}

const round = (x: number) => Math.round(x * 10_000) / 10_000;

function similarity(s: Extract<CompiledSignal, { kind: "similarity" }>, text: string, input: SignalInput, lower: () => string): SignalValue {
  const emb = input.embeddings;
  const v = emb?.get(text);
  if (v && s.examples.every((e) => emb?.has(e))) {
    let best = -1;
    for (const e of s.examples) best = Math.max(best, cosine(v, emb?.get(e) as ArrayLike<number>));
    return { value: best >= s.threshold, measure: round(best), via: "embedding", def: s.def };
  }
  const words = wordsOf(lower());
  let best = 0;
  for (const ex of exampleWords(s)) best = Math.max(best, wordCosine(words, ex));
  return { value: best >= s.lexicalThreshold, measure: round(best), via: "lexical", def: s.def };
}

/** The keywords found in a text by its scanner (rules.ts keywordScansOf), once per request and scope. */
function keywordsFound(rules: CompiledRules, input: SignalInput, scope: Scope, caseSensitive: boolean, scanned: Map<string, Set<string>>): Set<string> {
  const key = `${scope}/${caseSensitive}`;
  let found = scanned.get(key);
  if (found) return found;
  found = new Set<string>();
  const scan = rules.keywordScans.find((k) => k.scope === scope && k.caseSensitive === caseSensitive);
  const text = input.texts[scope] ?? "";
  for (const re of scan?.layers ?? []) {
    re.lastIndex = 0;
    for (const m of text.matchAll(re)) found.add(caseSensitive ? m[0] : m[0].toLowerCase());
  }
  scanned.set(key, found);
  return found;
}

/** Every signal of the rules, measured and judged. */
export function measureSignals(rules: CompiledRules, input: SignalInput): Record<string, SignalValue> {
  const lowered: Partial<Record<Scope, string>> = {};
  const lower = (scope: Scope) => () => {
    let l = lowered[scope];
    if (l === undefined) {
      l = (input.texts[scope] ?? "").toLowerCase();
      lowered[scope] = l;
    }
    return l;
  };
  const out: Record<string, SignalValue> = {};
  const scanned = new Map<string, Set<string>>();
  for (const s of rules.signals) {
    switch (s.kind) {
      case "keywords": {
        const found = keywordsFound(rules, input, s.scope, s.caseSensitive, scanned);
        out[s.name] = { value: s.all ? s.keywords.every((k) => found.has(k)) : s.keywords.some((k) => found.has(k)), def: s.def };
        break;
      }
      case "regex": {
        const text = input.texts[s.scope] ?? "";
        out[s.name] = { value: s.re.test(text.length > s.maxChars ? text.slice(0, s.maxChars) : text), def: s.def };
        break;
      }
      case "prompt-tokens":
        out[s.name] = { value: (s.gte === undefined || input.promptTokens >= s.gte) && (s.lt === undefined || input.promptTokens < s.lt), measure: input.promptTokens, def: s.def };
        break;
      case "language": {
        const lang = detectLanguage(input.texts[s.scope] ?? "");
        out[s.name] = { value: s.languages.has(lang), measure: lang, def: s.def };
        break;
      }
      case "header": {
        const h = input.headers[s.header];
        out[s.name] = { value: h !== undefined && (!s.values || s.values.has(h)), def: s.def };
        break;
      }
      case "user":
        out[s.name] = { value: (input.user !== undefined && s.users?.has(input.user) === true) || (input.keyClass !== undefined && s.classes?.has(input.keyClass) === true), def: s.def };
        break;
      case "similarity":
        out[s.name] = similarity(s, input.texts[s.scope] ?? "", input, lower(s.scope));
        break;
    }
  }
  if (rules.groups) applyGroups(rules.signals, out);
  return out;
}

/**
 * Similarity groups: of the signals of one group that hold, only the best-scoring one stays true
 * (ties: the first defined). `values` is changed in place.
 */
export function applyGroups(signals: readonly CompiledSignal[], values: Record<string, { value: boolean; measure?: number | string }>): void {
  const best = new Map<string, { name: string; score: number }>();
  for (const s of signals) {
    if (s.kind !== "similarity" || !s.group) continue;
    const v = values[s.name];
    if (!v?.value || typeof v.measure !== "number") continue;
    const b = best.get(s.group);
    if (!b || v.measure > b.score) best.set(s.group, { name: s.name, score: v.measure });
  }
  for (const s of signals) {
    if (s.kind !== "similarity" || !s.group) continue;
    const v = values[s.name];
    if (v?.value && best.get(s.group)?.name !== s.name) v.value = false;
  }
}

/** The texts a request's similarity signals need embedded (its own, and every example), or none. */
export function embeddingTextsOf(rules: CompiledRules, texts: Readonly<Partial<Record<Scope, string>>>): string[] {
  if (!rules.embeddingModel) return [];
  const out = new Set<string>();
  for (const s of rules.signals) {
    if (s.kind !== "similarity") continue;
    const t = texts[s.scope];
    if (t) out.add(t);
    for (const e of s.examples) out.add(e);
  }
  return [...out];
}

/**
 * A signal's value from a recorded one (replay under changed rules): the recorded value when the
 * signal is defined as it was; re-judged from the recorded measure when only its threshold or
 * list changed (prompt tokens, language, similarity); undefined when it was not recorded, or was
 * measured differently.
 */
export function judgeRecorded(s: CompiledSignal, recorded: SignalValue | undefined): boolean | undefined {
  if (!recorded || recorded.def !== s.def) return undefined;
  const m = recorded.measure;
  switch (s.kind) {
    case "prompt-tokens":
      return typeof m === "number" ? (s.gte === undefined || m >= s.gte) && (s.lt === undefined || m < s.lt) : undefined;
    case "language":
      return typeof m === "string" ? s.languages.has(m) : undefined;
    case "similarity":
      // A grouped signal is re-judged with its group (applyGroups), from every member's measure.
      if (typeof m !== "number") return undefined;
      return m >= (recorded.via === "embedding" ? s.threshold : s.lexicalThreshold);
    default:
      return recorded.value;
  }
}
