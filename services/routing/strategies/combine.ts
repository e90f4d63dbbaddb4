/**
 * Scorers -> one pick. A single scorer picks by its raw scores; several are min-max normalised to
 * [0, 1] (lower-is-better inverted, so 1 is always best), weighted, summed, and the highest sum
 * wins. Exact ties are broken by the replica's tie order when a scorer tracks this replica's own
 * charges (types.ts, TieOrder), else at random.
 *
 * A single scorer is not normalised on purpose: its raw scores stay readable in the decision
 * record, and normalising one scorer would not change which pods tie for best.
 *
 * Missing metrics: a pod whose score is `undefined` is the worst for that scorer (normalised 0).
 * A scorer with no value for any pod says nothing: in a combination it adds nothing; when no
 * scorer has a value for any pod, the pick falls back to least-request (the shared ledger always
 * has a value).
 */
import { inFlightScorer } from "./in-flight.js";
import type { Better, Pick, RoutingContext, Scored, Scorer, Strategy, StrategyTraits } from "./types.js";
import { pickBest } from "./types.js";

export interface WeightedScorer {
  readonly scorer: Scorer;
  readonly weight: number;
}

/** A finite stand-in for "no value" in reported scores (JSON has no Infinity). */
export const worstScore = (better: Better): number => (better === "lower" ? Number.MAX_VALUE : -Number.MAX_VALUE);

/** The strategy that is a single scorer: "a combination of one". */
export function scorerStrategy(scorer: Scorer, traits?: StrategyTraits): Strategy {
  return { name: scorer.name, scorer, ...(traits ? { traits } : {}), pick: (ctx) => pickByScorers(ctx, [{ scorer, weight: 1 }]) };
}

export function combinationStrategy(name: string, parts: readonly WeightedScorer[]): Strategy {
  return { name, pick: (ctx) => pickByScorers(ctx, parts) };
}

export function pickByScorers(ctx: RoutingContext, parts: readonly WeightedScorer[]): Pick {
  const raw = parts.map((p) => p.scorer.score(ctx));
  const informative = raw.map((r) => r.some((v) => v !== undefined));
  if (!informative.includes(true)) return withHeaders(ctx, parts, { ...leastRequestPick(ctx), fallback: inFlightScorer.name });
  if (parts.length === 1) {
    const { scorer } = parts[0] as WeightedScorer;
    const scores = raw[0] as readonly (number | undefined)[];
    const candidates = ctx.pods.map((pod, i) => ({ pod, score: scores[i] ?? worstScore(scorer.better) }));
    const eligible = candidates.filter((_, i) => scores[i] !== undefined);
    return withHeaders(ctx, parts, { pod: pickBest(eligible, scorer.better, ctx.random, scorer.tracksOwnCharges ? ctx.tieOrder : undefined).pod, candidates, better: scorer.better });
  }
  const total = new Array<number>(ctx.pods.length).fill(0);
  parts.forEach((part, j) => {
    if (!informative[j]) return;
    const norm = normalise(raw[j] as readonly (number | undefined)[], part.scorer.better);
    for (let i = 0; i < total.length; i++) total[i] = (total[i] as number) + part.weight * (norm[i] as number);
  });
  const candidates = ctx.pods.map((pod, i) => ({ pod, score: total[i] as number }));
  const order = parts.some((part, j) => informative[j] && part.scorer.tracksOwnCharges) ? ctx.tieOrder : undefined;
  return withHeaders(ctx, parts, { pod: pickBest(candidates, "higher", ctx.random, order).pod, candidates, better: "higher" });
}

/**
 * Min-max normalisation onto [0, 1] with 1 = best. Missing values get 0. When every present
 * value is equal the scorer cannot tell the pods apart: they all get 1.
 */
export function normalise(scores: readonly (number | undefined)[], better: Better): number[] {
  let min = Number.POSITIVE_INFINITY;
  let max = Number.NEGATIVE_INFINITY;
  for (const v of scores) {
    if (v === undefined) continue;
    if (v < min) min = v;
    if (v > max) max = v;
  }
  const span = max - min;
  return scores.map((v) => {
    if (v === undefined) return 0;
    if (!(span > 0) || !Number.isFinite(span)) return 1;
    return better === "lower" ? (max - v) / span : (v - min) / span;
  });
}

function leastRequestPick(ctx: RoutingContext): Pick {
  const scores = inFlightScorer.score(ctx);
  const candidates: Scored[] = ctx.pods.map((pod, i) => ({ pod, score: scores[i] ?? 0 }));
  return { pod: pickBest(candidates, "lower", ctx.random, ctx.tieOrder).pod, candidates };
}

/** Lets every scorer of the pick add its response headers for the pod finally chosen. */
export function withHeaders(ctx: RoutingContext, parts: readonly WeightedScorer[], pick: Pick): Pick {
  let headers: Record<string, string> | undefined;
  for (const { scorer } of parts) {
    const h = scorer.responseHeaders?.(ctx, pick.pod);
    if (h) headers = { ...headers, ...h };
  }
  return headers ? { ...pick, responseHeaders: headers } : pick;
}


