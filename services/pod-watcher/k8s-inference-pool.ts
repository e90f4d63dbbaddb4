/**
 * pod-watcher --inference-pool <namespace>/<name>: publishes the endpoints of one InferencePool
 * (`inference.networking.k8s.io/v1`) to PODS, under the same source, ownership, liveness and
 * lease rules as --kubernetes (pod-watcher.ts, kubernetes.ts).
 *
 * Two informers in the pool's namespace: the InferencePools (the pool is picked by name) and the
 * pods. The pods are watched without a label selector and matched against the pool's selector
 * here, so a change of the pool's selector or ports applies at the next derivation, without
 * restarting a watch. The pool deleted (or never created) -> no endpoints: its pods leave PODS.
 * A pool that fails validation (inference-pool.ts) is reported (log line, metric) and the last
 * valid spec of the same pool object stays in force. Models come from `modelLabel` or, for pods
 * without it, from the engines' `/v1/models` (model-discovery.ts).
 *
 * Objectives and model rewrites of the pool (InferenceObjective, InferenceModelRewrite) are
 * watched by pool-policy-watch.ts and published to the config bucket for the gateways.
 */
import { CoreV1Api, CustomObjectsApi, type KubeConfig } from "@kubernetes/client-node";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { informersBlind, type KubernetesObjectList, superviseUntilFirstRound, type Watched, watchObjects, watchPods } from "./k8s-informers.js";
import { kubeLeaseStore } from "./k8s-lease.js";
import type { KubePod } from "./k8s-pods.js";
import { clusterSourceName, DEFAULT_BLIND_AFTER_MS, defaultLeaseNamespace, inClusterConfig, type KubernetesWatcherOptions, loadKubeConfig, oncePerTurn, vouchGate, watcherLeaseName } from "./kubernetes.js";
import { checkPoolModels, INFERENCE_POOL_API_VERSION, type InferencePoolSpec, type KubeInferencePool, parseInferencePool, type PoolEndpoints, poolEndpoints } from "./inference-pool.js";
import { ModelDiscovery } from "./model-discovery.js";
import { defaultWatcherId, type PodWatcherHandle, startSourceRuntime } from "./pod-watcher.js";
import { checkObjectivesApiVersion } from "./pool-policy.js";
import { type PoolPolicyWatch, startPoolPolicyWatch } from "./pool-policy-watch.js";

export interface InferencePoolWatcherOptions extends Omit<KubernetesWatcherOptions, "namespaces" | "labelSelector"> {
  /** `<namespace>/<name>` of the InferencePool. */
  inferencePool: string;
  /** API version of the InferencePool (only `inference.networking.k8s.io/v1` is implemented). */
  poolApiVersion?: string;
  /** Pod label naming an endpoint's model; pods without it are asked (`/v1/models`) when `inferencePoolModels` is given, else skipped. */
  modelLabel?: string;
  /**
   * The models this pool serves (`--inference-pool-models`): an engine's `/v1/models` answer (and a label)
   * must name one of them, or its endpoint is not published. Required unless `modelLabel` is given.
   */
  inferencePoolModels?: readonly string[];
  /** API version of InferenceObjective / InferenceModelRewrite (pool-policy.ts); "none" = do not watch them. */
  objectivesApiVersion?: string;
  /** How often an engine's `/v1/models` is asked again (default 30 s). */
  modelsRefreshMs?: number;
}

/** `<namespace>/<name>` -> its parts; throws a RangeError naming the flag. */
export function parsePoolRef(ref: string): { namespace: string; name: string } {
  const m = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?)\/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$/.exec(ref);
  if (!m || ref.length > 317) throw new RangeError(`--inference-pool must be <namespace>/<name> (lower-case DNS names), got ${JSON.stringify(ref.slice(0, 80))}`);
  return { namespace: m[1] as string, name: m[3] as string };
}

