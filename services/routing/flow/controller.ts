/**
 * Flow control's decisions for one gateway replica: whether a request goes now or is held, which
 * held request goes next when a pod has room, and which ones expire or are shed. Pure apart from
 * the callbacks it is handed: the shell drives `pump` (on a short timer while anything is held,
 * and whenever a charge is released) and publishes `summary()` for the other replicas.
 *
 * One queue per model (services/routing/flow/queue.ts): bands by priority, fairness between flows
 * inside a band, FCFS or EDF inside a flow. Fleet-wide order: a band is not dispatched while
 * another replica's summary shows an older request of a higher band of the same model held for
 * longer than the bound (services/routing/flow/fleet.ts).
 *
 * A held request's `dispatch` runs synchronously inside `pump`, right after the room check, so
 * the charge it makes is in the ledger before the next room check.
 */
import type { ModelConfig } from "../../../schemas/config.js";
import type { ChargeLedger } from "../../views/charge-ledger.js";
import type { LoadReader } from "../../views/load-view.js";
import type { ConfigReader } from "../../views/model-config.js";
import type { PodInfo, PodSetReader } from "../../views/pod-set.js";
import type { UsageReader } from "../../views/usage-view.js";
import { RouteError } from "../errors.js";
import type { FleetQueues } from "./fleet.js";
import { FlowQueue, type HeldRequest } from "./queue.js";
import { SaturationDetector } from "./saturation.js";
import { type FlowClass, type FlowSettings, flowSettingsOf, userOfFlow } from "./settings.js";

export type FlowOutcome = "dispatched" | "expired" | "dropped" | "cancelled";

export interface FlowHooks {
  /** A held request left the queue. */
  outcome?(band: number, outcome: FlowOutcome, waitMs: number): void;
  /** This replica held a band back because another replica holds an older, higher band. */
  yielded?(band: number): void;
}

/** A held request: what to run when it goes, and how to answer it when it does not. */
export interface Held {
  readonly model: string;
  readonly cls: FlowClass;
  /**
   * Runs the request's scheduling and charge (synchronously: the ledger sees it before the next
   * room check), among `subset` (the addresses of the pods with room) when some pods are full.
   */
  dispatch(waitMs: number, subset: string[] | undefined): void;
  /** Answers the request with an error (expired, shed, shutting down). */
  fail(err: RouteError): void;
}

export interface FlowViews {
  readonly pods: PodSetReader;
  readonly load: LoadReader;
  readonly ledger: Pick<ChargeLedger, "outstanding">;
  readonly usage: UsageReader;
}

/** This replica's bounds over every model's held requests (`--flow-max-held-bytes`, `--flow-max-held`). */
export interface FlowLimits {
  /** Bytes held across models, as counted by held-bytes.ts (what held requests retain). */
  maxHeldBytes?: number;
  /** Requests held across models. */
  maxHeldRequests?: number;
}

/** The replica's defaults: sized to the deployed heap (docs/flow-control.md "Memory"). */
export const FLOW_LIMIT_DEFAULTS = { maxHeldBytes: 384 * 1024 * 1024, maxHeldRequests: 10_000 } as const;

export interface FlowControllerOptions {
  views: FlowViews;
  /** Default FLOW_LIMIT_DEFAULTS. */
  limits?: FlowLimits;
  config: ConfigReader | undefined;
  fleet: FleetQueues | undefined;
  now: () => number;
  hooks?: FlowHooks;
}

/** `/debug/explain`'s flow-control section. */
export interface FlowExplanation {
  band: number;
  objective?: string;
  wouldWait: boolean;
  /** Why it would wait: pods saturated, requests of its band or higher held here, another replica's older higher band, no pod (waiting room). */
  why: "saturated" | "held-ahead" | "fleet-order" | "no-ready-pod" | null;
  /** Requests held here that would go before it. */
  ahead: number;
  blocker?: { gateway: string; band: number; oldest: number };
  held: number;
  pods: Array<{ pod: string; utilization: number | null; full: boolean; reason?: string }>;
}

export interface OfferResult {
  /** The request goes now (flow control off for the model, or room and nothing ahead of it). */
  readonly now: boolean;
  /** When it was held: its queue id (to `cancel`). */
  readonly id?: number;
  /** When it goes now and some pods are full: the addresses of those with room (schedule among these). */
  readonly subset?: string[];
}

export class FlowController {
  private readonly queues = new Map<string, FlowQueue<Held>>();
  private readonly settingsCache = new WeakMap<ModelConfig, FlowSettings | undefined>();
  /** The base model of each requested name seen with pods (an adapter's config is its base model's), kept while it has a queue. */
  private readonly bases = new Map<string, string>();
  readonly detector: SaturationDetector;

