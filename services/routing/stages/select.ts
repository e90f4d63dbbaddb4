/**
 * The select stage, first of the commit section: the charge id and the views' cursors the decision
 * is made on, then the candidates, the prefix match and the strategy's pick (scheduling.ts),
 * charging nothing. /debug/explain runs `selectPod` alone, with `stagger: false` (ties broken by
 * `random` alone, so every replica explains a request the same way).
 */
import type { PodInfo } from "../../views/pod-set.js";
import { promptTokensOf, requestIdOf, type PlannedContext, type SelectedContext } from "../context.js";
import { RouteError } from "../errors.js";
import type { SectionStage, StageEnv } from "../pipeline.js";
import { routingRequestOf } from "../strategies/request.js";
import { decisionRandom, schedule } from "./scheduling.js";

export function selectPod(ctx: PlannedContext, env: StageEnv, o: { random?: () => number; stagger: boolean; chargeId: string }): SelectedContext {
  const { parsed, strategy } = ctx;
  const requestId = requestIdOf(ctx);
  const now = env.now();
  const t0 = performance.now();
  const rank = o.stagger ? env.views.ledger.rank(env.serverNow?.() ?? now) : undefined;
  const prefix = env.prefix;
  const tokens = ctx.tokens;
  const request = routingRequestOf(parsed.model, requestId, ctx.input.headers, promptTokensOf(ctx), () => env.views.pods.readyPods(parsed.model));
  const { pick, prefixMatch } = schedule({
    views: env.views,
    strategy,
    request,
    ...(ctx.subset ? { subset: ctx.subset } : {}),
    now,
    random: o.random ?? decisionRandom(requestId, env.gatewayId, o.chargeId),
    ...(rank && rank.count > 1 ? { rank } : {}),
    ...(tokens && prefix ? { prefix: (candidates: readonly PodInfo[]) => prefix.match(parsed.model, candidates, tokens, now, ctx.tokenizerMode, parsed.cacheSalt) } : {}),
    ...(ctx.slo ? { slo: ctx.slo } : {}),
  });
  env.onPick?.(strategy.name, (performance.now() - t0) / 1000);
  ctx.now = now;
  ctx.pick = pick;
  ctx.routingRequest = request;
  ctx.chargeId = o.chargeId;
  ctx.cursors ??= { ...env.state.cursors };
  if (rank && rank.count > 1) ctx.rank = rank;
  else delete ctx.rank;
  if (prefixMatch) ctx.prefixMatch = prefixMatch;
  else delete ctx.prefixMatch;
  return ctx as SelectedContext;
}

export const selectStage: SectionStage = {
  name: "select",
  phase: "commit",
  run(ctx, env): undefined {
    // A request that was tokenized or held by a rate limit across a shutdown is not charged.
    if (env.lifecycle.closed) throw new RouteError("notReady", "gateway is shutting down");
    const chargeId = env.lifecycle.nextChargeId();
    // The views' cursors at the moment of the decision (before this request's own events).
    ctx.cursors = { ...env.state.cursors };
    selectPod(ctx, env, { stagger: true, chargeId });
    return undefined;
  },
};
