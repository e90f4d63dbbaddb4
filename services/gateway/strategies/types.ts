/**
 * The contract between the gateway and its routing strategies. Strategies are pure: they read
 * views through these read-only interfaces and never import NATS, gRPC, HTTP or the logger.
 */
import type { LedgerReader } from "../../views/charge-ledger.js";
import type { LoadReader } from "../../views/load-view.js";
import type { PodInfo } from "../../views/pod-set.js";

export interface RoutingRequest {
  readonly model: string;
  readonly requestId: string;
  /** Lower-cased request headers. */
  readonly headers: Readonly<Record<string, string>>;
  /** Rough prompt size in tokens (exact when a tokenizer ran). */
  readonly promptTokens: number;
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
}

export interface Scored {
  readonly pod: PodInfo;
  /** Strategy-specific score; documented per strategy (lower is better unless stated). */
  readonly score: number;
}

export interface Pick {
  readonly pod: PodInfo;
  /** Every candidate with its score, for the decision record and /debug/explain. */
  readonly candidates: readonly Scored[];
}

export interface Strategy {
  readonly name: string;
  pick(ctx: RoutingContext): Pick;
}

/** Picks uniformly among the entries sharing the lowest score. */
export function pickLowest(scored: readonly Scored[], random: () => number): Scored {
  let best = Number.POSITIVE_INFINITY;
  let ties = 0;
  for (const s of scored) {
    if (s.score < best) {
      best = s.score;
      ties = 1;
    } else if (s.score === best) ties++;
  }
  let nth = Math.floor(random() * ties);
  for (const s of scored) {
    if (s.score === best && nth-- === 0) return s;
  }
  return scored[0] as Scored;
}
