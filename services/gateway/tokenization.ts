/**
 * Tokenization for prefix routing, per model: `remote` asks a pod's `/tokenize` (chat form with
 * `messages`, so the engine's own chat template applies — hashing raw text gets zero overlap with
 * engine blocks), cached by content hash; a slow or failing engine makes that request fall back
 * to `approximate` (counted). `local` and `approximate` run in-process. `hf:<dir>` uses the
 * model's real Hugging Face tokenizer (services/tokenizer/hf-tokenizer.ts), loaded at start — a
 * missing or corrupt directory fails the constructor with the file named; a request its template
 * cannot render, or one arriving while the encode queue is full, falls back to `approximate`
 * (counted: `templateErrors`, `queueFull`).
 *
 * Both what is read and what is kept are bounded in bytes, not counts: an engine's answer is read
 * up to `maxResponseBytes` (streamed, so a runaway body never sits in memory whole), and the cache
 * holds at most `cacheBytes` of token ids — a few 100k-token prompts weigh as much as thousands of
 * short ones, so an entry bound alone did not bound memory.
 */
import { BodyTooLargeError, readBodyCapped } from "../shared/http-body.js";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import client from "prom-client";
import { QueueFullError } from "../tokenizer/bounded-queue.js";
import { ChatTemplateError } from "../tokenizer/chat-template.js";
import { HfTokenizer, type HfTokenizerOptions } from "../tokenizer/hf-tokenizer.js";
import type { PrefixReuse } from "../tokenizer/prefix-ids.js";
import { isTokenId } from "../tokenizer/token-id.js";
import { approximateTokens, hfTokenizerDir, localTokens, type PromptInput, singlePrompt, type TokenIds, tokenIdsOf, type TokenizerMode, type TokenizerSetting } from "../tokenizer/prompt-tokens.js";

export interface TokenizeResult {
  /** The router's token type (a typed array) in every mode. */
  tokens: TokenIds;
  /** The mode that produced the ids (a remote failure yields "approximate"). */
  mode: TokenizerMode;
  cached?: boolean;
}

export interface TokenizerOptions {
  /** Sent as `authorization: Bearer …` to engines that require an API key (vLLM `--api-key`). */
  engineApiKey?: string;
  /** Mode per model (`hf:<dir>` for a real tokenizer); `defaultMode` for the rest. */
  modes?: Readonly<Record<string, TokenizerSetting>>;
  defaultMode?: TokenizerSetting;
  /** Queue and prefix-cache bounds of every `hf:` tokenizer. */
  hf?: HfTokenizerOptions;
  timeoutMs?: number;
  /** Bound on cached remote results, in estimated bytes (`cacheEntryBytes`); least recently used go first. */
  cacheBytes?: number;
  /** Bound on an engine's `/tokenize` answer; a longer one makes that request approximate (counted). */
  maxResponseBytes?: number;
}

export interface TokenizerStats {
  remote: number;
  cacheHits: number;
  /** Requests that fell back to approximate (engine slow, failing, or answering too much). */
  fallbacks: number;
  /** Of the fallbacks: answers over `maxResponseBytes`. */
  oversized: number;
  /** Cached results and their estimated bytes. */
  cacheEntries: number;
  cacheBytes: number;
  /** Results evicted to stay within `cacheBytes`. */
  cacheEvicted: number;
  /** Requests tokenized by a real (`hf:`) tokenizer. */
  hf: number;
  /** Of the fallbacks: chat templates that failed to render (or content they cannot tokenize, e.g. images). */
  templateErrors: number;
  /** Of the fallbacks: requests refused by a full encode queue. */
  queueFull: number;
  /** Of the fallbacks: completion requests with several prompts (a batch: no one prompt to match; remote and hf modes). */
  promptBatches: number;
}

class PromptBatchError extends Error {
  override name = "PromptBatchError";
}

export const DEFAULT_TOKENIZER_CACHE_BYTES = 64 * 1024 * 1024;
export const DEFAULT_TOKENIZE_RESPONSE_BYTES = 8 * 1024 * 1024;

/**
 * What a cached result costs, estimated: the key (UTF-16, 2 bytes a char), 4 bytes per token id
 * (kept as a Uint32Array) and ~100 bytes of Map entry and typed-array header.
 */
export function cacheEntryBytes(key: string, tokens: ArrayLike<number>): number {
  return 2 * key.length + 4 * tokens.length + 100;
}


