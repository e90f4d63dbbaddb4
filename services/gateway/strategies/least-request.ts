import { type Pick, pickLowest, type RoutingContext, type Strategy } from "./types.js";

/**
 * `least-request`: fewest requests in flight, counting every gateway replica's outstanding
 * charges from the shared ledger (not only this replica's, which is AIBrix's weakness).
 *
 * Score = ledger requests + engine-reported waiting / 1000. The ledger already counts the
 * requests the engine is running for us, so engine counts only break ties, preferring a pod
 * whose queue (perhaps from traffic that bypassed the gateways) is shorter. Missing or stale
 * load samples add nothing: the ledger alone decides. Remaining ties are broken at random.
 */
export const leastRequestStrategy: Strategy = {
  name: "least-request",
  pick(ctx: RoutingContext): Pick {
    const candidates = ctx.pods.map((pod) => {
      const inFlight = ctx.ledger.outstanding(pod.model, pod.pod).requests;
      const waiting = ctx.load.fresh(pod.model, pod.pod, ctx.now)?.waiting ?? 0;
      return { pod, score: inFlight + Math.min(waiting, 999) / 1000 };
    });
    return { pod: pickLowest(candidates, ctx.random).pod, candidates };
  },
};
