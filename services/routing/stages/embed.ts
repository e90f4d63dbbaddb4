/**
 * The embed stage: a virtual model whose similarity signals use an embedding model gets its texts'
 * embeddings before the (synchronous) semantic stage: from the cache at once, else by a call to the
 * embedding model's pods (the one await a signal needs). Nothing for any other request.
 */
import { parsedOf } from "../context.js";
import type { PrepareStage } from "../pipeline.js";
import { compiledRulesFor } from "../semantic/rules.js";
import { embeddingTextsOf } from "../semantic/signals.js";
import { requestTexts } from "./semantic.js";

export const embedStage: PrepareStage = {
  name: "embed",
  phase: "prepare",
  run(ctx, env): void | Promise<void> {
    const embed = env.embeddings;
    if (!embed) return;
    const parsed = parsedOf(ctx);
    const virtual = env.config?.get(parsed.model)?.semantic;
    if (!virtual) return;
    const rules = compiledRulesFor(parsed.model, virtual);
    if (!rules.embeddingModel) return;
    const texts = requestTexts(rules, parsed);
    ctx.semanticTexts = texts;
    const need = embeddingTextsOf(rules, texts);
    if (need.length === 0) return;
    const cached = embed.cached(rules.embeddingModel, need);
    if (cached) {
      ctx.embeddings = cached;
      return;
    }
    return embed.embed(rules.embeddingModel, need, rules.embeddingTimeoutMs).then((v) => {
      if (v) ctx.embeddings = v;
    });
  },
};
