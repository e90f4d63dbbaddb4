/**
 * Prefix-aware routing inside a gateway: prompt tokens -> router block hashes -> matches in the
 * engine-fed prefix index and in the shared routed-prefix history; and, after a decision, the
 * routed prefix published to the KV stream so every replica knows it at once.
 */
import type { KvRouted } from "../../schemas/events.js";
import type { Subjects } from "../../streams/subjects.js";
import type { Outbox } from "../shared/publish.js";
import type { PrefixEntry } from "../tokenizer/prefix-ids.js";
import type { TokenIds } from "../tokenizer/prompt-tokens.js";
import { type BlockHash, chainBlocks, chainSeed, hashToHex } from "../views/block-hash.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { PodInfo } from "../views/pod-set.js";
import { type PrefixSupport, type PromptBlocks, matchPrefix, type PrefixMatchResult } from "../routing/mod.js";
import type { Tokenizer } from "./tokenization.js";

export interface PrefixSupportOptions {
  gatewayId: string;
  /** Read for matching (index, routed prefixes, load); routed prefixes are applied to it as own events. */
  state: GatewayState;
  tokenizer: Tokenizer;
  subjects: Subjects;
  outbox: Outbox;
  /** How long a routed prefix counts in approximate mode (it is all there is). */
  routedTtlMs?: number;
  /**
   * How long a routed prefix counts next to the engine index (precise mode): long enough to cover
   * the engine's BlockStored arriving, short enough not to hide the engine's evictions.
   */
  routedPreciseMaxAgeMs?: number;
  /** Block size when the engine reports none (vLLM's default). */
  defaultBlockSize?: number;
  /** Longest prompt considered, in blocks (bounds hashing and lookup work per request). */
  maxBlocks?: number;
}

/** Approximate-mode hashes live in their own space: they must never match engine blocks. */
const APPROX_LORA_TAG = "\u0000approximate";

/** Block hashes of a cached prefix's ids under one chain seed and block size. */
interface KnownHashes {
  seed: BlockHash;
  size: number;
  hashes: BlockHash[];
}
/** Seeds (model/adapter/block size/salt) remembered per cached prefix; the oldest goes first. */
const SEEDS_PER_PREFIX = 2;

/**
 * Block hashes that reuse those of the cached prefix the tokenizer reused: a later turn of a
 * conversation hashes only the blocks past what its previous turn already hashed. Exact: the
 * tokenizer guarantees the prompt's ids start with the reused entry's ids, and a chained hash of
 * the same ids from the same seed is the same hash. Hashes are kept per cached prefix entry in a
 * WeakMap, so they live exactly as long as the tokenizer caches the entry; their bytes are part of
 * the tokenizer cache's bound (PREFIX_DERIVED_BYTES_PER_TOKEN: 2 seeds x ~2 bytes a token).
 */
export class IncrementalBlockHashes {
  private readonly known = new WeakMap<PrefixEntry, KnownHashes[]>();
  /** Blocks taken from a cached prefix, and blocks hashed. */
  readonly stats = { reusedBlocks: 0, hashedBlocks: 0 };

  hashes(tokens: TokenIds, seed: BlockHash, size: number, maxBlocks: number, reuse: { reused?: PrefixEntry; stored: readonly PrefixEntry[] } | undefined): BlockHash[] {
    const limit = Math.max(0, Math.min(Math.floor(tokens.length / size), maxBlocks));
    const known = reuse?.reused ? this.known.get(reuse.reused)?.find((k) => k.seed === seed && k.size === size)?.hashes : undefined;
    const k = Math.min(known?.length ?? 0, limit);
    const rest = chainBlocks(k > 0 ? ((known as BlockHash[])[k - 1] as BlockHash) : seed, tokens, size, k * size, limit - k);
    const hashes = k > 0 ? (known as BlockHash[]).slice(0, k).concat(rest) : rest;
    this.stats.reusedBlocks += k;
    this.stats.hashedBlocks += rest.length;
    for (const e of reuse?.stored ?? []) {
      const list = this.known.get(e) ?? [];
      if (list.some((x) => x.seed === seed && x.size === size)) continue;
      if (list.length >= SEEDS_PER_PREFIX) list.shift();
      list.push({ seed, size, hashes: hashes.slice(0, Math.min(Math.floor(e.ids.length / size), hashes.length)) });
      this.known.set(e, list);
    }
    return hashes;
  }
}

