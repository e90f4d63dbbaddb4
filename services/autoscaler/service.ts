/**
 * `jetroute autoscaler`: folds the fleet like a gateway that routes nothing (PODS, LOAD, CHARGES,
 * DECISIONS, flow control's summaries), evaluates every policy of the config bucket
 * (`autoscale.<name>`, live) once per interval, and publishes each evaluation on the AUTOSCALE
 * stream. Run two for HA: only the holder of the lease publishes (the other evaluates too, so a
 * takeover starts with warm windows).
 *
 * The decisions are the pure modules beside this file (runner, evaluator, kpa, apa, pd-planner);
 * this shell only moves events in and records out.
 */
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { type KV, type KvEntry, Kvm } from "@nats-io/kv";
import { AUTOSCALE_KEY_PREFIX, type AutoscalePolicy, type AutoscaleRecommendation, autoscalePolicyError, resolvePolicy } from "../../schemas/autoscale.js";
import { POOL_KEY_PREFIX, readPoolConfig } from "../../schemas/config.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { type RecordKeySets, sharedKeyError } from "../../streams/record-keys.js";
import { STREAM_EVENT_TYPES } from "../../streams/event-types.js";
import { Subjects } from "../../streams/subjects.js";
import { decodeToken } from "../../streams/tokens.js";
import { FleetQueues } from "../routing/mod.js";
import { StreamFollower } from "../shared/follower.js";
import { kvLeaseStore } from "../shared/kv-lease.js";
import { LeaderElector } from "../shared/leader.js";
import type { Logger } from "../shared/log.js";
import { configEntryJudge } from "../shared/config-judge.js";
import { connectNats, type NatsHandles, requireStream } from "../shared/nats.js";
import { ServerClock } from "../gateway/server-clock.js";
import { GatewayState } from "../views/gateway-state.js";
import { PoolMap } from "../views/pool-map.js";
import { GatewayAcks } from "./acks.js";
import type { WorkloadApplier, WorkloadClient } from "./kube-apply.js";
import type { PolicyFigures } from "./metrics.js";
import { OutcomeWindow } from "./outcomes.js";
import { Rounds } from "./rounds.js";
import { createRunner, type PolicyRunner } from "./runner.js";

/** Largest flow summary read (as the gateways read them). */
const MAX_FLOW_SUMMARY_BYTES = 256 * 1024;

export const DEFAULT_TICK_MS = 1000;
export const DEFAULT_AUTOSCALER_LEASE_MS = 12_000;
/** DECISIONS history read at start: the longest default window (the stable window, 180 s) and some. */
const OUTCOME_HISTORY_MS = 10 * 60_000;

export interface AutoscalerOptions {
  nats: string | string[];
  /** The namespace's prefix (a gateway pool's: `<prefix>.pool.<name>`): its streams and lease bucket. */
  prefix: string;
  /** The config bucket's prefix (the base prefix; default `prefix`). */
  configPrefix?: string;
  /**
   * The gateway pool this autoscaler serves: it evaluates only policies of the pool's models (the
   * config bucket's `pool.<name>`). Unpooled (undefined): only models of no pool.
   */
  pool?: string;
  id?: string;
  /** How often policies are evaluated (each policy's own `intervalMs` is honoured as a minimum). */
  tickMs?: number;
  leaderElection?: boolean;
  leaseMs?: number;
  log: Logger;
  clock?: () => number;
  /** `--apply`: write recommendations to the policies' workloads through this client. */
  apply?: WorkloadClient;
  /** With `apply`: false = plain scale subresource, no drain handshake (`--no-drain`). */
  drain?: boolean;
  /**
   * Signed records (docs/security.md): with `operator`, only policies and pool assignments the
   * operator's keys signed are acted on; with `podWatcher`, only pods and heartbeats a watcher's
   * keys signed count. Absent = unchecked.
   */
  signatures?: RecordKeySets;
  /** `--allow-workload`: `Kind/namespace/name` of workloads `--apply` may scale although their pods are not the policy model's in PODS. */
  allowWorkloads?: readonly string[];
}

