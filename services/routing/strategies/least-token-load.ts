/**
 * `least-token-load`: the pod with the least outstanding token work, from the shared ledger (every
 * gateway replica's charges), by AIBrix's TokenLoadTracker priority:
 *
 *   score = prefill tokens (prompts of requests with no first token yet: work still to do)
 *         + 0.3 x KV tokens (prompts of every request in flight: cache they hold until they end)
 *         + engine-reported waiting / 1000 (a tie-breaker, as in least-request)
 *
 * Unlike least-request it tells a pod with one 30 000-token prompt in prefill from a pod with
 * one short chat: what makes the next request's first token late is the prefill ahead of it.
 * Prompt sizes are the gateway's estimate (characters / 4) unless a tokenizer ran; a request
 * moves from prefill to decode at its first response chunk on its own replica, and on the others
 * at that replica's next heartbeat (at most one heartbeat interval later).
 *
 * Missing or stale metrics: the ledger always answers (0 for an idle pod), so it never falls back.
 */
import { tokenLoad } from "../../views/charge-ledger.js";
import { scorerStrategy } from "./combine.js";
import type { Scorer } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

export const leastTokenLoadScorer: Scorer = {
  name: "least-token-load",
  better: "lower",
  tracksOwnCharges: true,
  score: (ctx) =>
    ctx.pods.map((pod) => {
      const waiting = ctx.load.fresh(pod.model, pod.pod, ctx.now)?.waiting ?? 0;
      return tokenLoad(ctx.ledger.outstanding(pod.model, pod.pod)) + Math.min(Math.max(waiting, 0), 999) / 1000;
    }),
};

/** Replay may not reproduce every pick: the score moves at first tokens, which peers see a heartbeat later. */
export const leastTokenLoadStrategy = scorerStrategy(leastTokenLoadScorer, { replayResidual: "first-token timing" });

export const leastTokenLoadPlugin: StrategyPlugin = fixedPlugin(leastTokenLoadStrategy);
