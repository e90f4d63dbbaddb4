/**
 * A managed adapter's status, pure: the placement record's phase and the ModelAdapter's `status`
 * (AIBrix's fields: phase, candidates, desiredReplicas, readyReplicas, instances, conditions).
 * Phases: Pending (no replica loaded yet), Running (at least one loaded), Failed (loading failed
 * `maxAttempts` times and nothing is loaded, or the declaration is invalid), Deleted (unloading
 * after its declaration went).
 */
import type { AdapterPlacement } from "../../schemas/adapters.js";

export type Phase = AdapterPlacement["phase"];

export interface StatusInput {
  readonly loaded: readonly string[];
  readonly loading: readonly string[];
  readonly candidates: readonly string[];
  readonly desired: number;
  readonly failed: ReadonlyArray<{ pod: string; error: string; attempts: number }>;
  readonly deleted?: boolean;
  /** An invalid declaration: why. */
  readonly invalid?: string;
}

export function phaseOf(s: StatusInput): Phase {
  if (s.deleted) return "Deleted";
  if (s.invalid) return "Failed";
  if (s.loaded.length > 0) return "Running";
  return s.failed.length > 0 ? "Failed" : "Pending";
}

interface Condition {
  type: string;
  status: "True" | "False";
  reason: string;
  message: string;
  lastTransitionTime: string;
}

/**
 * The ModelAdapter's `status`. `prev`: the status last written, whose conditions keep their
 * `lastTransitionTime` while their status is unchanged; `now`: ISO time for the ones that change.
 */
export function modelAdapterStatus(s: StatusInput, prev: Record<string, unknown> | undefined, now: string): Record<string, unknown> {
  const phase = phaseOf(s);
  const prevConds = new Map(((prev?.conditions as Condition[] | undefined) ?? []).map((c) => [c.type, c]));
  const cond = (type: string, ok: boolean, reason: string, message: string): Condition => {
    const p = prevConds.get(type);
    const status = ok ? "True" : "False";
    return { type, status, reason, message, lastTransitionTime: p && p.status === status ? p.lastTransitionTime : now };
  };
  const lastFailure = s.failed[s.failed.length - 1];
  const conditions: Condition[] = s.invalid
    ? [cond("Initialized", false, "InvalidSpec", s.invalid)]
    : [
        cond("Initialized", true, "Validated", "the spec is valid"),
        cond("Scheduled", s.candidates.length > 0 && s.desired > 0, s.candidates.length === 0 ? "NoCandidatePods" : s.desired === 0 ? "NoDemand" : "Placed", s.candidates.length === 0 ? "no ready pod of the base model matches the podSelector" : `${s.desired} replica(s) desired among ${s.candidates.length} candidate pod(s)`),
        cond("Ready", s.loaded.length > 0, s.loaded.length > 0 ? "Loaded" : s.loading.length > 0 ? "Loading" : "NotLoaded", s.loaded.length > 0 ? `loaded on ${s.loaded.join(", ")}` : s.loading.length > 0 ? `loading on ${s.loading.join(", ")}` : "loaded on no pod"),
        ...(lastFailure ? [cond("Failed", true, "LoadFailed", `loading on ${lastFailure.pod} failed ${lastFailure.attempts} time(s): ${lastFailure.error}`.slice(0, 1024))] : []),
      ];
  return {
    phase,
    candidates: [...s.candidates],
    desiredReplicas: s.desired,
    readyReplicas: s.loaded.length,
    instances: [...s.loaded],
    conditions,
  };
}

/** Whether two statuses differ beyond condition timestamps (a write is due). */
export function statusChanged(a: Record<string, unknown> | undefined, b: Record<string, unknown>): boolean {
  const strip = (x: Record<string, unknown> | undefined) => JSON.stringify({ ...x, conditions: ((x?.conditions as Condition[] | undefined) ?? []).map(({ lastTransitionTime: _t, ...c }) => c) });
  return a === undefined || strip(a) !== strip(b);
}
