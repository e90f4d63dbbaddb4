/**
 * `jetroute autoscaler --apply`: writes a policy's recommendation to its workload's `scale`
 * subresource, through the drain handshake (apply-plan.ts decides; this file only talks to the
 * Kubernetes API). One applier per policy with a `scaleTarget`; only the lease holder runs rounds.
 *
 * A round: read the workload's scale and pods; let the drain tracker release pods that are done
 * (idle and acknowledged by every gateway, or past the grace deadline); plan; put the tracker's
 * marks on the pods (deletion cost + drain deadline; the pod-watcher publishes `draining` from
 * them); lower or raise `spec.replicas` — lowering only once every removed pod carries its
 * deletion cost, so the ReplicaSet removes exactly those. An API error ends the round; the next
 * one retries after a backoff (the tracker, not the API calls, holds the state).
 */
import { AppsV1Api, CoreV1Api, type KubeConfig, PatchStrategy, setHeaderOptions, type V1Scale } from "@kubernetes/client-node";
import type { AutoscaleRecommendation, ScaleTarget } from "../../schemas/autoscale.js";
import { backoffDelayMs } from "../pod-watcher/backoff.js";
import type { Logger } from "../shared/log.js";
import { LogRate } from "../shared/log-rate.js";
import { annotationPatches, type ApplyStep, planApply, REMOVAL_COST_BASE, removalIsExact, type WorkloadPod } from "./apply-plan.js";
import { DrainTracker, type Removal } from "./drain.js";
import { DELETION_COST_ANNOTATION, type PodCost } from "./victims.js";
import { checkWorkload } from "./workload-guard.js";

export interface WorkloadScale {
  replicas: number;
  /** The scale subresource's label selector (status.selector). */
  selector: string;
}

export interface ListedPod extends WorkloadPod {
  /** The Kubernetes name (without the namespace). */
  name: string;
  ready: boolean;
  /** Being deleted already (`deletionTimestamp`): neither a victim nor counted by the ReplicaSet. */
  terminating: boolean;
}

/** The Kubernetes calls an applier makes (a real cluster, or the stand-in in tests). */
export interface WorkloadClient {
  readScale(t: ScaleTarget): Promise<WorkloadScale>;
  writeScale(t: ScaleTarget, replicas: number): Promise<void>;
  listPods(namespace: string, selector: string): Promise<ListedPod[]>;
  annotate(namespace: string, name: string, annotations: Record<string, string | null>): Promise<void>;
}

const statusOf = (err: unknown): number | undefined => (err as { code?: number })?.code ?? (err as { statusCode?: number })?.statusCode;

