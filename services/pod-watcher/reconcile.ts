/**
 * What a watcher must publish to make PODS say what it knows: the diff between its desired pod
 * states and the stream's last word on each pod. Pure: no I/O, time from the caller.
 *
 * Ownership: a watcher only ever removes pods its own source published. A pod it wants that the
 * stream holds under another source is a conflict (two sources claiming one model/pod is a
 * misconfiguration for an operator to fix): while that source is live (heartbeating) it keeps the
 * pod — claiming it would make two publishers that follow PODS take it from each other forever;
 * a pod of a silent source (or of none) is republished under ours, and ownership moves with it.
 *
 * Re-assertion: a pod whose last event is older than `reassertMs` is published again even if
 * nothing changed, so stream retention (`max_age`) can never age a healthy pod out.
 */
import type { PodEvent } from "../../schemas/events.js";

/** One pod as a watcher wants it published (a pod event without the envelope). */
export type PodState = Omit<PodEvent, "type" | "action" | "ts" | "source">;

export const podKey = (model: string, pod: string): string => `${model}\u0000${pod}`;

export interface ReconcileInput {
  source: string;
  /** Every pod the watcher wants published, by `podKey`. */
  desired: ReadonlyMap<string, PodState>;
  /**
   * True when `desired` is the watcher's whole truth (a finished probe round, a finished list):
   * only then are published pods missing from it removed.
   */
  complete: boolean;
  /** The stream's last upsert per pod (removed pods absent), by `podKey`. */
  published: ReadonlyMap<string, PodEvent>;
  /** When each published pod's event was written (ms, same clock as `now`). */
  publishedAt: ReadonlyMap<string, number>;
  now: number;
  reassertMs: number;
  /**
   * Treat pods published without a source (before sources existed) as this source's, so they
   * are removed when not wanted: the one-off migration of an upgrade. Default false.
   */
  adoptUnowned?: boolean;
  /** Other sources heard heartbeating recently: their pods are not claimed. */
  liveSources?: ReadonlySet<string>;
}

export interface ReconcilePlan {
  upserts: PodEvent[];
  removes: PodEvent[];
  /** Keys wanted here but published by another source. */
  conflicts: string[];
  /** Upserts made only because the last event was older than `reassertMs`. */
  reasserted: number;
}

/** The fields that make two pod states the same, in a fixed order (envelope fields excluded). */
export function sameState(a: PodState, b: PodState): boolean {
  return canonical(a) === canonical(b);
}

function canonical(p: PodState): string {
  const { model, pod, address, ready, engine, role, roleset, podClass, schedulingPolicy, bootstrapPort, metricsAddress, kvEvents, adapters, labels, draining } = p;
  const sortedLabels = labels ? Object.fromEntries(Object.entries(labels).sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0))) : undefined;
  return JSON.stringify([model, pod, address, ready, engine, role ?? "combined", roleset ?? null, bootstrapPort ?? null, metricsAddress ?? null, kvEvents ?? null, adapters ?? [], sortedLabels ?? {}, podClass ?? null, draining?.deadline ?? null, schedulingPolicy ?? null]);
}

export function planReconcile(i: ReconcileInput): ReconcilePlan {
  const plan: ReconcilePlan = { upserts: [], removes: [], conflicts: [], reasserted: 0 };
  for (const [k, want] of i.desired) {
    const have = i.published.get(k);
    // Pods from before sources (no source) are taken over silently; another source's is a conflict.
    const theirs = have?.source !== undefined && have.source !== i.source;
    if (theirs) plan.conflicts.push(k);
    if (theirs && i.liveSources?.has(have.source as string)) continue;
    // A pod under another source (or none) is republished under ours: ownership moves with it.
    const changed = have === undefined || have.source !== i.source || !sameState(have, want);
    const due = !changed && i.now - (i.publishedAt.get(k) ?? Number.NEGATIVE_INFINITY) >= i.reassertMs;
    if (!changed && !due) continue;
    if (due) plan.reasserted++;
    plan.upserts.push({ type: "pod", action: "upsert", ...want, source: i.source, ts: i.now });
  }
  if (!i.complete) return plan;
  for (const [k, have] of i.published) {
    const ours = have.source === i.source || (i.adoptUnowned === true && have.source === undefined);
    if (!ours || i.desired.has(k)) continue;
    plan.removes.push({
      type: "pod", action: "remove", model: have.model, pod: have.pod, address: have.address, ready: false, engine: have.engine, source: i.source, ts: i.now,
    });
  }
  return plan;
}
