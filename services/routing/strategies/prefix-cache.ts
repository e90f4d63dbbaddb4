/**
 * `prefix-cache` (AIBrix semantics, on the shared index) and `prefix-cache-preble`.
 *
 * prefix-cache:
 *   1. Imbalance guard: if the spread of requests in flight (max - min) exceeds
 *      `imbalanceThreshold` (8), load wins: least-request.
 *   2. Load filter: only pods with in-flight <= mean + k·σ are eligible, so a hot prefix cannot
 *      pile everything onto one pod. k = 2 (AIBrix uses 1-2): with k = 1, a pod holding the
 *      prefix drops out as soon as it has one request in flight while most pods are idle
 *      ([1,0,0] -> limit 0.8), trading one step of waiting for a full prefill — measured as the
 *      main loss of hit rate in the prefix-quality benchmark.
 *   3. Among eligible pods, the longest (tier-weighted) match wins; ties go to fewer in flight.
 *   4. No eligible pod matches anything: least-request.
 * Scores reported: matched blocks (higher is better).
 *
 * prefix-cache-preble (after Preble's policy): if the best match covers more than half the prompt,
 * the least-loaded among the best-matching pods; otherwise a cost model: uncached prompt tokens
 * (prefill work) + in-flight requests × mean prompt tokens in flight (queueing), lowest wins.
 */
import type { PodInfo } from "../../views/pod-set.js";
import { inFlightScore } from "./in-flight.js";
import { checkParams, fixedPlugin, type StrategyPlugin } from "./plugin.js";
import { type Pick, pickBest, type RoutingContext, type Scored, type Scorer, type Strategy, type StrategyTraits } from "./types.js";

export interface PrefixCacheConfig {
  imbalanceThreshold: number;
  /** k in mean + k·σ. */
  stddevFactor: number;
}

export const DEFAULT_PREFIX_CACHE_CONFIG: PrefixCacheConfig = { imbalanceThreshold: 8, stddevFactor: 2 };

const PREFIX_TRAITS: StrategyTraits = { prefixMatch: true };

const matchScorer = (name: string): Scorer => ({
  name,
  better: "higher",
  score: (ctx) => ctx.pods.map((p) => (ctx.prefix ? ctx.prefix.matched(p.pod) : undefined)),
});

function leastRequest(ctx: RoutingContext, fallback: string): Pick {
  const candidates = ctx.pods.map((pod) => ({ pod, score: inFlightScore(ctx, pod) }));
  return { pod: pickBest(candidates, "lower", ctx.random, ctx.tieOrder).pod, candidates, fallback };
}

export function prefixCacheStrategy(config: PrefixCacheConfig = DEFAULT_PREFIX_CACHE_CONFIG): Strategy {
  return {
    name: "prefix-cache",
    needs: { promptTokenIds: true },
    traits: PREFIX_TRAITS,
    scorer: matchScorer("prefix-cache"),
    pick(ctx) {
      if (!ctx.prefix || ctx.prefix.queried === 0) return leastRequest(ctx, "least-request");
      const inFlight = ctx.pods.map((p) => ctx.ledger.outstanding(p.model, p.pod).requests);
      const max = Math.max(...inFlight);
      const min = Math.min(...inFlight);
      if (max - min > config.imbalanceThreshold) return leastRequest(ctx, "least-request (imbalance)");
      const mean = inFlight.reduce((a, b) => a + b, 0) / inFlight.length;
      const sd = Math.sqrt(inFlight.reduce((a, b) => a + (b - mean) ** 2, 0) / inFlight.length);
      const limit = mean + config.stddevFactor * sd;
      const candidates: Scored[] = ctx.pods.map((pod) => ({ pod, score: ctx.prefix?.matched(pod.pod) ?? 0 }));
      let best = 0;
      ctx.pods.forEach((_, i) => {
        if ((inFlight[i] as number) <= limit) best = Math.max(best, (candidates[i] as Scored).score);
      });
      if (best <= 0) return { ...leastRequest(ctx, "least-request (no match)"), candidates, better: "higher" };
      const top = ctx.pods.map((pod, i) => ({ pod, score: inFlight[i] as number, ok: (inFlight[i] as number) <= limit && (candidates[i] as Scored).score === best }));
      const pod = pickBest(
        top.filter((t) => t.ok),
        "lower",
        ctx.random,
        ctx.tieOrder,
      ).pod;
      return { pod, candidates, better: "higher" };
    },
  };
}

export const prefixCachePrebleStrategy: Strategy = {
  name: "prefix-cache-preble",
  needs: { promptTokenIds: true },
  traits: PREFIX_TRAITS,
  scorer: matchScorer("prefix-cache-preble"),
  pick(ctx) {
    const prefix = ctx.prefix;
    if (!prefix || prefix.queried === 0) return leastRequest(ctx, "least-request");
    const matched = ctx.pods.map((p) => prefix.matched(p.pod));
    const best = Math.max(...matched);
    if (best / prefix.queried > 0.5) {
      const top: Scored[] = ctx.pods.filter((_, i) => matched[i] === best).map((pod) => ({ pod, score: inFlightScore(ctx, pod) }));
      return { pod: pickBest(top, "lower", ctx.random, ctx.tieOrder).pod, candidates: ctx.pods.map((pod, i) => ({ pod, score: matched[i] as number })), better: "higher" };
    }
    const candidates: Scored[] = ctx.pods.map((pod: PodInfo, i) => {
      const o = ctx.ledger.outstanding(pod.model, pod.pod);
      const meanPrompt = o.requests > 0 ? o.promptTokens / o.requests : ctx.request.promptTokens;
      const uncached = Math.max(0, ctx.request.promptTokens - (matched[i] as number) * prefix.blockSize);
      return { pod, score: uncached + o.requests * meanPrompt };
    });
    return { pod: pickBest(candidates, "lower", ctx.random, ctx.tieOrder).pod, candidates };
  },
};

const defaultPrefixCache = prefixCacheStrategy();

export const prefixCachePlugin: StrategyPlugin = {
  type: "prefix-cache",
  needs: { promptTokenIds: true },
  traits: PREFIX_TRAITS,
  params: {
    imbalanceThreshold: { type: "number", min: 0, default: DEFAULT_PREFIX_CACHE_CONFIG.imbalanceThreshold, description: "requests in flight, max - min over the candidates, above which least-request decides" },
    stddevFactor: { type: "number", min: 0, default: DEFAULT_PREFIX_CACHE_CONFIG.stddevFactor, description: "k in mean + k x standard deviation: pods loaded above it are not preferred for their match" },
  },
  create(params) {
    if (!params || Object.keys(params).length === 0) return defaultPrefixCache;
    return prefixCacheStrategy(checkParams(prefixCachePlugin, params) as unknown as PrefixCacheConfig);
  },
};

export const prefixCachePreblePlugin: StrategyPlugin = fixedPlugin(prefixCachePrebleStrategy);
