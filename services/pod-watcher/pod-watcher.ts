/**
 * pod-watcher: publishes the pods of one source (a static list or a Kubernetes cluster) to PODS.
 *
 * A driver turns what it watches into desired pod states; a SourcePublisher keeps PODS equal to
 * them (ownership, heartbeats, re-assertion, retried publishes); with leader election only the
 * source's lease holder publishes. Static mode: each listed pod's readiness comes from probing
 * the engine's `/health`; a pod that leaves the list (or was published by an earlier run of the
 * same source and is no longer listed) is removed after the next full probe round.
 */
import type { RecordSigner } from "../../streams/signatures.js";
import { randomBytes } from "node:crypto";
import { unwatchFile, watchFile } from "node:fs";
import os from "node:os";
import path from "node:path";
import { namespaceOf } from "../../streams/pools.js";
import { Subjects } from "../../streams/subjects.js";
import { encodeToken } from "../../streams/tokens.js";
import { kvLeaseStore } from "../shared/kv-lease.js";
import { LeaderElector, type LeaseStore } from "../shared/leader.js";
import type { Logger } from "../shared/log.js";
import { connectNats, type NatsHandles } from "../shared/nats.js";
import { followPools, type ModelFilter, modelFilterFor, type PoolFollowHandle } from "./pool-models.js";
import { discardBody } from "../shared/http-body.js";
import { podKey, type PodState } from "./reconcile.js";
import { SourcePublisher, type SourcePublisherStats } from "./source-publisher.js";
import { readPodList, type StaticPod } from "./static-pods.js";

export const DEFAULT_HEARTBEAT_MS = 5_000;
/** A pooled watcher whose models stay unknown this long (its config entry unreadable or never valid) stops heartbeating. */
export const POOL_UNKNOWN_VOUCH_MS = 60_000;
/** PODS keeps pods 30 days (`max_age`); re-asserting every 10 minutes costs one message per pod per 10 minutes. */
export const DEFAULT_REASSERT_MS = 600_000;
/** 12 s: lease + two renewal rounds + a heartbeat (12 + 8 + 5 s) stays under the gateways' 30 s source timeout. */
export const DEFAULT_LEASE_MS = 12_000;
/**
 * A leader whose heartbeats or publishes have failed this long steps down and releases its lease:
 * a third of the gateways' default source timeout (30 s), so the standby takes over (lease
 * release, then its next round) before any gateway gives the source up.
 */
export const DEFAULT_STEP_DOWN_AFTER_MS = 10_000;

export interface CommonWatcherOptions {
  nats: string | string[];
  /** The base subject prefix; with `pool`, pods go to the pool's namespace under it. */
  prefix?: string;
  /** Gateway pools: publish only this pool's models' pods, into its namespace (streams/pools.ts). */
  pool?: string;
  /** With `pool`: its models, instead of the config bucket's `pool.<name>` entry. */
  poolModels?: string[];
  /** How often the config bucket's `pool.*` entries are re-read (default 5 s). */
  poolPollMs?: number;
  /** The source this watcher vouches for (default: derived from the list file / cluster). */
  source?: string;
  /** This instance's id (default `<hostname>-<pid>-<random>`). */
  watcherId?: string;
  heartbeatMs?: number;
  reassertMs?: number;
  /** Contend for the source's lease; only the holder publishes (run two for HA). */
  leaderElection?: boolean;
  leaseMs?: number;
  /** With leader election: step down after publishes have failed this long (default 10 s). */
  stepDownAfterMs?: number;
  /** Remove pods published without a source (before sources existed) when this watcher does not list them: the upgrade's one-off migration. */
  adoptUnowned?: boolean;
  /** Signs every pod event and heartbeat (gateways with `--pod-public-key` act only on signed ones). */
  signer?: RecordSigner;
  log: Logger;
}

export interface PodWatcherOptions extends CommonWatcherOptions {
  file: string;
  probeIntervalMs?: number;
  probeTimeoutMs?: number;
  /** Skip /health probes: every listed pod is ready. */
  noProbe?: boolean;
}

export interface PodWatcherHandle {
  readonly source: string;
  readonly watcherId: string;
  /** Publisher counters (published, removed, reasserted, heartbeats, publishFailures, ...) plus the mode's own. */
  readonly stats: Readonly<SourcePublisherStats & { leader: number } & Record<string, number>>;
  isLeader(): boolean;
  /** Resolves after the first full round was observed (and, when this instance publishes, published). */
  firstRound: Promise<void>;
  /** Stops; with `release` (default) a held lease is given up so the standby takes over at once. */
  close(o?: { release?: boolean }): Promise<void>;
}

