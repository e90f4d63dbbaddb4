/**
 * The engine's own `priority` for a request: what the gateway writes into the body it sends to a
 * pod whose engine schedules by priority, so the engine's queue keeps the order flow control
 * chose (docs/engine-priority.md for the engines' rules, docs/flow-control.md for the setting).
 * Pure: no I/O.
 *
 * A request's band (flow control's priority, -16..16, higher = more urgent) becomes an *urgency*
 * through the model's `flowControl.enginePriority` setting (default: the band itself), and the
 * urgency becomes the value in the pod's sign convention:
 *   - vLLM (`--scheduling-policy priority`): lower is more urgent, so the value is `-urgency`;
 *   - SGLang (`--enable-priority-scheduling`): higher is more urgent, so the value is `urgency`,
 *     unless the pod runs `--schedule-low-priority-values-first` (`priority-low-values-first`):
 *     then `-urgency`.
 * A pod without priority scheduling (no `schedulingPolicy`) gets nothing: vLLM V1 would ignore
 * the field, an SGLang pod run with `--abort-on-priority-when-disabled` would fail the request.
 */
import type { EngineKind, SchedulingPolicy } from "../../schemas/events.js";
import { FLOW_PRIORITY_MAX, FLOW_PRIORITY_MIN, type FlowControl } from "../../schemas/config.js";

/** The model's setting (`flowControl.enginePriority`); undefined = the default mapping. */
export type EnginePrioritySetting = FlowControl["enginePriority"];

/** What the mapping needs to know of a pod (the pod set's PodInfo has both fields). */
export interface EnginePriorityPod {
  readonly engine: EngineKind;
  readonly schedulingPolicy?: SchedulingPolicy;
}

/** Largest urgency a mapping may name (the config schema's bound); values stay exact and small. */
export const MAX_URGENCY = 1_000_000;

/** The default mapping: urgency = band. */
export const DEFAULT_ENGINE_PRIORITY_SCALE = 1;

/**
 * `set`: write `value` as the body's `priority`, replacing whatever the client sent.
 * `leave`: write nothing and leave the body as it is (`reason` says why; for the decision record).
 */
export type EnginePriorityDecision =
  | { readonly action: "set"; readonly value: number; readonly urgency: number }
  | { readonly action: "leave"; readonly reason: "fcfs-pod" | "off" | "no-band" };

/** Whether the pod's engine treats a lower `priority` as more urgent. */
export function lowerIsMoreUrgent(pod: EnginePriorityPod): boolean {
  return pod.engine === "vllm" || pod.schedulingPolicy === "priority-low-values-first";
}

/** A band's urgency under the setting; undefined when the setting is "off". */
export function urgencyOf(band: number, setting: EnginePrioritySetting): number | undefined {
  if (setting === "off") return undefined;
  const named = setting?.bands !== undefined && Object.hasOwn(setting.bands, String(band)) ? setting.bands[String(band)] : undefined;
  return named ?? band * (setting?.scale ?? DEFAULT_ENGINE_PRIORITY_SCALE);
}

/**
 * What to write into the body for a request of `band` (undefined: the request was not classified,
 * i.e. flow control is off for its model) sent to `pod`.
 */
export function enginePriorityFor(band: number | undefined, pod: EnginePriorityPod, setting: EnginePrioritySetting): EnginePriorityDecision {
  if (pod.schedulingPolicy === undefined) return { action: "leave", reason: "fcfs-pod" };
  if (setting === "off") return { action: "leave", reason: "off" };
  if (band === undefined) return { action: "leave", reason: "no-band" };
  const urgency = urgencyOf(band, setting) as number;
  // `+ 0` turns -0 into 0: the body says 0, not -0.
  const value = (lowerIsMoreUrgent(pod) ? -urgency : urgency) + 0;
  return { action: "set", value, urgency };
}

/** Every band's urgency, lowest band first (for docs, `/debug/explain` and validation). */
export function urgencyTable(setting: EnginePrioritySetting): Array<{ band: number; urgency: number }> {
  if (setting === "off") return [];
  const out: Array<{ band: number; urgency: number }> = [];
  for (let band = FLOW_PRIORITY_MIN; band <= FLOW_PRIORITY_MAX; band++) out.push({ band, urgency: urgencyOf(band, setting) as number });
  return out;
}

const BAND_KEY = /^(0|-?[1-9][0-9]?)$/;
const WHERE = "/flowControl/enginePriority";

