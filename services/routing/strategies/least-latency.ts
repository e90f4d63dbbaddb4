/**
 * `least-latency`: the lowest estimated end-to-end latency of this request, in ms:
 *
 *   queue   = max(the pod's mean queue time, pending requests × its mean prefill time)
 *   prefill = its mean prefill time × this prompt / its mean prompt (tokens)
 *   decode  = its mean decode time per output token × the expected output length
 *
 * as in AIBrix (queue + prefill + decode from the engine histograms), with two changes: the queue
 * term also looks at the current backlog (engine queue or shared ledger, see metrics.ts), because
 * lifetime means alone barely move and would send every request to the historically fastest pod;
 * and SGLang pods, which export no prefill/decode histograms, are estimated from TTFT and
 * inter-token latency instead. Expected output length = the candidates' mean output length.
 *
 * Missing or stale metrics: a pod with a fresh sample but no finished request yet (new, restarted)
 * borrows the other candidates' mean figures, so it gets traffic and then figures of its own. A pod
 * without a fresh sample is never preferred to one with an estimate; none with one -> least-request.
 */
import type { EngineLoadFields } from "../../../schemas/events.js";
import { scorerStrategy } from "./combine.js";
import { backlog, estimateDecodeS, estimateTtftS, expectedGenerationTokens, type PodMeans, podMeans, withPeerDefaults } from "./metrics.js";
import type { RoutingContext, Scorer } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

/** Estimated TTFT and decode time of this request on each candidate (seconds), shared with slo*. */
export function latencyEstimates(ctx: RoutingContext): { ttftS?: number; decodeS?: number; load?: EngineLoadFields; means?: PodMeans }[] {
  const loads = ctx.pods.map((pod) => ctx.load.fresh(pod.model, pod.pod, ctx.now));
  const means = withPeerDefaults(loads.map((l) => (l ? podMeans(l) : undefined)));
  const gen = expectedGenerationTokens(means);
  return ctx.pods.map((pod, i) => {
    const load = loads[i];
    const m = means[i];
    if (!load || !m) return {};
    return {
      ttftS: estimateTtftS(m, backlog(ctx, pod, load), ctx.request.promptTokens),
      decodeS: estimateDecodeS(m, gen),
      load,
      means: m,
    };
  });
}

export const leastLatencyScorer: Scorer = {
  name: "least-latency",
  better: "lower",
  score: (ctx) =>
    latencyEstimates(ctx).map((e) => (e.ttftS !== undefined && e.decodeS !== undefined ? 1000 * (e.ttftS + e.decodeS) : undefined)),
};

export const leastLatencyStrategy = scorerStrategy(leastLatencyScorer);

export const leastLatencyPlugin: StrategyPlugin = fixedPlugin(leastLatencyStrategy);
