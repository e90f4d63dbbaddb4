/**
 * The autoscaler's Prometheus metrics (`--metrics-port`, served with `/healthz` by
 * services/shared/metrics-server.ts), read at scrape time from the running service: evaluations,
 * recommendations and the desired count per policy, applied scales, Kubernetes API errors, pods
 * draining and drained, and whether this replica holds the lease.
 *
 * Policy names label series; they come from the config bucket (operator-controlled, 1-128
 * characters of a fixed alphabet) and are bounded here too: past MAX_POLICY_LABELS policies, the
 * rest are summed under `policy="_other"`. A pd policy's decode workload is labelled
 * `<policy>#decode`.
 */
import client from "prom-client";
import type { WorkloadApplier } from "./kube-apply.js";

export const MAX_POLICY_LABELS = 256;
export const OTHER_POLICY = "_other";

/** What one policy's evaluations have said (kept by the rounds, one entry per policy in force). */
export interface PolicyFigures {
  /** Evaluations run (published or not). */
  evaluations: number;
  /** Recommendations published on AUTOSCALE (the lease holder's). */
  published: number;
  /** The last evaluation's desired count and ready pods. */
  desired: number;
  readyPods: number;
}

export interface AutoscalerMetricsSource {
  isLeader(): boolean;
  readonly stats: { evaluations: number; published: number; publishErrors: number; invalidPolicies: number; refusedSignature?: number };
  policyFigures(): ReadonlyMap<string, PolicyFigures>;
  appliers(): ReadonlyMap<string, Pick<WorkloadApplier, "stats" | "tracker">>;
}

type Rows = Array<[Record<string, string>, number]>;

/** Per-policy rows with the label bound applied: the first MAX_POLICY_LABELS names in order, the rest summed. */
function boundedRows<T>(entries: Iterable<[string, T]>, value: (t: T) => number, extra: Record<string, string> = {}): Rows {
  const names = [...entries].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const rows: Rows = [];
  let other = 0;
  let others = 0;
  for (const [i, [name, t]] of names.entries()) {
    if (i < MAX_POLICY_LABELS) rows.push([{ policy: name, ...extra }, value(t)]);
    else {
      other += value(t);
      others++;
    }
  }
  if (others > 0) rows.push([{ policy: OTHER_POLICY, ...extra }, other]);
  return rows;
}

export function autoscalerRegistry(src: AutoscalerMetricsSource): client.Registry {
  const r = new client.Registry();
  client.collectDefaultMetrics({ register: r, prefix: "jetroute_autoscaler_" });
  // Counters whose values the service keeps: set at scrape time.
  const counter = (name: string, help: string, labelNames: string[], rows: () => Rows) =>
    new client.Counter({
      name,
      help,
      labelNames,
      registers: [r],
      collect() {
        this.reset();
        for (const [labels, v] of rows()) this.inc(labels, v);
      },
    });
  const gauge = (name: string, help: string, labelNames: string[], rows: () => Rows) =>
    new client.Gauge({
      name,
      help,
      labelNames,
      registers: [r],
      collect() {
        this.reset();
        for (const [labels, v] of rows()) this.set(labels, v);
      },
    });
  const one = (v: number): Rows => [[{}, v]];
  gauge("jetroute_autoscaler_leader", "1 while this replica holds the autoscaler lease (it alone publishes and applies)", [], () => one(src.isLeader() ? 1 : 0));
  gauge("jetroute_autoscaler_policies", "Autoscaling policies in force", [], () => one(src.policyFigures().size));
  counter("jetroute_autoscaler_evaluations_total", "Policy evaluations run (on every replica, leader or not)", [], () => one(src.stats.evaluations));
  counter("jetroute_autoscaler_published_total", "Recommendations published on AUTOSCALE", [], () => one(src.stats.published));
  counter("jetroute_autoscaler_publish_errors_total", "Rounds whose recommendation was not published (NATS or an apply failure)", [], () => one(src.stats.publishErrors));
  counter("jetroute_autoscaler_invalid_policies_total", "Invalid autoscaling policies found in the config bucket (ignored)", [], () => one(src.stats.invalidPolicies));
  counter("jetroute_autoscaler_records_refused_signature_total", "Autoscaling policies and pool assignments ignored because their signature did not verify under --config-public-key", [], () => one(src.stats.refusedSignature ?? 0));
  counter("jetroute_autoscaler_workload_refusals_total", "Rounds in which --apply refused the scaleTarget: not the policy model's workload and not in --allow-workload, per policy", ["policy"], () => boundedRows(src.appliers(), (a) => a.stats.refusedWorkload ?? 0));
  counter("jetroute_autoscaler_recommendations_total", "Recommendations published, per policy", ["policy"], () => boundedRows(src.policyFigures(), (f) => f.published));
  gauge("jetroute_autoscaler_desired_replicas", "The last evaluation's desired count, per policy", ["policy"], () => boundedRows(src.policyFigures(), (f) => f.desired));
  gauge("jetroute_autoscaler_ready_pods", "Ready pods (draining ones left out) at the last evaluation, per policy", ["policy"], () => boundedRows(src.policyFigures(), (f) => f.readyPods));
  counter("jetroute_autoscaler_scales_total", "Replica counts written to a workload's scale subresource (--apply), per policy", ["policy"], () => boundedRows(src.appliers(), (a) => a.stats.scaled));
  counter("jetroute_autoscaler_api_errors_total", "Kubernetes API calls that failed (retried after a backoff), per policy", ["policy"], () => boundedRows(src.appliers(), (a) => a.stats.errors));
  gauge("jetroute_autoscaler_draining_pods", "Pods in the drain handshake now (marked, not yet removed), per policy", ["policy"], () => boundedRows(src.appliers(), (a) => a.tracker.list().length));
  counter("jetroute_autoscaler_drained_pods_total", "Pods removed after draining, per policy, by why: idle (nothing in flight) or grace (the deadline passed)", ["policy", "reason"], () => [
    ...boundedRows(src.appliers(), (a) => a.stats.removedIdle, { reason: "idle" }),
    ...boundedRows(src.appliers(), (a) => a.stats.removedGrace, { reason: "grace" }),
  ]);
  return r;
}
