/**
 * The gateway's embeddings for virtual models' `similarity` signals (docs/semantic.md): OpenAI
 * `/v1/embeddings` calls to the embedding model's pods — discovered through PODS like any model's
 * — with a deadline, and a cache of vectors keyed by a hash of (model, text), bounded in bytes
 * (least recently used out first).
 *
 * Never rejects: no ready pod, an error or the deadline resolves `undefined`, and the semantic
 * stage scores those signals with its lexical fallback. A call that misses the deadline is left to
 * finish (at most CALL_LIMIT_MS) so that its vectors fill the cache for the next request.
 */
import { createHash } from "node:crypto";
import type { EmbeddingSource } from "../routing/mod.js";
import { discardBody, readBodyCapped } from "../shared/http-body.js";
import type { PodInfo } from "../views/pod-set.js";

/**
 * Bytes one cached entry costs besides its vector's 4 bytes per dimension: the 24-character key,
 * the Map entry, the Float32Array and ArrayBuffer objects. Measured: 212-213 bytes (heap and array
 * buffer growth over 50,000 entries of 256 dimensions, per entry, minus the 1,024 of the vector;
 * measured again by `npm run bench -- semantic`, which prints it).
 */
export const ENTRY_OVERHEAD_BYTES = 240;
/** Default cache bound (bytes). */
export const DEFAULT_CACHE_BYTES = 32 * 1024 * 1024;
/** A call past its deadline is abandoned at this age. */
const CALL_LIMIT_MS = 5_000;
/** Calls outstanding at once (beyond: the lexical fallback at once). */
const MAX_CALLS = 64;
/** Texts one call embeds at most. */
const MAX_BATCH = 256;
/**
 * Bound on one `/v1/embeddings` answer (bytes): 256 vectors of 2,048 dimensions printed as JSON
 * (about 22 bytes a number) fit with room. An answer declaring more is refused before its body is
 * read; one that streams more is cut there.
 */
export const DEFAULT_EMBEDDING_ANSWER_BYTES = 16 * 1024 * 1024;

export interface EmbeddingClientOptions {
  /** The model's ready pods (the fold's pod set). */
  readyPods(model: string): readonly PodInfo[];
  maxBytes?: number;
  /** The engines' API key, if they need one. */
  engineApiKey?: string;
  /** Bound on one answer's body (default DEFAULT_EMBEDDING_ANSWER_BYTES). */
  maxAnswerBytes?: number;
  /** Counts what happened to each request's embeddings. */
  observe?(event: "hit" | "miss" | "timeout" | "error" | "no-pod" | "busy"): void;
}

/** A bounded LRU of vectors by key, in bytes. */
export class VectorCache {
  private readonly entries = new Map<string, Float32Array>();
  private used = 0;
  constructor(readonly maxBytes: number) {}

  static costOf(v: Float32Array): number {
    return v.byteLength + ENTRY_OVERHEAD_BYTES;
  }
  get bytes(): number {
    return this.used;
  }
  get size(): number {
    return this.entries.size;
  }
  get(key: string): Float32Array | undefined {
    const v = this.entries.get(key);
    if (v) {
      // Most recently used last: evicted last.
      this.entries.delete(key);
      this.entries.set(key, v);
    }
    return v;
  }
  set(key: string, v: Float32Array): void {
    const old = this.entries.get(key);
    if (old) {
      this.entries.delete(key);
      this.used -= VectorCache.costOf(old);
    }
    const cost = VectorCache.costOf(v);
    if (cost > this.maxBytes) return;
    while (this.used + cost > this.maxBytes) {
      const first = this.entries.entries().next();
      if (first.done) break;
      this.entries.delete(first.value[0]);
      this.used -= VectorCache.costOf(first.value[1]);
    }
    this.entries.set(key, v);
    this.used += cost;
  }
}

/** The cache key of a text: 18 bytes of SHA-256 over the model and the text (base64, 24 characters). */
export function textKey(model: string, text: string): string {
  return createHash("sha256").update(model).update("\0").update(text).digest().subarray(0, 18).toString("base64");
}

/** Texts up to this long keep their cache key in a memo (example utterances: hashed once, not per request). */
const MEMO_MAX_CHARS = 256;
const MEMO_MAX_ENTRIES = 4096;

