/**
 * `least-busy-time`: the least busy pod. AIBrix reads a GPU busy-time ratio that no engine exports,
 * so this scores a documented proxy, the pod's saturation:
 *
 *   nothing waiting:      KV cache usage (0..1) — the share of the batch capacity in use. An
 *                         engine admits requests until its KV cache (or batch size) runs out, so
 *                         running / (running + free batch slots) ≈ KV usage when KV binds.
 *   requests waiting:     1 + waiting / max(1, running) — full, plus how many batches' worth of
 *                         requests queue behind the running ones.
 *
 * So an unsaturated pod always beats a saturated one, and among saturated pods the shorter queue
 * per running request wins.
 *
 * Missing or stale metrics: without a fresh sample, or with neither a queue nor a KV figure, a pod
 * is never preferred to one with a figure; no pod with one -> least-request.
 */
import type { EngineLoadFields } from "../../../schemas/events.js";
import { scorerStrategy } from "./combine.js";
import type { Scorer } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

export function saturation(load: EngineLoadFields): number | undefined {
  const waiting = load.waiting ?? 0;
  if (waiting > 0) return 1 + waiting / Math.max(1, load.running ?? 0);
  return load.kvCacheUsage ?? undefined;
}

export const leastBusyTimeScorer: Scorer = {
  name: "least-busy-time",
  better: "lower",
  score: (ctx) =>
    ctx.pods.map((pod) => {
      const load = ctx.load.fresh(pod.model, pod.pod, ctx.now);
      return load ? saturation(load) : undefined;
    }),
};

export const leastBusyTimeStrategy = scorerStrategy(leastBusyTimeScorer);

export const leastBusyTimePlugin: StrategyPlugin = fixedPlugin(leastBusyTimeStrategy);
