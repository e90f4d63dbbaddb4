/**
 * `vtc-basic`: virtual-token-counter fairness. Each user's recent usage (weighted tokens over the
 * usage view's window: input ×1, output ×2, 5 minutes) places the user on a ring of the
 * candidates; requests go to the pod nearest that place, nudged by load. Light users share the
 * first pods of the ring, a heavy user's position moves on as it spends, so heavy users end up on
 * other pods than light ones, and the light users' requests do not queue behind theirs.
 *
 *   bucket   = max(1000, (min + max) / 2) over the active users' usage (1000 / 8000 when none)
 *   place    = (user tokens / bucket) mod n          (n = candidates, in pod-name order)
 *   fairness = ring distance between pod index i and place: min(|i - place|, n - |i - place|)
 *   load     = min(requests in flight / 100, 1)
 *   score    = fairness + load                        (lower is better)
 *
 * As AIBrix's vtc-basic, with two changes: load is the shared ledger's in-flight count (every
 * replica's, current at every pick) instead of the engine's running gauge, and exact ties are
 * broken at random by the picker rather than by adding noise to every score. Candidates are in
 * pod-name order (the pod set sorts them), the same on every replica, so every replica maps a
 * user to the same pod.
 *
 * Missing data: no `user` header, or no usage view wired -> least-request. The ledger part never
 * lacks a value.
 */
import { scorerStrategy } from "./combine.js";
import type { RoutingContext, Scorer } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

export const USER_HEADER = "user";
const MIN_BUCKET = 1_000;
const DEFAULT_MAX = 8_000;
const MAX_POD_LOAD = 100;

/** The user's place on the ring of `n` candidates, in [0, n). */
export function ringPlace(tokens: number, bucket: number, n: number): number {
  const x = (tokens / bucket) % n;
  return x < 0 ? x + n : x;
}

function vtcScores(ctx: RoutingContext): (number | undefined)[] {
  const user = ctx.request.user;
  if (!user || !ctx.usage) return ctx.pods.map(() => undefined);
  const b = ctx.usage.bounds(ctx.now);
  const bucket = Math.max(MIN_BUCKET, b.users > 0 ? (b.min + b.max) / 2 : (MIN_BUCKET + DEFAULT_MAX) / 2);
  const n = ctx.pods.length;
  const place = ringPlace(ctx.usage.tokens(user, ctx.now), bucket, n);
  return ctx.pods.map((pod, i) => {
    const d = Math.abs(i - place);
    const fairness = Math.min(d, n - d);
    const load = Math.min(ctx.ledger.outstanding(pod.model, pod.pod).requests / MAX_POD_LOAD, 1);
    return fairness + load;
  });
}

export const vtcBasicScorer: Scorer = { name: "vtc-basic", better: "lower", tracksOwnCharges: true, score: vtcScores };

/** Replay may not reproduce every pick: the usage bounds it reads are time-cached. */
export const vtcBasicStrategy = scorerStrategy(vtcBasicScorer, { replayResidual: "vtc-basic usage bounds (time-cached)" });

export const vtcBasicPlugin: StrategyPlugin = fixedPlugin(vtcBasicStrategy);