export class EmbeddingClient implements EmbeddingSource {
  readonly cache: VectorCache;
  private calls = 0;
  private next = 0;
  /** Keys of short texts by model and text (bounded; cleared when full). */
  private readonly memo = new Map<string, Map<string, string>>();

  private keyOf(model: string, text: string): string {
    if (text.length > MEMO_MAX_CHARS) return textKey(model, text);
    let m = this.memo.get(model);
    if (!m) {
      if (this.memo.size >= 64) this.memo.clear();
      m = new Map();
      this.memo.set(model, m);
    }
    let k = m.get(text);
    if (k === undefined) {
      if (m.size >= MEMO_MAX_ENTRIES) m.clear();
      k = textKey(model, text);
      m.set(text, k);
    }
    return k;
  }

  constructor(private readonly o: EmbeddingClientOptions) {
    this.cache = new VectorCache(o.maxBytes ?? DEFAULT_CACHE_BYTES);
  }

  cached(model: string, texts: readonly string[]): ReadonlyMap<string, Float32Array> | undefined {
    const out = new Map<string, Float32Array>();
    for (const t of texts) {
      const v = this.cache.get(this.keyOf(model, t));
      if (!v) return undefined;
      out.set(t, v);
    }
    this.o.observe?.("hit");
    return out;
  }

  async embed(model: string, texts: readonly string[], timeoutMs: number): Promise<ReadonlyMap<string, Float32Array> | undefined> {
    const out = new Map<string, Float32Array>();
    const missing: string[] = [];
    for (const t of texts) {
      const v = this.cache.get(this.keyOf(model, t));
      if (v) out.set(t, v);
      else missing.push(t);
    }
    if (missing.length === 0) return out;
    this.o.observe?.("miss");
    const pods = this.o.readyPods(model);
    if (pods.length === 0) {
      this.o.observe?.("no-pod");
      return undefined;
    }
    if (this.calls >= MAX_CALLS) {
      this.o.observe?.("busy");
      return undefined;
    }
    const pod = pods[this.next++ % pods.length] as PodInfo;
    const call = this.call(pod, model, missing.slice(0, MAX_BATCH));
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), timeoutMs);
    });
    const got = await Promise.race([call, deadline]);
    clearTimeout(timer);
    if (got === "timeout") {
      this.o.observe?.("timeout");
      return undefined;
    }
    if (!got) return undefined;
    for (const [t, v] of got) out.set(t, v);
    return missing.length <= MAX_BATCH ? out : undefined;
  }

  /** One `/v1/embeddings` call; its vectors go into the cache whenever it ends. Never rejects. */
  private async call(pod: PodInfo, model: string, texts: string[]): Promise<Map<string, Float32Array> | undefined> {
    this.calls++;
    try {
      const res = await fetch(`http://${pod.address}/v1/embeddings`, {
        method: "POST",
        headers: { "content-type": "application/json", ...(this.o.engineApiKey ? { authorization: `Bearer ${this.o.engineApiKey}` } : {}) },
        body: JSON.stringify({ model, input: texts }),
        signal: AbortSignal.timeout(CALL_LIMIT_MS),
        // An engine answers for itself: a redirect would re-post the prompts (and the engine key) elsewhere.
        redirect: "error",
      });
      if (!res.ok) {
        await discardBody(res);
        this.o.observe?.("error");
        return undefined;
      }
      const body = JSON.parse(await readBodyCapped(res, this.o.maxAnswerBytes ?? DEFAULT_EMBEDDING_ANSWER_BYTES, "/v1/embeddings answer")) as { data?: Array<{ index?: number; embedding?: unknown }> };
      const out = new Map<string, Float32Array>();
      for (const d of body.data ?? []) {
        const t = typeof d.index === "number" ? texts[d.index] : undefined;
        if (t === undefined || !Array.isArray(d.embedding) || d.embedding.length === 0 || d.embedding.length > 65_536) continue;
        // A vector with anything but finite numbers would score NaN: not a vector.
        if (!d.embedding.every((x) => typeof x === "number" && Number.isFinite(x))) continue;
        const v = Float32Array.from(d.embedding as number[]);
        out.set(t, v);
        this.cache.set(this.keyOf(model, t), v);
      }
      if (out.size !== texts.length) {
        this.o.observe?.("error");
        return undefined;
      }
      return out;
    } catch {
      this.o.observe?.("error");
      return undefined;
    } finally {
      this.calls--;
    }
  }
}
