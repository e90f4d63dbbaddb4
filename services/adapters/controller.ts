/**
 * `jetroute adapter-controller`: keeps every declared LoRA adapter loaded where the placement rule
 * (placement.ts) says, through the engines' runtime LoRA API (engine-client.ts), and publishes each
 * decision with its reasons on the ADAPTERS stream, whose last record per adapter is what every
 * gateway routes the adapter by (docs/adapters.md).
 *
 * Each round (`tickMs`), as the holder of the lease (`--leader-election`; the standby folds the
 * same streams): read what each vLLM pod has loaded (`/v1/models`), decide, publish the records
 * of the adapters that change — loads as `loading` and unloads as `unloading` first, so no gateway
 * routes to a pod before its load succeeded or while its unload runs — then make the engine calls,
 * at most one at a time per pod, each with a timeout, retried up to the adapter's `maxAttempts`
 * with back-off; a load that keeps failing ends in `failed` on that pod (not retried there until
 * `failureBackoffMs`), visible in the record and the ModelAdapter's Failed condition. Unloads wait
 * `unloadGraceMs` after their record so requests already routed there finish.
 *
 * A controller killed mid-placement loses nothing: its records say what it was doing; the next
 * leader reads them back, asks the engines what they hold, and carries on (a load found done
 * counts as loaded, one not done is placed again).
 */
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import type { AdapterMove, AdapterPlacement, AdapterSpec } from "../../schemas/adapters.js";
import { ADAPTER_DEFAULTS, loraPathOf } from "../../schemas/adapters.js";
import { streamName } from "../../streams/definitions.js";
import { STREAM_EVENT_TYPES } from "../../streams/event-types.js";
import { Subjects } from "../../streams/subjects.js";
import { checkSummary } from "../routing/mod.js";
import { StreamFollower } from "../shared/follower.js";
import { kvLeaseStore } from "../shared/kv-lease.js";
import { LeaderElector } from "../shared/leader.js";
import type { Logger } from "../shared/log.js";
import { connectNats, type NatsHandles, requireStream } from "../shared/nats.js";
import { GatewayState } from "../views/gateway-state.js";
import type { PodInfo } from "../views/pod-set.js";
import type { Declaration, DeclarationSource, KubeDeclarationSource } from "./declarations.js";
import { watchConfigDeclarations } from "./declarations.js";
import type { RecordKeySets } from "../../streams/record-keys.js";
import { DemandWindow } from "./demand.js";
import { type EngineCallResult, type EngineTarget, listAdapters, loadAdapter, unloadAdapter } from "./engine-client.js";
import { type Move, type PlacementAdapter, type PlacementPod, place, type SlotState } from "./placement.js";
import { modelAdapterStatus, phaseOf, type StatusInput, statusChanged } from "./status.js";

/** Largest flow summary read (as the gateways read them). */
const MAX_FLOW_SUMMARY_BYTES = 256 * 1024;

export const DEFAULT_ADAPTER_TICK_MS = 500;
export const DEFAULT_ADAPTER_LEASE_MS = 12_000;
export const DEFAULT_MAX_LORAS = 1;
export const DEFAULT_LOAD_TIMEOUT_MS = 60_000;
export const DEFAULT_UNLOAD_GRACE_MS = 1_000;
export const DEFAULT_FAILURE_BACKOFF_MS = 60_000;
/** Bound on remembered load failures (adapter x pod); the oldest is forgotten first. */
const MAX_FAILURES = 100_000;

export interface AdapterControllerOptions {
  nats: string | string[];
  prefix: string;
  configPrefix?: string;
  id?: string;
  tickMs?: number;
  leaderElection?: boolean;
  leaseMs?: number;
  /** A pod's `max_loras` until its engine's LoRA metric says (vLLM's `--max-loras`, default 1). */
  maxLoras?: number;
  loadTimeoutMs?: number;
  unloadGraceMs?: number;
  failureBackoffMs?: number;
  /** First retry delay of a failed engine call (doubled each attempt). */
  retryDelayMs?: number;
  /** `--kubernetes`: ModelAdapters as well as the config bucket's declarations. */
  kube?: KubeDeclarationSource;
  /** `Authorization: Bearer` on engine calls when the adapter names no `api-key`. */
  engineApiKey?: string;
  /**
   * Signed records (docs/security.md): with `operator` (`--config-public-key`), only config-bucket
   * declarations (`adapter.*`) the operator's keys signed are placed; absent = unchecked.
   */
  signatures?: RecordKeySets;
  log: Logger;
  clock?: () => number;
}

