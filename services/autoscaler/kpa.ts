/**
 * KPA (Knative's pod autoscaler, as AIBrix runs it): desired pods from the metric's total over a
 * stable window and a short panic window. Pure: time and observations come in as arguments.
 *
 * Arithmetic of one step, with N = ready pods, T = the per-pod target:
 * - stable pods = ceil(stable total / T), panic pods = ceil(panic total / T), each clamped to
 *   [floor(N / maxScaleDownRate), max(1, ceil(maxScaleUpRate x N))];
 * - scaling from zero: a clamped count > 0 is raised to `activationScale`;
 * - panic starts when panic pods / max(1, N) >= panicThreshold, is extended on every step still
 *   over it, and ends once a whole stable window has passed without being over it;
 * - in panic the count never goes down: it is the highest of stable pods, panic pods and the
 *   highest count of this panic episode.
 * A decider that starts with more than one pod starts in panic (as Knative does): after a restart it
 * has no history, and must not scale down before its windows have filled.
 */
import type { ResolvedPolicy } from "../../schemas/autoscale.js";

export type KpaSettings = Pick<ResolvedPolicy, "target" | "maxScaleUpRate" | "maxScaleDownRate" | "panicThreshold" | "stableWindowMs" | "activationScale">;

export interface KpaArithmetic {
  readyPods: number;
  stableTotal: number;
  panicTotal: number;
  stablePods: number;
  panicPods: number;
  maxScaleUp: number;
  maxScaleDown: number;
  overPanicThreshold: boolean;
  inPanic: boolean;
  desired: number;
}

export class KpaDecider {
  /** When panic was last extended (ms); undefined = stable mode. */
  private panicAt: number | undefined;
  private maxPanicPods: number;

  constructor(
    private readonly s: KpaSettings,
    readyPodsAtStart: number,
    now: number,
  ) {
    this.panicAt = readyPodsAtStart > 1 ? now : undefined;
    this.maxPanicPods = readyPodsAtStart;
  }

  get inPanic(): boolean {
    return this.panicAt !== undefined;
  }

  step(now: number, readyPods: number, stableTotal: number, panicTotal: number): KpaArithmetic {
    const target = this.s.target as number;
    const n = Math.max(0, readyPods);
    const maxScaleUp = Math.max(1, Math.ceil(this.s.maxScaleUpRate * n));
    const maxScaleDown = Math.floor(n / this.s.maxScaleDownRate);
    const clamp = (pods: number) => {
      const c = Math.min(Math.max(pods, maxScaleDown), maxScaleUp);
      return c > 0 && c < this.s.activationScale ? this.s.activationScale : c;
    };
    const dspc = Math.ceil(Math.max(0, stableTotal) / target);
    const dppc = Math.ceil(Math.max(0, panicTotal) / target);
    const stablePods = clamp(dspc);
    const panicPods = clamp(dppc);
    const overPanicThreshold = dppc / Math.max(1, n) >= this.s.panicThreshold;
    if (overPanicThreshold) this.panicAt = now;
    else if (this.panicAt !== undefined && this.panicAt + this.s.stableWindowMs < now) {
      this.panicAt = undefined;
      this.maxPanicPods = 0;
    }
    let desired = stablePods;
    if (this.panicAt !== undefined) {
      desired = Math.max(desired, panicPods, this.maxPanicPods);
      this.maxPanicPods = desired;
    }
    return { readyPods: n, stableTotal, panicTotal, stablePods, panicPods, maxScaleUp, maxScaleDown, overPanicThreshold, inPanic: this.panicAt !== undefined, desired };
  }
}
