/**
 * Prefix-aware routing inside a gateway: prompt tokens -> router block hashes -> matches in the
 * engine-fed prefix index and in the shared routed-prefix history; and, after a decision, the
 * routed prefix published to the KV stream so every replica knows it at once.
 */
import type { KvRouted } from "../../schemas/events.js";
import type { Subjects } from "../../streams/subjects.js";
import type { Outbox } from "../shared/publish.js";
import { chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { PodInfo } from "../views/pod-set.js";
import type { PrefixSupport, PromptBlocks } from "../routing/director.js";
import { matchPrefix } from "../routing/stages/prefix-match.js";
import type { PrefixMatchResult } from "../routing/stages/scheduling.js";
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

export function createPrefixSupport(o: PrefixSupportOptions): PrefixSupport {
  const ttl = o.routedTtlMs ?? 120_000;
  const maxBlocks = o.maxBlocks ?? 8_192;
  /** The prompt's router block hashes as `pod`'s engine would key them. */
  const blocks = (model: string, pod: PodInfo, tokens: readonly number[], now: number, tokenizerMode: string | undefined, cacheSalt?: string): PromptBlocks => {
    const base = pod.model;
    // A request for a LoRA adapter names the adapter; its blocks are keyed by base model + adapter.
    const lora = model !== base ? model : null;
    const approximate = tokenizerMode === "approximate";
    const size = approximate ? 16 : (o.state.load.fresh(base, pod.pod, now)?.blockSize ?? o.defaultBlockSize ?? 16);
    // The salt is keyed like the engine keys it, in both modes: a salted prompt's routed prefixes
    // and index matches are those of the same salt only.
    const seed = chainSeed(base, approximate ? `${lora ?? ""}${APPROX_LORA_TAG}` : lora, size, cacheSalt);
    return { size, mode: approximate ? "approximate" : "precise", hashes: promptBlockHashes(tokens, seed, size, maxBlocks) };
  };
  return {
    tokenizer: o.tokenizer,
    match(model, candidates, tokens, now, tokenizerMode, cacheSalt): PrefixMatchResult {
      const b = blocks(model, candidates[0] as PodInfo, tokens, now, tokenizerMode, cacheSalt);
      return matchPrefix(o.state, candidates, b.hashes, b.size, b.mode === "approximate", now, o.routedPreciseMaxAgeMs);
    },
    blocks,
    recordRouted(pod, hashes, now, chargeId) {
      const ev: KvRouted = { type: "kv-routed", model: pod.model, pod: pod.pod, gateway: o.gatewayId, hashes: hashes.map(hashToHex), ts: now, ttlMs: ttl, charge: chargeId };
      o.state.ownRouted(ev, hashes);
      o.outbox.fire(o.subjects.kv(pod.model, pod.pod), ev);
    },
  };
}