/** A source name from a list file: `static-<file name without extension>`. */
export function staticSourceName(file: string): string {
  const base = path.basename(file).replace(/\.[^.]*$/, "") || "pods";
  return `static-${base}`.slice(0, 253);
}

/** `<hostname>-<pid>-<random>`: unique per process, so two watchers never share a lease identity. */
export const defaultWatcherId = (): string => `${os.hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`.slice(0, 253);

async function probe(address: string, timeoutMs: number): Promise<boolean> {
  try {
    const res = await fetch(`http://${address}/health`, { signal: AbortSignal.timeout(timeoutMs), redirect: "error" });
    // The status is the answer: the body is dropped unread, however long it is.
    await discardBody(res);
    return res.ok;
  } catch {
    return false;
  }
}

export function staticPodState(p: StaticPod, ready: boolean): PodState {
  return {
    model: p.model,
    pod: p.name,
    address: p.address,
    ready,
    engine: p.engine ?? "vllm",
    ...(p.role ? { role: p.role } : {}),
    ...(p.roleset ? { roleset: p.roleset } : {}),
    ...(p.podClass ? { podClass: p.podClass } : {}),
    ...(p.schedulingPolicy && p.schedulingPolicy !== "fcfs" ? { schedulingPolicy: p.schedulingPolicy } : {}),
    ...(p.bootstrapPort ? { bootstrapPort: p.bootstrapPort } : {}),
    ...(p.metricsAddress ? { metricsAddress: p.metricsAddress } : {}),
    ...(p.kvEvents ? { kvEvents: p.kvEvents } : {}),
    ...(p.adapters ? { adapters: p.adapters } : {}),
    ...(p.labels ? { labels: p.labels } : {}),
  };
}

/** The parts every mode shares: NATS, the source publisher, and (optionally) the lease. */
export interface SourceRuntime {
  nats: NatsHandles;
  publisher: SourcePublisher;
  elector: LeaderElector | undefined;
  isLeader(): boolean;
  /** Successful reads of the gateway pools from the config bucket (0 with --models). */
  poolReads(): number;
  close(release: boolean): Promise<void>;
}

/** Names that travel in every event: what the PODS schema accepts (1-253 characters, no whitespace). */
export function checkWatcherName(what: string, v: string): string {
  if (!/^\S{1,253}$/.test(v)) throw new RangeError(`${what} must be 1-253 characters without whitespace, got ${JSON.stringify(v.slice(0, 80))}`);
  return v;
}

export interface SourceRuntimeExtras {
  /** See SourcePublisherOptions.canVouch. */
  canVouch?: () => boolean;
}

/** Static mode's lease: this key of the namespace's lease bucket (services/shared/kv-lease.ts). */
export const staticLeaseKey = (source: string): string => `pod-watcher.${encodeToken(source)}`;

