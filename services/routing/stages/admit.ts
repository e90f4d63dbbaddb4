/**
 * The admit stage, the commit section's entry: the shared rate limits and their burst guard
 * (admission.ts) decide the request, and the section (select -> charge) runs in the same
 * synchronous step as the last verdict, so no other request is admitted in between.
 */
import { promptTokensOf } from "../context.js";
import type { AdmitStage } from "../pipeline.js";

export const admitStage: AdmitStage = {
  name: "admit",
  phase: "commit",
  run(ctx, env, section) {
    return env.admission.admit({ model: ctx.parsed.model, user: ctx.input.headers.user || undefined, tokens: promptTokensOf(ctx), rps: ctx.rps }, section);
  },
};
