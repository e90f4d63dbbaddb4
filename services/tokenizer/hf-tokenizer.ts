/**
 * A real model's tokenizer, from a Hugging Face tokenizer directory (`tokenizer.json`,
 * `tokenizer_config.json`, optionally `chat_template.jinja`), producing the ids vLLM produces:
 * - chat: the model's chat template rendered as vLLM renders it (chat-template.ts), then encoded
 *   without adding special tokens (vLLM's chat default; the template writes BOS itself);
 * - completion: the prompt encoded with special tokens (the tokenizer.json post-processor adds
 *   BOS where the model wants one).
 *
 * Neither costly step runs on the event loop: templates render on worker threads (render-pool.ts;
 * a long Qwen3 chat costs milliseconds), and Hugging Face's Rust `tokenizers` bindings encode on
 * libuv's threads (~0.01 ms on the loop against ~1.3 ms off it per 4 KB prompt,
 * docs/benchmarks.md). Both go through bounded queues: beyond them, QueueFullError, and the
 * caller falls back. Chat prompts reuse cached prefix ids (prefix-ids.ts) where the tokenizer
 * allows exact cuts (split-points.ts).
 *
 * Files are read by the caller (`read`), so this stays free of file-system I/O.
 */
import { Tokenizer as NativeTokenizer } from "tokenizers";
import { BoundedQueue } from "./bounded-queue.js";
import { RenderPool, RenderPoolUnavailableError } from "./render-pool.js";
import { ChatTemplateError, ChatTemplates, finishRender, type HfChatMessage, type RenderChatOptions, type RenderJob } from "./chat-template.js";
import { PrefixIdsCache, type PrefixReuse } from "./prefix-ids.js";
import { plainIds, tokenIdsOf } from "./prompt-tokens.js";
import { DEFAULT_RENDER_CACHE_BYTES, IncrementalRender, type IncrementalRenderStats } from "./incremental-render.js";
import { messageLocalLoop } from "./message-local.js";
import { WindowRender } from "./window-render.js";
import { windowLoop } from "./window-loop.js";

/** Rendered text past which chatIds hands the loop back around its render and its search (turn slicing). */
export const LARGE_TEXT_CHARS = 65_536;
import { type AddedTokenSpec, planSplits, type SplitPlan, SplitPoints } from "./split-points.js";

export const TOKENIZER_FILE = "tokenizer.json";
export const TOKENIZER_CONFIG_FILE = "tokenizer_config.json";
export const CHAT_TEMPLATE_FILE = "chat_template.jinja";

/** A tokenizer directory that cannot be used; the message names the file and what is wrong with it. */
export class TokenizerFilesError extends Error {
  override name = "TokenizerFilesError";
}

export interface HfTokenizerOptions {
  /** Encodes running at once (each occupies one libuv worker thread). */
  concurrency?: number;
  /** Encodes allowed to wait; more are refused (QueueFullError). */
  maxQueued?: number;
  /** Bound on cached prefix ids, in estimated bytes; 0 turns the prefix cache off. */
  prefixCacheBytes?: number;
  /**
   * Bound on cached conversation renders of message-local templates (incremental-render.ts), in
   * estimated bytes; 0 renders every request whole.
   */
  renderCacheBytes?: number;
  /**
   * Longest conversation (characters of message text) whose first render on a windowed template
   * (window-render.ts) runs on the calling thread to seed its cache (default 256 Ki); longer ones
   * render whole on the worker, and so do their later turns.
   */
  windowSeedChars?: number;
  /** Worker threads rendering chat templates (default 1); 0 renders on the calling thread. */
  renderThreads?: number;
  /** Where the one warning of a load goes (default: a process warning). */
  warn?: (message: string) => void;
  /**
   * Hands the event loop back between the steps of a chat prompt's ids (render, the conversation's
   * anchor and tail, the encode's result), so a ~600 KB prompt's milliseconds do not run in one
   * turn (the gateway: a setImmediate). Absent: the steps run back to back.
   */
  yieldTurn?: () => Promise<void>;
}

