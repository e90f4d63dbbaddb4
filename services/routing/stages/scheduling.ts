/**
 * The scheduling stage: candidates (filters) -> strategy (scorers + picker) -> one pod, as a pure
 * function of the views and a few recorded inputs. The gateway calls it for every request and
 * `jetroute replay` calls it for every recorded decision, with the same inputs rebuilt from the
 * record and the streams — which is why everything a pick depends on is an explicit parameter
 * here: the clock reading, the seeded tie-break, the replica's rank, the prefix match.
 *
 * Filters, in order: the model must be known (404) and have ready pods (503); the proxy's
 * endpoint subset, when given, must leave one (503).
 */
import type { ChargeLedger } from "../../views/charge-ledger.js";
import type { LoadReader } from "../../views/load-view.js";
import type { PodInfo, PodSetReader } from "../../views/pod-set.js";
import type { UsageReader } from "../../views/usage-view.js";
import type { LatencyReader } from "../../views/latency-model.js";
import { mulberry32 } from "../../shared/seeded-random.js";
import { fnv1a32 } from "../../tokenizer/sim-tokenizer.js";
import { RouteError } from "../errors.js";
import { NoCandidateError, type Pick, type PrefixMatchInfo, type RoutingContext, type RoutingRequest, type SloTargets, type Strategy, tieOrderOf } from "../strategies/types.js";

/** How often every replica's tie order rotates (together). */
export const TIE_ROTATION_MS = 10_000;

export interface SchedulingViews {
  readonly pods: PodSetReader;
  readonly load: LoadReader;
  readonly ledger: Pick2<ChargeLedger, "outstanding">;
  readonly usage?: UsageReader;
  readonly latency?: LatencyReader;
}
type Pick2<T, K extends keyof T> = { [P in K]: T[P] };

/** A replica's place among the live gateways (ChargeLedger.rank), recorded with every decision. */
export interface Rank {
  readonly index: number;
  readonly count: number;
}

export interface PrefixMatchDetail {
  pod: string;
  indexBlocks: number;
  indexGpuBlocks: number;
  indexWeighted: number;
  routedBlocks: number;
}

export interface PrefixMatchResult {
  info: PrefixMatchInfo;
  /** The prompt's block hashes (recorded as a routed prefix for the chosen pod). */
  hashes: bigint[];
  /** Per candidate: blocks matched in the engine index and in the routed-prefix history. */
  detail: PrefixMatchDetail[];
}

export interface SchedulingInput {
  views: SchedulingViews;
  strategy: Strategy;
  request: RoutingRequest;
  /** Endpoints the proxy allows (Inference Extension subset hint); undefined = no restriction. */
  subset?: readonly string[];
  now: number;
  random: () => number;
  /** The replica's rank: with 2 or more live replicas, ties follow its tie order (TieOrder). */
  rank?: Rank;
  /** The prompt's prefix match over the candidates (prefix strategies only). */
  prefix?: (candidates: readonly PodInfo[]) => PrefixMatchResult | undefined;
  slo?: SloTargets;
}

export interface Scheduled {
  pick: Pick;
  candidates: readonly PodInfo[];
  prefixMatch?: PrefixMatchResult;
}

/**
 * The candidates for a model: ready pods, restricted to the proxy's subset. Throws the
 * client-facing RouteError. Strategies other than `pd` (`disaggregated: false`) see combined pods
 * when there are any; a fleet of prefill/decode pods only leaves them its vLLM pods (which serve a
 * plain request whole), never SGLang ones (a decode-mode SGLang server needs the bootstrap fields).
 */
export function candidatesFor(pods: PodSetReader, model: string, subset?: readonly string[], disaggregated = false): readonly PodInfo[] {
  if (!pods.knows(model)) throw new RouteError("unknownModel", `The model \`${model}\` does not exist.`, "model");
  let candidates = pods.readyPods(model);
  if (candidates.length === 0) throw new RouteError("noReadyPod", `no ready pod serves model \`${model}\``);
  if (!disaggregated && candidates.some((p) => p.role !== "combined")) {
    const combined = candidates.filter((p) => p.role === "combined");
    candidates = combined.length > 0 ? combined : candidates.filter((p) => p.engine === "vllm");
    if (candidates.length === 0) throw new RouteError("noReadyPod", `only SGLang prefill/decode pods serve model \`${model}\`: route it with routing-strategy pd`);
  }
  if (subset) {
    const allowed = new Set(subset);
    candidates = candidates.filter((p) => allowed.has(p.address));
    if (candidates.length === 0) throw new RouteError("noPodInSubset", `no ready pod of \`${model}\` is in the proxy's endpoint subset`);
  }
  return candidates;
}

export function schedule(i: SchedulingInput): Scheduled {
  const candidates = candidatesFor(i.views.pods, i.request.model, i.subset, i.strategy.traits?.disaggregated === true);
  const prefixMatch = i.prefix?.(candidates);
  const tieOrder = i.rank ? tieOrderOf(i.rank.index, i.rank.count, (Math.floor(i.now / TIE_ROTATION_MS) * 0.6180339887498949) % 1) : undefined;
  const pick = pickOrRefuse(i.strategy, {
    request: i.request,
    pods: candidates,
    load: i.views.load,
    ledger: i.views.ledger,
    ...(i.views.usage ? { usage: i.views.usage } : {}),
    ...(i.views.latency ? { latency: i.views.latency } : {}),
    now: i.now,
    random: i.random,
    ...(tieOrder ? { tieOrder } : {}),
    ...(prefixMatch ? { prefix: prefixMatch.info } : {}),
    ...(i.slo ? { slo: i.slo } : {}),
  });
  return { pick, candidates, ...(prefixMatch ? { prefixMatch } : {}) };
}

function pickOrRefuse(strategy: Strategy, ctx: RoutingContext): Pick {
  try {
    return strategy.pick(ctx);
  } catch (err) {
    if (err instanceof NoCandidateError) throw new RouteError("noReadyPod", err.message);
    throw err;
  }
}

/**
 * The tie-break sequence of one decision, seeded by the request id, the gateway and the charge
 * id (all in the decision record): replay draws the same numbers, so random picks reproduce.
 */
export function decisionRandom(requestId: string, gateway: string, chargeId: string): () => number {
  return mulberry32(fnv1a32(`${requestId}\u0000${gateway}\u0000${chargeId}`));
}