export interface AutoscalerHandle {
  readonly id: string;
  readonly nats: NatsHandles;
  isLeader(): boolean;
  /** Policies in force, by name. */
  policies(): ReadonlyMap<string, PolicyRunner>;
  /** Runs one evaluation round now (tests; the timer calls it every tick); resolves once applied and published. */
  evaluate(): Promise<AutoscaleRecommendation[]>;
  /** The `--apply` appliers, by policy. */
  appliers(): ReadonlyMap<string, WorkloadApplier>;
  /** Per policy in force: its evaluations, recommendations published, last desired count and ready pods. */
  policyFigures(): ReadonlyMap<string, PolicyFigures>;
  readonly stats: { evaluations: number; published: number; publishErrors: number; invalidPolicies: number; refusedSignature: number };
  whenReady(): Promise<void>;
  close(): Promise<void>;
}

export async function startAutoscaler(o: AutoscalerOptions): Promise<AutoscalerHandle> {
  const log = o.log;
  const clock = o.clock ?? Date.now;
  const signatures = o.signatures ?? {};
  const shared = sharedKeyError(signatures);
  if (shared) throw new Error(shared);
  const id = o.id ?? `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
  const nats = await connectNats(o.nats, `jetroute-autoscaler-${id}`);
  const subjects = new Subjects(o.prefix);
  const autoscaleStream = streamName(o.prefix, "AUTOSCALE");
  await requireStream(nats, autoscaleStream);
  // Pods and watcher heartbeats: only those a pod-watcher's key signed count, as on the gateways.
  const state = new GatewayState(signatures.podWatcher ? { podSignatures: signatures.podWatcher } : {});
  const outcomes = new OutcomeWindow();
  const serverClock = new ServerClock(clock);
  const acks = new GatewayAcks();
  /** Each pod's current `draining` event (`<model>\0<pod>`): its PODS sequence and deadline. */
  const drainEvents = new Map<string, { seq: number; deadline: number }>();
  const fleet = new FleetQueues({ self: id, boundMs: 0 });
  const stats = { evaluations: 0, published: 0, publishErrors: 0, invalidPolicies: 0, refusedSignature: 0 };
  const followers = createFollowers({ nats, subjects, prefix: o.prefix, id, state, outcomes, serverClock, acks, drainEvents, log });
  const flowSub = nats.nc.subscribe(subjects.all("flow"), {
    callback: (err, m) => {
      if (err) return;
      try {
        // The gateways' own trust check: only the gateway the subject names, bounded bands and
        // counts, no future ts (services/routing/flow/fleet.ts).
        if (m.data.length > MAX_FLOW_SUMMARY_BYTES) return;
        fleet.applyFrom(subjects.parse(m.subject)?.names[0], m.json(), clock());
      } catch {
        // Not JSON: the gateways' own reader counts these; nothing to scale on.
      }
    },
  });
  const runners = new Map<string, PolicyRunner>();
  const pools = new PoolMap();
  const policyWatch = await watchPolicies(nats, o.configPrefix ?? o.prefix, runners, pools, stats, signatures, log);
  // Another namespace's models are not this autoscaler's to size: its views hold none of their pods.
  const inScope = (model: string) => pools.poolOf(model) === o.pool;
  const elector = o.leaderElection
    ? new LeaderElector({ store: await kvLeaseStore(nats, o.prefix, "autoscaler"), me: id, durationMs: o.leaseMs ?? DEFAULT_AUTOSCALER_LEASE_MS, log, onChange: (l) => log.info({ leader: l }, l ? "autoscaler lease acquired: publishing" : "autoscaler lease lost: evaluating only") })
    : undefined;
  elector?.start();
  await Promise.all(followers.map((f) => f.start()));
  const ready = Promise.all(followers.map((f) => f.whenCaughtUp())).then(() => log.info({ id, policies: runners.size }, "autoscaler caught up"));

  const isLeader = () => (elector ? elector.isLeader() : true);
  const rounds = new Rounds({ id, clock, state, fleet, outcomes, serverClock, acks, drainEvents, runners, inScope, isLeader, stats, log, ...(o.apply ? { apply: o.apply } : {}), drain: o.drain !== false, allowWorkloads: new Set(o.allowWorkloads ?? []),
    publish: (name, rec) => nats.js.publish(subjects.autoscale(name), JSON.stringify(rec)).then(() => undefined) });
  const evaluate = () => rounds.evaluate();
  const timer = setInterval(() => {
    evaluate().catch((err: unknown) => log.error({ err }, "evaluation failed"));
  }, o.tickMs ?? DEFAULT_TICK_MS);
  timer.unref?.();

  return {
    id,
    nats,
    isLeader,
    policies: () => runners,
    evaluate,
    appliers: () => rounds.appliers,
    policyFigures: () => rounds.figures,
    stats,
    whenReady: () => ready.then(() => undefined),
    async close() {
      clearInterval(timer);
      flowSub.unsubscribe();
      await elector?.stop(true);
      policyWatch.stop();
      await Promise.all(followers.map((f) => f.stop()));
      await nats.nc.drain().catch(() => undefined);
    },
  };
}

type Follower = Pick<StreamFollower<never>, "start" | "whenCaughtUp" | "stop">;

interface FollowerDeps {
  nats: NatsHandles;
  subjects: Subjects;
  prefix: string;
  id: string;
  state: GatewayState;
  outcomes: OutcomeWindow;
  serverClock: ServerClock;
  acks: GatewayAcks;
  drainEvents: Map<string, { seq: number; deadline: number }>;
  log: Logger;
}

function createFollowers(d: FollowerDeps): Follower[] {
  const { nats, subjects, prefix, id, state, outcomes, log } = d;
  type Meta = { seq: number; subject: string; serverTs: number };
  const fold = (stream: "pods" | "load" | "charges" | "kv") => (ev: Parameters<GatewayState["apply"]>[0], m: Meta) => {
    if (stream === "charges" || stream === "pods") d.serverClock.observe(m.serverTs);
    if (ev.type === "heartbeat") d.acks.observe(ev);
    if (ev.type === "pod") {
      const k = `${ev.model}\u0000${ev.pod}`;
      if (ev.action === "upsert" && ev.draining) d.drainEvents.set(k, { seq: m.seq, deadline: ev.draining.deadline });
      else d.drainEvents.delete(k);
    }
    state.apply(ev, { stream, ...m });
  };
  return [
    new StreamFollower({ nats, subjects, log, name: `autoscaler-${id}-pods`, family: "pods", types: STREAM_EVENT_TYPES.PODS, stream: streamName(prefix, "PODS"), startAt: { kind: "last-per-subject" }, onEvent: fold("pods") }),
    new StreamFollower({ nats, subjects, log, name: `autoscaler-${id}-load`, family: "load", types: STREAM_EVENT_TYPES.LOAD, stream: streamName(prefix, "LOAD"), startAt: { kind: "last-per-subject" }, onEvent: fold("load") }),
    new StreamFollower({ nats, subjects, log, name: `autoscaler-${id}-charges`, family: "charges", types: STREAM_EVENT_TYPES.CHARGES, stream: streamName(prefix, "CHARGES"), startAt: { kind: "time", sinceMs: Date.now() - 90_000 }, onEvent: fold("charges") }),
    // The prefix index: which cached blocks only one pod holds (what a scale-down would lose).
    new StreamFollower({ nats, subjects, log, name: `autoscaler-${id}-kv`, family: "kv", types: STREAM_EVENT_TYPES.KV, stream: streamName(prefix, "KV"), startAt: { kind: "all" }, onEvent: fold("kv") }),
    new StreamFollower({
      nats, subjects, log, name: `autoscaler-${id}-decisions`, family: "decisions", types: STREAM_EVENT_TYPES.DECISIONS,
      stream: streamName(prefix, "DECISIONS"), startAt: { kind: "time", sinceMs: Date.now() - OUTCOME_HISTORY_MS },
      onEvent: (ev) => {
        // Routed requests that ran (not refusals, not the prefill leg of a P/D pair).
        if (ev.pick === null || ev.outcome === "rejected" || ev.pd?.leg === "prefill") return;
        outcomes.add(ev.model, {
          ts: ev.ts,
          ...(ev.ttftMs !== undefined ? { ttftMs: ev.ttftMs } : {}),
          ...(ev.tpotMs !== undefined ? { tpotMs: ev.tpotMs } : {}),
          ...(ev.promptTokens !== undefined ? { promptTokens: ev.promptTokens } : {}),
          ...(ev.completionTokens !== undefined ? { completionTokens: ev.completionTokens } : {}),
        });
      },
    }),
  ];
}

/**
 * Keeps `runners` in step with the bucket's `autoscale.*` entries; an invalid entry, or one whose
 * signature does not verify under the operator's keys, is logged and leaves the policy as it was.
 */
async function watchPolicies(nats: NatsHandles, prefix: string, runners: Map<string, PolicyRunner>, pools: PoolMap, stats: { invalidPolicies: number; refusedSignature: number }, signatures: RecordKeySets, log: Logger): Promise<{ stop(): void }> {
  const bucket = configBucketName(prefix);
  const kv: KV = await new Kvm(nats.js).open(bucket);
  const refusal = configEntryJudge(bucket, signatures, stats, log, "config entry refused: its signature does not verify under the operator's keys; ignored (the previous value, if any, stays)");
  const json = (e: KvEntry): unknown => {
    try {
      return e.json();
    } catch {
      return undefined;
    }
  };
  const applyPool = (e: KvEntry) => {
    const pool = e.key.slice(POOL_KEY_PREFIX.length);
    if (e.operation !== "PUT") {
      refusal.forget(e.key);
      return pools.set(pool, undefined);
    }
    if (refusal(e, json(e))) return;
    const r = readPoolConfig(() => e.json());
    // An invalid entry is the gateways' to report; here it assigns nothing.
    pools.set(pool, r.ok ? r.value.models : undefined);
  };
  const apply = (e: KvEntry) => {
    let name: string;
    try {
      name = decodeToken(e.key.slice(AUTOSCALE_KEY_PREFIX.length));
    } catch {
      return;
    }
    if (e.operation !== "PUT") {
      refusal.forget(e.key);
      if (runners.delete(name)) log.info({ policy: name }, "autoscaling policy removed");
      return;
    }
    const value = json(e);
    if (value !== undefined && refusal(e, value)) return;
    const err = value === undefined ? "not JSON" : autoscalePolicyError(value);
    if (err) {
      stats.invalidPolicies++;
      log.error({ policy: name.slice(0, 128), err }, "invalid autoscaling policy in the config bucket: ignored (the previous one, if any, stays)");
      return;
    }
    const prev = runners.get(name);
    const policy = resolvePolicy(value as AutoscalePolicy);
    if (prev && JSON.stringify(prev.policy) === JSON.stringify(policy)) return;
    runners.set(name, createRunner(name, policy));
    log.info({ policy: name, algorithm: policy.algorithm, model: policy.model }, prev ? "autoscaling policy changed" : "autoscaling policy loaded");
  };
  // One subject filter per watch on nats-server 2.9: policies and pool assignments apart.
  const watches = await Promise.all([kv.watch({ key: `${AUTOSCALE_KEY_PREFIX}>` }), kv.watch({ key: `${POOL_KEY_PREFIX}>` })]);
  // Each watch delivers every current value first, then updates.
  watches.forEach((w, i) => {
    void (async () => {
      for await (const e of w) (i === 0 ? apply : applyPool)(e);
    })().catch((err: unknown) => log.warn({ err }, "config watch of the autoscaler ended"));
  });
  await applyCurrent(kv, `${POOL_KEY_PREFIX}>`, applyPool);
  await applyCurrent(kv, `${AUTOSCALE_KEY_PREFIX}>`, apply);
  return {
    stop: () => {
      for (const w of watches) w.stop();
    },
  };
}

/** Applies the current entries directly, so the first evaluation round already has them. */
async function applyCurrent(kv: KV, filter: string, apply: (e: KvEntry) => void): Promise<void> {
  for await (const k of await kv.keys(filter)) {
    const e = await kv.get(k);
    if (e) apply(e);
  }
}