  constructor(private readonly opts: FlowControllerOptions) {
    this.detector = new SaturationDetector({ ledger: opts.views.ledger, load: opts.views.load });
  }

  /** The other replicas' queue summaries (absent: this replica orders only its own queue). */
  get fleet(): FleetQueues | undefined {
    return this.opts.fleet;
  }

  /** The model's flow-control settings (undefined: off). Cached per config object. */
  settingsFor(model: string): FlowSettings | undefined {
    const c = this.opts.config?.get(this.baseModel(model));
    if (!c) return undefined;
    if (!this.settingsCache.has(c)) this.settingsCache.set(c, flowSettingsOf(c.flowControl));
    return this.settingsCache.get(c);
  }

  /** Configs are keyed by the base model; an adapter's requests go by its pods' model (remembered while its requests are held, should its pods go). */
  private baseModel(model: string): string {
    const base = this.opts.views.pods.readyPods(model)[0]?.model;
    if (base !== undefined) {
      if (this.queues.has(model)) this.bases.set(model, base);
      return base;
    }
    // A managed LoRA adapter with no replica yet (docs/adapters.md): its base model's settings, so
    // its requests wait in the waiting room while the adapter controller loads it.
    return this.bases.get(model) ?? this.opts.views.pods.baseOf?.(model) ?? model;
  }

  /** Requests held, all models. */
  get held(): number {
    let n = 0;
    for (const q of this.queues.values()) n += q.size;
    return n;
  }

  /** Bytes held, all models, as counted (held-bytes.ts). */
  get heldBytes(): number {
    let n = 0;
    for (const q of this.queues.values()) n += q.bytes;
    return n;
  }

  /** Held per model and band (metrics, debug state). */
  queueSummaries(): ReadonlyMap<string, FlowQueue<Held>> {
    return this.queues;
  }

  /**
   * Either the request goes now (`{now: true}`: the caller routes it as usual) or it is held and
   * `held.dispatch` / `held.fail` is called later. `bytes`: what it retains while held
   * (held-bytes.ts `heldBytesOf`), counted against the band, user and replica byte bounds.
   */
  offer(held: Held, bytes: number, s: FlowSettings): OfferResult {
    const now = this.opts.now();
    const { model, cls } = held;
    const pods = this.opts.views.pods.readyPods(model);
    const q = this.queues.get(model);
    if (pods.length === 0) {
      // The waiting room: hold for a pod to appear, when configured; else today's 503.
      if (s.waitingRoomTtlMs <= 0) return { now: true };
      const expiresAt = Math.min(cls.expiresAt, now + s.waitingRoomTtlMs);
      return this.hold({ ...held, cls: { ...cls, expiresAt } }, bytes, s);
    }
    const ahead = q?.summary().some((b) => b.band >= cls.band && b.count > 0) === true;
    if (!ahead && !this.blocked(model, cls.band, now)) {
      const roomy = this.withRoom(pods, s, now, cls.band);
      if (roomy.length > 0) return { now: true, ...subsetOf(roomy, pods) };
    }
    return this.hold(held, bytes, s);
  }

  private blocked(model: string, band: number, now: number): boolean {
    const b = this.opts.fleet?.blocker(model, band, now);
    if (b) this.opts.hooks?.yielded?.(band);
    return b !== undefined;
  }

  /**
   * The model's queue, its options set from the settings; its total bounds are what the replica's
   * bounds leave after the other models' held requests (so the queue's own drop rule applies: a
   * sheddable band of this model may make room, never another model's requests).
   */
  private queueFor(model: string, s: FlowSettings): FlowQueue<Held> {
    const lim = this.opts.limits ?? {};
    const maxBytes = lim.maxHeldBytes ?? FLOW_LIMIT_DEFAULTS.maxHeldBytes;
    const maxRequests = lim.maxHeldRequests ?? FLOW_LIMIT_DEFAULTS.maxHeldRequests;
    let otherBytes = 0;
    let otherRequests = 0;
    for (const [m, other] of this.queues) {
      if (m === model) continue;
      otherBytes += other.bytes;
      otherRequests += other.size;
    }
    const opts = {
      fairness: s.fairness,
      order: s.order,
      maxRequestsPerBand: s.maxRequestsPerBand,
      maxBytesPerBand: s.maxBytesPerBand,
      maxRequestsPerUser: s.maxRequestsPerUser,
      maxBytesPerUser: s.maxBytesPerUser,
      maxTotalBytes: Math.max(0, maxBytes - otherBytes),
      maxTotalRequests: Math.max(0, maxRequests - otherRequests),
    };
    let q = this.queues.get(model);
    if (!q) {
      q = new FlowQueue<Held>(opts);
      this.queues.set(model, q);
    } else {
      q.setOptions(opts);
    }
    return q;
  }

