/**
 * pod-watcher --kubernetes: one `@kubernetes/client-node` informer per watched namespace (or one
 * across all namespaces) on pods matching the label selector. The informers' caches are the
 * desired state: every add/update/delete re-derives it (k8s-pods.ts) and hands it to the source
 * publisher, which publishes the difference to PODS. Once every informer finished its first list
 * the state is complete, and pods of this source that PODS still holds but the cluster no longer
 * does (deleted while the watcher was down) are removed; an informer that relists after a 410
 * emits deletes for what vanished meanwhile, so the same diff covers relists.
 *
 * The informer stops on any watch error (a dropped connection fires "Premature close"); it is
 * restarted with backoff, resuming from its last resourceVersion (a 410 makes it relist). The
 * backoff starts over only once a watch delivered something, so a watch that fails right after
 * connecting keeps backing off instead of retrying every 100-200 ms.
 * client-node's `makeInformer` never asks for bookmarks; ours is the same ListWatch on a Watch
 * that adds `allowWatchBookmarks=true` (the server's BOOKMARKs keep the resourceVersion recent, so
 * a reconnect after a quiet spell resumes instead of relisting) and `timeoutSeconds` (5-10
 * minutes, as client-go's reflector asks). `timeoutSeconds` is only the server's promise to end
 * the watch: a connection the server never closes (half-open after a network fault) would stay
 * silent for good, and client-node's own request timeout does not help (it overwrites its abort
 * signal). So each watch has a client-side watchdog: nothing (no event, no BOOKMARK) within
 * `timeoutSeconds` plus a margin aborts it, and the informer restarts.
 *
 * Blind informers: the heartbeats vouch for the pods, so they stop when any informer has been
 * unsynced or failing (403, API down, watchdog) for longer than `blindAfterMs` (about the gateways'
 * source timeout): the source goes silent and the gateways stop routing to pods nobody can see.
 */
import { readFileSync } from "node:fs";
import { CoreV1Api, type Informer, KubeConfig, type KubernetesObject, ListWatch, type ObjectCache, type V1Pod, Watch } from "@kubernetes/client-node";
import type { NatsHandles } from "../shared/nats.js";
import { backoffDelayMs, DEFAULT_BACKOFF } from "./backoff.js";
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

const inClusterConfig = (file: string | undefined): boolean => !file && !!process.env.KUBERNETES_SERVICE_HOST;

function defaultLeaseNamespace(): string {
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

/**
 * A Watch that asks for bookmarks and a server-side timeout on every watch request, and aborts a
 * watch that stays silent past that timeout (plus a margin) itself.
 */
class BookmarkingWatch extends Watch {
  constructor(
    kc: KubeConfig,
    private readonly range: [number, number],
    private readonly marginMs: number,
    /** Something arrived on a watch (an event or a BOOKMARK): the connection works. */
    private readonly onActivity: () => void,
    private readonly onStall: () => void,
  ) {
    super(kc);
  }

  override async watch(path: string, queryParams: Record<string, unknown>, callback: (phase: string, apiObj: unknown, watchObj?: unknown) => void, done: (err: unknown) => void): Promise<AbortController> {
    const [lo, hi] = this.range;
    const timeoutSeconds = lo + Math.floor(Math.random() * Math.max(1, hi - lo));
    const limitMs = timeoutSeconds * 1_000 + this.marginMs;
    let finished = false;
    let controller: AbortController | undefined;
    let timer: NodeJS.Timeout | undefined;
    const finish = (err: unknown) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      done(err);
    };
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        this.onStall();
        controller?.abort();
        finish(new Error(`watch silent for ${limitMs} ms (no event, no BOOKMARK, not closed): aborted`));
      }, limitMs);
    };
    arm();
    controller = await super.watch(path, { ...queryParams, allowWatchBookmarks: true, timeoutSeconds }, (phase, obj, w) => {
      if (finished) return;
      arm();
      this.onActivity();
      callback(phase, obj, w);
    }, finish);
    if (finished) controller.abort();
    return controller;
  }
}

interface Watched {
  namespace: string | undefined;
  informer: Informer<V1Pod> & ObjectCache<V1Pod>;
  synced: boolean;
  attempt: number;
  restart?: NodeJS.Timeout;
  /** Since when (local ms) this informer has been unsynced or failing; undefined = healthy. */
  blindSince?: number;
  errors: number;
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
  const blind = () => watched.some((w) => w.blindSince !== undefined && Date.now() - w.blindSince >= blindAfterMs);
  let blindLogged = false;
  const canVouch = () => {
    const b = blind();
    if (b !== blindLogged) {
      blindLogged = b;
      if (b) log.error({ blindAfterMs }, "a pod informer has been failing or unsynced too long: heartbeats stop, so gateways stop routing to this source's pods");
      else log.info("pod informers healthy again: heartbeats resume");
    }
    own.blind = b ? 1 : 0;
    return !b;
  };
  const rt = await startSourceRuntime({ ...o, watcherId }, source, async (_n: NatsHandles) => kubeLeaseStore(kc, leaseNamespace, o.leaseName ?? watcherLeaseName(source, o.pool)), {
    canVouch,
  });
  const api = kc.makeApiClient(CoreV1Api);
  const own = { pods: 0, ready: 0, skippedInvalid: 0, skippedNoIp: 0, informerErrors: 0, informerRestarts: 0, events: 0, watchStalls: 0, blind: 0, backoffAttempt: 0 };
  const invalidLogged = new Set<string>();
  let stopped = false;

