/**
 * What `--apply` does to a workload this round, given the recommendation. Pure: the shell reads
 * the workload and its pods, calls this, and performs the returned steps in order.
 *
 * With the drain handshake (the default), `spec` (the workload's replicas) still counts pods that
 * are draining; `active` = spec - draining.
 * - desired > active: take back draining pods first (unmark them: warm, cached), then raise spec
 *   to cover what is still missing;
 * - desired < active: mark the cheapest active pods to leave (victims.ts), spec unchanged — they
 *   finish what they hold while every gateway routes around them;
 * - drained pods (drain.ts: idle and acknowledged, or past the grace deadline) are removed by
 *   lowering spec by their number: the ReplicaSet removes the pods with the lowest
 *   `pod-deletion-cost`, which are exactly the marked ones.
 * Without the handshake (`drain: false`), spec is set to desired and Kubernetes picks the pods.
 */
import type { DrainingPod, DrainTracker, Removal } from "./drain.js";
import { chooseVictims, DELETION_COST_ANNOTATION, type PodCost, type Victim } from "./victims.js";

export type ApplyStep =
  | { kind: "unmark"; pod: string }
  | { kind: "mark"; victim: Victim; deadline: number }
  | { kind: "scale"; replicas: number; removed: Removal[] };

export interface ApplyInput {
  now: number;
  desired: number;
  /** The workload's `spec.replicas`. */
  spec: number;
  /** The workload's pods (PODS names), with their removal cost. */
  pods: readonly PodCost[];
  drain: boolean;
  /** Pods already removed by the tracker this round (drain.ts `step`). */
  removed: readonly Removal[];
}

export function planApply(i: ApplyInput, tracker: DrainTracker): ApplyStep[] {
  if (!i.drain) return i.desired === i.spec ? [] : [{ kind: "scale", replicas: i.desired, removed: [] }];
  const steps: ApplyStep[] = [];
  let spec = i.spec;
  if (i.removed.length > 0) {
    spec = Math.max(0, spec - i.removed.length);
    steps.push({ kind: "scale", replicas: spec, removed: [...i.removed] });
  }
  const draining = tracker.size;
  const active = spec - draining;
  if (i.desired > active) {
    for (const pod of tracker.reclaim(i.desired - active)) steps.push({ kind: "unmark", pod });
    const stillDraining = tracker.size;
    if (i.desired > spec - stillDraining) {
      spec = i.desired + stillDraining;
      steps.push({ kind: "scale", replicas: spec, removed: [] });
    }
  } else if (i.desired < active) {
    const candidates = i.pods.filter((p) => !tracker.has(p.pod));
    for (const victim of chooseVictims(candidates, active - i.desired)) {
      const d = tracker.mark(victim.pod, i.now, victim.deletionCost);
      steps.push({ kind: "mark", victim, deadline: d.deadline });
    }
  }
  return steps;
}

export const DRAIN_DEADLINE_ANNOTATION = "jetroute.io/drain-deadline";

/** A workload's pod as Kubernetes lists it (name in PODS terms: `<name>.<namespace>`). */
export interface WorkloadPod {
  pod: string;
  annotations: Readonly<Record<string, string>>;
}

export interface AnnotationPatch {
  pod: string;
  /** Merge-patch values: a string sets, null removes. */
  annotations: Record<string, string | null>;
}

/**
 * The annotation changes that make the pods say what the tracker holds: a draining pod carries its
 * deletion cost and drain deadline; any other pod carrying our drain deadline loses both. Applied
 * every round until they hold, so a failed patch is simply retried (the tracker is the truth).
 * Pods being removed this round (`removing`: drained, left the tracker) keep their marks: lowering
 * the replicas must find their deletion cost in place.
 */
export function annotationPatches(draining: readonly DrainingPod[], pods: readonly WorkloadPod[], removing: ReadonlySet<string> = new Set()): AnnotationPatch[] {
  const want = new Map(draining.map((d) => [d.pod, d]));
  const out: AnnotationPatch[] = [];
  for (const p of pods) {
    const d = want.get(p.pod);
    if (d) {
      const cost = String(d.deletionCost);
      const deadline = String(d.deadline);
      if (p.annotations[DELETION_COST_ANNOTATION] !== cost || p.annotations[DRAIN_DEADLINE_ANNOTATION] !== deadline) {
        out.push({ pod: p.pod, annotations: { [DELETION_COST_ANNOTATION]: cost, [DRAIN_DEADLINE_ANNOTATION]: deadline } });
      }
    } else if (p.annotations[DRAIN_DEADLINE_ANNOTATION] !== undefined && !removing.has(p.pod)) {
      out.push({ pod: p.pod, annotations: { [DELETION_COST_ANNOTATION]: null, [DRAIN_DEADLINE_ANNOTATION]: null } });
    }
  }
  return out;
}

/** Deletion costs of pods about to be removed: below every victim's, so they rank first. */
export const REMOVAL_COST_BASE = -2_000_000;

/** The cost annotation as the ReplicaSet reads it (an int32; absent or unreadable = 0). */
export const costOf = (p: WorkloadPod): number => {
  const v = Number(p.annotations[DELETION_COST_ANNOTATION] ?? 0);
  return Number.isInteger(v) ? v : 0;
};

/**
 * Whether lowering replicas by `removed.length` removes exactly the removed pods: the ReplicaSet
 * removes pods that are not Ready first, then the lowest deletion cost. So every other pod must be
 * Ready, and every removed pod must cost less than any other. (Pods already terminating are not
 * counted by the ReplicaSet and are left out by the caller.)
 */
export function removalIsExact(removed: readonly Removal[], pods: readonly (WorkloadPod & { ready: boolean })[]): boolean {
  const gone = new Set(removed.map((r) => r.pod));
  const others = pods.filter((p) => !gone.has(p.pod));
  if (others.some((p) => !p.ready)) return false;
  const floor = Math.min(...others.map(costOf), Number.POSITIVE_INFINITY);
  return pods.filter((p) => gone.has(p.pod)).every((p) => costOf(p) < floor);
}
