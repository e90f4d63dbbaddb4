/**
 * What the routing core needs from outside, as small interfaces: the views it reads, where its
 * events go, and the optional helpers a shell plugs in (prefix matching, embeddings, model
 * rewrites). The gateway implements them over NATS and HTTP; replay and unit tests in memory.
 */
import type { ChargeEvent, DecisionRecord, ReleaseEvent } from "../../schemas/events.js";
import type { ChargeLedger } from "../views/charge-ledger.js";
import type { LatencyModel } from "../views/latency-model.js";
import type { LoadView } from "../views/load-view.js";
import type { PodInfo, PodSet } from "../views/pod-set.js";
import type { RateView } from "../views/rate-view.js";
import type { UsageView } from "../views/usage-view.js";
import type { promptInputOf, TokenIds } from "../tokenizer/prompt-tokens.js";
import type { PromptBlocks } from "./request.js";
import type { PrefixMatchResult } from "./stages/scheduling.js";

export interface GatewayViews {
  pods: PodSet;
  load: LoadView;
  ledger: ChargeLedger;
  /** Per-user token usage across all replicas (vtc-basic fairness). */
  usage: UsageView;
  /** Request and token counts for rate limits, across all replicas. */
  rates: RateView;
  /** The latency model (predicted-latency*, and the prediction every decision record carries). */
  latency?: LatencyModel;
}

/** Where the core's events go (JetStream in production, an array in unit tests). */
export interface EventSink {
  charge(ev: ChargeEvent): void;
  release(ev: ReleaseEvent): void;
  decision(rec: DecisionRecord): void;
}

/**
 * Where the semantic stage's embeddings come from (the gateway's client of the embedding model's
 * pods, with its cache). Never rejects: a slow or absent embedding model resolves undefined, and
 * the similarity signals fall back to their lexical scores.
 */
export interface EmbeddingSource {
  /** Every text's embedding if all are cached (the request then stays synchronous), else undefined. */
  cached(model: string, texts: readonly string[]): ReadonlyMap<string, ArrayLike<number>> | undefined;
  embed(model: string, texts: readonly string[], timeoutMs: number): Promise<ReadonlyMap<string, ArrayLike<number>> | undefined>;
}

/** What prefix-aware routing needs (absent: prefix strategies fall back). */
export interface PrefixSupport {
  tokenizer: {
    tokenize(model: string, input: ReturnType<typeof promptInputOf>, address: string | undefined): Promise<{ tokens: TokenIds; mode: string }>;
    /** The model's configured mode (a `remote` request may still fall back to approximate). */
    modeFor?(model: string): string;
  };
  /** `cacheSalt`: the request's `cache_salt`, part of its first block's key as in the engine's. */
  match(model: string, candidates: readonly PodInfo[], tokens: TokenIds, now: number, tokenizerMode?: string, cacheSalt?: string): PrefixMatchResult;
  recordRouted(pod: PodInfo, hashes: readonly bigint[], now: number, chargeId: string): void;
  /** The prompt's block hashes for `pod` (decision records of strategies that do not match prefixes). */
  blocks(model: string, pod: PodInfo, tokens: TokenIds, now: number, tokenizerMode: string | undefined, cacheSalt?: string): PromptBlocks;
}

/**
 * InferenceModelRewrite (docs/inference-pool.md; the gateway's pool policies view): the model a
 * request for `model` is routed for instead, chosen per request id. `active()` false: none defined.
 */
export interface ModelRewrites {
  active(): boolean;
  rewrite(model: string, requestId: string): { model: string; rule: string; pool: string } | undefined;
}

/**
 * The Responses API's response store (the gateway's JetStream store, docs/stateful-apis.md):
 * a stored turn of one tenant by id. Absent: `previous_response_id` is forwarded as the client
 * sent it and the engine alone decides.
 */
export interface ResponseState {
  /** `owner`'s stored response `id` (undefined: absent, deleted, expired, another tenant's). Rejects when the store cannot be read. */
  stored(owner: string, id: string): Promise<StoredTurn | undefined>;
}

/** A stored turn as routing reads it. */
export interface StoredTurn {
  readonly id: string;
  readonly model: string;
  /** The pod that produced it. */
  readonly pod?: string;
  readonly previousResponseId?: string;
  readonly input: ReadonlyArray<Record<string, unknown>>;
  readonly output: ReadonlyArray<Record<string, unknown>>;
}

/** A gateway's pool (streams/pools.ts). */
export interface PoolIdentity {
  /** This gateway's pool; undefined = unpooled (the base namespace). */
  pool?: string;
  /** `--models`: the pool's models given on the command line, instead of the config's list. */
  models?: ReadonlySet<string>;
}
