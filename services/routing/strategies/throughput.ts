/**
 * `throughput`: the least token work in flight, with prompt tokens counted twice (AIBrix: prefill
 * of a prompt token costs about twice a generated token):
 *
 *   score = 2 × prompt tokens in flight + requests in flight × the pod's mean output tokens/request
 *
 * AIBrix minimises 2 × prompt tok/s + generation tok/s, read from engine gauges vLLM no longer
 * exports; a rate needs two samples (counter deltas), and a lifetime mean of tokens per request
 * barely moves, so either would lag behind bursts. The shared ledger knows every replica's
 * outstanding requests and their prompt tokens now; the engine's histograms supply only the output
 * length the ledger cannot know yet. In steady state in-flight tokens = token rate × time in system
 * (Little's law), so this ranks pods like AIBrix's rate does, without the lag.
 *
 * Missing or stale metrics: a pod without a mean output length uses the candidates' mean (else
 * AIBrix's guess, 100 tokens); the ledger part is always known, so this never falls back.
 */
import { scorerStrategy } from "./combine.js";
import { expectedGenerationTokens, podMeans } from "./metrics.js";
import type { Scorer } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

export const throughputScorer: Scorer = {
  name: "throughput",
  better: "lower",
  tracksOwnCharges: true,
  score: (ctx) => {
    const means = ctx.pods.map((pod) => {
      const load = ctx.load.fresh(pod.model, pod.pod, ctx.now);
      return load ? podMeans(load) : undefined;
    });
    const fallbackGen = expectedGenerationTokens(means);
    return ctx.pods.map((pod, i) => {
      const o = ctx.ledger.outstanding(pod.model, pod.pod);
      const gen = means[i]?.generationTokensPerRequest ?? fallbackGen;
      return 2 * o.promptTokens + o.requests * gen;
    });
  },
};

/** Replay may not reproduce every pick: the score moves at first tokens, which peers see a heartbeat later. */
export const throughputStrategy = scorerStrategy(throughputScorer, { replayResidual: "first-token timing" });

export const throughputPlugin: StrategyPlugin = fixedPlugin(throughputStrategy);
