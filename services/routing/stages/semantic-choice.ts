/**
 * The semantic stage on the request path: for a virtual model, classify the request
 * (semantic.ts) and apply the winning decision's action: the model it chose, its system prompt and
 * `chat_template_kwargs` written into the parsed body, its profile and strategy into the headers
 * the plan reads. 400 when no decision matches and there is no default.
 */
import { markRewritten, parsedOf } from "../context.js";
import type { PrepareStage } from "../pipeline.js";
import { compiledRulesFor } from "../semantic/rules.js";
import { actionHeaders, applyAction, judge, requestTexts } from "./semantic.js";

export const semanticStage: PrepareStage = {
  name: "semantic",
  phase: "prepare",
  run(ctx, env): void {
    const parsed = parsedOf(ctx);
    const virtual = env.config?.get(parsed.model)?.semantic;
    if (!virtual) return;
    const rules = compiledRulesFor(parsed.model, virtual);
    const texts = ctx.semanticTexts ?? requestTexts(rules, parsed);
    const headers = ctx.input.headers;
    const user = headers.user || undefined;
    const j = judge(rules, parsed, { headers, ...(user ? { user } : {}), ...(ctx.input.keyClass ? { keyClass: ctx.input.keyClass } : {}), ...(ctx.embeddings ? { embeddings: ctx.embeddings } : {}) }, texts);
    if ("refused" in j) {
      ctx.semanticRefusal = j.tag;
      throw j.refused;
    }
    ctx.semantic = j;
    ctx.parsed = applyAction(parsed, j.action);
    ctx.headers = actionHeaders(ctx.headers, j.action);
    markRewritten(ctx);
  },
};
