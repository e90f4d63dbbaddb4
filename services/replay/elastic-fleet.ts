/**
 * A simulated fleet whose size changes over time (`jetroute replay --autoscale`): pods are
 * created, become routable after a start-up delay, and leave on a scale-down — through the drain
 * handshake (the cheapest pods by the autoscaler's own ranking stop taking requests and leave when
 * idle or at their grace deadline) or, without it, at once as a ReplicaSet removes them (the newest
 * first), cutting what they still stream. Pure: virtual time, no I/O.
 *
 * It also integrates the provisioned pods over time (a pod counts from creation to removal,
 * starting and draining included: it holds its GPU the whole time).
 */
import { chooseVictims } from "../autoscaler/victims.js";
import type { PodInfo } from "../views/pod-set.js";
import type { Fleet, PodSim } from "./sim-pods.js";
import type { VirtualClock } from "./virtual-clock.js";

/** How the fleet changes size (the policy's and the cluster's side of it). */
export interface ElasticSettings {
  /** A new pod's creation to Ready (virtual ms): its model loading. */
  readonly startupMs: number;
  /** true: the drain handshake; false: the plain scale subresource (removed pods cut their requests). */
  readonly drain: boolean;
  /** The handshake's deadline for a draining pod (virtual ms). */
  readonly drainGraceMs: number;
}

export interface ElasticHooks {
  /** A new pod of `fleet`, created now (not routable until ready). */
  newPod(fleet: Fleet, now: number): PodSim;
  /** Requests on the pod not finished yet (the ledger). */
  inFlight(sim: PodSim): number;
  /** Cached blocks only this pod holds (what the fleet would recompute without it). */
  uniqueBlocks(sim: PodSim): number;
  /** The routable set grew: route the requests held for lack of a pod. */
  routable(fleet: Fleet): void;
}

/** One change of the fleet's target size. */
export interface ScaleEvent {
  /** Virtual ms. */
  atMs: number;
  from: number;
  to: number;
}

/** Most scale events kept in a run's result (the count goes on). */
export const MAX_SCALE_EVENTS = 1_000;

export class ElasticFleet {
  /** The target size (a workload's spec.replicas): pods starting or ready, draining ones left out. */
  target: number;
  private podMs = 0;
  private lastAt = 0;
  peak: number;
  readonly events: ScaleEvent[] = [];
  eventCount = 0;
  /** Pods removed once idle after draining, and at their grace deadline. */
  drainedIdle = 0;
  drainedAtDeadline = 0;
  /** Requests cut by a removal (at the grace deadline, or by a plain scale-down). */
  cut = 0;
  private readonly timers = new Map<PodSim, () => void>();

  constructor(
    readonly fleet: Fleet,
    private readonly clock: VirtualClock,
    private readonly s: ElasticSettings,
    private readonly hooks: ElasticHooks,
  ) {
    this.target = fleet.sims.length;
    this.peak = fleet.sims.length;
  }

  /** Provisioned pod-seconds from virtual 0 to `endMs` (the current pods counted up to it). */
  podSeconds(endMs: number): number {
    return (this.podMs + this.fleet.sims.length * Math.max(0, endMs - this.lastAt)) / 1000;
  }

  /** Pods that exist now (starting, ready, draining). */
  get provisioned(): number {
    return this.fleet.sims.length;
  }

  /** Moves the fleet towards `desired` pods (called at each evaluation). */
  resize(desired: number): void {
    const now = this.clock.now();
    const want = Math.max(0, Math.floor(desired));
    if (want !== this.target) {
      this.eventCount++;
      if (this.events.length < MAX_SCALE_EVENTS) this.events.push({ atMs: now, from: this.target, to: want });
    }
    const active = () => this.fleet.sims.filter((x) => x.state !== "draining");
    let changed = false;
    if (want > active().length) {
      // Draining pods come back first: they are warm and hold their cache.
      for (const x of this.fleet.sims) {
        if (active().length >= want) break;
        if (x.state !== "draining") continue;
        x.state = "ready";
        delete x.drainDeadline;
        this.timers.get(x)?.();
        this.timers.delete(x);
        changed = true;
      }
      while (active().length < want) this.create(now);
    } else if (want < active().length) {
      let excess = active().length - want;
      // Pods not ready yet go first (a ReplicaSet removes those first too), the newest of them first.
      const starting = active().filter((x) => x.state === "starting").sort((a, b) => b.createdAt - a.createdAt || (a.info.pod < b.info.pod ? 1 : -1));
      for (const x of starting.slice(0, excess)) {
        this.remove(x, now);
        excess--;
      }
      if (excess > 0) changed = this.shrinkReady(excess, now) || changed;
    }
    this.target = want;
    if (changed) this.refresh();
    // Pods taken back from draining are routable at once: requests held for lack of one go now.
    if (changed && want > 0) this.hooks.routable(this.fleet);
  }

