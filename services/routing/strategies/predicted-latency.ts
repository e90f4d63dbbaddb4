/**
 * `predicted-latency` and `predicted-latency-targets`: route by the latency model learned from the
 * fleet's own outcomes (services/views/latency-model.ts, docs/latency-model.md).
 *
 * Each candidate's features for this request (prompt tokens, tokens it holds in its prefix cache,
 * the shared ledger's prefill tokens and decoding requests on it, its engine queue and KV usage)
 * go through its pod class's regressions, giving a predicted TTFT and TPOT.
 *
 *   predicted-latency          lowest predicted TTFT; equal TTFTs (to 0.01 ms) by lower TPOT.
 *                              Score: the predicted TTFT in ms (+ TPOT × 1e-7, the tie-break).
 *   predicted-latency-targets  meet the model's targets (profile `slo`: TTFT, TPOT) at least cost:
 *                              among the pods predicted to meet every target, the one with the
 *                              least headroom (the slowest that still meets them, so the fast
 *                              pods stay free for requests only they can serve); score = its
 *                              headroom (0..1), a pod that misses gets 1 + its relative excess.
 *                              No targets: as predicted-latency.
 *
 * Both are scorers (lower is better), so they combine with prefix-cache and the others. Both read
 * the prefix match (`prefixMatch` trait), so their records keep the prompt's blocks and replay
 * rebuilds the same features. No latency model in the context (a fold without one): least-request.
 */
import type { LatencyFeatures, LatencyPrediction, LatencyReader } from "../../views/latency-model.js";
import type { PodInfo } from "../../views/pod-set.js";
import type { LoadReader } from "../../views/load-view.js";
import type { Outstanding } from "../../views/charge-ledger.js";
import { scorerStrategy } from "./combine.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";
import type { PrefixMatchInfo, RoutingContext, Scorer, SloTargets, StrategyTraits } from "./types.js";

const TRAITS: StrategyTraits = { prefixMatch: true };

/** The features of `pod` for a request of `promptTokens`, from the views as they are now. */
export function latencyFeaturesOf(
  v: { load: LoadReader; ledger: { outstanding(model: string, pod: string): Readonly<Outstanding> } },
  pod: PodInfo,
  promptTokens: number,
  prefix: PrefixMatchInfo | undefined,
  now: number,
): LatencyFeatures {
  const o = v.ledger.outstanding(pod.model, pod.pod);
  const l = v.load.fresh(pod.model, pod.pod, now);
  const cached = prefix ? Math.min(promptTokens, Math.floor(prefix.matched(pod.pod) * prefix.blockSize)) : 0;
  const int = (x: number | null | undefined) => (x !== null && x !== undefined && Number.isFinite(x) && x > 0 ? Math.round(x) : 0);
  return {
    promptTokens,
    cachedTokens: cached,
    prefillTokens: o.prefillTokens,
    decoding: Math.max(0, o.requests - o.prefillRequests),
    waiting: int(l?.waiting),
    kvPermille: Math.min(1000, int((l?.kvCacheUsage ?? 0) * 1000)),
  };
}

/** The release's `latency.x` of a feature set (schemas/events.ts LatencySample). */
export const featureVector = (f: LatencyFeatures): number[] => [f.promptTokens, f.cachedTokens, f.prefillTokens, f.decoding, f.waiting, f.kvPermille];

/** Every candidate's features and prediction (undefined without a latency model). */
export function predictions(ctx: RoutingContext): Array<{ features: LatencyFeatures; prediction: LatencyPrediction }> | undefined {
  const model = ctx.latency;
  if (!model) return undefined;
  return ctx.pods.map((pod) => {
    const features = latencyFeaturesOf(ctx, pod, ctx.request.promptTokens, ctx.prefix, ctx.now);
    return { features, prediction: model.predict(pod.model, pod.podClass, features, ctx.now) };
  });
}

const ttftScore = (p: LatencyPrediction) => Math.round(p.ttftMs * 100) / 100 + p.tpotMs * 1e-7;

export const predictedLatencyScorer: Scorer = {
  name: "predicted-latency",
  better: "lower",
  tracksOwnCharges: true,
  score: (ctx) => predictions(ctx)?.map((x) => ttftScore(x.prediction)) ?? ctx.pods.map(() => undefined),
};

const valid = (ms: number | undefined): number | undefined => (ms !== undefined && ms > 0 && Number.isFinite(ms) ? ms : undefined);

/** Headroom against the targets (0 = just meets, 1 = free), or 1 + the relative excess of a pod that misses. */
export function targetScore(p: LatencyPrediction, t: SloTargets): number {
  let room = 1;
  let excess = 0;
  for (const [target, predicted] of [
    [valid(t.ttftMs), p.ttftMs],
    [valid(t.tpotMs), p.tpotMs],
  ] as const) {
    if (target === undefined) continue;
    const r = (target - predicted) / target;
    if (r < 0) excess = Math.max(excess, -r);
    else room = Math.min(room, r);
  }
  return excess > 0 ? 1 + excess : room;
}

export const predictedLatencyTargetsScorer: Scorer = {
  name: "predicted-latency-targets",
  better: "lower",
  tracksOwnCharges: true,
  score: (ctx) => {
    const all = predictions(ctx);
    if (!all) return ctx.pods.map(() => undefined);
    const t = ctx.slo;
    if (!t || (valid(t.ttftMs) === undefined && valid(t.tpotMs) === undefined)) return all.map((x) => ttftScore(x.prediction));
    return all.map((x) => targetScore(x.prediction, t));
  },
};

export const predictedLatencyStrategy = { ...scorerStrategy(predictedLatencyScorer, TRAITS), needs: { promptTokenIds: true } };
export const predictedLatencyTargetsStrategy = { ...scorerStrategy(predictedLatencyTargetsScorer, TRAITS), needs: { promptTokenIds: true } };

export const predictedLatencyPlugin: StrategyPlugin = fixedPlugin(predictedLatencyStrategy);
export const predictedLatencyTargetsPlugin: StrategyPlugin = fixedPlugin(predictedLatencyTargetsStrategy);

export type { LatencyReader };
