/**
 * The autoscaler's rounds: every tick, each policy in scope whose interval has passed is evaluated
 * on the fleet's views; the lease holder then applies it (`--apply`) and publishes the record.
 * A shell (it calls the applier and the publisher); the decisions are runner.ts and apply-plan.ts.
 */
import type { AutoscaleRecommendation, ScaleTarget } from "../../schemas/autoscale.js";
import type { ServerClock } from "../gateway/server-clock.js";
import type { FleetQueues } from "../routing/mod.js";
import type { Logger } from "../shared/log.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { GatewayAcks } from "./acks.js";
import { WorkloadApplier, type WorkloadClient } from "./kube-apply.js";
import type { PolicyFigures } from "./metrics.js";
import type { OutcomeWindow } from "./outcomes.js";
import type { PolicyRunner } from "./runner.js";
import { type QueueReading, queueReadingOf, type SignalSources } from "./signals.js";

const DECODE_SUFFIX = "#decode";

export interface RoundsDeps {
  id: string;
  clock: () => number;
  state: GatewayState;
  fleet: FleetQueues;
  outcomes: OutcomeWindow;
  serverClock: ServerClock;
  acks: GatewayAcks;
  /** Each pod's current `draining` event (`<model>\0<pod>`): its PODS sequence and deadline. */
  drainEvents: ReadonlyMap<string, { seq: number; deadline: number }>;
  runners: ReadonlyMap<string, PolicyRunner>;
  inScope(model: string): boolean;
  isLeader(): boolean;
  stats: { evaluations: number; published: number; publishErrors: number };
  log: Logger;
  apply?: WorkloadClient;
  drain: boolean;
  /** `--allow-workload`: workloads `--apply` may scale whatever their pods (workload-guard.ts). */
  allowWorkloads?: ReadonlySet<string>;
  publish(policy: string, rec: AutoscaleRecommendation): Promise<void>;
}

export class Rounds {
  readonly appliers = new Map<string, WorkloadApplier>();
  /** Per policy in force: what its evaluations said (the metrics port's series). */
  readonly figures = new Map<string, PolicyFigures>();
  private readonly lastRun = new Map<string, number>();
  private readonly busy = new Set<string>();
  private readonly releasing = new Set<string>();
  private readonly sources: SignalSources;

  constructor(private readonly d: RoundsDeps) {
    this.sources = { pods: d.state.pods, load: d.state.load, ledger: d.state.ledger, queues: (m) => this.queues(m), outcomes: d.outcomes };
  }

  /** Flow control's held requests of a model, over every gateway's latest summary; waits on our clock alone (signals.ts heldAgeMs). */
  queues(model: string): QueueReading {
    return queueReadingOf(model, this.d.fleet.received(), this.d.clock());
  }

  /** One round; resolves once every evaluated policy is applied and published. */
  async evaluate(): Promise<AutoscaleRecommendation[]> {
    const { d } = this;
    const now = d.clock();
    d.state.sweep(now, { liveNow: d.serverClock.now() });
    // The autoscaler publishes no heartbeat on CHARGES, so when every gateway is gone its ledger's
    // stream clock would stop: it moves it on the broker's time, for gateways that died to lapse.
    d.state.ledger.advance(d.serverClock.now());
    d.fleet.sweep(now);
    if (d.isLeader()) this.releaseOrphans();
    for (const name of this.figures.keys()) if (!d.runners.has(name)) this.figures.delete(name);
    const out: Array<Promise<AutoscaleRecommendation>> = [];
    for (const [name, r] of d.runners) {
      if (!d.inScope(r.policy.model)) continue;
      const last = this.lastRun.get(name);
      if (this.busy.has(name) || (last !== undefined && now - last < r.policy.intervalMs * 0.9)) continue;
      this.lastRun.set(name, now);
      const rec = r.evaluate({ now, autoscaler: d.id }, this.sources);
      d.stats.evaluations++;
      const fig = this.figures.get(name) ?? { evaluations: 0, published: 0, desired: 0, readyPods: 0 };
      this.figures.set(name, fig);
      fig.evaluations++;
      fig.desired = rec.desired;
      fig.readyPods = rec.readyPods;
      // A lost lease stops applying and publishing at once: isLeader() is false from the moment the lease lapses.
      if (!d.isLeader()) {
        out.push(Promise.resolve(rec));
        continue;
      }
      this.busy.add(name);
      out.push(
        this.applyRound(name, r, rec)
          .then(async () => {
            if (!d.isLeader()) return rec;
            await d.publish(name, rec);
            d.stats.published++;
            fig.published++;
            return rec;
          })
          .catch((err: unknown) => {
            d.stats.publishErrors++;
            d.log.warn({ policy: name, err: (err as Error).message }, "recommendation not published");
            return rec;
          })
          .finally(() => this.busy.delete(name)),
      );
    }
    return Promise.all(out);
  }

