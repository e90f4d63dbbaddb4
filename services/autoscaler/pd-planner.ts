/**
 * The `pd` planner: prefill and decode pod counts from what the fleet is asked to do and what its
 * pods have shown they can do. Pure.
 *
 * Demand over the last interval: request rate r (req/s), mean prompt tokens I, mean output tokens
 * O, prefix hit rate h (the share of prompt tokens the engines found cached). Capacity per pod:
 * prefill tokens/s P and decode tokens/s D that a pod sustained while meeting the TTFT and TPOT
 * targets (learned by `CapacityLearner` below from the fleet's own intervals, a prior until then).
 *   prefill = ceil(r x I x (1 - h) / P),  decode = ceil(r x O / D)
 * Each role gets at least 1 pod while there is demand (0 with none, if minReplicas allows). Over
 * the budget (`maxPods`), both are scaled down in proportion, each keeping at least 1.
 */

export interface PdDemand {
  requestsPerS: number;
  meanPromptTokens: number;
  meanOutputTokens: number;
  prefixHitRate: number;
}

export interface PdCapacity {
  prefillTokensPerS: number;
  decodeTokensPerS: number;
}

export interface PdPlan {
  prefill: number;
  decode: number;
  /** Before the budget: what the targets alone ask for. */
  unbudgeted: { prefill: number; decode: number };
  prefillTokensPerS: number;
  decodeTokensPerS: number;
  overBudget: boolean;
}

export function planPd(d: PdDemand, c: PdCapacity, o: { maxPods: number; minPerRole?: number }): PdPlan {
  const r = Math.max(0, d.requestsPerS);
  const hit = Math.min(1, Math.max(0, d.prefixHitRate));
  const prefillTokensPerS = r * Math.max(0, d.meanPromptTokens) * (1 - hit);
  const decodeTokensPerS = r * Math.max(0, d.meanOutputTokens);
  const floor = r > 0 ? Math.max(1, o.minPerRole ?? 0) : (o.minPerRole ?? 0);
  const prefill = Math.max(floor, Math.ceil(prefillTokensPerS / c.prefillTokensPerS));
  const decode = Math.max(floor, Math.ceil(decodeTokensPerS / c.decodeTokensPerS));
  const unbudgeted = { prefill, decode };
  if (prefill + decode <= o.maxPods) return { prefill, decode, unbudgeted, prefillTokensPerS, decodeTokensPerS, overBudget: false };
  const keep = Math.min(floor, 1);
  let p = Math.max(keep, Math.round((o.maxPods * prefill) / (prefill + decode)));
  let dd = Math.max(keep, o.maxPods - p);
  if (p + dd > o.maxPods) p = Math.max(keep, o.maxPods - dd);
  if (p + dd > o.maxPods) dd = Math.max(keep, o.maxPods - p);
  return { prefill: p, decode: dd, unbudgeted, prefillTokensPerS, decodeTokensPerS, overBudget: true };
}

/**
 * Per-pod throughput a role sustains within its latency target, learned from intervals of the
 * fleet's own history (one observation per evaluation interval: tokens per pod per second and the
 * interval's latency percentile). An interval within target proves the pods can do at least that
 * much: the estimate rises to it (it starts at the prior, so a quiet fleet never drags it down). An interval over target at a throughput below the estimate
 * proves the estimate too high: it falls to that throughput. One number per role: bounded and
 * deterministic (the same intervals give the same estimate on every replica and in replay).
 */
export class CapacityLearner {
  private estimate: number;
  private learned = false;

  constructor(
    readonly prior: number,
    readonly targetMs: number,
  ) {
    this.estimate = prior;
  }

  get value(): number {
    return this.estimate;
  }

  /** Whether any interval has taught it (otherwise it is the prior). */
  get fromHistory(): boolean {
    return this.learned;
  }

  observe(tokensPerPodPerS: number, latencyMs: number | undefined): void {
    if (!(tokensPerPodPerS > 0) || latencyMs === undefined || !Number.isFinite(latencyMs)) return;
    if (latencyMs <= this.targetMs) {
      if (tokensPerPodPerS > this.estimate) {
        this.estimate = tokensPerPodPerS;
        this.learned = true;
      }
    } else if (tokensPerPodPerS < this.estimate) {
      this.estimate = tokensPerPodPerS;
      this.learned = true;
    }
  }
}
