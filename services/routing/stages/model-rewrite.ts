/**
 * The model-rewrite stage (InferenceModelRewrite, docs/inference-pool.md): a request for a model a
 * pool's rewrite rule matches is routed and sent for the rule's target instead, chosen by weight
 * from the request id (the same target for a retry). Runs on the body's one parse; the rewrite is
 * part of the decision's inputs (its record, /debug/explain, replay). Which rules may apply is the
 * pool policies view's business: a pool's rules match only models that pool serves, and name only
 * its models as targets.
 */
import { markRewritten, parsedOf, requestIdOf } from "../context.js";
import type { PrepareStage } from "../pipeline.js";

export const modelRewriteStage: PrepareStage = {
  name: "model-rewrite",
  phase: "prepare",
  run(ctx, env): void {
    const rw = env.modelRewrites;
    if (!rw?.active()) return;
    const parsed = parsedOf(ctx);
    const to = rw.rewrite(parsed.model, requestIdOf(ctx));
    if (!to || to.model === parsed.model) return;
    ctx.rewrite = { from: parsed.model, to: to.model, rule: to.rule, pool: to.pool };
    ctx.parsed = { ...parsed, model: to.model, body: { ...parsed.body, model: to.model } };
    markRewritten(ctx);
  },
};