  private hold(held: Held, bytes: number, s: FlowSettings): OfferResult {
    const { cls } = held;
    const q = this.queueFor(held.model, s);
    this.baseModel(held.model);
    const r = q.enqueue({ band: cls.band, flow: cls.flow, enqueuedAt: cls.enqueuedAt, expiresAt: cls.expiresAt, deadline: cls.deadline, bytes, value: held });
    if (!r.ok) {
      this.dropIfEmpty(held.model);
      if (r.reason === "user-full") throw userFull(held.model, cls.band);
      const o = q.options;
      throw q.size + 1 > (o.maxTotalRequests ?? Number.POSITIVE_INFINITY) || q.bytes + bytes > (o.maxTotalBytes ?? Number.POSITIVE_INFINITY) ? replicaFull(held.model) : queueFull(held.model, cls.band);
    }
    const now = this.opts.now();
    for (const d of r.dropped) this.leave(d, "dropped", now, queueFull(d.value.model, d.band));
    return { now: false, id: r.held.id };
  }

  /**
   * What `offer` would do with a request of class `cls` now, charging and holding nothing
   * (`/debug/explain`): whether it would wait, why, and how many held requests would go before it.
   */
  explain(model: string, cls: FlowClass, s: FlowSettings): FlowExplanation {
    const now = this.opts.now();
    const pods = this.opts.views.pods.readyPods(model);
    const q = this.queues.get(model);
    const ahead = q ? q.summary().reduce((n, b) => n + (b.band >= cls.band ? b.count : 0), 0) : 0;
    const blocker = this.opts.fleet?.blocker(model, cls.band, now);
    const rooms = pods.map((p) => ({ pod: p.pod, ...this.detector.podRoom(p, s.saturation, now, cls.band) }));
    const room = rooms.some((r) => !r.full);
    const why: FlowExplanation["why"] =
      pods.length === 0 ? (s.waitingRoomTtlMs > 0 ? "no-ready-pod" : null) : ahead > 0 ? "held-ahead" : blocker ? "fleet-order" : room ? null : "saturated";
    return {
      band: cls.band,
      ...(cls.objective !== undefined ? { objective: cls.objective } : {}),
      wouldWait: why !== null,
      why,
      ahead,
      ...(blocker ? { blocker } : {}),
      held: this.queues.get(model)?.size ?? 0,
      pods: rooms.map((r) => ({ pod: r.pod, utilization: Number.isNaN(r.utilization) ? null : Math.round(r.utilization * 1000) / 1000, full: r.full, ...(r.reason ? { reason: r.reason } : {}) })),
    };
  }

  /** The client left: its held request goes, answered by nobody. */
  cancel(model: string, id: number): boolean {
    const d = this.queues.get(model)?.remove(id);
    if (!d) return false;
    this.opts.hooks?.outcome?.(d.band, "cancelled", this.opts.now() - d.enqueuedAt);
    this.dropIfEmpty(model);
    return true;
  }

  private leave(d: HeldRequest<Held>, outcome: FlowOutcome, now: number, err: RouteError): void {
    this.opts.hooks?.outcome?.(d.band, outcome, now - d.enqueuedAt);
    d.value.fail(err);
  }

  private dropIfEmpty(model: string): void {
    if (this.queues.get(model)?.size !== 0) return;
    this.queues.delete(model);
    this.bases.delete(model);
  }

  /** Forgets saturation baselines of pods that are gone (the shell calls it every few seconds). */
  sweep(): void {
    const pods = this.opts.views.pods;
    this.detector.retain((model, pod) => pods.get(model, pod) !== undefined);
  }

  /**
   * The addresses of the model's pods with room, when some of its pods are full (undefined when
   * all have room): a request that goes now or is dispatched is scheduled among these only, so a
   * strategy that prefers a busy pod cannot pour held requests into it.
   */
  roomy(model: string, s: FlowSettings, band?: number): string[] | undefined {
    const pods = this.opts.views.pods.readyPods(model);
    return subsetOf(this.withRoom(pods, s, this.opts.now(), band), pods).subset;
  }

  /** The pods with room for a request of `band` (saturation.ts `queueDepthFor`; undefined: the base limit). */
  private withRoom(pods: readonly PodInfo[], s: FlowSettings, now: number, band?: number): PodInfo[] {
    return pods.filter((p) => !this.detector.podRoom(p, s.saturation, now, band).full);
  }

