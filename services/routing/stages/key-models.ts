/**
 * The key-models stage: the authenticated API key's `models` list must name the model the request
 * is routed for (403), also when a virtual model's decision or a model rewrite chose it.
 */
import { parsedOf } from "../context.js";
import { RouteError } from "../errors.js";
import type { PrepareStage } from "../pipeline.js";

export const keyModelsStage: PrepareStage = {
  name: "key-models",
  phase: "prepare",
  run(ctx): void {
    const allowed = ctx.input.keyModels;
    const model = parsedOf(ctx).model;
    if (!allowed || allowed.includes(model)) return;
    const s = ctx.semantic;
    const via = s ? ` (chosen by decision ${JSON.stringify(s.decision)} of the virtual model ${JSON.stringify(s.virtualModel)})` : "";
    throw new RouteError("modelNotAllowed", `this API key may not use the model ${JSON.stringify(model)}${via}`, "model");
  },
};
