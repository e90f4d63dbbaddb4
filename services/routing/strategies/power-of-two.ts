/**
 * `power-of-two`: two distinct candidates drawn at random, the one with fewer requests in flight
 * wins (ties: a coin flip). Sampling instead of scanning keeps replicas that decide at the same
 * moment from all choosing the same least-loaded pod, at the price of sometimes missing the best.
 *
 * The in-flight count is least-request's (shared ledger, never missing), so no fallback is needed.
 * `candidates` lists only the pods drawn. In a combination only the score takes part (sampling is a
 * picker, not a metric), so there it weighs exactly like least-request.
 */
import type { PodInfo } from "../../views/pod-set.js";
import { inFlightScore, inFlightScorer } from "./in-flight.js";
import type { Pick, RoutingContext, Scorer, Strategy } from "./types.js";
import { pickBest } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

export const powerOfTwoScorer: Scorer = { ...inFlightScorer, name: "power-of-two" };

export const powerOfTwoStrategy: Strategy = {
  name: "power-of-two",
  scorer: powerOfTwoScorer,
  pick(ctx: RoutingContext): Pick {
    const n = ctx.pods.length;
    const drawn = [Math.min(n - 1, Math.floor(ctx.random() * n))];
    if (n > 1) {
      // A second draw among the other n-1 pods, shifted past the first: two distinct pods, uniformly.
      const j = Math.min(n - 2, Math.floor(ctx.random() * (n - 1)));
      drawn.push(j >= (drawn[0] as number) ? j + 1 : j);
    }
    const candidates = drawn.map((k) => {
      const pod = ctx.pods[k] as PodInfo;
      return { pod, score: inFlightScore(ctx, pod) };
    });
    return { pod: pickBest(candidates, "lower", ctx.random).pod, candidates, better: "lower" };
  },
};

export const powerOfTwoPlugin: StrategyPlugin = fixedPlugin(powerOfTwoStrategy);
