/**
 * Tokenization for prefix routing, per model: `remote` asks a pod's `/tokenize` (chat form with
 * `messages`, so the engine's own chat template applies — hashing raw text gets zero overlap with
 * engine blocks), cached by content hash; a slow or failing engine makes that request fall back
 * to `approximate` (counted). `local` and `approximate` run in-process.
 */
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
  /** Bound on cached remote results (entries). */
  cacheEntries?: number;
}

export interface TokenizerStats {
  remote: number;
  cacheHits: number;
  fallbacks: number;
}

export class Tokenizer {
  readonly stats: TokenizerStats = { remote: 0, cacheHits: 0, fallbacks: 0 };
  private readonly cache = new Map<string, number[]>();
  private readonly cacheEntries: number;

  constructor(private readonly o: TokenizerOptions = {}) {
    this.cacheEntries = o.cacheEntries ?? 10_000;
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
      return { tokens: hit, mode, cached: true };
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
      if (!res.ok) throw new Error(`/tokenize answered ${res.status}`);
      const tokens = ((await res.json()) as { tokens?: unknown }).tokens;
      if (!Array.isArray(tokens) || !tokens.every((t) => typeof t === "number")) throw new Error("/tokenize returned no token list");
      if (this.cache.size >= this.cacheEntries) this.cache.delete(this.cache.keys().next().value as string);
      this.cache.set(key, tokens as number[]);
      return { tokens: tokens as number[], mode };
    } catch {
      this.stats.fallbacks++;
      return { tokens: approximateTokens(input), mode: "approximate" };
    }
  }
}