/** The API version must be one this watcher implements: a clear error at start, not a silent empty pool. */
export function checkPoolApiVersion(v: string | undefined): string {
  const version = v ?? INFERENCE_POOL_API_VERSION;
  if (version !== INFERENCE_POOL_API_VERSION) throw new RangeError(`unknown InferencePool API version ${JSON.stringify(version.slice(0, 80))}: this pod-watcher implements ${INFERENCE_POOL_API_VERSION} only`);
  return version;
}

/** The API server does not serve a resource this mode needs (its CRD is not installed). */
export class ApiNotServedError extends Error {
  override name = "ApiNotServedError";
}

/** Fails at start when the API server does not serve InferencePools (the CRD is not installed). */
async function checkServed(kc: KubeConfig, group: string, version: string, namespace: string): Promise<void> {
  try {
    await kc.makeApiClient(CustomObjectsApi).listNamespacedCustomObject({ group, version, namespace, plural: "inferencepools", limit: 1 });
  } catch (err) {
    if ((err as { code?: number }).code === 404) throw new ApiNotServedError(`the API server does not serve inferencepools.${group}/${version}: install the InferencePool CRD (docs/inference-pool.md)`);
    // Anything else (the API down, 403) is what the informers retry and report.
  }
}

type PoolWatcherCounters = Record<string, number> & { endpoints: number; poolPresent: number; poolInvalid: number };

/**
 * Which spec of the pool is in force: the pool's own when it validates, else the last valid spec
 * of the same pool object (by uid). Each refusal is logged and counted once per pool generation.
 */
class PoolSpecTracker {
  private lastValid: { uid: string; spec: InferencePoolSpec } | undefined;
  private reported = "";

  constructor(
    private readonly pool: string,
    private readonly own: PoolWatcherCounters,
    private readonly log: Logger,
  ) {}

  current(obj: KubeInferencePool | undefined, synced: boolean): InferencePoolSpec | undefined {
    this.own.poolPresent = obj ? 1 : 0;
    if (!obj) {
      this.lastValid = undefined;
      this.own.poolInvalid = 0;
      if (synced && this.reported !== "absent") {
        if (this.own.endpoints > 0) this.log.warn({ pool: this.pool }, "InferencePool gone: its endpoints leave");
        this.reported = "absent";
      }
      return undefined;
    }
    const meta = obj.metadata as { uid?: string; generation?: number } | undefined;
    const uid = meta?.uid ?? "";
    const parsed = parseInferencePool(obj);
    const key = `${parsed.ok ? "ok" : "bad"} ${uid} ${meta?.generation ?? 0}`;
    if (parsed.ok) {
      this.lastValid = { uid, spec: parsed.spec };
      this.own.poolInvalid = 0;
    } else {
      if (this.lastValid?.uid !== uid) this.lastValid = undefined;
      this.own.poolInvalid = 1;
      if (key !== this.reported) {
        const counter = { "too-many-ports": "poolRejectedTooManyPorts", "duplicate-ports": "poolRejectedDuplicatePorts", "empty-selector": "poolRejectedEmptySelector", invalid: "poolRejectedInvalid" } as const;
        this.own[counter[parsed.problem]] = (this.own[counter[parsed.problem]] ?? 0) + 1;
        this.log.error({ pool: this.pool, problem: parsed.problem, reason: parsed.reason, keeping: this.lastValid ? "the last valid spec" : "no endpoints" }, "InferencePool refused");
      }
    }
    this.reported = key;
    return this.lastValid?.spec;
  }
}

