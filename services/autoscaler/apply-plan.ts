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
import type { DrainTracker, Removal } from "./drain.js";
import { chooseVictims, type PodCost, type Victim } from "./victims.js";

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
      const d = tracker.mark(victim.pod, i.now);
      steps.push({ kind: "mark", victim, deadline: d.deadline });
    }
  }
  return steps;
}