/**
 * Checks a model config's `flowControl.enginePriority` (any shape, parsed JSON), naming the field:
 * `"off"` or `{scale?, bands?}`, bands as decimal integers in the flow priority range, urgencies
 * integers within ±MAX_URGENCY, and the mapping order-preserving over the bands in play: the
 * bands it names, the bands of the model's objectives (`objectiveBands`) and band 0 (a request
 * without an objective). A higher band must never get a lower urgency than a lower one, or the
 * engine would undo the gateway's order. Undefined when valid.
 */
export function enginePriorityConfigError(value: unknown, objectiveBands: readonly number[] = []): string | undefined {
  if (value === undefined || value === "off") return undefined;
  if (typeof value !== "object" || value === null || Array.isArray(value)) return `${WHERE}: must be "off" or an object {scale?, bands?}`;
  const o = value as Record<string, unknown>;
  for (const k of Object.keys(o)) if (k !== "scale" && k !== "bands") return `${WHERE}/${k.slice(0, 64)}: unknown field; expected scale or bands`;
  if (o.scale !== undefined && !(Number.isInteger(o.scale) && (o.scale as number) >= 1 && (o.scale as number) <= 1000)) {
    return `${WHERE}/scale: must be an integer from 1 to 1000`;
  }
  const inPlay = new Set<number>([0, ...objectiveBands.filter((b) => Number.isInteger(b) && b >= FLOW_PRIORITY_MIN && b <= FLOW_PRIORITY_MAX)]);
  if (o.bands !== undefined) {
    if (typeof o.bands !== "object" || o.bands === null || Array.isArray(o.bands)) return `${WHERE}/bands: must be an object mapping a band to its urgency`;
    for (const [k, v] of Object.entries(o.bands)) {
      const band = BAND_KEY.test(k) ? Number(k) : Number.NaN;
      if (!(band >= FLOW_PRIORITY_MIN && band <= FLOW_PRIORITY_MAX)) {
        return `${WHERE}/bands/${k.slice(0, 64)}: bands are integers from ${FLOW_PRIORITY_MIN} to ${FLOW_PRIORITY_MAX}, written without leading zeros`;
      }
      if (!(Number.isInteger(v) && Math.abs(v as number) <= MAX_URGENCY)) return `${WHERE}/bands/${k}: the urgency must be an integer from ${-MAX_URGENCY} to ${MAX_URGENCY}`;
      inPlay.add(band);
    }
  }
  const setting = o as Exclude<EnginePrioritySetting, "off">;
  const bands = [...inPlay].sort((a, b) => a - b);
  for (let i = 1; i < bands.length; i++) {
    const lower = bands[i - 1] as number;
    const higher = bands[i] as number;
    const lo = urgencyOf(lower, setting) as number;
    const hi = urgencyOf(higher, setting) as number;
    if (hi < lo) {
      return `${WHERE}/bands: band ${higher} maps to urgency ${hi}, below band ${lower}'s ${lo}; a higher band must never get a lower urgency (bands not named get band × scale)`;
    }
  }
  return undefined;
}

/**
 * The body with the decision applied: a copy with `priority` set (whatever the client sent), or
 * undefined when the body goes as it is. The request path serialises the copy it gets.
 */
export function bodyWithEnginePriority(body: Readonly<Record<string, unknown>>, decision: EnginePriorityDecision): Record<string, unknown> | undefined {
  if (decision.action !== "set") return undefined;
  if (body.priority === decision.value) return undefined;
  return { ...body, priority: decision.value };
}

/** The decision as a decision record keeps it: the value written, or why none was. */
export function recordedEnginePriority(decision: EnginePriorityDecision): number | "fcfs-pod" | "off" | undefined {
  return decision.action === "set" ? decision.value : decision.reason === "no-band" ? undefined : decision.reason;
}

/**
 * One leg of a disaggregated (P/D) request: `body` already carries what the engine-fields stage
 * wrote for the decode pod; the prefill pod may schedule otherwise. Returns the body this leg's pod
 * gets: `priority` set to the decision's value, or — for a pod that gets none — the client's own
 * `priority` as sent (`client`: the body before the engine-fields stage), or no field when the
 * client sent none. The same object when nothing changes.
 */
export function bodyForLeg(body: Readonly<Record<string, unknown>>, client: Readonly<Record<string, unknown>>, decision: EnginePriorityDecision): Readonly<Record<string, unknown>> {
  if (decision.action === "set") return bodyWithEnginePriority(body, decision) ?? body;
  if (Object.hasOwn(client, "priority")) return body.priority === client.priority ? body : { ...body, priority: client.priority };
  if (!Object.hasOwn(body, "priority")) return body;
  const { priority: _decodes, ...rest } = body;
  return rest;
}