function defaultWarn(message: string): void {
  process.emitWarning(message, "JetrouteTokenizer");
}

const ADDED_TOKEN_FLAGS = ["content", "lstrip", "rstrip", "single_word", "normalized", "special"] as const;

/**
 * Why the split points (read from tokenizer.json) might not be where the engine's tokenizer splits:
 * `split_special_tokens` (transformers then encodes special tokens as text), or
 * `added_tokens_decoder` flags that differ from tokenizer.json's (transformers applies the config's).
 */
export function prefixCacheProblem(config: Readonly<Record<string, unknown>>, added: readonly AddedTokenSpec[]): string | undefined {
  if (config.split_special_tokens === true) return `${TOKENIZER_CONFIG_FILE} sets split_special_tokens`;
  const decoder = config.added_tokens_decoder;
  if (!decoder || typeof decoder !== "object") return undefined;
  const byId = new Map(added.map((t) => [String(t.id), t as unknown as Record<string, unknown>]));
  for (const [id, flags] of Object.entries(decoder as Record<string, unknown>)) {
    if (!flags || typeof flags !== "object") continue;
    const spec = byId.get(id);
    if (!spec) return `${TOKENIZER_CONFIG_FILE} added_tokens_decoder has token ${id.slice(0, 16)}, ${TOKENIZER_FILE} does not`;
    for (const k of ADDED_TOKEN_FLAGS) {
      const v = (flags as Record<string, unknown>)[k];
      if (v !== undefined && spec[k] !== undefined && v !== spec[k]) return `added token ${id.slice(0, 16)}: ${k} differs between ${TOKENIZER_CONFIG_FILE} and ${TOKENIZER_FILE}`;
    }
  }
  return undefined;
}

export const DEFAULT_PREFIX_CACHE_BYTES = 32 * 1024 * 1024;
export const DEFAULT_WINDOW_SEED_CHARS = 256 * 1024;

/** Characters of a conversation's message strings. */
function messageChars(messages: readonly Record<string, unknown>[]): number {
  let n = 0;
  for (const m of messages) for (const v of Object.values(m)) if (typeof v === "string") n += v.length;
  return n;
}

/** Reads one file of the directory by name: its text, or undefined when it does not exist. */
export type ReadTokenizerFile = (name: string) => string | undefined;

function parseJsonFile(source: string, name: string, text: string | undefined): Record<string, unknown> {
  if (text === undefined) throw new TokenizerFilesError(`${source}/${name}: file not found`);
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw new TokenizerFilesError(`${source}/${name}: not valid JSON (${(err as Error).message})`);
  }
  if (!v || typeof v !== "object" || Array.isArray(v)) throw new TokenizerFilesError(`${source}/${name}: expected a JSON object`);
  return v as Record<string, unknown>;
}

export class HfTokenizer {
  private readonly native: NativeTokenizer;
  private readonly templates: ChatTemplates | undefined;
  private readonly prefixes: PrefixIdsCache | undefined;
  readonly queue: BoundedQueue;
  /** Template render workers; undefined when rendering on the calling thread. */
  readonly renderPool: RenderPool | undefined;
  readonly splitPlan: SplitPlan;
  readonly vocabSize: number;
  /** Why chat requests cannot be rendered (no template), if so. */
  readonly templateProblem: string | undefined;
  /** Why the prefix-id cache is off for this model although asked for (tokenizer_config.json disagrees with tokenizer.json), if so. */
  readonly prefixCacheProblem: string | undefined;
  /** Incremental renderers of the message-local templates, by template name. */
  private readonly incremental = new Map<string, IncrementalRender>();
  /** Why each template (by name) is not message-local (message-local.ts). */
  readonly notMessageLocal = new Map<string, string>();
  /** Windowed renderers (window-render.ts) of the templates that are not message-local but qualify (window-loop.ts), by name. */
  private readonly windowed = new Map<string, WindowRender>();
  /** Why each template (by name) renders whole on every request: neither message-local nor windowed. */
  readonly rendersWhole = new Map<string, string>();
  private readonly windowSeedChars: number;
  private readonly yieldTurn: (() => Promise<void>) | undefined;

