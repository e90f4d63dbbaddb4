/**
 * One policy's evaluation loop, as a pure state machine: feed it one fleet sample per interval,
 * get the recommendation and every number that produced it. The autoscaler service publishes the
 * result on the AUTOSCALE stream; `jetroute replay --autoscale` runs the same class in virtual time.
 *
 * Per sample: the metric is recorded into the stable and panic windows (as a total over the
 * model's pods for sum metrics, as is for fleet-wide ones); the algorithm (KPA or APA) proposes a
 * count; the scale-down delay keeps the highest proposal of the last `scaleDownDelayMs` (so a
 * recommendation never drops faster than the policy allows, and a rise applies at once); the
 * result is clamped to [minReplicas, maxReplicas].
 */
import { type AutoscaleMetric, isSumMetric, type ResolvedPolicy } from "../../schemas/autoscale.js";
import { type ApaArithmetic, apaDesired } from "./apa.js";
import { type KpaArithmetic, KpaDecider } from "./kpa.js";
import { TimeWindow } from "./window.js";

export interface FleetSample {
  now: number;
  /** Ready pods of the policy's model (and role) in PODS, draining ones left out. */
  readyPods: number;
  /** The metric now: the sum over pods for sum metrics, the fleet figure for the others; undefined = no data. */
  value: number | undefined;
  /** Requests flow control holds for the model (its waiting room at zero pods). */
  held?: number;
}

export interface Evaluation {
  ts: number;
  readyPods: number;
  metric: AutoscaleMetric;
  value: number | null;
  stableAverage: number | null;
  panicAverage: number | null;
  /** The algorithm's own proposal, before the delay and the bounds. */
  proposed: number;
  /** After the scale-down delay: the highest proposal in the delay window. */
  delayed: number;
  desired: number;
  reason: string;
  kpa?: KpaArithmetic;
  apa?: ApaArithmetic;
}

export class PolicyEvaluator {
  private readonly stable: TimeWindow;
  private readonly panic: TimeWindow;
  private readonly delay: TimeWindow | undefined;
  private kpa: KpaDecider | undefined;

  constructor(readonly policy: ResolvedPolicy) {
    if (policy.algorithm === "pd") throw new Error("PolicyEvaluator runs kpa and apa; the pd planner is services/autoscaler/pd-planner.ts");
    this.stable = new TimeWindow(policy.stableWindowMs, policy.intervalMs);
    this.panic = new TimeWindow(policy.panicWindowMs, policy.intervalMs);
    this.delay = policy.scaleDownDelayMs > 0 ? new TimeWindow(policy.scaleDownDelayMs, policy.intervalMs) : undefined;
  }

  get metric(): AutoscaleMetric {
    return this.policy.metric as AutoscaleMetric;
  }

  step(sample: FleetSample): Evaluation {
    const p = this.policy;
    const n = Math.max(0, sample.readyPods);
    if (sample.value !== undefined && Number.isFinite(sample.value)) {
      this.stable.record(sample.now, sample.value);
      this.panic.record(sample.now, sample.value);
    }
    const stableAverage = this.stable.average(sample.now);
    const panicAverage = this.panic.average(sample.now) ?? stableAverage;
    const base = { ts: sample.now, readyPods: n, metric: this.metric, value: sample.value ?? null, stableAverage: stableAverage ?? null, panicAverage: panicAverage ?? null };
    if (stableAverage === undefined) {
      const hold = n === 0 && (sample.held ?? 0) > 0 ? p.activationScale : n;
      const desired = this.bound(this.delayed(sample.now, hold));
      return { ...base, proposed: n, delayed: desired, desired, reason: "no samples of the metric in the stable window: holding the current count" };
    }
    let proposed: number;
    let reason: string;
    let kpa: KpaArithmetic | undefined;
    let apa: ApaArithmetic | undefined;
    if (p.algorithm === "kpa") {
      this.kpa ??= new KpaDecider(p, n, sample.now);
      // A fleet-wide figure (a percentile, a wait) is per pod already: the total is figure x pods.
      const total = (v: number) => (isSumMetric(this.metric) ? v : v * Math.max(1, n));
      kpa = this.kpa.step(sample.now, n, total(stableAverage), total(panicAverage as number));
      proposed = kpa.desired;
      reason = kpa.inPanic ? "kpa panic mode: never below the episode's highest count" : "kpa stable mode";
    } else {
      const perPod = isSumMetric(this.metric) ? (n > 0 ? stableAverage / n : stableAverage) : stableAverage;
      apa = apaDesired(p, n, perPod);
      proposed = apa.desired;
      reason = `apa ${apa.band}`;
    }
    // Scale from zero: requests waiting for a model with no pod ask for one whatever the metric
    // says (a load metric reads 0 on zero pods, and would keep the model at zero forever).
    if (n === 0 && (sample.held ?? 0) > 0 && proposed < p.activationScale) {
      proposed = p.activationScale;
      reason += `; scale from zero: ${sample.held} request(s) held in flow control's waiting room`;
    }
    const delayed = this.delayed(sample.now, proposed);
    if (delayed > proposed) reason += `; scale-down delayed (highest proposal of the last ${p.scaleDownDelayMs} ms is ${delayed})`;
    const desired = this.bound(delayed);
    if (desired !== delayed) reason += `; clamped to [${p.minReplicas}, ${p.maxReplicas}]`;
    return { ...base, proposed, delayed, desired, reason, ...(kpa ? { kpa } : {}), ...(apa ? { apa } : {}) };
  }

  private delayed(now: number, proposed: number): number {
    if (!this.delay) return proposed;
    this.delay.record(now, proposed);
    return Math.max(proposed, this.delay.max(now) ?? proposed);
  }

  private bound(n: number): number {
    return Math.min(this.policy.maxReplicas, Math.max(this.policy.minReplicas, n));
  }
}
