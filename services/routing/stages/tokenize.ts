/**
 * The tokenize stage: a strategy that matches prefixes needs the prompt's token ids. A prompt sent
 * as token ids is used as it is; otherwise the tokenizer runs (in `remote` mode one of the model's
 * pods is asked, spread by the prompt: tokenizer-pod.ts), which may await. Nothing for strategies
 * that do not need tokens, nor without prefix support.
 */
import { promptInputOf } from "../../tokenizer/prompt-tokens.js";
import { isPlanned, upstreamBodyOf } from "../context.js";
import type { PrepareStage } from "../pipeline.js";
import { LARGE_TOKEN_COUNT } from "../turn-budget.js";
import { tokenizerPodFor } from "./tokenizer-pod.js";

export const tokenizeStage: PrepareStage = {
  name: "tokenize",
  phase: "prepare",
  run(ctx, env): void | Promise<void> {
    const prefix = env.prefix;
    if (!prefix || !isPlanned(ctx) || !ctx.strategy.needs?.promptTokenIds) return;
    const parsed = ctx.parsed;
    // A prompt sent as token ids is exactly what the index is keyed on.
    if (parsed.promptTokenIds) {
      ctx.tokens = parsed.promptTokenIds;
      ctx.tokenizerMode = "ids";
      return;
    }
    const upstream = upstreamBodyOf(ctx);
    const raw = upstream ?? ctx.input.body;
    // Only remote mode asks a pod: the digest of a ~600 KB agent prompt is not worth it otherwise.
    const tokenizerPod = prefix.tokenizer.modeFor && prefix.tokenizer.modeFor(parsed.model) !== "remote" ? undefined : tokenizerPodFor(env.views.pods.readyPods(parsed.model), raw);
    // The body's text as the parse decoded it (when it is the body sent), for the raw tool-JSON scan.
    const text = upstream ? raw : (parsed.text ?? raw);
    const tokenized = prefix.tokenizer.tokenize(parsed.model, promptInputOf(parsed.body, text, parsed.api), tokenizerPod?.address).then((r) => {
      ctx.tokens = r.tokens;
      ctx.tokenizerMode = r.mode;
    });
    const turns = env.turns;
    if (!turns) return tokenized;
    // Sliced (turn-budget.ts): the prompt's block hashes in a turn of their own, ahead of select,
    // whose match finds them (prefix support keeps them with the ids) instead of hashing a long
    // prompt inside the commit section.
    return tokenized.then(() => (ctx.tokens && ctx.tokens.length >= LARGE_TOKEN_COUNT ? turns.yieldTurn() : undefined)).then(() => {
      const pod = env.views.pods.readyPods(parsed.model)[0];
      if (pod && ctx.tokens) prefix.blocks(parsed.model, pod, ctx.tokens, env.now(), ctx.tokenizerMode, parsed.cacheSalt);
    });
  },
};
