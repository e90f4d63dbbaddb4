import type { Pick, RoutingContext, Strategy } from "./types.js";

/** `random`: uniform over ready pods. Every candidate scores 0. */
export const randomStrategy: Strategy = {
  name: "random",
  pick(ctx: RoutingContext): Pick {
    const i = Math.min(ctx.pods.length - 1, Math.floor(ctx.random() * ctx.pods.length));
    return { pod: ctx.pods[i] as Pick["pod"], candidates: ctx.pods.map((pod) => ({ pod, score: 0 })) };
  },
};