  /** `source` names the directory in errors and stats. */
  static fromDir(source: string, read: ReadTokenizerFile, o: HfTokenizerOptions = {}): HfTokenizer {
    return new HfTokenizer(source, read(TOKENIZER_FILE), read(TOKENIZER_CONFIG_FILE), read(CHAT_TEMPLATE_FILE), o);
  }

  constructor(
    readonly source: string,
    tokenizerJson: string | undefined,
    configJson: string | undefined,
    chatTemplateFile: string | undefined,
    o: HfTokenizerOptions = {},
  ) {
    const spec = parseJsonFile(source, TOKENIZER_FILE, tokenizerJson);
    const config = parseJsonFile(source, TOKENIZER_CONFIG_FILE, configJson);
    if (!spec.model || typeof spec.model !== "object") throw new TokenizerFilesError(`${source}/${TOKENIZER_FILE}: no "model" section (not a tokenizers file)`);
    try {
      this.native = NativeTokenizer.fromString(tokenizerJson as string);
    } catch (err) {
      throw new TokenizerFilesError(`${source}/${TOKENIZER_FILE}: rejected by tokenizers (${(err as Error).message})`);
    }
    // tokenizer.json may carry `truncation` / `padding` (saved from a training setup); transformers
    // turns both off for an encode that does not ask for them, and so does vLLM's prompt path.
    this.native.disableTruncation();
    this.native.disablePadding();
    this.vocabSize = this.native.getVocabSize(true);
    // transformers prefers chat_template.jinja over the config's chat_template.
    const template = chatTemplateFile ?? config.chat_template;
    let templates: ChatTemplates | undefined;
    let templateProblem: string | undefined;
    if (template === undefined || template === null) templateProblem = `${source}: no chat template (${TOKENIZER_CONFIG_FILE} has no chat_template, no ${CHAT_TEMPLATE_FILE})`;
    else {
      try {
        templates = new ChatTemplates(template, config);
      } catch (err) {
        const file = chatTemplateFile !== undefined ? CHAT_TEMPLATE_FILE : TOKENIZER_CONFIG_FILE;
        throw new TokenizerFilesError(`${source}/${file}: ${(err as Error).message}`);
      }
    }
    if (templates?.contentParts.has("default")) templateProblem = `${source}: the chat template iterates over message content parts (vLLM's "openai" content format); chat requests fall back`;
    this.templates = templates;
    this.templateProblem = templateProblem;
    const renderCacheBytes = o.renderCacheBytes ?? DEFAULT_RENDER_CACHE_BYTES;
    for (const [name, src] of templates?.sources ?? []) {
      if (renderCacheBytes <= 0) break;
      const where = messageLocalLoop(templates?.parsed(name) as { body: never[] });
      if (typeof where !== "string") {
        this.incremental.set(name, new IncrementalRender(src, where, renderCacheBytes));
        continue;
      }
      this.notMessageLocal.set(name, where);
      const parsed = templates?.parsed(name) as { body: never[] };
      const window = windowLoop(parsed);
      if (typeof window === "string") this.rendersWhole.set(name, `${where}; ${window}`);
      else this.windowed.set(name, new WindowRender(parsed, window, renderCacheBytes));
    }
    this.windowSeedChars = o.windowSeedChars ?? DEFAULT_WINDOW_SEED_CHARS;
    this.yieldTurn = o.yieldTurn;
    this.queue = new BoundedQueue(o.concurrency ?? 2, o.maxQueued ?? 256);
    const threads = o.renderThreads ?? 1;
    this.renderPool = templates && threads > 0 ? new RenderPool(templates.sources, threads, o.maxQueued ?? 256) : undefined;
    const added = (Array.isArray(spec.added_tokens) ? spec.added_tokens : []) as AddedTokenSpec[];
    this.splitPlan = planSplits({ added_tokens: added, pre_tokenizer: spec.pre_tokenizer });
    const cacheBytes = o.prefixCacheBytes ?? DEFAULT_PREFIX_CACHE_BYTES;
    this.prefixCacheProblem = prefixCacheProblem(config, added);
    if (this.prefixCacheProblem && cacheBytes > 0) (o.warn ?? defaultWarn)(`${source}: prefix-id cache off: ${this.prefixCacheProblem}`);
    if (cacheBytes > 0 && this.splitPlan.boundaryTokens.length > 0 && !this.prefixCacheProblem) {
      const byContent = new Map(added.map((t) => [t.content, t.id]));
      const boundaryIds = new Map(this.splitPlan.boundaryTokens.map((t) => [t, byContent.get(t) as number]));
      this.prefixes = new PrefixIdsCache({ splits: new SplitPoints(this.splitPlan), boundaryIds, maxBytes: cacheBytes, encode: (t) => this.encodeNow(t, false) });
    }
  }

