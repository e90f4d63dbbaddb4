/**
 * The contract between the gateway and its routing strategies. Strategies are pure: they read
 * views through these read-only interfaces and never import NATS, gRPC, HTTP or the logger.
 *
 * Anatomy (as in the Inference Extension's EPP): a strategy is a scorer (one raw score per pod and
 * which end of the scale is better) plus a picker. Most strategies are exactly "the combination of
 * one scorer" (see combine.ts); a few need their own picker (random, power-of-two, slo*).
 */
import type { LedgerReader } from "../../views/charge-ledger.js";
import type { LatencyReader } from "../../views/latency-model.js";
import type { LoadReader } from "../../views/load-view.js";
import type { PodInfo } from "../../views/pod-set.js";
import type { UsageReader } from "../../views/usage-view.js";

export interface RoutingRequest {
  readonly model: string;
  readonly requestId: string;
  /** Rough prompt size in tokens (exact when a tokenizer ran). */
  readonly promptTokens: number;
  /** The requesting user (header `user`, or the API key's user), for fairness. */
  readonly user?: string;
  /** What the client said about its session (session-affinity), already decoded and hashed. */
  readonly session?: SessionHint;
}

/**
 * A request's session, as strategies may use it: the pod address an `x-session-id` names, and a
 * hash of `x-aibrix-session-key` (the key itself never reaches a strategy or a decision record).
 * Everything here is what a decision record keeps, so replay can hand strategies the same.
 */
export interface SessionHint {
  readonly address?: string;
  readonly keyHash?: string;
}

/** A model's latency targets, for the slo* strategies. Absent fields are not targeted. */
export interface SloTargets {
  /** Time to first token, ms. */
  readonly ttftMs?: number;
  /** Time per output token after the first, ms. */
  readonly tpotMs?: number;
}

export interface RoutingContext {
  readonly request: RoutingRequest;
  /** Ready candidates for the model, never empty when a strategy is called. */
  readonly pods: readonly PodInfo[];
  readonly load: LoadReader;
  readonly ledger: LedgerReader;
  readonly now: number;
  /** Uniform in [0, 1); injected so tests are deterministic. */
  readonly random: () => number;
  /**
   * How this replica breaks ties when several gateway replicas are live (set by the director;
   * absent: at random). See TieOrder.
   */
  readonly tieOrder?: TieOrder;
  /** Per-user token usage over a recent window (vtc-basic). Absent: vtc-basic falls back to least-request. */
  readonly usage?: UsageReader;
  /** The model's latency targets (slo*). Absent: the slo* strategies fall back to least-latency. */
  readonly slo?: SloTargets;
  /**
   * Cached-prefix match of this request's prompt per candidate (prefix-cache*), computed by the
   * director from the shared prefix index. Absent: the prefix strategies fall back to least-request.
   */
  readonly prefix?: PrefixMatchInfo;
  /** The latency model learned from the fleet's outcomes (predicted-latency*). Absent: they fall back to least-request. */
  readonly latency?: LatencyReader;
}

/**
 * A replica's walk round the candidate list when scores tie. A burst that reaches every replica
 * before any charge has travelled is split among them without coordination; each replica spreads
 * its own share evenly (it charges its picks at once), so what piles up is the remainders. The
 * candidates (sorted by pod name, the same on every replica) are cut into `slots` equal arcs;
 * replicas 2j and 2j+1 share arc j, the first filling it forwards from its start, the second
 * backwards from its end, so their remainders meet only when together they exceed the arc. All
 * replicas rotate the walk by the same `shift` so light traffic does not settle on one pod.
 */
export interface TieOrder {
  /** Arc boundary (0..slots) a forward walk starts at, or a reverse walk starts just before. */
  readonly boundary: number;
  readonly slots: number;
  readonly reverse: boolean;
  /** Rotation shared by all replicas, in [0, 1) of the list (applied in whole candidates). */
  readonly shift: number;
}

/** The tie order of replica `index` of `count` live replicas (sorted by id); none for one replica. */
export function tieOrderOf(index: number, count: number, shift: number): TieOrder | undefined {
  if (count < 2) return undefined;
  const reverse = index % 2 === 1;
  const arc = Math.floor(index / 2);
  return { boundary: reverse ? arc + 1 : arc, slots: Math.ceil(count / 2), reverse, shift };
}

/** How much of the request's prompt each candidate holds, from the prefix index. */
export interface PrefixMatchInfo {
  /** Full blocks in the prompt. */
  readonly queried: number;
  readonly blockSize: number;
  /** Matched leading blocks per pod name, weighted by tier (GPU = 1, CPU/storage less). */
  matched(pod: string): number;
}

export interface Scored {
  readonly pod: PodInfo;
  /** Strategy-specific score; documented per strategy; read it with `Pick.better` (lower when absent). */
  readonly score: number;
}

