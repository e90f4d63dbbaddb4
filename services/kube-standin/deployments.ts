/**
 * Deployments in the stand-in: the `scale` subresource's view, and a ReplicaSet-like loop that
 * keeps each Deployment's pods at `spec.replicas` — creating pods from the template, deleting the
 * cheapest ones first the way the ReplicaSet controller ranks them — and keeps its status. The
 * kubelet's part is the caller's (`PodLifecycle`): in tests and benchmarks a hook starts a
 * simulated engine for a new pod and reports it Ready, and stops it when the pod terminates.
 *
 * Which pods a scale-down removes (the ReplicaSet controller's ranking, simplified to what pods
 * here can differ in): not Ready before Ready; then the lower
 * `controller.kubernetes.io/pod-deletion-cost` annotation (an int32, default 0); then the newer
 * pod; then the name. Removed pods terminate with the template's `terminationGracePeriodSeconds`
 * (default 30, as in Kubernetes).
 */
import { createHash, randomBytes } from "node:crypto";
import { DEPLOYMENT_RESOURCE } from "./resources.js";
import type { KubeObject, ObjectStore, StoredEvent } from "./store.js";

export const POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost";

interface DeploymentSpec {
  replicas?: number;
  selector?: { matchLabels?: Record<string, string> };
  template?: { metadata?: { labels?: Record<string, string>; annotations?: Record<string, string> }; spec?: Record<string, unknown> };
}

const specOf = (d: KubeObject) => (d.spec ?? {}) as DeploymentSpec;
const selectorString = (m: Record<string, string> | undefined) => Object.entries(m ?? {}).map(([k, v]) => `${k}=${v}`).join(",");

/** The autoscaling/v1 Scale of a Deployment. */
export function scaleOf(d: KubeObject): Record<string, unknown> {
  const spec = specOf(d);
  return {
    apiVersion: "autoscaling/v1",
    kind: "Scale",
    metadata: { name: d.metadata.name, namespace: d.metadata.namespace, uid: d.metadata.uid, resourceVersion: d.metadata.resourceVersion, creationTimestamp: d.metadata.creationTimestamp },
    spec: { replicas: spec.replicas ?? 1 },
    status: { replicas: Number((d.status as { replicas?: number } | undefined)?.replicas ?? 0), selector: selectorString(spec.selector?.matchLabels) },
  };
}

