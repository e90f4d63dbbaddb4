/** The plan stage: the (chosen) model's profile -> strategy, latency targets, rate limit (parse.ts `planRoute`). */
import { parsedOf } from "../context.js";
import type { PrepareStage } from "../pipeline.js";
import { planRoute } from "./parse.js";

export const planStage: PrepareStage = {
  name: "plan",
  phase: "prepare",
  run(ctx, env): void {
    Object.assign(ctx, planRoute(parsedOf(ctx), ctx.headers, env.config, env.defaultStrategy));
  },
};
