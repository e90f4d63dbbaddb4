/**
 * A prompt longer than the model's context is refused before it is held or routed: the engines
 * report their context length (`max_model_len` on `/v1/models`, carried by LOAD samples), and a
 * prompt no pod can take would only be refused by the engine after waiting in the queues. Pure.
 *
 * The model's context is the largest its ready pods report, and known only when every ready pod
 * reported one (a pod that did not tell might take a longer prompt).
 *
 * The prompt's size is what the gateway knows for sure: the tokenizer's count when the strategy
 * tokenized it (not an approximation), the token ids a completion prompt carries, else a lower bound
 * from the character estimate: half of it, i.e. 8 characters per token (text averages about 4;
 * only very repetitive text packs more into a token), so that no prompt an engine would accept is
 * refused for an estimate.
 */
import type { PodInfo } from "../../views/pod-set.js";
import { RouteError } from "../errors.js";

/** What the load view tells about a pod's context. */
export interface ContextReader {
  get(model: string, pod: string): { readonly maxModelLen?: number } | undefined;
}

/** The largest context among the ready pods, when every one of them reported one. */
export function contextLengthOf(pods: readonly PodInfo[], load: ContextReader): number | undefined {
  let max: number | undefined;
  for (const p of pods) {
    const n = load.get(p.model, p.pod)?.maxModelLen;
    if (n === undefined) return undefined;
    if (max === undefined || n > max) max = n;
  }
  return max;
}

export interface PromptSize {
  /** The strategy's tokenization (ids). */
  tokens?: { readonly length: number };
  tokenizerMode?: string;
  parsed: { promptTokens: number; promptTokenIds?: { readonly length: number } };
}

/** The fewest tokens the prompt can have, as far as the gateway knows. */
export function promptTokensAtLeast(p: PromptSize): number {
  if (p.tokens !== undefined && p.tokenizerMode !== undefined && p.tokenizerMode !== "approximate") return p.tokens.length;
  return Math.max(p.parsed.promptTokenIds?.length ?? 0, Math.ceil(p.parsed.promptTokens / 2));
}

/** The 400 for a prompt longer than the model's context, or undefined. */
export function contextRefusal(model: string, p: PromptSize, pods: readonly PodInfo[], load: ContextReader): RouteError | undefined {
  const limit = contextLengthOf(pods, load);
  if (limit === undefined) return undefined;
  const atLeast = promptTokensAtLeast(p);
  if (atLeast <= limit) return undefined;
  return new RouteError(
    "contextLengthExceeded",
    `this model's maximum context length is ${limit} tokens, and the prompt has at least ${atLeast} tokens; shorten the prompt (model \`${model.slice(0, 256)}\`)`,
    p.parsed.promptTokenIds ? "prompt" : "messages",
  );
}
