/**
 * Whether `--apply` may scale a policy's `scaleTarget`. A policy names its workload freely, and the
 * autoscaler's RoleBinding reaches every workload of its namespaces: without this check a policy
 * (planted, or simply wrong) could scale some other model's servers to zero or to the cluster's
 * limits. Pure: the shell lists the workload's pods and reads PODS; this decides.
 *
 * A workload is the policy model's when its pods are that model's pods in PODS:
 * - refused when any of its pods is published in PODS under other models only (it serves
 *   something else);
 * - refused when none of its pods is published under the model (nothing ties it to the model),
 *   unless this applier already saw it serve the model (a workload scaled to zero keeps its
 *   verdict for the life of the process);
 * - an operator's allow-list (`--allow-workload Kind/namespace/name`) admits a workload whatever
 *   its pods (scale from zero after a restart; workloads whose pods another source publishes).
 * Pods not in PODS at all (starting, not ready yet) neither prove nor disprove anything.
 */
import type { ScaleTarget } from "../../schemas/autoscale.js";

/** `Kind/namespace/name`, as `--allow-workload` takes it. */
export function workloadRef(t: ScaleTarget): string {
  return `${t.kind}/${t.namespace}/${t.name}`;
}

/** Parses one `--allow-workload` value; a message naming the problem when it is not `Deployment|StatefulSet/<namespace>/<name>`. */
export function parseWorkloadRef(s: string): { ok: true; ref: string } | { ok: false; error: string } {
  const parts = s.split("/");
  if (parts.length !== 3 || !parts.every((p) => p.length > 0)) return { ok: false, error: `"${s.slice(0, 200)}": expected Kind/namespace/name (e.g. Deployment/llm/vllm-llama)` };
  const [kind, ns, name] = parts as [string, string, string];
  if (kind !== "Deployment" && kind !== "StatefulSet") return { ok: false, error: `"${s.slice(0, 200)}": the kind must be Deployment or StatefulSet` };
  if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(ns) || ns.length > 63) return { ok: false, error: `"${s.slice(0, 200)}": "${ns.slice(0, 100)}" is not a namespace name` };
  if (name.length > 253) return { ok: false, error: `"${s.slice(0, 200)}": the name is longer than 253 characters` };
  return { ok: true, ref: `${kind}/${ns}/${name}` };
}

export interface WorkloadCheck {
  target: ScaleTarget;
  /** The policy's model. */
  model: string;
  /** The workload's pods, as PODS names them (`<pod>.<namespace>`). */
  pods: readonly string[];
  /** The models PODS publishes a pod under (empty: not in PODS). */
  modelsOf(pod: string): readonly string[];
  /** `--allow-workload` refs. */
  allowed: ReadonlySet<string>;
  /** This applier saw the workload's pods serve the model before. */
  verifiedBefore: boolean;
}

export type WorkloadVerdict = { ok: true; by: "allow-list" | "pods" | "earlier" } | { ok: false; reason: string };

export function checkWorkload(c: WorkloadCheck): WorkloadVerdict {
  if (c.allowed.has(workloadRef(c.target))) return { ok: true, by: "allow-list" };
  const ref = workloadRef(c.target);
  let ofModel = 0;
  for (const pod of c.pods) {
    const models = c.modelsOf(pod);
    if (models.length === 0) continue;
    if (models.includes(c.model)) {
      ofModel++;
      continue;
    }
    return { ok: false, reason: `${ref} is not ${c.model}'s workload: its pod ${pod.slice(0, 253)} serves ${models.slice(0, 3).join(", ").slice(0, 300)} in PODS (list it with --allow-workload to scale it anyway)` };
  }
  if (ofModel > 0) return { ok: true, by: "pods" };
  if (c.verifiedBefore) return { ok: true, by: "earlier" };
  return { ok: false, reason: `${ref} is not known to be ${c.model}'s workload: none of its ${c.pods.length} pods is a pod of the model in PODS (list it with --allow-workload to scale it anyway)` };
}
