/**
 * `least-kv-cache` and `least-gpu-cache`: the lowest KV cache usage (0..1).
 *
 * AIBrix's least-kv-cache adds the GPU and CPU tiers, least-gpu-cache reads the GPU tier alone.
 * Engines report one figure here (vLLM `kv_cache_usage_perc`, the GPU cache; SGLang `token_usage`)
 * and no CPU-tier usage, so both strategies score the same number until a CPU-tier figure is
 * scraped; they stay separate names so profiles written for AIBrix keep working.
 *
 * Missing or stale metrics: a pod without a fresh usage figure is never preferred to one with;
 * no pod with a figure -> least-request.
 */
import { scorerStrategy } from "./combine.js";
import type { RoutingContext, Scorer } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

function kvUsage(ctx: RoutingContext): (number | undefined)[] {
  return ctx.pods.map((pod) => ctx.load.fresh(pod.model, pod.pod, ctx.now)?.kvCacheUsage ?? undefined);
}

export const leastKvCacheScorer: Scorer = { name: "least-kv-cache", better: "lower", score: kvUsage };
export const leastGpuCacheScorer: Scorer = { name: "least-gpu-cache", better: "lower", score: kvUsage };

export const leastKvCacheStrategy = scorerStrategy(leastKvCacheScorer);
export const leastGpuCacheStrategy = scorerStrategy(leastGpuCacheScorer);

export const leastKvCachePlugin: StrategyPlugin = fixedPlugin(leastKvCacheStrategy);
export const leastGpuCachePlugin: StrategyPlugin = fixedPlugin(leastGpuCacheStrategy);
