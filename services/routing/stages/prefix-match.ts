/**
 * How much of a prompt each candidate holds: the engine-fed prefix index (tier-weighted) and the
 * gateways' routed-prefix history, from the prompt's router block hashes. Pure; shared by live
 * routing (after tokenization) and replay (from the hashes a decision record keeps).
 */
import type { PodInfo } from "../../views/pod-set.js";
import type { PrefixIndex } from "../../views/prefix-index.js";
import type { RoutedPrefixes } from "../../views/routed-prefixes.js";
import type { PrefixMatchResult } from "./scheduling.js";

/** How long a routed prefix counts next to the engine index (precise mode): covers the engine's BlockStored arriving, short enough not to hide its evictions. */
export const ROUTED_PRECISE_MAX_AGE_MS = 5_000;

export interface PrefixMatchViews {
  readonly index: PrefixIndex;
  readonly routed: RoutedPrefixes;
}

export function matchPrefix(
  views: PrefixMatchViews,
  candidates: readonly PodInfo[],
  hashes: bigint[],
  blockSize: number,
  approximate: boolean,
  now: number,
  routedPreciseMaxAgeMs = ROUTED_PRECISE_MAX_AGE_MS,
): PrefixMatchResult {
  const base = (candidates[0] as PodInfo).model;
  const names = candidates.map((p) => p.pod);
  const fromIndex = approximate ? undefined : views.index.longestMatch(base, hashes, names);
  const maxAge = approximate ? Number.POSITIVE_INFINITY : routedPreciseMaxAgeMs;
  const fromRouted = views.routed.match(base, hashes, now, names, maxAge);
  // Precise: a routed prefix may continue where the engine index stops for that pod (a gateway
  // publishes only the blocks past what the index showed for the pod it picked).
  const continued = fromIndex ? views.routed.matchFrom(base, hashes, now, names, fromIndex.blocks, maxAge) : undefined;
  const byPod = new Map<string, number>();
  const detail = names.map((pod, i) => {
    const indexBlocks = fromIndex?.blocks[i] ?? 0;
    const indexWeighted = fromIndex?.weighted[i] ?? 0;
    const more = continued?.[i] ?? 0;
    const routedBlocks = Math.max(fromRouted.blocks.get(pod) ?? 0, more > 0 ? indexBlocks + more : 0);
    byPod.set(pod, Math.max(indexWeighted, routedBlocks, indexWeighted + more));
    return { pod, indexBlocks, indexGpuBlocks: fromIndex?.gpuBlocks[i] ?? 0, indexWeighted, routedBlocks };
  });
  return { info: { queried: hashes.length, blockSize, matched: (pod) => byPod.get(pod) ?? 0 }, hashes, detail };
}
