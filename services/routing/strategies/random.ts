import type { Pick, RoutingContext, Scorer, Strategy } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

/**
 * In a combination `random` adds uniform noise (higher is better), e.g. `least-kv-cache:1,random:0.1`
 * to spread requests among pods whose metrics barely differ.
 */
export const randomScorer: Scorer = {
  name: "random",
  better: "higher",
  score: (ctx) => ctx.pods.map(() => ctx.random()),
};

/** `random`: uniform over ready pods, one draw. Every candidate scores 0. Needs no metrics. */
export const randomStrategy: Strategy = {
  name: "random",
  scorer: randomScorer,
  pick(ctx: RoutingContext): Pick {
    const i = Math.min(ctx.pods.length - 1, Math.floor(ctx.random() * ctx.pods.length));
    return { pod: ctx.pods[i] as Pick["pod"], candidates: ctx.pods.map((pod) => ({ pod, score: 0 })) };
  },
};

export const randomPlugin: StrategyPlugin = fixedPlugin(randomStrategy);
