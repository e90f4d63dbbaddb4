/**
 * The autoscaler's rounds: every tick, each policy in scope whose interval has passed is evaluated
 * on the fleet's views; the lease holder then applies it (`--apply`) and publishes the record.
 * A shell (it calls the applier and the publisher); the decisions are runner.ts and apply-plan.ts.
 */
import type { AutoscaleRecommendation } from "../../schemas/autoscale.js";
import type { ServerClock } from "../gateway/server-clock.js";
import type { FleetQueues } from "../routing/flow/fleet.js";
import type { Logger } from "../shared/log.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { GatewayAcks } from "./acks.js";
import { WorkloadApplier, type WorkloadClient } from "./kube-apply.js";
import type { OutcomeWindow } from "./outcomes.js";
import type { PolicyRunner } from "./runner.js";
import type { QueueReading, SignalSources } from "./signals.js";

export interface RoundsDeps {
  id: string;
  clock: () => number;
  state: GatewayState;
  fleet: FleetQueues;
  outcomes: OutcomeWindow;
  serverClock: ServerClock;
  acks: GatewayAcks;
  /** PODS sequence of each pod's current `draining` event (`<model>\0<pod>`). */
  drainSeqs: ReadonlyMap<string, number>;
  runners: ReadonlyMap<string, PolicyRunner>;
  inScope(model: string): boolean;
  isLeader(): boolean;
  stats: { evaluations: number; published: number; publishErrors: number };
  log: Logger;
  apply?: WorkloadClient;
  drain: boolean;
  publish(policy: string, rec: AutoscaleRecommendation): Promise<void>;
}

export class Rounds {
  readonly appliers = new Map<string, WorkloadApplier>();
  private readonly lastRun = new Map<string, number>();
  private readonly busy = new Set<string>();
  private readonly sources: SignalSources;

  constructor(private readonly d: RoundsDeps) {
    this.sources = { pods: d.state.pods, load: d.state.load, ledger: d.state.ledger, queues: (m) => this.queues(m), outcomes: d.outcomes };
  }

  /** Flow control's held requests of a model, over every gateway's latest summary. */
  queues(model: string): QueueReading {
    let queued = 0;
    let oldest: number | undefined;
    for (const r of this.d.fleet.dump()) {
      for (const b of r.models[model] ?? []) {
        queued += b.count;
        if (oldest === undefined || b.oldest < oldest) oldest = b.oldest;
      }
    }
    return oldest === undefined ? { queued } : { queued, oldest };
  }

  /** One round; resolves once every evaluated policy is applied and published. */
  async evaluate(): Promise<AutoscaleRecommendation[]> {
    const { d } = this;
    const now = d.clock();
    d.state.sweep(now, { liveNow: d.serverClock.now() });
    d.fleet.sweep(now);
    const out: Array<Promise<AutoscaleRecommendation>> = [];
    for (const [name, r] of d.runners) {
      if (!d.inScope(r.policy.model)) continue;
      const last = this.lastRun.get(name);
      if (this.busy.has(name) || (last !== undefined && now - last < r.policy.intervalMs * 0.9)) continue;
      this.lastRun.set(name, now);
      const rec = r.evaluate({ now, autoscaler: d.id }, this.sources);
      d.stats.evaluations++;
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

  private applierOf(name: string, r: PolicyRunner): WorkloadApplier | undefined {
    const target = r.policy.scaleTarget;
    if (!this.d.apply || !target) return undefined;
    let a = this.appliers.get(name);
    if (!a || JSON.stringify(a.target) !== JSON.stringify(target)) {
      a = new WorkloadApplier(name, target, this.d.apply, this.d.log, { drain: this.d.drain, graceMs: r.policy.drainGraceMs });
      this.appliers.set(name, a);
    }
    return a;
  }

  private async applyRound(name: string, r: PolicyRunner, rec: AutoscaleRecommendation): Promise<void> {
    const a = this.applierOf(name, r);
    if (!a) return;
    const { d } = this;
    const model = r.policy.model;
    const res = await a.round({
      now: d.clock(),
      rec,
      inFlight: (pod) => d.state.ledger.outstanding(model, pod).requests,
      uniqueBlocks: (pod) => d.state.index.uniqueEntries(model, pod),
      drainSeq: (pod) => d.drainSeqs.get(`${model}\u0000${pod}`),
      acknowledged: (seq) => d.acks.acknowledged(seq, d.state.ledger.liveGateways(d.serverClock.now())),
      stillLeader: () => d.isLeader(),
    });
    if (res.specReplicas !== undefined) rec.specReplicas = res.specReplicas;
    if (res.draining.length > 0) rec.draining = res.draining.slice(0, 1024);
    if (res.removed.length > 0) rec.removed = res.removed.slice(0, 1024).map((x) => ({ pod: x.pod, reason: x.reason, inFlight: x.inFlight, drainedMs: x.drainedMs }));
    if (res.error) rec.reason = `${rec.reason}; apply: ${res.error}`.slice(0, 1024);
  }
}