  get prefixStats(): PrefixIdsCache["stats"] | undefined {
    return this.prefixes?.stats;
  }

  /** Incremental render stats, summed over the message-local and windowed templates (undefined: none is either). */
  get renderStats(): IncrementalRenderStats | undefined {
    if (this.incremental.size === 0 && this.windowed.size === 0) return undefined;
    const out: IncrementalRenderStats = { hits: 0, reusedMessages: 0, misses: 0, entries: 0, bytes: 0 };
    for (const r of [...this.incremental.values(), ...this.windowed.values()]) for (const k of Object.keys(out) as (keyof IncrementalRenderStats)[]) out[k] += r.stats[k];
    return out;
  }

  /** Windowed render stats (window-render.ts) by template name. */
  windowStats(): ReadonlyMap<string, WindowRender["stats"]> {
    return new Map([...this.windowed].map(([n, w]) => [n, w.stats]));
  }

  /** The chat prompt text vLLM would build, rendered on this thread. Throws ChatTemplateError. */
  renderChat(messages: readonly HfChatMessage[], o: RenderChatOptions = {}): string {
    if (!this.templates) throw new ChatTemplateError(this.templateProblem ?? "no chat template");
    return this.templates.render(messages, o);
  }

  /** The same text, rendered on a worker thread when there are any. Throws ChatTemplateError, QueueFullError. */
  async renderChatOffLoop(messages: readonly HfChatMessage[], o: RenderChatOptions = {}): Promise<string> {
    if (!this.templates) throw new ChatTemplateError(this.templateProblem ?? "no chat template");
    const job = this.templates.job(messages, o);
    // A later turn on a message-local template: its new messages only, on this thread (small renders).
    const inc = job.cutAfter === undefined ? this.incremental.get(job.name) : undefined;
    const lookup = inc?.lookup(job.name, job.context);
    if (inc && lookup?.entry) {
      try {
        return inc.renderFrom(lookup);
      } catch (err) {
        throw new ChatTemplateError(`chat template failed: ${(err as Error).message}`);
      }
    }
    // A template that looks beyond each message: pieces reused where their context reads still hold
    // (window-render.ts), on this thread; a conversation's first render only when it is short.
    const win = job.cutAfter === undefined && !inc ? this.windowed.get(job.name) : undefined;
    if (win && (win.has(job.name, job.context) || messageChars(job.context.messages as readonly Record<string, unknown>[]) <= this.windowSeedChars)) {
      const text = win.render(job.name, job.context);
      if (text !== undefined) return text;
    }
    const text = await this.renderWhole(job);
    if (inc && lookup) inc.remember(lookup, text);
    return text;
  }