  /** A request on `sim` finished: a draining pod that is now idle leaves. */
  finished(sim: PodSim): void {
    if (sim.state !== "draining" || this.hooks.inFlight(sim) > 0 || !this.fleet.byName.has(sim.info.pod)) return;
    this.drainedIdle++;
    this.remove(sim, this.clock.now());
  }

  private shrinkReady(excess: number, now: number): boolean {
    const ready = this.fleet.sims.filter((x) => x.state === "ready");
    if (!this.s.drain) {
      // The ReplicaSet's own order among ready pods: the most recently started first.
      const newest = [...ready].sort((a, b) => b.createdAt - a.createdAt || (a.info.pod < b.info.pod ? 1 : -1)).slice(0, excess);
      for (const x of newest) {
        this.cut += this.hooks.inFlight(x);
        this.remove(x, now, true);
      }
      return newest.length > 0;
    }
    const victims = chooseVictims(
      ready.map((x) => ({ pod: x.info.pod, ready: true, inFlight: this.hooks.inFlight(x), uniqueBlocks: this.hooks.uniqueBlocks(x) })),
      excess,
    );
    for (const v of victims) {
      const x = this.fleet.byName.get(v.pod) as PodSim;
      x.state = "draining";
      x.drainDeadline = now + this.s.drainGraceMs;
      if (v.inFlight === 0) {
        this.drainedIdle++;
        this.remove(x, now);
        continue;
      }
      this.timers.set(
        x,
        this.clock.at(x.drainDeadline, () => {
          this.timers.delete(x);
          if (x.state !== "draining" || !this.fleet.byName.has(x.info.pod)) return;
          this.drainedAtDeadline++;
          this.cut += this.hooks.inFlight(x);
          this.remove(x, this.clock.now(), true);
        }),
      );
    }
    return victims.length > 0;
  }

  private create(now: number): void {
    this.account(now);
    const x = this.hooks.newPod(this.fleet, now);
    x.state = "starting";
    this.fleet.sims.push(x);
    this.fleet.sims.sort((a, b) => (a.info.pod < b.info.pod ? -1 : a.info.pod > b.info.pod ? 1 : 0));
    this.fleet.byName.set(x.info.pod, x);
    this.peak = Math.max(this.peak, this.fleet.sims.length);
    const ready = () => {
      this.timers.delete(x);
      if (x.state !== "starting" || !this.fleet.byName.has(x.info.pod)) return;
      x.state = "ready";
      this.refresh();
      this.hooks.routable(this.fleet);
    };
    if (this.s.startupMs <= 0) ready();
    else this.timers.set(x, this.clock.at(now + this.s.startupMs, ready));
  }

  /** Takes the pod out; `abort` cuts what it still runs (each request finishes as "abort"). */
  private remove(x: PodSim, now: number, abort = false): void {
    this.account(now);
    this.timers.get(x)?.();
    this.timers.delete(x);
    const wasRoutable = x.state === "ready";
    this.fleet.byName.delete(x.info.pod);
    this.fleet.sims.splice(this.fleet.sims.indexOf(x), 1);
    this.fleet.retired.push(x);
    if (abort) x.engine.abortAll();
    else x.engine.close();
    if (wasRoutable || x.state === "draining") this.refresh();
  }

  private account(now: number): void {
    this.podMs += this.fleet.sims.length * Math.max(0, now - this.lastAt);
    this.lastAt = Math.max(this.lastAt, now);
  }

  /** The routable set: a new array (strategies may key on its identity). */
  private refresh(): void {
    const pods: PodInfo[] = [];
    for (const x of this.fleet.sims) if (x.state === "ready") pods.push(x.info);
    this.fleet.pods = pods;
  }
}