export function createPrefixSupport(o: PrefixSupportOptions): PrefixSupport {
  const ttl = o.routedTtlMs ?? 120_000;
  const maxBlocks = o.maxBlocks ?? 8_192;
  const incremental = new IncrementalBlockHashes();
  /** A precise match's hashes -> blocks the engine index held per candidate (read back by recordRouted). */
  const indexHeld = new WeakMap<readonly bigint[], Map<string, number>>();
  /**
   * A prompt's hashes per chain seed and block size, kept as long as its ids are: the tokenize
   * stage hashes ahead (in its own turn of the loop) and select's match finds them here instead of
   * hashing a long prompt inside the commit section. Same ids, seed and size: the same hashes.
   */
  const hashed = new WeakMap<TokenIds, { seed: BlockHash; size: number; hashes: BlockHash[] }>();
  /** The prompt's router block hashes as `pod`'s engine would key them. */
  const blocks = (model: string, pod: PodInfo, tokens: TokenIds, now: number, tokenizerMode: string | undefined, cacheSalt?: string): PromptBlocks => {
    const base = pod.model;
    // A request for a LoRA adapter names the adapter; its blocks are keyed by base model + adapter.
    const lora = model !== base ? model : null;
    const approximate = tokenizerMode === "approximate";
    const size = approximate ? 16 : (o.state.load.fresh(base, pod.pod, now)?.blockSize ?? o.defaultBlockSize ?? 16);
    // The salt is keyed like the engine keys it, in both modes: a salted prompt's routed prefixes
    // and index matches are those of the same salt only.
    const seed = chainSeed(base, approximate ? `${lora ?? ""}${APPROX_LORA_TAG}` : lora, size, cacheSalt);
    const mode = approximate ? "approximate" : "precise";
    const known = hashed.get(tokens);
    if (known && known.seed === seed && known.size === size) return { size, mode, hashes: known.hashes };
    const reuse = approximate ? undefined : o.tokenizer.prefixReuseOf?.(tokens);
    const hashes = incremental.hashes(tokens, seed, size, maxBlocks, reuse);
    hashed.set(tokens, { seed, size, hashes });
    return { size, mode, hashes };
  };
  return {
    tokenizer: o.tokenizer,
    match(model, candidates, tokens, now, tokenizerMode, cacheSalt): PrefixMatchResult {
      const b = blocks(model, candidates[0] as PodInfo, tokens, now, tokenizerMode, cacheSalt);
      const result = matchPrefix(o.state, candidates, b.hashes, b.size, b.mode === "approximate", now, o.routedPreciseMaxAgeMs);
      if (b.mode === "precise") indexHeld.set(result.hashes, new Map(result.detail.map((d) => [d.pod, d.indexBlocks])));
      return result;
    },
    blocks,
    recordRouted(pod, all, now, chargeId) {
      // Precise: only the blocks past what the engine index already showed for this pod (matching
      // continues a routed prefix from there): a later turn of a long conversation publishes what
      // the turn adds, not the whole conversation again.
      const held = indexHeld.get(all)?.get(pod.pod) ?? 0;
      const hashes = held > 0 ? all.slice(held) : all;
      if (hashes.length === 0) return;
      const ev: KvRouted = { type: "kv-routed", model: pod.model, pod: pod.pod, gateway: o.gatewayId, hashes: hashes.map(hashToHex), ts: now, ttlMs: ttl, charge: chargeId };
      o.state.ownRouted(ev, hashes);
      o.outbox.fire(o.subjects.kv(pod.model, pod.pod), ev);
    },
  };
}
