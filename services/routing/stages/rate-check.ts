/**
 * The rate-check stage: a request already over a shared rate limit is refused now (429), before
 * any tokenization or queueing work, and for /debug/explain too. The limits are decided again,
 * with the burst guard, by the admit stage right before the charge.
 */
import { parsedOf } from "../context.js";
import type { PrepareStage } from "../pipeline.js";

export const rateCheckStage: PrepareStage = {
  name: "rate-check",
  phase: "prepare",
  run(ctx, env): void {
    env.admission.check({ model: parsedOf(ctx).model, user: ctx.input.headers.user || undefined, tokens: parsedOf(ctx).promptTokens, rps: ctx.rps });
  },
};
