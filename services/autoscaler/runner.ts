/**
 * One policy, one evaluation: reads its signal from the fleet's views, runs its algorithm and
 * returns the AUTOSCALE record. Pure (time and views come in); the autoscaler service and
 * `replay --autoscale` call it once per interval.
 */
import type { AutoscaleRecommendation, ResolvedPolicy } from "../../schemas/autoscale.js";
import { PolicyEvaluator } from "./evaluator.js";
import { CapacityLearner, planPd } from "./pd-planner.js";
import { policyPods, readSignal, type SignalSources } from "./signals.js";
import { TimeWindow } from "./window.js";

export const MAX_REASON_CHARS = 1024;

export interface Tick {
  now: number;
  autoscaler: string;
  /** The workload's replicas as read from Kubernetes (`--apply`). */
  specReplicas?: number;
}

export interface PolicyRunner {
  readonly policy: ResolvedPolicy;
  evaluate(t: Tick, s: SignalSources): AutoscaleRecommendation;
}

export function createRunner(name: string, policy: ResolvedPolicy): PolicyRunner {
  return policy.algorithm === "pd" ? new PdRunner(name, policy) : new MetricRunner(name, policy);
}

const head = (name: string, p: ResolvedPolicy, t: Tick) => ({
  type: "autoscale" as const,
  policy: name,
  model: p.model,
  ...(p.role !== undefined ? { role: p.role } : {}),
  algorithm: p.algorithm,
  autoscaler: t.autoscaler,
  ts: t.now,
  ...(t.specReplicas !== undefined ? { specReplicas: t.specReplicas } : {}),
});

class MetricRunner implements PolicyRunner {
  private readonly evaluator: PolicyEvaluator;

  constructor(
    readonly name: string,
    readonly policy: ResolvedPolicy,
  ) {
    this.evaluator = new PolicyEvaluator(policy);
  }

  evaluate(t: Tick, s: SignalSources): AutoscaleRecommendation {
    const pods = policyPods(this.policy, s);
    const reading = readSignal(this.evaluator.metric, this.policy, pods, s, t.now, this.policy.stableWindowMs);
    const e = this.evaluator.step({ now: t.now, readyPods: pods.length, value: reading.value, held: s.queues(this.policy.model).queued });
    const reason = reading.missing > 0 ? `${e.reason}; ${reading.missing} pod(s) without a fresh sample` : e.reason;
    return {
      ...head(this.name, this.policy, t),
      readyPods: e.readyPods,
      metric: e.metric,
      value: e.value,
      stableAverage: e.stableAverage,
      panicAverage: e.panicAverage,
      proposed: e.proposed,
      delayed: e.delayed,
      desired: e.desired,
      reason: reason.slice(0, MAX_REASON_CHARS),
      ...(e.kpa
        ? {
            kpa: {
              stableTotal: e.kpa.stableTotal,
              panicTotal: e.kpa.panicTotal,
              stablePods: e.kpa.stablePods,
              panicPods: e.kpa.panicPods,
              maxScaleUp: e.kpa.maxScaleUp,
              maxScaleDown: e.kpa.maxScaleDown,
              overPanicThreshold: e.kpa.overPanicThreshold,
              inPanic: e.kpa.inPanic,
            },
          }
        : {}),
      ...(e.apa ? { apa: { perPod: e.apa.perPod, ratio: e.apa.ratio, band: e.apa.band } } : {}),
    };
  }
}

/** Prefix hit rate from the engines' counters: the share of queried tokens that hit, since the last read. */
class HitRate {
  private readonly last = new Map<string, { hits: number; queries: number }>();

  read(s: SignalSources, pods: readonly { model: string; pod: string }[], now: number): number | undefined {
    let dh = 0;
    let dq = 0;
    const rates: number[] = [];
    const seen = new Set<string>();
    for (const p of pods) {
      const key = `${p.model}\u0000${p.pod}`;
      seen.add(key);
      const l = s.load.fresh(p.model, p.pod, now);
      if (!l) continue;
      if (typeof l.cacheHitRate === "number") rates.push(l.cacheHitRate);
      if (typeof l.prefixCacheHits !== "number" || typeof l.prefixCacheQueries !== "number") continue;
      const prev = this.last.get(key);
      this.last.set(key, { hits: l.prefixCacheHits, queries: l.prefixCacheQueries });
      // A counter that went down is an engine restart: its new value is the delta.
      if (prev) {
        dh += l.prefixCacheHits >= prev.hits ? l.prefixCacheHits - prev.hits : l.prefixCacheHits;
        dq += l.prefixCacheQueries >= prev.queries ? l.prefixCacheQueries - prev.queries : l.prefixCacheQueries;
      }
    }
    for (const k of this.last.keys()) if (!seen.has(k)) this.last.delete(k);
    if (dq > 0) return Math.min(1, dh / dq);
    if (rates.length > 0) return rates.reduce((a, b) => a + b, 0) / rates.length;
    return undefined;
  }
}