  /** The workload each applier key drives: a policy's `scaleTarget`, and a pd policy's decode role (`<name>#decode`). */
  private targetOf(key: string): { target: ScaleTarget; runner: PolicyRunner } | undefined {
    const decode = key.endsWith(DECODE_SUFFIX);
    const r = this.d.runners.get(decode ? key.slice(0, -DECODE_SUFFIX.length) : key);
    const target = decode ? r?.policy.pd?.decodeScaleTarget : r?.policy.scaleTarget;
    return r && target ? { target, runner: r } : undefined;
  }

  /**
   * Appliers whose policy is gone, or names another workload now, give their marks back before
   * they are dropped (retried every round until Kubernetes accepts it).
   */
  private releaseOrphans(): void {
    for (const [key, a] of this.appliers) {
      const now = this.targetOf(key);
      if (now && JSON.stringify(now.target) === JSON.stringify(a.target)) continue;
      if (this.releasing.has(key)) continue;
      this.releasing.add(key);
      a.release(() => this.d.isLeader())
        .then(() => {
          if (this.appliers.get(key) === a) this.appliers.delete(key);
        })
        .catch((err: unknown) => this.d.log.warn({ policy: key, err: (err as Error).message }, "taking the drain marks off a dropped policy's pods failed; retrying"))
        .finally(() => this.releasing.delete(key));
    }
  }

  private applierOf(key: string): WorkloadApplier | undefined {
    const t = this.targetOf(key);
    if (!this.d.apply || !t) return undefined;
    const a = this.appliers.get(key);
    if (a && JSON.stringify(a.target) === JSON.stringify(t.target)) return a;
    // A changed target: the old applier releases its marks first (releaseOrphans), then a new one starts.
    if (a) return undefined;
    const fresh = new WorkloadApplier(key, t.target, this.d.apply, this.d.log, { drain: this.d.drain, graceMs: t.runner.policy.drainGraceMs, model: t.runner.policy.model, ...(this.d.allowWorkloads ? { allowed: this.d.allowWorkloads } : {}) });
    this.appliers.set(key, fresh);
    return fresh;
  }

  private async applyRound(name: string, r: PolicyRunner, rec: AutoscaleRecommendation): Promise<void> {
    // A pd policy's decode role: its own workload, sized by `desiredDecode` (its record lists the prefill side).
    const decode = r.policy.pd?.decodeScaleTarget && rec.desiredDecode !== undefined ? this.applierOf(`${name}${DECODE_SUFFIX}`) : undefined;
    if (decode) await this.roundOf(decode, r, { ...rec, desired: rec.desiredDecode as number });
    const a = this.applierOf(name);
    if (!a) return;
    const res = await this.roundOf(a, r, rec);
    if (res.specReplicas !== undefined) rec.specReplicas = res.specReplicas;
    if (res.draining.length > 0) rec.draining = res.draining.slice(0, 1024);
    if (res.removed.length > 0) rec.removed = res.removed.slice(0, 1024).map((x) => ({ pod: x.pod, reason: x.reason, inFlight: x.inFlight, drainedMs: x.drainedMs }));
    if (res.error) rec.reason = `${rec.reason}; apply: ${res.error}`.slice(0, 1024);
  }

  /** PODS pod name -> the models it is published under (one pass over the pod set; built once per round of an applier). */
  private modelsByPod(): Map<string, string[]> {
    const out = new Map<string, string[]>();
    for (const p of this.d.state.pods.all()) {
      const models = out.get(p.pod);
      if (models) models.push(p.model);
      else out.set(p.pod, [p.model]);
    }
    return out;
  }

  private roundOf(a: WorkloadApplier, r: PolicyRunner, rec: AutoscaleRecommendation) {
    const { d } = this;
    const model = r.policy.model;
    let byPod: Map<string, string[]> | undefined;
    return a.round({
      now: d.clock(),
      rec,
      inFlight: (pod) => d.state.ledger.outstanding(model, pod).requests,
      uniqueBlocks: (pod) => d.state.index.uniqueEntries(model, pod),
      drainEvent: (pod) => d.drainEvents.get(`${model}\u0000${pod}`),
      acknowledged: (seq) => d.acks.acknowledged(seq, d.state.ledger.liveGateways(d.serverClock.now())),
      stillLeader: () => d.isLeader(),
      modelsOf: (pod) => (byPod ??= this.modelsByPod()).get(pod) ?? [],
    });
  }
}