export interface Pick {
  readonly pod: PodInfo;
  /** The candidates the strategy weighed, with their scores, for the decision record and /debug/explain. */
  readonly candidates: readonly Scored[];
  /** Which end of `candidates[].score` is better. Absent = "lower" (the original contract). */
  readonly better?: Better;
  /** Headers the gateway must set on the response to the client (session-affinity's `x-session-id`). */
  readonly responseHeaders?: Readonly<Record<string, string>>;
  /** Set when the strategy could not apply its own rule and used another one (e.g. "least-request"). */
  readonly fallback?: string;
  /**
   * What the strategy wants run beyond sending the request to `pod` (the `pd` strategy's two-leg
   * plan, strategies/pd.ts `pdPlanOf`). Only strategies with `traits.disaggregated` set one.
   */
  readonly plan?: PickPlan;
}

/** A strategy's plan for the request beyond the pick; its owner reads it (e.g. `pdPlanOf`). */
export interface PickPlan {
  readonly kind: string;
}

/** What a strategy needs computed for it before it can pick (the director provides only that). */
export interface StrategyNeeds {
  /** The prompt's token ids, hence its block hashes and their prefix match (tokenization may be a network call). */
  readonly promptTokenIds?: boolean;
}

/**
 * What the code around a strategy may know about it: replay, metrics and the director read these,
 * never the strategy's name. A combination has the union of its parts' traits.
 */
export interface StrategyTraits {
  /** It reads the prefix match (prefix-cache*): its records keep the prompt's block hashes, and replay needs them whole. */
  readonly prefixMatch?: boolean;
  /**
   * Why replay may not reproduce its picks exactly from a record and the streams (absent: it
   * does). Shown as the residual of a pick replay could not reproduce.
   */
  readonly replayResidual?: string;
  /** Candidates include prefill and decode pods, and the pick carries a two-leg plan (P/D). */
  readonly disaggregated?: boolean;
}

export interface Strategy {
  /** The name the `routing-strategy` header selects (for a combination: its canonical spec). */
  readonly name: string;
  readonly needs?: StrategyNeeds;
  readonly traits?: StrategyTraits;
  pick(ctx: RoutingContext): Pick;
  /** The strategy's metric, for weighted combinations. Every built-in strategy has one. */
  readonly scorer?: Scorer;
  /** An exclusive strategy (slo*, pd) decides alone and cannot be part of a combination. */
  readonly exclusive?: boolean;
}

export type Better = "lower" | "higher";

/**
 * One metric over the candidates. `score` returns one raw value per `ctx.pods` entry, in order;
 * `undefined` means "no usable metric for this pod" (missing or stale sample): the picker then
 * treats the pod as the worst, and when no pod has a value the strategy falls back (combine.ts).
 */
export interface Scorer {
  readonly name: string;
  readonly better: Better;
  score(ctx: RoutingContext): readonly (number | undefined)[];
  /**
   * True when every charge this replica makes raises the charged pod's score at once (it is
   * read from the shared ledger). Only then may ties follow the replica's tie order: each pick
   * breaks the next tie. A score from scraped metrics stays put between samples, so a fixed
   * tie order would send every request to one pod; such scorers break ties at random.
   */
  readonly tracksOwnCharges?: boolean;
  /** Response headers to set once `picked` is chosen (by this scorer or by a combination containing it). */
  responseHeaders?(ctx: RoutingContext, picked: PodInfo): Readonly<Record<string, string>> | undefined;
}

/**
 * Picks among the entries sharing the best score: with a tie order (RoutingContext.tieOrder) the
 * first tied entry on the replica's walk round the list; else uniformly at random. `scored` must
 * not be empty.
 */
export function pickBest(scored: readonly Scored[], better: Better, random: () => number, order?: TieOrder): Scored {
  const sign = better === "lower" ? 1 : -1;
  let best = Number.POSITIVE_INFINITY;
  let ties = 0;
  for (const s of scored) {
    const v = sign * s.score;
    if (v < best) {
      best = v;
      ties = 1;
    } else if (v === best) ties++;
  }
  if (order !== undefined && ties > 1) {
    const n = scored.length;
    const b = Math.floor((order.boundary * n) / order.slots) + Math.floor(order.shift * n);
    const start = order.reverse ? b - 1 : b;
    const step = order.reverse ? -1 : 1;
    for (let k = 0; k < n; k++) {
      const s = scored[((((start + step * k) % n) + n) % n)] as Scored;
      if (sign * s.score === best) return s;
    }
  }
  let nth = Math.floor(random() * ties);
  for (const s of scored) {
    if (sign * s.score === best && nth-- === 0) return s;
  }
  return scored[0] as Scored;
}

/** A strategy found no pod it may pick among the ready ones (the scheduling stage answers 503). */
export class NoCandidateError extends Error {
  override name = "NoCandidateError";
}