export interface AdapterControllerHandle {
  readonly id: string;
  readonly nats: NatsHandles;
  isLeader(): boolean;
  /** One round now (tests; the timer runs them): resolves once its records are published (engine calls go on). */
  tick(): Promise<void>;
  /** Resolves when no engine call is in flight. */
  idle(): Promise<void>;
  /** The last record of each adapter (published or read back). */
  records(): ReadonlyMap<string, AdapterPlacement>;
  /** `refusedSignature`: config-bucket declarations ignored because their signature did not verify under `signatures.operator`. */
  readonly stats: { rounds: number; published: number; loads: number; unloads: number; failedCalls: number; statusWrites: number; statusErrors: number; refusedSignature: number };
  whenReady(): Promise<void>;
  close(): Promise<void>;
}

const key = (a: string, pod: string) => `${a}\u0000${pod}`;

export async function startAdapterController(o: AdapterControllerOptions): Promise<AdapterControllerHandle> {
  const log = o.log;
  const clock = o.clock ?? Date.now;
  const id = o.id ?? `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
  const nats = await connectNats(o.nats, `jetroute-adapter-controller-${id}`);
  const subjects = new Subjects(o.prefix);
  const adaptersStream = streamName(o.prefix, "ADAPTERS");
  await requireStream(nats, adaptersStream);
  const state = new GatewayState({});
  const demand = new DemandWindow();
  const records = new Map<string, AdapterPlacement>();
  /** What the controller holds each pod to have loaded (managed and not), and what it is doing to it. */
  const slots = new Map<string, Map<string, SlotState>>();
  /** Pods with an engine call in flight, and when each pod's last call ended (a listing started before is stale). */
  const busy = new Set<string>();
  const lastCallEnd = new Map<string, number>();
  const failures = new Map<string, { attempts: number; until: number; error: string }>();
  const statuses = new Map<string, Record<string, unknown>>();
  const inflight = new Set<Promise<void>>();
  const stats = { rounds: 0, published: 0, loads: 0, unloads: 0, failedCalls: 0, statusWrites: 0, statusErrors: 0, refusedSignature: 0 };
  const settings = {
    maxLoras: o.maxLoras ?? DEFAULT_MAX_LORAS,
    loadTimeoutMs: o.loadTimeoutMs ?? DEFAULT_LOAD_TIMEOUT_MS,
    unloadGraceMs: o.unloadGraceMs ?? DEFAULT_UNLOAD_GRACE_MS,
    failureBackoffMs: o.failureBackoffMs ?? DEFAULT_FAILURE_BACKOFF_MS,
    retryDelayMs: o.retryDelayMs ?? 200,
  };

  const followers = [
    new StreamFollower({ nats, subjects, log, name: `adapters-${id}-pods`, family: "pods", types: STREAM_EVENT_TYPES.PODS, stream: streamName(o.prefix, "PODS"), startAt: { kind: "last-per-subject" }, onEvent: (ev, m) => void state.apply(ev, { stream: "pods", ...m }) }),
    new StreamFollower({ nats, subjects, log, name: `adapters-${id}-load`, family: "load", types: STREAM_EVENT_TYPES.LOAD, stream: streamName(o.prefix, "LOAD"), startAt: { kind: "last-per-subject" }, onEvent: (ev, m) => void state.apply(ev, { stream: "load", ...m }) }),
    new StreamFollower({
      nats, subjects, log, name: `adapters-${id}-decisions`, family: "decisions", types: STREAM_EVENT_TYPES.DECISIONS,
      stream: streamName(o.prefix, "DECISIONS"), startAt: { kind: "time", sinceMs: clock() - demand.windowMs },
      onEvent: (ev) => {
        if (ev.pick === null || ev.outcome === "rejected") return;
        if (declared().has(ev.model)) demand.add(ev.model, ev.ts);
      },
    }),
    // Placements: read back at start (what the previous leader was doing), and the leader's while standing by.
    new StreamFollower({
      nats, subjects, log, name: `adapters-${id}-placements`, family: "adapters", types: STREAM_EVENT_TYPES.ADAPTERS, stream: adaptersStream, startAt: { kind: "last-per-subject" },
      onEvent: (ev) => {
        if (ev.controller === id) return;
        if (ev.deleted) records.delete(ev.adapter);
        else records.set(ev.adapter, ev);
        for (const p of ev.pods) slotsOf(p.pod).set(ev.adapter, p.state);
      },
    }),
  ];
  const flowSub = nats.nc.subscribe(subjects.all("flow"), {
    callback: (err, m) => {
      if (err) return;
      try {
        // The gateways' own trust check (services/routing/flow/fleet.ts): a forged summary cannot
        // speak for another gateway, claim unbounded demand or hide a real one behind a future ts.
        if (m.data.length > MAX_FLOW_SUMMARY_BYTES) return;
        const r = checkSummary(subjects.parse(m.subject)?.names[0], m.json(), clock());
        if (r.parsed) demand.applySummary(r.parsed.summary.gateway, r.parsed.summary.models, clock());
      } catch {
        // not JSON: the gateways' readers count those
      }
    },
  });
  const configDecls: DeclarationSource = await watchConfigDeclarations(nats, o.configPrefix ?? o.prefix, log, o.signatures ?? {}, stats);
  const sources: DeclarationSource[] = [configDecls, ...(o.kube ? [o.kube] : [])];
  /** Valid declarations by adapter name; the config bucket's win over a ModelAdapter of the same name. */
  function declared(): Map<string, Declaration> {
    const out = new Map<string, Declaration>();
    for (const s of [...sources].reverse()) for (const d of s.current().values()) if (d.spec) out.set(d.name, d);
    return out;
  }
  function slotsOf(pod: string): Map<string, SlotState> {
    let s = slots.get(pod);
    if (!s) slots.set(pod, (s = new Map()));
    return s;
  }

  const elector = o.leaderElection
    ? new LeaderElector({ store: await kvLeaseStore(nats, o.prefix, "adapter-controller"), me: id, durationMs: o.leaseMs ?? DEFAULT_ADAPTER_LEASE_MS, log, onChange: (l) => log.info({ leader: l }, l ? "adapter-controller lease acquired: placing" : "adapter-controller lease lost: standing by") })
    : undefined;
  elector?.start();
  await Promise.all(followers.map((f) => f.start()));
  const ready = Promise.all(followers.map((f) => f.whenCaughtUp())).then(() => log.info({ id, adapters: declared().size }, "adapter-controller caught up"));
  const isLeader = () => (elector ? elector.isLeader() : true);

  const routable = (p: PodInfo) => p.ready && p.draining === undefined && state.pods.vouched(p);
  const targetOf = (p: PodInfo, spec: AdapterSpec | undefined): EngineTarget => {
    const apiKey = spec?.additionalConfig?.["api-key"] ?? o.engineApiKey;
    return { address: p.address, engine: p.engine, ...(apiKey ? { apiKey } : {}) };
  };

  /** Asks every vLLM pod of a managed base model what it holds; pods with a call in flight keep the controller's view. */
  async function refresh(bases: ReadonlySet<string>): Promise<void> {
    const pods = state.pods.all().filter((p) => routable(p) && bases.has(p.model));
    await Promise.all(
      pods.map(async (p) => {
        const started = clock();
        const list = await listAdapters(targetOf(p, undefined), p.model, 2_000);
        if (list === undefined || busy.has(p.pod) || (lastCallEnd.get(p.pod) ?? 0) >= started) return;
        const s = slotsOf(p.pod);
        for (const a of [...s.keys()]) if (!list.includes(a)) s.delete(a);
        for (const a of list) s.set(a, "loaded");
      }),
    );
    // Pods gone from PODS hold nothing any more.
    const known = new Set(state.pods.all().map((p) => p.pod));
    for (const pod of [...slots.keys()]) if (!known.has(pod) && !busy.has(pod)) slots.delete(pod);
  }

  function failed(adapter: string, now: number): Array<{ pod: string; error: string; attempts: number }> {
    const out: Array<{ pod: string; error: string; attempts: number }> = [];
    for (const [k, f] of failures) {
      const [a, pod] = k.split("\u0000") as [string, string];
      if (a === adapter && f.until > now) out.push({ pod, error: f.error, attempts: f.attempts });
    }
    return out;
  }

  function publish(adapter: string, r: Omit<AdapterPlacement, "type" | "adapter" | "controller" | "ts">): Promise<void> {
    const rec: AdapterPlacement = { type: "adapter", adapter, controller: id, ts: clock(), ...r };
    if (rec.deleted) records.delete(adapter);
    else records.set(adapter, rec);
    stats.published++;
    return nats.js.publish(subjects.adapter(adapter), JSON.stringify(rec)).then(
      () => undefined,
      (err: unknown) => log.warn({ err: (err as Error).message, adapter }, "placement record not published"),
    );
  }

  /** The record of an adapter as the controller's slots have it now, with `moves`. */
  function recordOf(adapter: string, base: string | undefined, desired: number, candidates: string[], moves: AdapterMove[], reason: string, deleted: boolean, now: number): Omit<AdapterPlacement, "type" | "adapter" | "controller" | "ts"> {
    const pods: AdapterPlacement["pods"] = [];
    for (const [pod, s] of slots) {
      const st = s.get(adapter);
      if (st) pods.push({ pod, state: st });
    }
    pods.sort((a, b) => (a.pod < b.pod ? -1 : 1));
    const f = failed(adapter, now);
    const input: StatusInput = { loaded: pods.filter((p) => p.state === "loaded").map((p) => p.pod), loading: pods.filter((p) => p.state === "loading").map((p) => p.pod), candidates, desired, failed: f, deleted };
    return {
      ...(base !== undefined ? { baseModel: base } : {}),
      ...(deleted && pods.length === 0 ? { deleted: true } : {}),
      phase: phaseOf(input),
      pods,
      desired,
      candidates: candidates.length,
      demand: { rps: Math.round(demand.rps(adapter, now) * 1000) / 1000, queued: demand.queued(adapter, now) },
      moves,
      ...(f.length > 0 ? { failed: f.slice(0, 256) } : {}),
      reason: reason.slice(0, 512),
    };
  }

  const same = (a: AdapterPlacement | undefined, b: Omit<AdapterPlacement, "type" | "adapter" | "controller" | "ts">) =>
    a !== undefined && a.phase === b.phase && a.desired === b.desired && a.candidates === b.candidates && a.baseModel === b.baseModel && JSON.stringify(a.pods) === JSON.stringify(b.pods) && JSON.stringify(a.failed ?? []) === JSON.stringify(b.failed ?? []) && b.moves.length === 0 && !b.deleted;

  /** Runs one engine call with retries; resolves with the last answer and the attempts made. */
  async function withRetries(call: () => Promise<EngineCallResult>, attempts: number): Promise<{ r: EngineCallResult; attempts: number; ms: number }> {
    const t0 = clock();
    let r: EngineCallResult = { ok: false, status: 0, message: "not tried" };
    for (let i = 1; i <= attempts; i++) {
      r = await call();
      if (r.ok) return { r, attempts: i, ms: clock() - t0 };
      stats.failedCalls++;
      if (i < attempts) await new Promise((res) => setTimeout(res, settings.retryDelayMs * 2 ** (i - 1)));
    }
    return { r, attempts, ms: clock() - t0 };
  }

  /** Carries out one move (the record saying `loading` / `unloading` is already published). */
  function execute(m: Move, p: PodInfo, spec: AdapterSpec | undefined, finish: (m: Move, outcome: AdapterMove) => Promise<void>): void {
    busy.add(p.pod);
    const target = targetOf(p, spec);
    const attempts = spec?.maxAttempts ?? ADAPTER_DEFAULTS.maxAttempts;
    const job = (async () => {
      if (m.action === "unload") {
        await new Promise((res) => setTimeout(res, settings.unloadGraceMs));
        const { r, attempts: n, ms } = await withRetries(() => unloadAdapter(target, m.adapter, { timeoutMs: settings.loadTimeoutMs }), attempts);
        if (r.ok) {
          stats.unloads++;
          slotsOf(p.pod).delete(m.adapter);
        } else slotsOf(p.pod).set(m.adapter, "loaded");
        await finish(m, { action: "unload", pod: p.pod, reason: m.reason, outcome: r.ok ? "ok" : "failed", attempt: n, ms, ...(r.ok ? {} : { error: r.message }) });
        return;
      }
      const path = loraPathOf(spec?.artifactURL ?? "");
      const { r, attempts: n, ms } = await withRetries(() => loadAdapter(target, m.adapter, path, { ...(spec?.pinned ? { pinned: true } : {}), timeoutMs: settings.loadTimeoutMs }), attempts);
      if (r.ok) {
        stats.loads++;
        failures.delete(key(m.adapter, p.pod));
        slotsOf(p.pod).set(m.adapter, "loaded");
      } else {
        slotsOf(p.pod).delete(m.adapter);
        if (failures.size >= MAX_FAILURES) failures.delete(failures.keys().next().value as string);
        failures.set(key(m.adapter, p.pod), { attempts: n, until: clock() + settings.failureBackoffMs, error: `${r.status || "no answer"}: ${r.message}` });
        log.warn({ adapter: m.adapter, pod: p.pod, attempts: n, err: r.message }, "adapter load failed");
      }
      await finish(m, { action: "load", pod: p.pod, reason: m.reason, outcome: r.ok ? "ok" : "failed", attempt: n, ms, ...(r.ok ? {} : { error: `${r.status || "no answer"}: ${r.message}` }) });
    })()
      .catch((err: unknown) => log.error({ err, adapter: m.adapter, pod: p.pod }, "adapter move failed"))
      .finally(() => {
        busy.delete(p.pod);
        lastCallEnd.set(p.pod, clock());
        inflight.delete(job);
      });
    inflight.add(job);
  }

  let ticking: Promise<void> | undefined;
  let closed = false;
  async function round(): Promise<void> {
    if (!isLeader()) return;
    stats.rounds++;
    const now = clock();
    const decls = declared();
    const synced = sources.every((s) => s.synced);
    demand.retain((a) => decls.has(a));
    const bases = new Set<string>();
    const podsAll = state.pods.all();
    for (const d of decls.values()) {
      if (d.spec?.baseModel) bases.add(d.spec.baseModel);
      else for (const p of podsAll) if (routable(p)) bases.add(p.model);
    }
    await refresh(bases);
    // Adapters still loaded somewhere (or with a record) but no longer declared: deleted.
    const gone = new Set<string>();
    if (synced) {
      for (const a of records.keys()) if (!decls.has(a)) gone.add(a);
      for (const s of slots.values()) for (const a of s.keys()) if (records.has(a) && !decls.has(a)) gone.add(a);
    }
    const adapters: PlacementAdapter[] = [];
    for (const d of decls.values()) {
      const spec = d.spec as AdapterSpec;
      const blocked = new Set(failed(d.name, now).map((f) => f.pod));
      adapters.push({ name: d.name, spec, demand: { rps: demand.rps(d.name, now), queued: demand.queued(d.name, now) }, ...(blocked.size > 0 ? { blocked } : {}) });
    }
    for (const a of gone) adapters.push({ name: a, spec: { artifactURL: "/", ...(records.get(a)?.baseModel ? { baseModel: records.get(a)?.baseModel } : {}) }, demand: { rps: 0, queued: 0 }, deleted: true });
    const pods: PlacementPod[] = [];
    for (const p of podsAll) {
      if (p.role !== "combined") continue;
      const loadF = state.load.fresh(p.model, p.pod, now);
      pods.push({
        pod: p.pod, model: p.model, labels: p.labels, ready: routable(p),
        maxLoras: loadF?.maxLora ?? settings.maxLoras,
        load: (loadF?.running ?? 0) + (loadF?.waiting ?? 0),
        adapters: new Map(slots.get(p.pod) ?? []), busy: busy.has(p.pod),
      });
    }
    const { moves, plans } = place({ pods, adapters });
    // Record first (loading / unloading: not routable), then call the engines.
    for (const m of moves) slotsOf(m.pod).set(m.adapter, m.action === "load" ? "loading" : "unloading");
    const byAdapter = new Map<string, Move[]>();
    for (const m of moves) byAdapter.set(m.adapter, [...(byAdapter.get(m.adapter) ?? []), m]);
    const publishes: Array<Promise<void>> = [];
    const specOf = (a: string) => decls.get(a)?.spec;
    const candidatesOf = (a: PlacementAdapter) => [...(plans.get(a.name)?.candidatePods ?? [])];
    const planFor = new Map(adapters.map((a) => [a.name, a]));
    const finish = async (m: Move, outcome: AdapterMove) => {
      const a = planFor.get(m.adapter);
      const plan = plans.get(m.adapter);
      const rec = recordOf(m.adapter, plan?.base, plan?.desired ?? 0, a ? candidatesOf(a) : [], [outcome], `${m.action} on ${m.pod}: ${outcome.outcome}`, a?.deleted === true || !declared().has(m.adapter), clock());
      await publish(m.adapter, rec);
      await writeStatus(m.adapter, rec, a ? candidatesOf(a) : []);
    };
    for (const a of adapters) {
      const plan = plans.get(a.name);
      const ms = byAdapter.get(a.name) ?? [];
      const rec = recordOf(a.name, plan?.base, plan?.desired ?? 0, candidatesOf(a), ms.map((m) => ({ action: m.action, pod: m.pod, reason: m.reason })), plan?.reason ?? "", a.deleted === true, now);
      if (same(records.get(a.name), rec)) continue;
      if (!a.deleted && plan?.reason.startsWith("refused:")) log.warn({ adapter: a.name.slice(0, 128) }, plan.reason);
      publishes.push(publish(a.name, rec).then(() => writeStatus(a.name, rec, candidatesOf(a))));
    }
    await Promise.all(publishes);
    // Closed meanwhile: the records say what was decided; the next leader carries it out.
    if (closed) return;
    const podBy = new Map(podsAll.map((p) => [p.pod, p]));
    for (const m of moves) {
      const p = podBy.get(m.pod);
      if (p) execute(m, p, specOf(m.adapter), finish);
    }
    await writeInvalidStatuses();
  }

  async function writeStatus(adapter: string, rec: Omit<AdapterPlacement, "type" | "adapter" | "controller" | "ts">, candidates: string[]): Promise<void> {
    const d = o.kube?.current().get(adapter);
    if (!o.kube || !d?.ref || rec.deleted || rec.phase === "Deleted") return;
    const loaded = rec.pods.filter((p) => p.state === "loaded").map((p) => p.pod);
    const loading = rec.pods.filter((p) => p.state === "loading").map((p) => p.pod);
    const prevKey = `${d.ref.namespace}/${d.ref.name}`;
    const status = modelAdapterStatus({ loaded, loading, candidates, desired: rec.desired, failed: rec.failed ?? [] }, statuses.get(prevKey), new Date(clock()).toISOString());
    if (!statusChanged(statuses.get(prevKey), status)) return;
    try {
      await o.kube.writeStatus(d.ref, status);
      statuses.set(prevKey, status);
      stats.statusWrites++;
    } catch (err) {
      stats.statusErrors++;
      log.warn({ err: (err as Error).message, adapter }, "ModelAdapter status not written");
    }
  }

  async function writeInvalidStatuses(): Promise<void> {
    if (!o.kube) return;
    for (const d of o.kube.current().values()) {
      if (!d.error || !d.ref) continue;
      const k = `${d.ref.namespace}/${d.ref.name}`;
      const status = modelAdapterStatus({ loaded: [], loading: [], candidates: [], desired: 0, failed: [], invalid: d.error }, statuses.get(k), new Date(clock()).toISOString());
      if (!statusChanged(statuses.get(k), status)) continue;
      try {
        await o.kube.writeStatus(d.ref, status);
        statuses.set(k, status);
        stats.statusWrites++;
      } catch (err) {
        stats.statusErrors++;
        log.warn({ err: (err as Error).message, adapter: d.name }, "ModelAdapter status not written");
      }
    }
  }

  const tick = async () => {
    if (ticking) return ticking;
    ticking = round().finally(() => {
      ticking = undefined;
    });
    return ticking;
  };
  void ready.then(() => {
    const loop = async () => {
      while (!closed) {
        await tick().catch((err: unknown) => log.error({ err }, "adapter placement round failed"));
        await new Promise((r) => setTimeout(r, o.tickMs ?? DEFAULT_ADAPTER_TICK_MS).unref?.());
      }
    };
    void loop();
  });

  return {
    id,
    nats,
    isLeader,
    tick,
    async idle() {
      while (inflight.size > 0 || ticking) await Promise.all([...inflight, ticking]);
    },
    records: () => records,
    stats,
    whenReady: () => ready.then(() => undefined),
    async close() {
      closed = true;
      await ticking?.catch(() => undefined);
      flowSub.unsubscribe();
      await elector?.stop(true);
      for (const s of sources) s.stop();
      await Promise.allSettled([...inflight]);
      await Promise.all(followers.map((f) => f.stop()));
      await nats.nc.drain().catch(() => undefined);
    },
  };
}