export async function startSourceRuntime(o: CommonWatcherOptions, source: string, leaseStore?: (nats: NatsHandles) => Promise<LeaseStore>, extras: SourceRuntimeExtras = {}): Promise<SourceRuntime> {
  checkWatcherName("--source", source);
  if (o.watcherId !== undefined) checkWatcherName("--watcher-id", o.watcherId);
  const ns = namespaceOf(o.prefix ?? "jr", o.pool);
  const prefix = ns.prefix;
  const subjects = new Subjects(prefix);
  const nats = await connectNats(o.nats, "jetroute-pod-watcher");
  const watcher = o.watcherId ?? defaultWatcherId();
  let elector: LeaderElector | undefined;
  let unknownSince: number | undefined;
  const publisher = new SourcePublisher({
    nats, subjects, prefix, source, watcher, log: o.log, heartbeatMs: o.heartbeatMs ?? DEFAULT_HEARTBEAT_MS, reassertMs: o.reassertMs ?? DEFAULT_REASSERT_MS,
    adoptUnowned: o.adoptUnowned ?? false,
    ...(o.signer ? { signer: o.signer } : {}),
    stillLeader: () => (elector ? elector.isLeader() : true),
    exclusive: !o.leaderElection,
    // A pooled watcher that has not known its models for POOL_UNKNOWN_VOUCH_MS stops vouching: its
    // earlier pods (frozen, neither updated nor removed meanwhile) then time out in the gateways.
    canVouch: () => (extras.canVouch ? extras.canVouch() : true) && !(unknownSince !== undefined && Date.now() - unknownSince > POOL_UNKNOWN_VOUCH_MS),
  });
  const setFilter = (f: ModelFilter) => {
    if (f !== "unknown") unknownSince = undefined;
    else unknownSince ??= Date.now();
    publisher.setModelFilter(f);
  };
  // Which models' pods this watcher publishes (pool-models.ts): a pooled one its pool's, an
  // unpooled one those no pool lists; a pooled one with --models exactly those.
  let pools: PoolFollowHandle | undefined;
  if (ns.pool !== undefined && o.poolModels) {
    const models = new Set(o.poolModels);
    setFilter((m) => models.has(m));
  } else {
    setFilter(modelFilterFor(ns.pool, undefined));
    pools = followPools({ nc: nats.nc, configPrefix: ns.configPrefix, log: o.log, ...(o.poolPollMs ? { pollMs: o.poolPollMs } : {}), onPools: (map, invalid) => setFilter(modelFilterFor(ns.pool, map, invalid)) });
    await pools.ready;
  }
  if (o.leaderElection) {
    const store = await (leaseStore ?? ((n) => kvLeaseStore(n, prefix, staticLeaseKey(source))))(nats);
    const stepDownAfterMs = o.stepDownAfterMs ?? DEFAULT_STEP_DOWN_AFTER_MS;
    elector = new LeaderElector({
      store, me: watcher, durationMs: o.leaseMs ?? DEFAULT_LEASE_MS, log: o.log, onChange: (leader) => publisher.setActive(leader),
      healthy: () => publisher.failingForMs() < stepDownAfterMs,
    });
    elector.start();
  } else publisher.setActive(true);
  return {
    nats,
    publisher,
    elector,
    isLeader: () => (elector ? elector.isLeader() : true),
    poolReads: () => pools?.reads ?? 0,
    async close(release) {
      pools?.stop();
      await elector?.stop(release);
      await publisher.close();
      await nats.nc.drain().catch(() => undefined);
    },
  };
}

export async function startPodWatcher(o: PodWatcherOptions): Promise<PodWatcherHandle> {
  const log = o.log;
  const source = o.source ?? staticSourceName(o.file);
  let pods = readPodList(o.file);
  const watcherId = o.watcherId ?? defaultWatcherId();
  const rt = await startSourceRuntime({ ...o, watcherId }, source);
  const own = { pods: 0, ready: 0, probeRounds: 0, reloadsRejected: 0 };

  let stopped = false;
  const probeRound = async () => {
    const listed = pods;
    const results = await Promise.all(listed.map(async (p) => [p, o.noProbe ? true : await probe(p.address, o.probeTimeoutMs ?? 1_000)] as const));
    if (stopped) return;
    own.probeRounds++;
    own.pods = results.length;
    own.ready = results.filter(([, r]) => r).length;
    const desired = new Map<string, PodState>();
    for (const [p, ready] of results) desired.set(podKey(p.model, p.name), staticPodState(p, ready));
    // A round of the list as it was when the round started: removals only for that list.
    rt.publisher.setDesired(desired, listed === pods);
  };

  let round: Promise<void> = probeRound();
  const firstRound = round.then(async () => {
    if (rt.publisher.isActive) await rt.publisher.whenSynced();
  });
  const timer = setInterval(() => {
    round = round.then(probeRound).catch((err: unknown) => log.error({ err }, "probe round failed"));
  }, o.probeIntervalMs ?? 1_000);

  watchFile(o.file, { interval: 1_000 }, () => {
    try {
      pods = readPodList(o.file);
      log.info({ pods: pods.length }, "pod list reloaded");
      round = round.then(probeRound).catch((err: unknown) => log.error({ err }, "reload failed"));
    } catch (err) {
      own.reloadsRejected++;
      log.error({ err: (err as Error).message }, "pod list rejected; keeping the previous one");
    }
  });

  return {
    source,
    watcherId,
    get stats() {
      return { ...own, ...rt.publisher.stats, leader: rt.isLeader() ? 1 : 0, poolReads: rt.poolReads() };
    },
    isLeader: () => rt.isLeader(),
    firstRound,
    async close(c = {}) {
      stopped = true;
      clearInterval(timer);
      unwatchFile(o.file);
      await round.catch(() => undefined);
      await rt.close(c.release ?? true);
    },
  };
}