  const namespaces = o.namespaces && o.namespaces.length > 0 ? o.namespaces : [undefined];
  const range = o.watchTimeoutSeconds ?? [300, 600];
  const margin = o.watchdogMarginMs ?? DEFAULT_WATCHDOG_MARGIN_MS;
  watched = namespaces.map((namespace) => {
    const path = namespace ? `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods` : "/api/v1/pods";
    const list = namespace ? () => api.listNamespacedPod({ namespace, labelSelector }) : () => api.listPodForAllNamespaces({ labelSelector });
    const w: Watched = { namespace, informer: undefined as unknown as Watched["informer"], synced: false, attempt: 0, blindSince: Date.now(), errors: 0 };
    const watch = new BookmarkingWatch(kc, range, margin, () => {
      w.attempt = 0;
      w.blindSince = undefined;
    }, () => own.watchStalls++);
    w.informer = new ListWatch<V1Pod>(path, watch, list, false, labelSelector);
    return w;
  });

  const derive = () => {
    const desired = new Map<string, PodState>();
    let ready = 0;
    let invalid = 0;
    let noIp = 0;
    for (const w of watched) {
      for (const p of w.informer.list()) {
        const m = mapPod(p as KubePod);
        if (m.ok) {
          desired.set(podKey(m.state.model, m.state.pod), m.state);
          if (m.state.ready) ready++;
        } else if (m.skip === "invalid") {
          invalid++;
          const id = `${p.metadata?.namespace}/${p.metadata?.name}`;
          if (!invalidLogged.has(id) && invalidLogged.size < 1_000) {
            invalidLogged.add(id);
            log.warn({ pod: id.slice(0, 300), reason: m.reason }, "pod skipped: bad discovery labels");
          }
        } else if (m.skip === "no-ip") noIp++;
      }
    }
    own.pods = desired.size;
    own.ready = ready;
    own.skippedInvalid = invalid;
    own.skippedNoIp = noIp;
    rt.publisher.setDesired(desired, watched.every((w) => w.synced));
  };

  // Coalesce bursts (a relist of 1,000 pods is 1,000 callbacks) into one derivation per loop turn.
  let scheduled = false;
  const changed = () => {
    own.events++;
    if (scheduled) return;
    scheduled = true;
    setImmediate(() => {
      scheduled = false;
      if (!stopped) derive();
    });
  };

  const start = async (w: Watched): Promise<void> => {
    const errorsBefore = w.errors;
    try {
      await w.informer.start();
      // A failed list does not reject start(): it fires "error" (which schedules the restart)
      // and leaves no resourceVersion behind.
      if (!(w.informer as unknown as { latestResourceVersion(): string }).latestResourceVersion()) return;
      // Listed (or resumed) without an error meanwhile (a refused watch errors inside start()): it
      // sees the cluster again. The backoff restarts only once the watch delivers something.
      if (w.errors === errorsBefore) w.blindSince = undefined;
      if (!w.synced) {
        w.synced = true;
        log.info({ namespace: w.namespace ?? "(all)", pods: w.informer.list().length }, "informer synced");
      }
      changed();
    } catch (err) {
      onError(w, err);
    }
  };
  const onError = (w: Watched, err: unknown) => {
    if (stopped || w.restart) return;
    own.informerErrors++;
    w.errors++;
    w.blindSince ??= Date.now();
    const delay = backoffDelayMs(w.attempt++, Math.random(), DEFAULT_BACKOFF);
    own.backoffAttempt = Math.max(...watched.map((x) => x.attempt));
    log.warn({ namespace: w.namespace ?? "(all)", err: (err as Error)?.message ?? String(err), retryInMs: delay }, "pod watch failed; restarting");
    w.restart = setTimeout(() => {
      w.restart = undefined;
      own.informerRestarts++;
      void start(w);
    }, delay);
  };
  for (const w of watched) {
    for (const verb of ["add", "update", "delete"] as const) w.informer.on(verb, (_obj: KubernetesObject) => changed());
    w.informer.on("error", (err: unknown) => onError(w, err));
  }
  const starting = Promise.all(watched.map((w) => start(w)));
  const firstRound = starting.then(async () => {
    await new Promise((r) => setImmediate(r));
    if (watched.every((w) => w.synced) && rt.publisher.isActive) await rt.publisher.whenSynced();
  });

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