export function kubeWorkloadClient(kc: KubeConfig): WorkloadClient {
  const apps = kc.makeApiClient(AppsV1Api);
  const core = kc.makeApiClient(CoreV1Api);
  const scaleOf = (s: V1Scale): WorkloadScale => ({ replicas: s.spec?.replicas ?? 0, selector: s.status?.selector ?? "" });
  return {
    async readScale(t) {
      const s = t.kind === "Deployment" ? await apps.readNamespacedDeploymentScale({ name: t.name, namespace: t.namespace }) : await apps.readNamespacedStatefulSetScale({ name: t.name, namespace: t.namespace });
      return scaleOf(s);
    },
    async writeScale(t, replicas) {
      const body: V1Scale = { apiVersion: "autoscaling/v1", kind: "Scale", metadata: { name: t.name, namespace: t.namespace }, spec: { replicas } };
      if (t.kind === "Deployment") await apps.replaceNamespacedDeploymentScale({ name: t.name, namespace: t.namespace, body });
      else await apps.replaceNamespacedStatefulSetScale({ name: t.name, namespace: t.namespace, body });
    },
    async listPods(namespace, selector) {
      const list = await core.listNamespacedPod({ namespace, labelSelector: selector });
      return list.items.map((p) => ({
        name: p.metadata?.name ?? "",
        pod: `${p.metadata?.name ?? ""}.${namespace}`,
        annotations: p.metadata?.annotations ?? {},
        ready: !p.metadata?.deletionTimestamp && (p.status?.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True"),
        terminating: !!p.metadata?.deletionTimestamp,
      }));
    },
    async annotate(namespace, name, annotations) {
      await core.patchNamespacedPod({ name, namespace, body: { metadata: { annotations } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch));
    },
  };
}

export interface RoundContext {
  now: number;
  rec: AutoscaleRecommendation;
  /** In-flight requests on a pod (PODS name) in the shared ledger. */
  inFlight(pod: string): number;
  /** Cached blocks only this pod holds (the prefix index). */
  uniqueBlocks(pod: string): number;
  /** The pod's current `draining` event as the autoscaler folded it: its PODS sequence and deadline. */
  drainEvent(pod: string): { seq: number; deadline: number } | undefined;
  /** Every live gateway has folded PODS up to `seq`. */
  acknowledged(seq: number): boolean;
  /** Checked before every write: a lost lease stops applying at once, mid-round too. */
  stillLeader(): boolean;
  /** The models PODS publishes a pod under (empty: not in PODS), for the workload check. */
  modelsOf(pod: string): readonly string[];
}

export interface RoundResult {
  specReplicas?: number;
  removed: Removal[];
  draining: Array<{ pod: string; since: number; deadline: number }>;
  error?: string;
}

export class WorkloadApplier {
  readonly tracker: DrainTracker;
  private failures = 0;
  private retryAt = 0;
  private readonly errLog = new LogRate(1, 10_000);
  /** The workload's pods were seen serving the policy's model (workload-guard.ts). */
  private verified = false;
  readonly stats = { rounds: 0, errors: 0, scaled: 0, marked: 0, unmarked: 0, removedIdle: 0, removedGrace: 0, refusedWorkload: 0 };

  constructor(
    readonly policy: string,
    readonly target: ScaleTarget,
    private readonly client: WorkloadClient,
    private readonly log: Logger,
    readonly o: {
      drain: boolean;
      graceMs: number;
      random?: () => number;
      /** The policy's model: the workload's pods must be its pods in PODS (workload-guard.ts), unless `allowed` names it. */
      model: string;
      /** `--allow-workload` refs (`Kind/namespace/name`). */
      allowed?: ReadonlySet<string>;
    },
  ) {
    this.tracker = new DrainTracker(o.graceMs);
  }

  async round(c: RoundContext): Promise<RoundResult> {
    const draining = () => this.tracker.list().map((d) => ({ pod: d.pod, since: d.markedAt, deadline: d.deadline }));
    if (c.now < this.retryAt) return { removed: [], draining: draining(), error: "backing off after an API error" };
    if (this.o.drain && this.target.kind === "StatefulSet") {
      // A StatefulSet removes its highest ordinals whatever the pods' costs: the handshake cannot choose.
      return { removed: [], draining: [], error: "the drain handshake cannot choose which StatefulSet pods leave (it always removes the highest ordinals): run with --no-drain, or scale a Deployment" };
    }
    this.stats.rounds++;
    const removedThisRound: Removal[] = [];
    try {
      const scale = await this.client.readScale(this.target);
      const listed = await this.client.listPods(this.target.namespace, scale.selector);
      const pods = listed.filter((p) => !p.terminating);
      // Nothing is marked or scaled on a workload that is not the policy model's.
      const verdict = checkWorkload({ target: this.target, model: this.o.model, pods: pods.map((p) => p.pod), modelsOf: c.modelsOf, allowed: this.o.allowed ?? new Set(), verifiedBefore: this.verified });
      if (!verdict.ok) {
        this.stats.refusedWorkload++;
        if (this.errLog.admit(c.now).log) this.log.warn({ policy: this.policy, target: `${this.target.kind}/${this.target.namespace}/${this.target.name}`, reason: verdict.reason }, "not applying: the scaleTarget is not the policy model's workload");
        return { removed: [], draining: draining(), error: verdict.reason };
      }
      if (verdict.by === "pods") this.verified = true;
      for (const d of this.tracker.list()) {
        // Only the event of this mark counts: an older one (a pod marked, taken back, marked again)
        // was acknowledged before the gateways routed to it again.
        const ev = c.drainEvent(d.pod);
        if (ev !== undefined && ev.deadline === d.deadline) this.tracker.published(d.pod, ev.seq);
        // A marked pod that left by itself (deleted, crashed) needs no removal.
        if (!pods.some((p) => p.pod === d.pod)) this.tracker.forget(d.pod);
      }
      const removed = this.o.drain ? this.tracker.step({ now: c.now, inFlight: c.inFlight, acknowledged: c.acknowledged }) : [];
      removedThisRound.push(...removed);
      const costs: PodCost[] = pods.map((p) => ({ pod: p.pod, ready: p.ready, inFlight: c.inFlight(p.pod), uniqueBlocks: c.uniqueBlocks(p.pod) }));
      const steps = planApply({ now: c.now, desired: c.rec.desired, spec: scale.replicas, pods: costs, drain: this.o.drain, removed }, this.tracker);
      const spec = await this.perform(steps, pods, scale.replicas, c.stillLeader);
      this.failures = 0;
      for (const r of removed) this.stats[r.reason === "idle" ? "removedIdle" : "removedGrace"]++;
      return { specReplicas: spec, removed: removedThisRound, draining: draining() };
    } catch (err) {
      // Pods the tracker released this round are not lost: re-mark them (same deadline) so the next round removes them.
      for (const r of removedThisRound) this.tracker.mark(r.pod, c.now - r.drainedMs, r.deletionCost);
      this.stats.errors++;
      this.retryAt = c.now + backoffDelayMs(this.failures++, (this.o.random ?? Math.random)(), { baseMs: 500, maxMs: 30_000 });
      const msg = `${(err as Error).message ?? err}`.slice(0, 300);
      if (this.errLog.admit(c.now).log) this.log.warn({ policy: this.policy, target: `${this.target.kind}/${this.target.namespace}/${this.target.name}`, status: statusOf(err), err: msg, retryInMs: this.retryAt - c.now }, "applying the recommendation failed; retrying");
      return { removed: [], draining: draining(), error: msg };
    }
  }

  /**
   * Takes every mark this applier set off the workload's pods (the policy was deleted or now names
   * another workload): without it, pods marked draining would stay out of routing for good.
   */
  async release(stillLeader: () => boolean): Promise<void> {
    this.tracker.reclaim(this.tracker.size);
    const scale = await this.client.readScale(this.target);
    const pods = (await this.client.listPods(this.target.namespace, scale.selector)).filter((p) => !p.terminating);
    for (const p of annotationPatches([], pods)) {
      if (!stillLeader()) throw new Error("the autoscaler lease was lost: not applying");
      const listed = pods.find((x) => x.pod === p.pod);
      if (listed) await this.client.annotate(this.target.namespace, listed.name, p.annotations);
    }
  }

  /** Marks first (so a lowered spec removes the marked pods), then the scale changes. Returns spec as left. */
  private async perform(steps: ApplyStep[], pods: readonly ListedPod[], spec: number, stillLeader: () => boolean): Promise<number> {
    const guard = () => {
      if (!stillLeader()) throw new Error("the autoscaler lease was lost: not applying");
    };
    const byPod = new Map(pods.map((p) => [p.pod, p]));
    const removing = new Set(steps.flatMap((s) => (s.kind === "scale" ? s.removed.map((r) => r.pod) : [])));
    const patches = this.o.drain ? annotationPatches(this.tracker.list(), pods, removing) : [];
    for (const p of patches) {
      const listed = byPod.get(p.pod);
      if (!listed) continue;
      guard();
      await this.client.annotate(this.target.namespace, listed.name, p.annotations);
      if (Object.values(p.annotations)[0] === null) this.stats.unmarked++;
      else this.stats.marked++;
      // What the pod now carries, for the removal check below.
      const next: Record<string, string> = { ...listed.annotations };
      for (const [k, v] of Object.entries(p.annotations)) {
        if (v === null) delete next[k];
        else next[k] = v;
      }
      byPod.set(p.pod, { ...listed, annotations: next });
    }
    let current = spec;
    for (const s of steps) {
      if (s.kind !== "scale") continue;
      if (s.removed.length > 0) {
        // The removed pods go below every other pod's cost, so the ReplicaSet removes exactly them.
        for (const [i, r] of s.removed.entries()) {
          const listed = byPod.get(r.pod);
          const cost = String(REMOVAL_COST_BASE + i);
          if (!listed || listed.annotations[DELETION_COST_ANNOTATION] === cost) continue;
          guard();
          await this.client.annotate(this.target.namespace, listed.name, { [DELETION_COST_ANNOTATION]: cost });
          byPod.set(r.pod, { ...listed, annotations: { ...listed.annotations, [DELETION_COST_ANNOTATION]: cost } });
        }
        if (!removalIsExact(s.removed, [...byPod.values()])) throw new Error(`lowering replicas now could remove a pod other than ${s.removed.map((r) => r.pod).join(", ")} (another pod is not Ready or costs less): waiting`);
      }
      if (s.replicas === current) continue;
      guard();
      await this.client.writeScale(this.target, s.replicas);
      this.stats.scaled++;
      this.log.info({ policy: this.policy, from: current, to: s.replicas, removed: s.removed.map((r) => `${r.pod} (${r.reason}, ${r.inFlight} in flight)`) }, "workload scaled");
      current = s.replicas;
    }
    return current;
  }
}