  private async renderWhole(job: RenderJob): Promise<string> {
    const templates = this.templates as ChatTemplates;
    if (!this.renderPool) return templates.renderJob(job);
    try {
      return finishRender(job, await this.renderPool.render(job));
    } catch (err) {
      // Workers that cannot start: render here rather than lose the request (the pool retries later).
      if (err instanceof RenderPoolUnavailableError) return templates.renderJob(job);
      throw err;
    }
  }

  /** Stops the render workers (they never keep a process alive; this frees them early). */
  async close(): Promise<void> {
    await this.renderPool?.close();
  }

  /**
   * Ids of a chat request (vLLM: template, then `add_special_tokens` false unless asked).
   * Throws ChatTemplateError (template) or QueueFullError (too many waiting).
   */
  async chatIds(messages: readonly HfChatMessage[], o: RenderChatOptions & { addSpecialTokens?: boolean } = {}): Promise<Uint32Array> {
    const text = await this.renderChatOffLoop(messages, o);
    // The render (on this thread for a later turn) and what follows (the text's first search
    // flattens a ~600 KB string) each cost milliseconds: other requests run in between.
    const large = text.length >= LARGE_TEXT_CHARS;
    if (large && this.yieldTurn) await this.yieldTurn();
    if (o.addSpecialTokens) return this.queue.run(() => this.encodeIds(text, true));
    const prefixes = this.prefixes;
    if (!prefixes) return this.queue.run(() => this.encodeIds(text, false));
    // The end of the first message's text: a system prompt shared by many conversations. The end of
    // the next message with text (the first user task): the conversation's anchor (prefix-ids.ts).
    const first = messages[0]?.content;
    const at = typeof first === "string" && first.length > 0 ? text.indexOf(first) : -1;
    const firstEnd = at >= 0 ? at + (first as string).length : -1;
    const second = messages.slice(1, 4).find((m) => typeof m.content === "string" && m.content.length > 0)?.content as string | undefined;
    const secondAt = firstEnd >= 0 && second !== undefined ? text.indexOf(second, firstEnd) : -1;
    const anchorAt = secondAt >= 0 ? secondAt + (second as string).length : undefined;
    if (large && this.yieldTurn) await this.yieldTurn();
    const r = await this.queue.run(() => prefixes.encodeWithReuse("", text, firstEnd >= 0 ? [firstEnd] : [], anchorAt));
    if (r.reused || r.stored.length > 0) this.reuse.set(r.ids, r);
    return r.ids;
  }

  /** Ids returned by `chatIds` -> the cached prefixes they reused and stored (held only as long as the ids are). */
  private readonly reuse = new WeakMap<Uint32Array, PrefixReuse>();

  /** Which cached prefix entries a `chatIds` result reused and stored (block hashes are derived per entry). */
  prefixReuseOf(ids: ArrayLike<number>): PrefixReuse | undefined {
    return ids instanceof Uint32Array ? this.reuse.get(ids) : undefined;
  }

  /** Ids of a completion prompt (vLLM: `add_special_tokens` true by default). Throws QueueFullError. */
  async promptIds(text: string, addSpecialTokens = true): Promise<Uint32Array> {
    return this.queue.run(() => this.encodeIds(text, addSpecialTokens));
  }

  async decode(ids: ArrayLike<number>, skipSpecialTokens = false): Promise<string> {
    return this.native.decode(plainIds(ids), skipSpecialTokens);
  }

  /** Id of a single token's text, if the vocabulary has it. */
  tokenId(token: string): number | undefined {
    return this.native.tokenToId(token) ?? undefined;
  }

  private async encodeNow(text: string, addSpecialTokens: boolean): Promise<number[]> {
    return (await this.native.encode(text, null, { addSpecialTokens })).getIds();
  }

  /** `encodeNow` as the router's token type (one copy of the encoder's array). */
  private async encodeIds(text: string, addSpecialTokens: boolean): Promise<Uint32Array> {
    return tokenIdsOf(await this.encodeNow(text, addSpecialTokens));
  }
}
