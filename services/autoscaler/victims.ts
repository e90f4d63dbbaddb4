/**
 * Which pods a scale-down removes: those whose loss costs least. Pure.
 *
 * Order (cheapest first): pods that are not ready; then fewest in-flight requests fleet-wide (the
 * shared ledger: every gateway's charges); then fewest cached blocks that no other pod of the
 * model holds (the prefix index: what the fleet would have to recompute); then the name, so every
 * replica of the autoscaler picks the same pods from the same state.
 *
 * The chosen pods get the ReplicaSet's `controller.kubernetes.io/pod-deletion-cost` annotation:
 * the lowest values, in removal order, so a controller that removes pods by it removes these.
 */

export interface PodCost {
  pod: string;
  ready: boolean;
  inFlight: number;
  uniqueBlocks: number;
}

export interface Victim extends PodCost {
  /** The deletion-cost annotation value (an int32; lower = removed first). */
  deletionCost: number;
}

export const DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost";
/** Victims' deletion costs start here: below any value an operator is likely to set by hand. */
export const VICTIM_COST_BASE = -1_000_000;

export function compareRemovalCost(a: PodCost, b: PodCost): number {
  if (a.ready !== b.ready) return a.ready ? 1 : -1;
  if (a.inFlight !== b.inFlight) return a.inFlight - b.inFlight;
  if (a.uniqueBlocks !== b.uniqueBlocks) return a.uniqueBlocks - b.uniqueBlocks;
  return a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : 0;
}

/** The `count` cheapest pods to remove, cheapest first. */
export function chooseVictims(pods: readonly PodCost[], count: number): Victim[] {
  if (count <= 0) return [];
  return [...pods]
    .sort(compareRemovalCost)
    .slice(0, count)
    .map((p, i) => ({ ...p, deletionCost: VICTIM_COST_BASE + i }));
}