const isReady = (p: KubeObject) => ((p.status as { conditions?: Array<{ type: string; status: string }> } | undefined)?.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True");

function deletionCost(p: KubeObject): number {
  const v = Number(p.metadata.annotations?.[POD_DELETION_COST] ?? 0);
  return Number.isInteger(v) ? v : 0;
}

/** Pods in the order a scale-down removes them (first = removed first). */
export function removalOrder(pods: readonly KubeObject[]): KubeObject[] {
  return [...pods].sort((a, b) => {
    const ra = isReady(a);
    const rb = isReady(b);
    if (ra !== rb) return ra ? 1 : -1;
    const ca = deletionCost(a);
    const cb = deletionCost(b);
    if (ca !== cb) return ca - cb;
    const ta = a.metadata.creationTimestamp ?? "";
    const tb = b.metadata.creationTimestamp ?? "";
    if (ta !== tb) return ta < tb ? 1 : -1;
    return a.metadata.name < b.metadata.name ? 1 : -1;
  });
}

export interface PodLifecycle {
  /** A pod the controller created (the kubelet starts it, then reports Ready through pods/status). */
  started?(pod: KubeObject): void | Promise<void>;
  /** A pod the controller removed, now terminating (the kubelet's SIGTERM); it is gone after its grace period. */
  stopping?(pod: KubeObject): void | Promise<void>;
}

export interface DeploymentControllerOptions {
  lifecycle?: PodLifecycle;
  /** Deletes a pod with a grace period (the server's DELETE: terminating, then finalized). */
  deletePod(ns: string, name: string, graceMs: number): void;
  clock?: () => number;
}

export class DeploymentController {
  private readonly dirty = new Set<string>();
  private scheduled = false;
  private unsubscribe: (() => void) | undefined;
  readonly stats = { created: 0, deleted: 0, hookErrors: 0 };

  constructor(
    private readonly store: ObjectStore,
    private readonly o: DeploymentControllerOptions,
  ) {}

  start(): void {
    this.unsubscribe = this.store.onEvent((ev) => this.onEvent(ev));
  }

  stop(): void {
    this.unsubscribe?.();
    this.dirty.clear();
  }

  private onEvent(ev: StoredEvent): void {
    const ns = ev.object.metadata.namespace ?? "";
    if (ev.resource === DEPLOYMENT_RESOURCE.id) this.mark(ns, ev.object.metadata.name);
    else if (ev.resource === "pods") {
      const owner = (ev.object.metadata.ownerReferences as Array<{ kind: string; name: string }> | undefined)?.find((r) => r.kind === "Deployment");
      if (owner) this.mark(ns, owner.name);
    }
  }

  private mark(ns: string, name: string): void {
    this.dirty.add(`${ns}/${name}`);
    if (this.scheduled) return;
    this.scheduled = true;
    // After the write that caused the event has returned: never re-enter the store from its listener.
    setImmediate(() => {
      this.scheduled = false;
      const keys = [...this.dirty];
      this.dirty.clear();
      for (const k of keys) {
        const [ns2, name2] = k.split("/") as [string, string];
        this.reconcile(ns2, name2);
      }
    });
  }

  /** Brings one Deployment's pods to its replica count and writes its status. */
  reconcile(ns: string, name: string): void {
    let d: KubeObject | undefined;
    try {
      d = this.store.get(DEPLOYMENT_RESOURCE.id, ns, name);
    } catch {
      d = undefined;
    }
    const owned = this.store.list("pods", ns).items.filter((p) => (p.metadata.ownerReferences as Array<{ kind: string; name: string }> | undefined)?.some((r) => r.kind === "Deployment" && r.name === name));
    const live = owned.filter((p) => !p.metadata.deletionTimestamp);
    const spec = d ? specOf(d) : undefined;
    const want = d ? (spec?.replicas ?? 1) : 0;
    const graceMs = Number(spec?.template?.spec?.terminationGracePeriodSeconds ?? 30) * 1000;
    if (live.length > want) {
      for (const p of removalOrder(live).slice(0, live.length - want)) this.remove(p, graceMs);
    } else if (d && live.length < want) {
      for (let i = live.length; i < want; i++) this.create(d);
    }
    if (!d) return;
    const stillLive = this.store.list("pods", ns).items.filter((p) => !p.metadata.deletionTimestamp && (p.metadata.ownerReferences as Array<{ kind: string; name: string }> | undefined)?.some((r) => r.kind === "Deployment" && r.name === name));
    const ready = stillLive.filter(isReady).length;
    const status = {
      observedGeneration: d.metadata.generation ?? 1,
      replicas: stillLive.length,
      updatedReplicas: stillLive.length,
      readyReplicas: ready,
      availableReplicas: ready,
      ...(stillLive.length > ready ? { unavailableReplicas: stillLive.length - ready } : {}),
    };
    this.store.patch(DEPLOYMENT_RESOURCE.id, ns, name, "application/merge-patch+json", { status: { ...status, unavailableReplicas: status.unavailableReplicas ?? null } }, "status");
  }

  private create(d: KubeObject): void {
    const spec = specOf(d);
    const template = spec.template ?? {};
    const hash = createHash("sha256").update(JSON.stringify(template)).digest("hex").slice(0, 10);
    const name = `${d.metadata.name}-${hash}-${randomBytes(3).toString("hex").slice(0, 5)}`;
    const labels = { ...(template.metadata?.labels ?? {}), "pod-template-hash": hash };
    const pod = this.store.create(
      "pods",
      d.metadata.namespace ?? "",
      {
        apiVersion: "v1",
        kind: "Pod",
        metadata: {
          name,
          labels,
          ...(template.metadata?.annotations ? { annotations: template.metadata.annotations } : {}),
          ownerReferences: [{ apiVersion: "apps/v1", kind: "Deployment", name: d.metadata.name, uid: d.metadata.uid, controller: true }],
        },
        spec: template.spec ?? {},
      },
      (this.o.clock ?? Date.now)(),
    );
    this.stats.created++;
    this.hook(() => this.o.lifecycle?.started?.(pod));
  }

  private remove(p: KubeObject, graceMs: number): void {
    this.o.deletePod(p.metadata.namespace ?? "", p.metadata.name, graceMs);
    this.stats.deleted++;
    this.hook(() => this.o.lifecycle?.stopping?.(p));
  }

  private hook(fn: () => void | Promise<void> | undefined): void {
    try {
      Promise.resolve(fn()).catch(() => {
        this.stats.hookErrors++;
      });
    } catch {
      this.stats.hookErrors++;
    }
  }
}
