/**
 * pod-watcher --kubernetes: one `@kubernetes/client-node` informer per watched namespace (or one
 * across all namespaces) on pods matching the label selector. The informers' caches are the
 * desired state: every add/update/delete re-derives it (k8s-pods.ts) and hands it to the source
 * publisher, which publishes the difference to PODS. Once every informer finished its first list
 * the state is complete, and pods of this source that PODS still holds but the cluster no longer
 * does (deleted while the watcher was down) are removed; an informer that relists after a 410
 * emits deletes for what vanished meanwhile, so the same diff covers relists.
 *
 * The informers themselves (bookmarking watches with a client-side watchdog, restarts with
 * backoff) are in k8s-informers.ts.
 *
 * Blind informers: the heartbeats vouch for the pods, so they stop when any informer has been
 * unsynced or failing (403, API down, watchdog) for longer than `blindAfterMs` (about the gateways'
 * source timeout): the source goes silent and the gateways stop routing to pods nobody can see.
 */
import { readFileSync } from "node:fs";
import { CoreV1Api, KubeConfig, type V1Pod } from "@kubernetes/client-node";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { type InformerSettings, informersBlind, superviseUntilFirstRound, type Watched, watchPods } from "./k8s-informers.js";
import { kubeLeaseStore } from "./k8s-lease.js";
import { type KubePod, LABEL_MODEL, mapPod } from "./k8s-pods.js";
import { type CommonWatcherOptions, defaultWatcherId, type PodWatcherHandle, startSourceRuntime } from "./pod-watcher.js";
import { podKey, type PodState } from "./reconcile.js";

export const DEFAULT_LABEL_SELECTOR = LABEL_MODEL;
/**
 * The source name when --source is not given: `kubernetes-<context or API host>` from a kubeconfig,
 * sanitized and bounded. In-cluster every cluster's API is `kubernetes.default.svc` (or the same
 * service IP): a derived name would make two clusters' watchers one source that removes the
 * other's pods, so in-cluster --source is required (undefined here).
 */
export function clusterSourceName(kc: KubeConfig, inCluster: boolean): string | undefined {
  if (inCluster) return undefined;
  let host = "";
  try {
    host = new URL(kc.getCurrentCluster()?.server ?? "").host;
  } catch {
    host = "";
  }
  const id = (kc.getCurrentContext() || host).replace(/[^A-Za-z0-9._-]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 100);
  return id ? `kubernetes-${id}` : undefined;
}
const SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

export interface KubernetesWatcherOptions extends CommonWatcherOptions {
  /** kubeconfig file; absent = in-cluster config when running in a pod, else the default kubeconfig. */
  kubeconfig?: string;
  /** Namespaces to watch; absent or empty = all. */
  namespaces?: string[];
  labelSelector?: string;
  /** Namespace of the leader-election Lease (default $POD_NAMESPACE, the service account's, else "default"). */
  leaseNamespace?: string;
  /** Lease name (default `jetroute-pod-watcher-<source>`). */
  leaseName?: string;
  /** Watch `timeoutSeconds` range (default 300-600 s); the watchdog fires `watchdogMarginMs` after it. */
  watchTimeoutSeconds?: [number, number];
  watchdogMarginMs?: number;
  /** Heartbeats stop after an informer has been unsynced or failing this long (default 30 s, the gateways' default source timeout). */
  blindAfterMs?: number;
}

export const DEFAULT_BLIND_AFTER_MS = 30_000;
const DEFAULT_WATCHDOG_MARGIN_MS = 30_000;

export function loadKubeConfig(file: string | undefined): KubeConfig {
  const kc = new KubeConfig();
  if (file) kc.loadFromFile(file);
  else if (process.env.KUBERNETES_SERVICE_HOST) kc.loadFromCluster();
  else kc.loadFromDefault();
  return kc;
}

export const inClusterConfig = (file: string | undefined): boolean => !file && !!process.env.KUBERNETES_SERVICE_HOST;

export function defaultLeaseNamespace(): string {
  if (process.env.POD_NAMESPACE) return process.env.POD_NAMESPACE;
  try {
    return readFileSync(SA_NAMESPACE_FILE, "utf8").trim() || "default";
  } catch {
    return "default";
  }
}

/**
 * The default Lease of a watcher pair: per source, and per pool (pools in one cluster often share a
 * source): `jetroute-pod-watcher-pool.<pool>.<source>`. Dots, which neither pool names nor the
 * unpooled `jetroute-pod-watcher-<source>` put there, keep a pool's name apart from its source's.
 */
export function watcherLeaseName(source: string, pool?: string): string {
  return leaseNameFor(pool !== undefined ? `pool.${pool}.${source}` : source);
}

/** A lease name from a source: lower-case RFC 1123, at most 63 characters. */
export function leaseNameFor(source: string): string {
  const s = `jetroute-pod-watcher-${source}`.toLowerCase().replace(/[^a-z0-9.-]+/g, "-").replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, "");
  return s.slice(0, 63).replace(/[^a-z0-9]+$/, "");
}

/** The desired state the informers' caches describe, and what was skipped (mapPod). */
export interface DesiredPods {
  desired: Map<string, PodState>;
  ready: number;
  /** Pods with bad discovery labels: `namespace/name` and why. */
  invalid: { id: string; reason: string }[];
  noIp: number;
}

