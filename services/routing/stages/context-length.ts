/**
 * The context-length stage: a prompt surely longer than every ready pod's context (engines report
 * `max_model_len` on `/v1/models`; the metrics scraper carries it on LOAD samples) is refused with a
 * 400 now, before it is held by flow control or routed to an engine that would refuse it anyway.
 * "Surely": the rule is flow/context-length.ts (exact ids when tokenized, else a conservative
 * estimate); a model any of whose ready pods has not reported a context is not checked.
 */
import { parsedOf } from "../context.js";
import { contextRefusal } from "../flow/context-length.js";
import type { PrepareStage } from "../pipeline.js";

export const contextLengthStage: PrepareStage = {
  name: "context-length",
  phase: "prepare",
  run(ctx, env): void {
    const parsed = parsedOf(ctx);
    const tooLong = contextRefusal(parsed.model, { parsed, ...(ctx.tokens ? { tokens: ctx.tokens } : {}), ...(ctx.tokenizerMode ? { tokenizerMode: ctx.tokenizerMode } : {}) }, env.views.pods.readyPods(parsed.model), env.views.load);
    if (tooLong) throw tooLong;
  },
};
