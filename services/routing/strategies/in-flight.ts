/**
 * Requests in flight per pod: least-request's scorer, and every strategy's last resort because it
 * never lacks a value (the shared ledger always answers, with 0 for an idle pod).
 *
 * Score = ledger requests + engine-reported waiting / 1000. The ledger counts every gateway
 * replica's outstanding charges (not only this replica's, which is AIBrix's weakness) and already
 * includes the requests the engine is running for us, so engine counts only break ties, preferring
 * a pod whose queue (perhaps from traffic that bypassed the gateways) is shorter. Missing or stale
 * load samples add nothing: the ledger alone decides.
 */
import type { PodInfo } from "../../views/pod-set.js";
import type { RoutingContext, Scorer } from "./types.js";

export function inFlightScore(ctx: RoutingContext, pod: PodInfo): number {
  const inFlight = ctx.ledger.outstanding(pod.model, pod.pod).requests;
  const waiting = ctx.load.fresh(pod.model, pod.pod, ctx.now)?.waiting ?? 0;
  return inFlight + Math.min(Math.max(waiting, 0), 999) / 1000;
}

export const inFlightScorer: Scorer = {
  name: "least-request",
  better: "lower",
  tracksOwnCharges: true,
  score: (ctx) => ctx.pods.map((pod) => inFlightScore(ctx, pod)),
};
