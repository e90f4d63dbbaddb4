/**
 * `slo`, `slo-least-load`, `slo-pack-load`: meet the model's latency targets (`ctx.slo`: TTFT and
 * TPOT in ms). Each candidate's TTFT and TPOT for this request are estimated from its load and
 * histograms (metrics.ts: queue from the mean queue time or the current backlog, prefill scaled
 * by this prompt, TPOT = mean inter-token latency, ×1.5 above 90% KV usage where preemption
 * starts). A pod meets the targets when every given target >= its estimate. Its headroom is the
 * smallest (target - estimate) / target over the given targets: 0 = just meets, 1 = idle.
 *
 * Among the pods that meet the targets:
 *   slo             fewest requests in flight (least-request over the shared ledger)
 *   slo-least-load  the most headroom (spread load; lowest latency for this request)
 *   slo-pack-load   the least headroom (bin packing: fill the pods that still meet the target,
 *                   keep the others free for bursts or for scaling in)
 * Ties: random. Candidates report their headroom (higher is better; pods without an estimate get
 * the worst value); the pick rule is the one above, not always the highest.
 *
 * AIBrix's `slo` queues requests at the gateway and uses offline latency profiles; here Envoy
 * holds the request, so the gateway routes at once, and the estimates come from live metrics.
 *
 * Fallbacks: no targets, or no pod meets them (or none has the metrics to tell) -> least-latency
 * (itself -> least-request without metrics). Exclusive: not combinable with other strategies.
 */
import { worstScore } from "./combine.js";
import { inFlightScore } from "./in-flight.js";
import { leastLatencyStrategy, latencyEstimates } from "./least-latency.js";
import { estimateTpotS } from "./metrics.js";
import type { Pick, RoutingContext, Scored, Scorer, SloTargets, Strategy } from "./types.js";
import { pickBest } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

type Rule = "least-request" | "least-load" | "pack-load";

/** A target that is not a positive number (0, negative, NaN) is treated as not set. */
const target = (ms: number | undefined): number | undefined => (ms !== undefined && ms > 0 && Number.isFinite(ms) ? ms : undefined);
const hasTargets = (t: SloTargets | undefined): t is SloTargets => !!t && (target(t.ttftMs) !== undefined || target(t.tpotMs) !== undefined);

/** Headroom of each candidate against the targets; undefined when a targeted estimate is missing. */
export function headrooms(ctx: RoutingContext, targets: SloTargets): (number | undefined)[] {
  const ttftMs = target(targets.ttftMs);
  const tpotMs = target(targets.tpotMs);
  return latencyEstimates(ctx).map((e) => {
    let room = Number.POSITIVE_INFINITY;
    if (ttftMs !== undefined) {
      if (e.ttftS === undefined) return undefined;
      room = Math.min(room, (ttftMs - 1000 * e.ttftS) / ttftMs);
    }
    if (tpotMs !== undefined) {
      const tpotS = e.means && e.load ? estimateTpotS(e.means, e.load.kvCacheUsage) : undefined;
      if (tpotS === undefined) return undefined;
      room = Math.min(room, (tpotMs - 1000 * tpotS) / tpotMs);
    }
    return room === Number.POSITIVE_INFINITY ? undefined : room;
  });
}

function makeSloStrategy(name: string, rule: Rule): Strategy {
  const scorer: Scorer = {
    name,
    better: "higher",
    score: (ctx) => (hasTargets(ctx.slo) ? headrooms(ctx, ctx.slo) : ctx.pods.map(() => undefined)),
  };
  return {
    name,
    scorer,
    exclusive: true,
    pick(ctx: RoutingContext): Pick {
      const room = scorer.score(ctx);
      const meeting: Scored[] = [];
      ctx.pods.forEach((pod, i) => {
        const r = room[i];
        if (r !== undefined && r >= 0) meeting.push({ pod, score: rule === "least-request" ? inFlightScore(ctx, pod) : r });
      });
      if (meeting.length === 0) {
        const p = leastLatencyStrategy.pick(ctx);
        return { ...p, fallback: p.fallback ?? leastLatencyStrategy.name };
      }
      const better = rule === "least-load" ? "higher" : "lower";
      const candidates = ctx.pods.map((pod, i) => ({ pod, score: room[i] ?? worstScore("higher") }));
      return { pod: pickBest(meeting, better, ctx.random).pod, candidates, better: "higher" };
    },
  };
}

export const sloStrategy = makeSloStrategy("slo", "least-request");
export const sloLeastLoadStrategy = makeSloStrategy("slo-least-load", "least-load");
export const sloPackLoadStrategy = makeSloStrategy("slo-pack-load", "pack-load");

export const sloPlugin: StrategyPlugin = fixedPlugin(sloStrategy);
export const sloLeastLoadPlugin: StrategyPlugin = fixedPlugin(sloLeastLoadStrategy);
export const sloPackLoadPlugin: StrategyPlugin = fixedPlugin(sloPackLoadStrategy);