export function desiredPods(pods: Iterable<V1Pod>): DesiredPods {
  const out: DesiredPods = { desired: new Map(), ready: 0, invalid: [], noIp: 0 };
  for (const p of pods) {
    const m = mapPod(p as KubePod);
    if (m.ok) {
      out.desired.set(podKey(m.state.model, m.state.pod), m.state);
      if (m.state.ready) out.ready++;
    } else if (m.skip === "invalid") out.invalid.push({ id: `${p.metadata?.namespace}/${p.metadata?.name}`, reason: m.reason });
    else if (m.skip === "no-ip") out.noIp++;
  }
  return out;
}

/**
 * The heartbeats' gate: false while the informers are blind. Logs each change between blind and
 * healthy once, and reports the current state to `report`.
 */
export function vouchGate(blind: () => boolean, log: Logger, blindAfterMs: number, report: (blind: boolean) => void): () => boolean {
  let blindLogged = false;
  return () => {
    const b = blind();
    if (b !== blindLogged) {
      blindLogged = b;
      if (b) log.error({ blindAfterMs }, "a pod informer has been failing or unsynced too long: heartbeats stop, so gateways stop routing to this source's pods");
      else log.info("pod informers healthy again: heartbeats resume");
    }
    report(b);
    return !b;
  };
}

/** Runs `fn` once on the next loop turn however often it is asked for before then. */
export function oncePerTurn(fn: () => void): () => void {
  let scheduled = false;
  return () => {
    if (scheduled) return;
    scheduled = true;
    setImmediate(() => {
      scheduled = false;
      fn();
    });
  };
}

export async function startKubernetesWatcher(o: KubernetesWatcherOptions): Promise<PodWatcherHandle> {
  const log = o.log;
  const kc = loadKubeConfig(o.kubeconfig);
  const source = o.source ?? clusterSourceName(kc, inClusterConfig(o.kubeconfig));
  if (source === undefined) throw new RangeError("--source is required in-cluster: name this cluster (every cluster's API looks the same from inside, so a derived name would collide)");
  const watcherId = o.watcherId ?? defaultWatcherId();
  const labelSelector = o.labelSelector ?? DEFAULT_LABEL_SELECTOR;
  const leaseNamespace = o.leaseNamespace ?? defaultLeaseNamespace();
  const blindAfterMs = o.blindAfterMs ?? DEFAULT_BLIND_AFTER_MS;
  let watched: Watched[] = [];
  const canVouch = vouchGate(() => informersBlind(watched, Date.now(), blindAfterMs), log, blindAfterMs, (b) => {
    own.blind = b ? 1 : 0;
  });
  const rt = await startSourceRuntime({ ...o, watcherId }, source, async (_n: NatsHandles) => kubeLeaseStore(kc, leaseNamespace, o.leaseName ?? watcherLeaseName(source, o.pool)), {
    canVouch,
  });
  const api = kc.makeApiClient(CoreV1Api);
  const own = { pods: 0, ready: 0, skippedInvalid: 0, skippedNoIp: 0, informerErrors: 0, informerRestarts: 0, events: 0, watchStalls: 0, blind: 0, backoffAttempt: 0 };
  const invalidLogged = new Set<string>();
  let stopped = false;

  const namespaces = o.namespaces && o.namespaces.length > 0 ? o.namespaces : [undefined];
  const settings: InformerSettings = { kc, api, labelSelector, range: o.watchTimeoutSeconds ?? [300, 600], marginMs: o.watchdogMarginMs ?? DEFAULT_WATCHDOG_MARGIN_MS, onStall: () => own.watchStalls++ };
  watched = namespaces.map((namespace) => watchPods(namespace, settings));

  const derive = () => {
    const d = desiredPods(watched.flatMap((w) => w.informer.list()));
    for (const { id, reason } of d.invalid) {
      if (!invalidLogged.has(id) && invalidLogged.size < 1_000) {
        invalidLogged.add(id);
        log.warn({ pod: id.slice(0, 300), reason }, "pod skipped: bad discovery labels");
      }
    }
    own.pods = d.desired.size;
    own.ready = d.ready;
    own.skippedInvalid = d.invalid.length;
    own.skippedNoIp = d.noIp;
    rt.publisher.setDesired(d.desired, watched.every((w) => w.synced));
  };

  // Coalesce bursts (a relist of 1,000 pods is 1,000 callbacks) into one derivation per loop turn.
  const deriveSoon = oncePerTurn(() => {
    if (!stopped) derive();
  });
  const firstRound = superviseUntilFirstRound(watched, { log, own, stopped: () => stopped, derive: deriveSoon, publisher: rt.publisher });

  return {
    source,
    watcherId,
    get stats() {
      return { ...own, ...rt.publisher.stats, leader: rt.isLeader() ? 1 : 0 };
    },
    isLeader: () => rt.isLeader(),
    firstRound,
    async close(c = {}) {
      stopped = true;
      for (const w of watched) {
        if (w.restart) clearTimeout(w.restart);
        await w.informer.stop().catch(() => undefined);
      }
      await rt.close(c.release ?? true);
    },
  };
}