/** The endpoint figures of one derivation. */
function countEndpoints(own: PoolWatcherCounters, e: PoolEndpoints | undefined, discovery: ModelDiscovery): void {
  const states = e ? [...e.desired.values()] : [];
  own.endpoints = states.length;
  own.ready = states.filter((s) => s.ready).length;
  own.pods = new Set(states.map((s) => s.address.slice(0, s.address.lastIndexOf(":")))).size;
  own.skippedNoIp = e?.noIp ?? 0;
  own.skippedInvalid = e?.invalid.length ?? 0;
  own.undiscovered = e?.undiscovered.length ?? 0;
  own.mixedModels = e?.mixedModels.length ?? 0;
  own.modelsRefused = e?.refusedModels ?? 0;
  own.adaptersDropped = e?.droppedAdapters ?? 0;
  own.modelAsks = discovery.stats.asked;
  own.modelAskFailures = discovery.stats.failed;
}

export async function startInferencePoolWatcher(o: InferencePoolWatcherOptions): Promise<PodWatcherHandle> {
  const log = o.log;
  const { namespace, name } = parsePoolRef(o.inferencePool);
  const [group, version] = checkPoolApiVersion(o.poolApiVersion).split("/") as [string, string];
  if (o.objectivesApiVersion !== "none") checkObjectivesApiVersion(o.objectivesApiVersion);
  const allowedModels = checkPoolModels(o.inferencePoolModels, o.modelLabel);
  const kc = loadKubeConfig(o.kubeconfig);
  const cluster = clusterSourceName(kc, inClusterConfig(o.kubeconfig));
  const source = o.source ?? (cluster !== undefined ? `${cluster}-inferencepool-${namespace}-${name}` : undefined);
  if (source === undefined) throw new RangeError("--source is required in-cluster: name this cluster and pool (every cluster's API looks the same from inside)");
  await checkServed(kc, group, version, namespace);
  const watcherId = o.watcherId ?? defaultWatcherId();
  const leaseNamespace = o.leaseNamespace ?? defaultLeaseNamespace();
  const blindAfterMs = o.blindAfterMs ?? DEFAULT_BLIND_AFTER_MS;
  const own = {
    pods: 0, ready: 0, endpoints: 0, skippedInvalid: 0, skippedNoIp: 0, undiscovered: 0, poolPresent: 0, poolInvalid: 0, mixedModels: 0, modelsRefused: 0, adaptersDropped: 0,
    informerErrors: 0, informerRestarts: 0, events: 0, watchStalls: 0, blind: 0, backoffAttempt: 0, modelAsks: 0, modelAskFailures: 0,
    poolRejectedTooManyPorts: 0, poolRejectedDuplicatePorts: 0, poolRejectedEmptySelector: 0, poolRejectedInvalid: 0,
  };
  let watched: Watched[] = [];
  const canVouch = vouchGate(() => informersBlind(watched, Date.now(), blindAfterMs), log, blindAfterMs, (b) => {
    own.blind = b ? 1 : 0;
  });
  const rt = await startSourceRuntime({ ...o, watcherId }, source, async (_n: NatsHandles) => kubeLeaseStore(kc, leaseNamespace, o.leaseName ?? watcherLeaseName(source, o.pool)), { canVouch });
  let stopped = false;
  const settings = { kc, range: o.watchTimeoutSeconds ?? ([300, 600] as [number, number]), marginMs: o.watchdogMarginMs ?? 30_000, onStall: () => own.watchStalls++ };
  const objects = kc.makeApiClient(CustomObjectsApi);
  const poolWatch = watchObjects(`/apis/${group}/${version}/namespaces/${namespace}/inferencepools`, () => objects.listNamespacedCustomObject({ group, version, namespace, plural: "inferencepools" }) as Promise<KubernetesObjectList>, settings, `inferencepools/${namespace}`);
  const podWatch = watchPods(namespace, { ...settings, api: kc.makeApiClient(CoreV1Api), labelSelector: "" });
  watched = [poolWatch, podWatch];

  const discovery = new ModelDiscovery({ changed: () => deriveSoon(), ...(o.modelsRefreshMs ? { refreshMs: o.modelsRefreshMs } : {}), ...(process.env.JETROUTE_ENGINE_API_KEY ? { apiKey: process.env.JETROUTE_ENGINE_API_KEY } : {}) });
  const specs = new PoolSpecTracker(`${namespace}/${name}`, own, log);
  let mixedReported = "";
  let refusedReported = "";
  let policy: PoolPolicyWatch | undefined;

  const derive = () => {
    const obj = (poolWatch.informer.list() as unknown as KubeInferencePool[]).find((p) => p.metadata?.name === name);
    const spec = specs.current(obj, poolWatch.synced);
    const pods = podWatch.informer.list() as unknown as KubePod[];
    const e = spec ? poolEndpoints({ namespace, spec, pods, ...(o.modelLabel ? { modelLabel: o.modelLabel } : {}), ...(allowedModels ? { allowedModels } : {}), discovered: discovery.known }) : undefined;
    discovery.track(e?.asked ?? []);
    countEndpoints(own, e, discovery);
    const refusedNow = (e?.invalid ?? []).filter((x) => x.reason.includes("--inference-pool-models")).map((x) => `${x.id}: ${x.reason}`).slice(0, 10).join("; ");
    if (refusedNow !== refusedReported) {
      refusedReported = refusedNow;
      if (refusedNow) log.warn({ pool: `${namespace}/${name}`, refused: refusedNow.slice(0, 2_000) }, "InferencePool endpoints not published: their engine or label names a model the pool does not serve (--inference-pool-models)");
    }
    const mixed = e?.mixedModels.join(",") ?? "";
    if (mixed !== mixedReported) {
      mixedReported = mixed;
      if (mixed) log.error({ pool: `${namespace}/${name}`, models: e?.mixedModels }, "InferencePool selector spans pods of several models and they carry no model label: each endpoint is published under the model its engine serves; label the pods or narrow the selector");
    }
    policy?.setModels(e ? [...new Set([...e.desired.values()].map((s) => s.model))].sort() : []);
    // Complete once both informers listed; an endpoint whose models are not known yet is left out (not removed).
    // (An engine that never answers holds no removal up: once asked, its endpoint counts as gone.)
    const complete = watched.every((w) => w.synced) && (e?.undiscovered ?? []).every((a) => discovery.attempted(a));
    rt.publisher.setDesired(e?.desired ?? new Map(), complete);
  };
  const deriveSoon = oncePerTurn(() => {
    if (!stopped) derive();
  });
  // Engines that did not answer are asked again, and answers refreshed, without waiting for an event.
  const tick = setInterval(deriveSoon, 1_000);
  tick.unref();
  if (o.objectivesApiVersion !== "none") {
    policy = await startPoolPolicyWatch({
      kc, nc: rt.nats.nc, prefix: o.prefix ?? "jr", ...(o.pool !== undefined ? { gatewayPool: o.pool } : {}), namespace, pool: name, apiVersion: o.objectivesApiVersion, log, settings,
      isLeader: () => rt.isLeader() && rt.publisher.isActive, ...(o.signer ? { signer: o.signer } : {}),
    });
    watched.push(...policy.watched);
  }
  const firstRound = superviseUntilFirstRound(watched, { log, own, stopped: () => stopped, derive: deriveSoon, publisher: rt.publisher });
  log.info({ pool: `${namespace}/${name}`, apiVersion: `${group}/${version}`, modelLabel: o.modelLabel ?? "(ask the engines)" }, "watching an InferencePool");
  return {
    source,
    watcherId,
    get stats() {
      return { ...own, ...(policy?.stats ?? {}), ...rt.publisher.stats, leader: rt.isLeader() ? 1 : 0 };
    },
    isLeader: () => rt.isLeader(),
    firstRound,
    async close(c = {}) {
      stopped = true;
      clearInterval(tick);
      discovery.stop();
      await policy?.stop();
      for (const w of watched) {
        if (w.restart) clearTimeout(w.restart);
        await w.informer.stop().catch(() => undefined);
      }
      await rt.close(c.release ?? true);
    },
  };
}