/** Reads a Hugging Face tokenizer directory from disk (missing files as undefined). */
export function loadHfTokenizerDir(dir: string, o: HfTokenizerOptions = {}): HfTokenizer {
  return HfTokenizer.fromDir(dir, (name) => {
    try {
      return readFileSync(join(dir, name), "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw new Error(`${join(dir, name)}: ${(err as Error).message}`);
    }
  }, o);
}

export class Tokenizer {
  readonly stats: TokenizerStats = { remote: 0, cacheHits: 0, fallbacks: 0, oversized: 0, cacheEntries: 0, cacheBytes: 0, cacheEvicted: 0, hf: 0, templateErrors: 0, queueFull: 0, promptBatches: 0 };
  /** One loaded tokenizer per directory, shared by the models naming it. */
  private readonly hfByDir = new Map<string, HfTokenizer>();
  /** Map iteration order is insertion order: re-inserting on a hit keeps the least recently used first. */
  private readonly cache = new Map<string, { tokens: TokenIds; bytes: number }>();
  private readonly cacheBytes: number;
  private readonly maxResponseBytes: number;

  constructor(private readonly o: TokenizerOptions = {}) {
    this.cacheBytes = o.cacheBytes ?? DEFAULT_TOKENIZER_CACHE_BYTES;
    this.maxResponseBytes = o.maxResponseBytes ?? DEFAULT_TOKENIZE_RESPONSE_BYTES;
    // Loaded now, so a bad directory stops the gateway at start rather than at the first request.
    for (const setting of [o.defaultMode, ...Object.values(o.modes ?? {})]) {
      const dir = setting ? hfTokenizerDir(setting) : undefined;
      if (dir !== undefined && !this.hfByDir.has(dir)) this.hfByDir.set(dir, loadHfTokenizerDir(dir, o.hf));
    }
  }

  private settingFor(model: string): TokenizerSetting {
    const modes = this.o.modes;
    return (modes && Object.hasOwn(modes, model) ? modes[model] : undefined) ?? this.o.defaultMode ?? "approximate";
  }

  modeFor(model: string): TokenizerMode {
    const s = this.settingFor(model);
    return hfTokenizerDir(s) !== undefined ? "hf" : (s as TokenizerMode);
  }

  /** Stops the `hf:` tokenizers' render workers. */
  async close(): Promise<void> {
    await Promise.all([...this.hfByDir.values()].map((t) => t.close()));
  }

  /** The loaded `hf:` tokenizers, by directory (for stats and benches). */
  hfTokenizers(): ReadonlyMap<string, HfTokenizer> {
    return this.hfByDir;
  }

  /** The cached prefix entries an `hf:` result reused and stored (prefix-support derives block hashes per entry). */
  prefixReuseOf(tokens: TokenIds): PrefixReuse | undefined {
    for (const t of this.hfByDir.values()) {
      const r = t.prefixReuseOf(tokens);
      if (r) return r;
    }
    return undefined;
  }

  /** Gauges of these stats on a gateway's metrics registry (`jetroute_gateway_tokenizer{figure}`). */
  registerMetrics(registry: client.Registry): void {
    const stats = this.stats;
    const hf = this.hfByDir;
    new client.Gauge({
      name: "jetroute_gateway_tokenizer",
      help: "Prompt tokenization: remote calls, cache hits, fallbacks to approximate (of which oversized, template_errors, queue_full, prompt_batches), hf requests, hf prefix-cache hits and reused characters",
      labelNames: ["figure"],
      registers: [registry],
      collect() {
        this.set({ figure: "remote" }, stats.remote);
        this.set({ figure: "cache_hits" }, stats.cacheHits);
        this.set({ figure: "fallbacks" }, stats.fallbacks);
        this.set({ figure: "oversized" }, stats.oversized);
        this.set({ figure: "template_errors" }, stats.templateErrors);
        this.set({ figure: "queue_full" }, stats.queueFull);
        this.set({ figure: "prompt_batches" }, stats.promptBatches);
        this.set({ figure: "hf" }, stats.hf);
        let hits = 0;
        let reused = 0;
        for (const t of hf.values()) {
          hits += t.prefixStats?.hits ?? 0;
          reused += t.prefixStats?.reusedChars ?? 0;
        }
        this.set({ figure: "hf_prefix_hits" }, hits);
        this.set({ figure: "hf_prefix_reused_chars" }, reused);
      },
    });
  }

  private async hfTokens(t: HfTokenizer, input: PromptInput): Promise<TokenizeResult> {
    try {
      this.stats.hf++;
      const tokens = input.messages
        ? await t.chatIds(input.messages, {
            ...(input.tools ? { tools: input.tools } : {}),
            ...(input.templateKwargs ? { templateKwargs: input.templateKwargs } : {}),
            ...(input.rawToolJsonProblem ? { rawToolJsonProblem: input.rawToolJsonProblem } : {}),
            ...(input.continueFinalMessage ? { continueFinalMessage: true } : {}),
            addGenerationPrompt: input.addGenerationPrompt ?? true,
            addSpecialTokens: input.addSpecialTokens ?? false,
          })
        : await t.promptIds(this.completionText(input), input.addSpecialTokens ?? true);
      return { tokens, mode: "hf" };
    } catch (err) {
      if (err instanceof PromptBatchError) return this.batchFallback(input);
      this.stats.fallbacks++;
      if (err instanceof ChatTemplateError) this.stats.templateErrors++;
      else if (err instanceof QueueFullError) this.stats.queueFull++;
      return { tokens: approximateTokens(input), mode: "approximate" };
    }
  }

  /** The one text of a completion request; a batch of prompts throws PromptBatchError. */
  private completionText(input: PromptInput): string {
    if (input.prompt === undefined) return "";
    const text = singlePrompt(input.prompt);
    if (text === undefined) throw new PromptBatchError();
    return text;
  }

  private batchFallback(input: PromptInput): TokenizeResult {
    this.stats.fallbacks++;
    this.stats.promptBatches++;
    return { tokens: approximateTokens(input), mode: "approximate" };
  }

  /** `address` = a ready pod of the model, asked in `remote` mode. */
  async tokenize(model: string, input: PromptInput, address: string | undefined): Promise<TokenizeResult> {
    const mode = this.modeFor(model);
    if (mode === "hf") return this.hfTokens(this.hfByDir.get(hfTokenizerDir(this.settingFor(model)) as string) as HfTokenizer, input);
    if (mode === "local") return { tokens: tokenIdsOf(localTokens(input)), mode };
    if (mode === "approximate" || !address) return { tokens: approximateTokens(input), mode: "approximate" };
    if (!input.messages && input.prompt !== undefined && singlePrompt(input.prompt) === undefined) return this.batchFallback(input);
    const key = createHash("sha1").update(model).update("\u0000").update(JSON.stringify(input)).digest("base64");
    const hit = this.cache.get(key);
    if (hit) {
      // Refresh recency: Map iteration order is insertion order, so re-inserting makes it newest.
      this.cache.delete(key);
      this.cache.set(key, hit);
      this.stats.cacheHits++;
      return { tokens: hit.tokens, mode, cached: true };
    }
    try {
      this.stats.remote++;
      const body = input.messages
        ? {
            model,
            messages: input.messages,
            add_generation_prompt: input.addGenerationPrompt ?? true,
            add_special_tokens: input.addSpecialTokens ?? false,
            ...(input.continueFinalMessage ? { continue_final_message: true } : {}),
            ...(input.tools ? { tools: input.tools } : {}),
            ...(input.templateKwargs ? { chat_template_kwargs: input.templateKwargs } : {}),
          }
        : { model, prompt: singlePrompt(input.prompt) ?? "", add_special_tokens: input.addSpecialTokens ?? true };
      const res = await fetch(`http://${address}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(this.o.engineApiKey ? { authorization: `Bearer ${this.o.engineApiKey}` } : {}) },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(this.o.timeoutMs ?? 200),
        // An engine answers for itself: a redirect would send the engine key and the prompt elsewhere.
        redirect: "error",
      });
      if (!res.ok) {
        await res.body?.cancel().catch(() => undefined);
        throw new Error(`/tokenize answered ${res.status}`);
      }
      const tokens = (JSON.parse(await readBodyCapped(res, this.maxResponseBytes, "/tokenize answer")) as { tokens?: unknown }).tokens;
      // Ids outside 0..2^32-1 (or not integers) would wrap in the router's type: the answer is not used.
      if (!Array.isArray(tokens) || !tokens.every(isTokenId)) throw new Error("/tokenize returned no list of token ids");
      const ids = tokenIdsOf(tokens as number[]);
      this.remember(key, ids);
      return { tokens: ids, mode };
    } catch (err) {
      this.stats.fallbacks++;
      if (err instanceof BodyTooLargeError) this.stats.oversized++;
      return { tokens: approximateTokens(input), mode: "approximate" };
    }
  }

  /** Caches a result, evicting the least recently used until the byte bound holds. */
  private remember(key: string, tokens: TokenIds): void {
    const bytes = cacheEntryBytes(key, tokens);
    // One result larger than the whole bound would evict everything and still not fit.
    if (bytes > this.cacheBytes) return;
    const old = this.cache.get(key);
    if (old) {
      this.cache.delete(key);
      this.stats.cacheBytes -= old.bytes;
    }
    while (this.stats.cacheBytes + bytes > this.cacheBytes) {
      const first = this.cache.entries().next();
      if (first.done) break;
      this.cache.delete(first.value[0]);
      this.stats.cacheBytes -= first.value[1].bytes;
      this.stats.cacheEvicted++;
    }
    this.cache.set(key, { tokens, bytes });
    this.stats.cacheBytes += bytes;
    this.stats.cacheEntries = this.cache.size;
  }
}