class PdRunner implements PolicyRunner {
  private readonly prefillCap: CapacityLearner;
  private readonly decodeCap: CapacityLearner;
  private readonly delayPrefill: TimeWindow | undefined;
  private readonly delayDecode: TimeWindow | undefined;
  private readonly hits = new HitRate();
  private hitRate = 0;

  constructor(
    readonly name: string,
    readonly policy: ResolvedPolicy,
  ) {
    const pd = policy.pd as NonNullable<ResolvedPolicy["pd"]>;
    this.prefillCap = new CapacityLearner(pd.priorPrefillTokensPerS ?? 8000, pd.ttftMs);
    this.decodeCap = new CapacityLearner(pd.priorDecodeTokensPerS ?? 1500, pd.tpotMs);
    const d = policy.scaleDownDelayMs;
    this.delayPrefill = d > 0 ? new TimeWindow(d, policy.intervalMs) : undefined;
    this.delayDecode = d > 0 ? new TimeWindow(d, policy.intervalMs) : undefined;
  }

  evaluate(t: Tick, s: SignalSources): AutoscaleRecommendation {
    const p = this.policy;
    const pd = p.pd as NonNullable<ResolvedPolicy["pd"]>;
    const prefillPods = policyPods({ model: p.model, role: "prefill" }, s);
    const decodePods = policyPods({ model: p.model, role: "decode" }, s);
    this.hitRate = this.hits.read(s, prefillPods, t.now) ?? this.hitRate;
    // Learn from the recent past (the panic window): what each pod did and whether targets held.
    const recent = s.outcomes.demand(p.model, t.now, p.panicWindowMs);
    if (prefillPods.length > 0) this.prefillCap.observe((recent.requestsPerS * recent.meanPromptTokens * (1 - this.hitRate)) / prefillPods.length, s.outcomes.percentile(p.model, "ttft", 0.9, t.now, p.panicWindowMs));
    if (decodePods.length > 0) this.decodeCap.observe((recent.requestsPerS * recent.meanOutputTokens) / decodePods.length, s.outcomes.percentile(p.model, "tpot", 0.9, t.now, p.panicWindowMs));
    // Size for the stable window's demand.
    const d = s.outcomes.demand(p.model, t.now, p.stableWindowMs);
    const plan = planPd(
      { requestsPerS: d.requestsPerS, meanPromptTokens: d.meanPromptTokens, meanOutputTokens: d.meanOutputTokens, prefixHitRate: this.hitRate },
      { prefillTokensPerS: this.prefillCap.value, decodeTokensPerS: this.decodeCap.value },
      { maxPods: pd.maxPods, minPerRole: p.minReplicas },
    );
    const delayed = (w: TimeWindow | undefined, n: number) => {
      if (!w) return n;
      w.record(t.now, n);
      return Math.max(n, w.max(t.now) ?? n);
    };
    const bound = (n: number) => Math.min(p.maxReplicas, Math.max(p.minReplicas, n));
    const prefillDelayed = delayed(this.delayPrefill, plan.prefill);
    const decodeDelayed = delayed(this.delayDecode, plan.decode);
    const reason = `pd: ${d.requests} requests in the stable window; prefill ${plan.prefill}, decode ${plan.decode}${plan.overBudget ? ` (budget ${pd.maxPods} pods)` : ""}${this.prefillCap.fromHistory || this.decodeCap.fromHistory ? "" : "; capacity from the prior (no interval has taught it yet)"}`;
    return {
      ...head(this.name, p, t),
      readyPods: prefillPods.length,
      proposed: plan.prefill,
      delayed: prefillDelayed,
      desired: bound(prefillDelayed),
      desiredDecode: bound(decodeDelayed),
      reason: reason.slice(0, MAX_REASON_CHARS),
      pd: {
        requestsPerS: d.requestsPerS,
        meanPromptTokens: d.meanPromptTokens,
        meanOutputTokens: d.meanOutputTokens,
        prefixHitRate: this.hitRate,
        prefillTokensPerS: plan.prefillTokensPerS,
        decodeTokensPerS: plan.decodeTokensPerS,
        prefillCapacityPerPod: this.prefillCap.value,
        decodeCapacityPerPod: this.decodeCap.value,
        capacityFromHistory: this.prefillCap.fromHistory || this.decodeCap.fromHistory,
        unbudgetedPrefill: plan.unbudgeted.prefill,
        unbudgetedDecode: plan.unbudgeted.decode,
        overBudget: plan.overBudget,
      },
    };
  }
}
