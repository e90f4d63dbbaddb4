/**
 * The engine-fields stage, in the commit section between `select` and `charge`: once the pod is
 * chosen, the fields whose value depends on that pod's engine are written into the body it gets.
 * - `priority` (issue 36): the request's flow-control band in the pod's engine convention
 *   (engine-priority.ts, docs/engine-priority.md); nothing for a pod without priority scheduling,
 *   a model whose `flowControl.enginePriority` is "off", or a request without a band (its model has
 *   no flow control).
 * - `model` (docs/adapters.md): SGLang names a LoRA adapter `base:adapter` in the request's model,
 *   so a request for a managed adapter picked onto an SGLang pod carries `<base>:<adapter>`; vLLM
 *   pods keep the adapter's name.
 *
 * Why here and not as the first `after` stage: the charge stage serialises the engine's body into
 * the routed request (`upstreamBodyOf`) and keeps the decision inputs for the record, so a field
 * written before it is in both at once, serialised once; an `after` stage would have to
 * re-serialise and patch the record. The stage is pure and synchronous, as the section requires.
 * A strict commit runs the section again after a lost compare-and-set and may pick another pod:
 * each run starts from the body as it was before this stage's first run.
 *
 * P/D: a disaggregated request's picked pod is its decode pod: the body gets the decode pod's
 * `priority` (recorded as for any request). The prefill leg goes to another pod, possibly with
 * another scheduling policy: the legs stage (pd-legs.ts) rewrites its `priority` for the prefill
 * pod of each attempt (`bodyForLeg`), from the client's body kept in `beforeEngineFields`. The
 * SGLang adapter model name is not written for P/D legs.
 */
import { bodyWithEnginePriority, enginePriorityFor, recordedEnginePriority } from "../engine-priority.js";
import type { SelectedContext } from "../context.js";
import { isSelected, markRewritten } from "../context.js";
import type { SectionStage, StageEnv } from "../pipeline.js";
import { pdPlanOf } from "../strategies/pd.js";

export const engineFieldsStage: SectionStage = {
  name: "engine-fields",
  phase: "commit",
  run(c, env): undefined {
    if (!isSelected(c)) throw new Error("stage order: engine-fields before select");
    writeEngineFields(c, env);
    return undefined;
  },
};

/** Writes the picked pod's engine fields into the context's body; records what it wrote in `ctx.engineFields`. */
export function writeEngineFields(ctx: SelectedContext, env: Pick<StageEnv, "config" | "views">): void {
  // A strict commit's next attempt: back to the body before the last attempt's fields.
  if (ctx.beforeEngineFields) {
    ctx.parsed = ctx.beforeEngineFields.parsed;
    if (ctx.beforeEngineFields.rewritten) markRewritten(ctx);
    else {
      ctx.bodyRewritten = false;
      ctx.upstreamBody = undefined;
    }
  } else ctx.beforeEngineFields = { parsed: ctx.parsed, rewritten: ctx.bodyRewritten === true };
  delete ctx.engineFields;
  const pod = ctx.pick.pod;
  const disaggregated = pdPlanOf(ctx.pick)?.kind === "pd";
  const body = ctx.parsed.body;
  // Configs are keyed by the base model: the pod's model (an adapter's pods serve its base).
  const setting = env.config?.get(pod.model)?.flowControl?.enginePriority;
  const band = ctx.flow?.band;
  // The engines' Messages request (`/v1/messages`) has no `priority` field: nothing is written or recorded.
  const decision = ctx.parsed.api === "messages" ? undefined : enginePriorityFor(band, pod, setting);
  let next = decision ? bodyWithEnginePriority(body, decision) : undefined;
  const adapter = ctx.parsed.model;
  let engineModel: string | undefined;
  if (!disaggregated && pod.engine === "sglang" && adapter !== pod.model && env.views.pods.baseOf?.(adapter) !== undefined) {
    engineModel = `${pod.model}:${adapter}`;
    if (body.model !== engineModel) next = { ...(next ?? body), model: engineModel };
  }
  // Recorded only for a request with a band: the others' "no band" is what `flow` being absent says.
  const recorded = band === undefined || decision === undefined ? undefined : recordedEnginePriority(decision);
  if (recorded !== undefined || engineModel !== undefined) {
    ctx.engineFields = { ...(recorded !== undefined ? { enginePriority: recorded } : {}), ...(engineModel !== undefined && engineModel.length <= 520 ? { engineModel } : {}) };
  }
  if (!next) return;
  ctx.parsed = { ...ctx.parsed, body: next };
  markRewritten(ctx);
}
