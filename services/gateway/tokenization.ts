/**
 * Tokenization for prefix routing, per model: `remote` asks a pod's `/tokenize` (chat form with
 * `messages`, so the engine's own chat template applies — hashing raw text gets zero overlap with
 * engine blocks), cached by content hash; a slow or failing engine makes that request fall back
 * to `approximate` (counted). `local` and `approximate` run in-process.
 *
 * Both what is read and what is kept are bounded in bytes, not counts: an engine's answer is read
 * up to `maxResponseBytes` (streamed, so a runaway body never sits in memory whole), and the cache
 * holds at most `cacheBytes` of token ids — a few 100k-token prompts weigh as much as thousands of
 * short ones, so an entry bound alone did not bound memory.
 */
import { BodyTooLargeError, readBodyCapped } from "../shared/http-body.js";
import { createHash } from "node:crypto";
import { approximateTokens, localTokens, type PromptInput, type TokenizerMode } from "../tokenizer/prompt-tokens.js";

export interface TokenizeResult {
  tokens: number[];
  /** The mode that produced the ids (a remote failure yields "approximate"). */
  mode: TokenizerMode;
  cached?: boolean;
}

export interface TokenizerOptions {
  /** Mode per model; `defaultMode` for the rest. */
  modes?: Readonly<Record<string, TokenizerMode>>;
  defaultMode?: TokenizerMode;
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
}

export const DEFAULT_TOKENIZER_CACHE_BYTES = 64 * 1024 * 1024;
export const DEFAULT_TOKENIZE_RESPONSE_BYTES = 8 * 1024 * 1024;

/**
 * What a cached result costs, estimated: the key (UTF-16, 2 bytes a char), 8 bytes per token id
 * (a JS array of small integers: one tagged slot each) and ~100 bytes of Map entry and array
 * header.
 */
export function cacheEntryBytes(key: string, tokens: readonly number[]): number {
  return 2 * key.length + 8 * tokens.length + 100;
}


export class Tokenizer {
  readonly stats: TokenizerStats = { remote: 0, cacheHits: 0, fallbacks: 0, oversized: 0, cacheEntries: 0, cacheBytes: 0, cacheEvicted: 0 };
  /** Map iteration order is insertion order: re-inserting on a hit keeps the least recently used first. */
  private readonly cache = new Map<string, { tokens: number[]; bytes: number }>();
  private readonly cacheBytes: number;
  private readonly maxResponseBytes: number;

  constructor(private readonly o: TokenizerOptions = {}) {
    this.cacheBytes = o.cacheBytes ?? DEFAULT_TOKENIZER_CACHE_BYTES;
    this.maxResponseBytes = o.maxResponseBytes ?? DEFAULT_TOKENIZE_RESPONSE_BYTES;
  }

  modeFor(model: string): TokenizerMode {
    return this.o.modes?.[model] ?? this.o.defaultMode ?? "approximate";
  }

  /** `address` = a ready pod of the model, asked in `remote` mode. */
  async tokenize(model: string, input: PromptInput, address: string | undefined): Promise<TokenizeResult> {
    const mode = this.modeFor(model);
    if (mode === "local") return { tokens: localTokens(input), mode };
    if (mode === "approximate" || !address) return { tokens: approximateTokens(input), mode: "approximate" };
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
        ? { model, messages: input.messages, add_generation_prompt: true, add_special_tokens: false }
        : { model, prompt: Array.isArray(input.prompt) ? input.prompt.join("") : (input.prompt ?? ""), add_special_tokens: true };
      const res = await fetch(`http://${address}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(this.o.timeoutMs ?? 200),
      });
      if (!res.ok) {
        await res.body?.cancel().catch(() => undefined);
        throw new Error(`/tokenize answered ${res.status}`);
      }
      const tokens = (JSON.parse(await readBodyCapped(res, this.maxResponseBytes, "/tokenize answer")) as { tokens?: unknown }).tokens;
      if (!Array.isArray(tokens) || !tokens.every((t) => typeof t === "number")) throw new Error("/tokenize returned no token list");
      this.remember(key, tokens as number[]);
      return { tokens: tokens as number[], mode };
    } catch (err) {
      this.stats.fallbacks++;
      if (err instanceof BodyTooLargeError) this.stats.oversized++;
      return { tokens: approximateTokens(input), mode: "approximate" };
    }
  }

  /** Caches a result, evicting the least recently used until the byte bound holds. */
  private remember(key: string, tokens: number[]): void {
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
