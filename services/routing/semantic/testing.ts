/** Test helpers for semantic model selection: a fold with pods of several models and a virtual model's rules. */
import type { ModelConfig } from "../../../schemas/config.js";
import type { PodEvent } from "../../../schemas/events.js";
import { encodeToken } from "../../../streams/tokens.js";
import { GatewayState } from "../../views/gateway-state.js";
import { validateModelConfig } from "../config-check.js";

export const CODER = "org/coder";
export const GENERAL = "org/general";
export const MATH = "org/math";
export const EMBED = "org/embed";

/** `auto`: code (keywords or a regex) -> coder with thinking on; math -> math with a system prompt; else general. */
export const AUTO: ModelConfig = {
  semantic: {
    signals: {
      code: { type: "keywords", keywords: ["python", "function", "compile", "stack trace"] },
      codeFence: { type: "regex", pattern: "```|\\bdef\\s+\\w+\\(" },
      math: { type: "keywords", keywords: ["integral", "derivative", "equation", "prove"] },
      long: { type: "prompt-tokens", gte: 2000 },
      french: { type: "language", languages: ["fr"] },
      vip: { type: "user", users: ["vip-user"], classes: ["gold"] },
    },
    decisions: [
      { name: "coding", priority: 20, when: { any: ["code", "codeFence"] }, action: { model: CODER, chatTemplateKwargs: { enable_thinking: true } } },
      { name: "math", priority: 10, when: "math", action: { model: MATH, systemPrompt: { text: "You are a careful mathematician.", mode: "prepend" } } },
      { name: "vip", priority: 5, when: { all: ["vip", { not: "long" }] }, action: { model: MATH } },
    ],
    default: { model: GENERAL },
  },
};

/** Applies a config entry to a fold as the config bucket would deliver it. */
export function putConfig(state: GatewayState, key: string, value: unknown, seq: number): void {
  state.apply({ type: "config-entry", key, operation: "PUT", value }, { stream: "config", subject: key, seq, serverTs: 0 });
}

export function putModelConfig(state: GatewayState, model: string, config: ModelConfig, seq: number): void {
  putConfig(state, `model.${encodeToken(model)}`, config, seq);
}

/** A fold with `perModel` ready pods of each model (addresses 10.<i>.0.<j>:8000 unless given). */
export function semanticState(models: readonly string[] = [CODER, GENERAL, MATH], perModel = 2, self = "gw", addresses: Record<string, string[]> = {}): GatewayState {
  const s = new GatewayState({ self, checkModelConfig: validateModelConfig });
  let seq = 1;
  models.forEach((model, i) => {
    for (let j = 0; j < perModel; j++) {
      const address = addresses[model]?.[j] ?? `10.${i + 1}.0.${j}:8000`;
      const ev: PodEvent = { type: "pod", action: "upsert", model, pod: `${model.split("/")[1]}-${j}`, address, ready: true, engine: "vllm", ts: 0 };
      s.apply(ev, { stream: "pods", subject: `pods.${i}.${j}`, seq: seq++, serverTs: 0 });
    }
  });
  return s;
}
