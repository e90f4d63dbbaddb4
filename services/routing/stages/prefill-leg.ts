/**
 * The prefill-leg stage, after routing: a request the `pd` strategy disaggregated has its prefill
 * leg run (pd-legs.ts) before the decode pod is named to the proxy (vLLM), or alongside the
 * decode (SGLang). Nothing for any other request. A refusal here comes after the charge: the
 * legs stage has ended the request, and the adapter only answers.
 *
 * A request with a band: the body carries the decode pod's engine priority (engine-fields.ts);
 * the legs give each prefill attempt its own pod's (`LegPriority`).
 */
import type { AfterStage } from "../pipeline.js";

export const prefillLegStage: AfterStage = {
  name: "prefill-leg",
  phase: "after",
  run(r, ctx, env) {
    if (!ctx.strategy.traits?.disaggregated || !r.pd || !env.legs) return r;
    if (r.pd.plan.engine === "sglang" && !r.pd.prefillCharge) return r;
    const band = ctx.flow?.band;
    const priority =
      band === undefined ? undefined : { band, setting: env.config?.get(r.pod.model)?.flowControl?.enginePriority, client: (ctx.beforeEngineFields?.parsed ?? ctx.parsed).body };
    return env.legs.run(r, ctx.input, ctx.parsed.body, ctx.input.headers[":path"]?.split("?")[0] || "/v1/chat/completions", priority);
  },
};