  /**
   * Expires what is due, then dispatches while pods have room: at most one request per pod with
   * room per call (each release calls it again), highest band first. Returns how many went.
   */
  pump(): number {
    const now = this.opts.now();
    let sent = 0;
    for (const [model, q] of [...this.queues]) {
      const pods = this.opts.views.pods.readyPods(model);
      for (const d of q.expire(now)) {
        const err = pods.length > 0 ? queueTimeout(model, d) : new RouteError("noReadyPod", `no ready pod for model \`${model}\` within the waiting room's ${Math.round(now - d.enqueuedAt)} ms`);
        this.leave(d, "expired", now, err);
      }
      const s = this.settingsFor(model);
      if (!s) {
        // Flow control was turned off for the model: what it held goes now.
        sent += this.flush(model, q, now);
        continue;
      }
      if (pods.length === 0 && s.waitingRoomTtlMs <= 0) {
        // Every pod went and there is no waiting room: 503 now, as for a request arriving now.
        this.failAll(model, q, now, new RouteError("noReadyPod", `no ready pod for model \`${model}\``));
        continue;
      }
      // One dispatch per pod with room for the highest band held, per call. A pod's room grows with
      // the band (per-band admission): the band chosen next decides which pods have room for it,
      // and when it has none no lower band has either (its limit is no higher).
      let budget = this.withRoom(pods, s, now, topBand(q)).length;
      while (budget > 0 && q.size > 0) {
        // No room even for the highest band held: nothing goes (and no band counts as yielded).
        if (this.withRoom(pods, s, now, topBand(q)).length === 0) break;
        const next = q.peek(
          (flow) => this.opts.views.usage.tokens(userOfFlow(flow), now),
          (band) => !this.blocked(model, band, now),
        );
        if (!next) break;
        const roomy = this.withRoom(pods, s, now, next.band);
        if (roomy.length === 0) break;
        q.take(next.id);
        budget--;
        sent++;
        this.go(next, now, subsetOf(roomy, pods).subset);
      }
      this.dropIfEmpty(model);
    }
    return sent;
  }

  private go(d: HeldRequest<Held>, now: number, subset: string[] | undefined): void {
    const waitMs = now - d.enqueuedAt;
    this.opts.hooks?.outcome?.(d.band, "dispatched", waitMs);
    d.value.dispatch(waitMs, subset);
  }

  private flush(model: string, q: FlowQueue<Held>, now: number): number {
    let n = 0;
    for (let d = q.peek(() => 0); d; d = q.peek(() => 0)) {
      q.take(d.id);
      this.go(d, now, undefined);
      n++;
    }
    this.dropIfEmpty(model);
    return n;
  }

  private failAll(model: string, q: FlowQueue<Held>, now: number, err: RouteError): number {
    let n = 0;
    for (let d = q.peek(() => 0); d; d = q.peek(() => 0)) {
      q.take(d.id);
      this.leave(d, "dropped", now, err);
      n++;
    }
    this.dropIfEmpty(model);
    return n;
  }

  /** Shutdown: every held request is answered with `err` (503). */
  drain(err: RouteError): number {
    const now = this.opts.now();
    let n = 0;
    for (const [model, q] of [...this.queues]) n += this.failAll(model, q, now, err);
    return n;
  }
}

/** The highest band with a request held (undefined when none is). */
function topBand(q: FlowQueue<Held>): number | undefined {
  let top: number | undefined;
  for (const b of q.summary()) if (b.count > 0 && (top === undefined || b.band > top)) top = b.band;
  return top;
}

/** The addresses of `roomy` when they are not all of `pods` (nor none): the subset to schedule among. */
function subsetOf(roomy: readonly PodInfo[], pods: readonly PodInfo[]): { subset?: string[] } {
  return roomy.length === pods.length || roomy.length === 0 ? {} : { subset: roomy.map((p) => p.address) };
}


function queueFull(model: string, band: number): RouteError {
  return new RouteError("queueFull", `model \`${model}\` is saturated and its queue for priority ${band} is full; retry later`, null, { "retry-after": "1" });
}

function replicaFull(model: string): RouteError {
  return new RouteError("queueFull", `model \`${model}\` is saturated and this gateway holds as many requests as its memory bound allows; retry later`, null, { "retry-after": "1" });
}

function userFull(model: string, band: number): RouteError {
  return new RouteError("queueFull", `model \`${model}\` is saturated and this user's share of its queue for priority ${band} is full; retry later`, null, { "retry-after": "1" });
}

function queueTimeout(model: string, d: HeldRequest<Held>): RouteError {
  const waited = Math.max(0, Math.round(d.expiresAt - d.enqueuedAt));
  return new RouteError("queueTimeout", `model \`${model}\` stayed saturated for the ${waited} ms this request may wait (priority ${d.band}); retry later`, null, { "retry-after": "1" });
}
