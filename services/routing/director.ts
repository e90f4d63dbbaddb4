/**
 * The director: everything between "a request body arrived" and "these headers go back to Envoy",
 * and the request's end. It never imports Envoy, NATS or HTTP types: the ext_proc adapter calls
 * it, and it speaks to the streams only through an `EventSink`.
 *
 * Selection and charging happen in one synchronous call: no await between reading the ledger and
 * recording the charge, so two requests in this replica can never both see a pod as idle.
 */
import { randomUUID } from "node:crypto";
import type { ChargeEvent, DecisionRecord, ReleaseEvent, ReleaseOutcome } from "../../schemas/events.js";
import type { ChargeLedger } from "../views/charge-ledger.js";
import type { LoadView } from "../views/load-view.js";
import type { PodInfo, PodSet } from "../views/pod-set.js";
import { RouteError } from "./errors.js";
import { promptInputOf } from "../tokenizer/prompt-tokens.js";
import type { UsageView } from "../views/usage-view.js";
import type { ConfigReader } from "../views/model-config.js";
import { type RateView, rateUserOf } from "../views/rate-view.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { LatencyModel, LatencyPrediction } from "../views/latency-model.js";
import { featureVector, latencyFeaturesOf } from "./strategies/predicted-latency.js";
import { findStrategy, strategyNames } from "./strategies/registry.js";
import { type ParsedInput, parseInput, planRoute } from "./stages/parse.js";
import { actionHeaders, applyAction, classify as classifySemantic, DECISION_HEADER, requestTexts, type SemanticOutcome, tagError } from "./stages/semantic.js";
import { type CompiledRules, compiledRulesFor } from "./semantic/rules.js";
import { embeddingTextsOf } from "./semantic/signals.js";
import { routingRequestOf } from "./strategies/request.js";
import type { Pick, RoutingRequest } from "./strategies/types.js";
import { Admission, type AdmissionClock } from "./stages/admission.js";
import { misdirected, type PoolIdentity } from "./stages/pool-check.js";
import { type Committer, EventualCommitter } from "./stages/commit.js";
import { decisionRandom, type PrefixMatchResult, type Rank, schedule } from "./stages/scheduling.js";
import { type LegClient, type PdLegOptions, PdLegs } from "./stages/pd-legs.js";
import { pdPlanOf } from "./strategies/pd.js";
import { PdCoordinator } from "./stages/pd-coordinator.js";
import { tokenizerPodFor } from "./stages/tokenizer-pod.js";
import { rejectedRecord, routedRecord } from "./decision-record.js";
import { refuseBatch } from "./stages/pd-bodies.js";
import { chargeIdOf } from "./charge-id.js";
import { FlowController, type FlowHooks, type FlowLimits, type Held } from "./flow/controller.js";
import { contextRefusal } from "./flow/context-length.js";
import { heldBytesOf } from "./flow/held-bytes.js";
import type { FleetQueues } from "./flow/fleet.js";
import { classify } from "./flow/settings.js";

export type { PrefixMatchResult } from "./stages/scheduling.js";
export type { DecisionContext, FinishInfo, OwnAdmissionKey, Prepared, PromptBlocks, RoutedRequest, RouteInput } from "./request.js";
import type { FinishInfo, Prepared, PromptBlocks, RecordedPrediction, RoutedRequest, RouteInput } from "./request.js";

export { MAX_REQUEST_ID_LENGTH, MAX_USER_LENGTH } from "./stages/parse.js";

const round2 = (x: number) => Math.round(x * 100) / 100;

const recordedPrediction = (p: LatencyPrediction, pod: PodInfo): RecordedPrediction => ({ ttftMs: round2(p.ttftMs), tpotMs: round2(p.tpotMs), source: p.source, ...(pod.podClass ? { podClass: pod.podClass } : {}) });

/**
 * The release's latency sample (docs/latency-model.md): a completed streamed request's features
 * and the TTFT and TPOT it saw. Not for a P/D leg (its TTFT spans two pods), nor for a request
 * answered whole (its first bytes are its last: no TTFT).
 */
function latencySampleOf(r: RoutedRequest, outcome: ReleaseOutcome, info: FinishInfo, now: number): { latency?: ReleaseEvent["latency"] } {
  if (!r.latency || outcome !== "completed" || r.pd || r.stream !== true) return {};
  const ttft = r.firstChunkAt !== undefined ? r.firstChunkAt - r.startedAt : undefined;
  const tokens = info.completionTokens;
  const tpot = r.firstChunkAt !== undefined && tokens !== undefined && tokens > 1 ? (now - r.firstChunkAt) / (tokens - 1) : undefined;
  return { latency: { ...r.latency, ...(ttft !== undefined ? { ttftMs: round2(ttft) } : {}), ...(tpot !== undefined ? { tpotMs: round2(tpot) } : {}) } };
}

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

/** Where the director's events go (JetStream in production, an array in unit tests). */
export interface EventSink {
  charge(ev: ChargeEvent): void;
  release(ev: ReleaseEvent): void;
  decision(rec: DecisionRecord): void;
}

export interface DirectorOptions {
  gatewayId: string;
  defaultStrategy: string;
  chargeTtlMs: number;
  /** The fold this director reads its views from and applies its own events to. */
  state: GatewayState;
  sink: EventSink;
  now?: () => number;
  /** The admission stage's clock and timer (default: the system's; `now` alone sets only the clock). */
  clock?: AdmissionClock;
  prefix?: PrefixSupport;
  /** Model configs (locked strategy, profiles); absent: header, then the default. */
  config?: ConfigReader;
  /** Gateway pools: this gateway's pool (absent: unpooled); requests for another pool's model get 421. */
  pool?: PoolIdentity;
  /** Observes how long each pick took (seconds). */
  onPick?: (strategy: string, seconds: number) => void;
  /**
   * Tokenize and hash every prompt for its decision record, also under strategies that do not
   * need it (after routing, off its path), so replay can ask "what would prefix-cache have hit".
   * Default true; with `remote` tokenization it costs an engine /tokenize call per uncached prompt.
   */
  recordPromptBlocks?: boolean;
  /** The broker's time (liveness of peers is read on it); default: the director's clock. */
  serverNow?: () => number;
  /** Whether a model commits its charges in strict mode (its config's `consistency`, else the gateway's). */
  strictFor?: (model: string) => boolean;
  /** `off`: this replica counts only its own charges (recorded in decision records). */
  consistency?: "eventual" | "strict" | "off";
  /** P/D: how the gateway sends prefill legs (absent: a `pd` plan routes decode only, the decode pod computing the prompt). */
  pdLegClient?: LegClient;
  /**
   * Runs publishing that may follow the reply to the proxy (a completed prefill leg's decision
   * record). Default: setImmediate, which runs after the reply's write was handed to the socket.
   */
  defer?: (fn: () => void) => void;
  pdLegOptions?: Partial<PdLegOptions>;
  /** Flow control (routing/flow/): the other replicas' queue summaries, and what to count. Absent: a lone replica's own order. */
  flow?: { fleet?: FleetQueues; hooks?: FlowHooks; limits?: FlowLimits };
  /** Embeddings for virtual models' `similarity` signals (absent: their lexical fallback). */
  embeddings?: EmbeddingSource;
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


/** What the director needs for prefix-aware routing (absent: prefix strategies fall back). */
export interface PrefixSupport {
  tokenizer: {
    tokenize(model: string, input: ReturnType<typeof promptInputOf>, address: string | undefined): Promise<{ tokens: number[]; mode: string }>;
    /** The model's configured mode (a `remote` request may still fall back to approximate). */
    modeFor?(model: string): string;
  };
  /** `cacheSalt`: the request's `cache_salt`, part of its first block's key as in the engine's. */
  match(model: string, candidates: readonly PodInfo[], tokens: readonly number[], now: number, tokenizerMode?: string, cacheSalt?: string): PrefixMatchResult;
  recordRouted(pod: PodInfo, hashes: readonly bigint[], now: number, chargeId: string): void;
  /** The prompt's block hashes for `pod` (decision records of strategies that do not match prefixes). */
  blocks(model: string, pod: PodInfo, tokens: readonly number[], now: number, tokenizerMode: string | undefined, cacheSalt?: string): PromptBlocks;
}


export interface Selection {
  requestId: string;
  now: number;
  pick: Pick;
  /** The request as the strategy saw it. */
  request: RoutingRequest;
  /** The rank the tie order came from (only with 2 or more live replicas). */
  rank?: Rank;
  prefixMatch?: PrefixMatchResult;
}

export class Director {
  readonly gatewayId: string;
  /** The views routing reads (the state's). */
  readonly views: GatewayViews;
  private readonly now: () => number;
  private readonly admission: Admission;
  /** Requests routed and not yet finished, by charge id (drained on shutdown). */
  readonly inFlight = new Map<string, RoutedRequest>();
  /** P/D: the prefill legs' charges and records (stages/pd-coordinator.ts). */
  readonly pd: PdCoordinator;
  /** Flow control: the requests this replica holds while their model's pods are saturated. */
  readonly flow: FlowController;

  /** Finished requests whose SGLang prefill leg is still out (its charge is released when it returns). */
  get lingering(): ReadonlySet<RoutedRequest> {
    return this.pd.lingering;
  }

  /** Every request holding a charge of this replica: what heartbeats list. */
  *holdingCharges(): Iterable<RoutedRequest> {
    yield* this.inFlight.values();
    yield* this.pd.lingering;
  }
  private chargeSeq = 0;
  /** Charges made so far (the number in the last charge id): the release batcher stamps releases with it. */
  get chargesMade(): number {
    return this.chargeSeq;
  }

  constructor(private readonly opts: DirectorOptions) {
    if (!findStrategy(opts.defaultStrategy)) {
      throw new Error(`unknown default strategy ${JSON.stringify(opts.defaultStrategy)}; known: ${strategyNames().join(", ")}`);
    }
    this.gatewayId = opts.gatewayId;
    this.views = opts.state;
    this.now = opts.now ?? Date.now;
    const serverNow = opts.serverNow;
    // Peers' liveness (the rank the burst guard counts) on the broker's time; windows on ours.
    const admissionViews = serverNow ? { rates: opts.state.rates, pods: opts.state.pods, ledger: { rank: () => opts.state.ledger.rank(serverNow()) } } : opts.state;
    this.admission = new Admission(admissionViews, opts.config, opts.clock ?? { now: this.now, setTimeout: (fn, ms) => void setTimeout(fn, ms) });
    this.flow = new FlowController({ views: opts.state, config: opts.config, fleet: opts.flow?.fleet, now: this.now, ...(opts.flow?.hooks ? { hooks: opts.flow.hooks } : {}), ...(opts.flow?.limits ? { limits: opts.flow.limits } : {}) });
    this.pd = new PdCoordinator({
      gatewayId: opts.gatewayId,
      state: opts.state,
      views: opts.state,
      sink: opts.sink,
      now: this.now,
      ...(opts.prefix ? { recordRouted: (pod: PodInfo, hashes: readonly bigint[], at: number, id: string) => opts.prefix?.recordRouted(pod, hashes, at, id) } : {}),
      defer: opts.defer ?? ((fn) => void setImmediate(fn)),
    });
    if (opts.pdLegClient) {
      this.legs = new PdLegs(
        opts.pdLegClient,
        {
          endPrefill: (r, outcome, status, afterReply) => this.pd.endPrefill(r, outcome, status, afterReply),
          retryPrefill: (r) => this.pd.retryPrefill(r),
          fail: (r, err) => {
            this.finish(r, err.kind === "clientCancelled" ? "cancelled" : "error", { status: err.status, errorCode: err.code });
          },
          now: this.now,
        },
        opts.pdLegOptions,
      );
    }
  }

  /** P/D plans made: disaggregated, prefill skipped by the decider, combined fallbacks, unusable rolesets seen. */
  get pdStats(): PdCoordinator["stats"] {
    return this.pd.stats;
  }

  /** The P/D legs stage (absent without a leg client). */
  readonly legs: PdLegs | undefined;

  /**
   * Everything about a request that does not depend on the views: the parsed body, the strategy,
   * and — for prefix strategies — the prompt's token ids (which may take a call to an engine's
   * /tokenize, hence a promise). Throws RouteError for anything the client must be told.
   */
  prepare(input: RouteInput): Prepared | Promise<Prepared> {
    const parsedInput = parseInput(input.headers, input.body, input.tenantSalt);
    const virtual = this.opts.config?.get(parsedInput.parsed.model)?.semantic;
    if (!virtual) return this.plan(input, parsedInput, input.headers);
    // A virtual model: the semantic stage chooses the model, then everything below runs on it.
    const rules = compiledRulesFor(parsedInput.parsed.model, virtual);
    const texts = requestTexts(rules, parsedInput.parsed);
    const embed = this.opts.embeddings;
    const need = rules.embeddingModel && embed ? embeddingTextsOf(rules, texts) : [];
    if (need.length === 0 || !embed || !rules.embeddingModel) return this.planSemantic(input, parsedInput, rules, texts, undefined);
    // Embeddings are the one signal that needs I/O: fetched (or found cached) before the synchronous decision.
    const cached = embed.cached(rules.embeddingModel, need);
    if (cached) return this.planSemantic(input, parsedInput, rules, texts, cached);
    return embed.embed(rules.embeddingModel, need, rules.embeddingTimeoutMs).then((v) => this.planSemantic(input, parsedInput, rules, texts, v));
  }

  /** The semantic stage (stages/semantic.ts) on a parsed request for a virtual model, then the plan of the model it chose. */
  private planSemantic(input: RouteInput, p: ParsedInput, rules: CompiledRules, texts: ReturnType<typeof requestTexts>, embeddings: ReadonlyMap<string, ArrayLike<number>> | undefined): Prepared | Promise<Prepared> {
    const user = input.headers.user || undefined;
    const outcome = classifySemantic(rules, p.parsed, { headers: input.headers, ...(user ? { user } : {}), ...(input.keyClass ? { keyClass: input.keyClass } : {}), ...(embeddings ? { embeddings } : {}) }, texts);
    const parsed = applyAction(p.parsed, outcome.action);
    // One serialisation of the rewritten body: Envoy forwards it (content-length set by the adapter).
    const rewritten: ParsedInput = { parsed, upstreamBody: Buffer.from(JSON.stringify(parsed.body)) };
    try {
      return this.plan(input, rewritten, actionHeaders(input.headers, outcome.action), outcome);
    } catch (err) {
      // A refusal of the chosen model (pool, permissions, limits) is recorded with the classification that chose it.
      if (err instanceof RouteError) tagError(err, outcome);
      throw err;
    }
  }

  /** A parsed request's plan on its (real) model: strategy, pool, permissions, limits, prompt tokens. */
  private plan(input: RouteInput, p: ParsedInput, headers: Readonly<Record<string, string>>, semantic?: SemanticOutcome): Prepared | Promise<Prepared> {
    const planned = planRoute(p, headers, this.opts.config, this.opts.defaultStrategy);
    const base: Prepared = semantic ? { ...planned, semantic } : planned;
    const { parsed, strategy, rps } = base;
    const wrongPool = misdirected(parsed.model, this.opts.pool ?? {}, this.opts.state);
    if (wrongPool) throw wrongPool;
    if (input.keyModels && !input.keyModels.includes(parsed.model)) {
      const via = semantic ? ` (chosen by decision ${JSON.stringify(semantic.decision)} of the virtual model ${JSON.stringify(semantic.virtualModel)})` : "";
      throw new RouteError("modelNotAllowed", `this API key may not use the model ${JSON.stringify(parsed.model)}${via}`, "model");
    }
    // Over a limit already: refuse now (also for /debug/explain, and before any tokenization work).
    // The limits are decided in admit(), right before the charge.
    this.admission.check({ model: parsed.model, user: input.headers.user || undefined, tokens: parsed.promptTokens, rps });
    const prefix = this.opts.prefix;
    if (!prefix || !strategy.needs?.promptTokenIds) return base;
    // A prompt sent as token ids is exactly what the index is keyed on.
    if (parsed.promptTokenIds) return { ...base, tokens: parsed.promptTokenIds, tokenizerMode: "ids" };
    // Remote mode asks one of the model's pods, spread by the prompt (stages/tokenizer-pod.ts).
    const raw = p.upstreamBody ?? input.body;
    // Only remote mode asks a pod: the digest of a ~600 KB agent prompt is not worth it otherwise.
    const tokenizerPod = prefix.tokenizer.modeFor && prefix.tokenizer.modeFor(parsed.model) !== "remote" ? undefined : tokenizerPodFor(this.views.pods.readyPods(parsed.model), raw);
    // The body's text as the parse decoded it (when it is the body sent), for the raw tool-JSON scan.
    const text = p.upstreamBody ? raw : (parsed.text ?? raw);
    const t = prefix.tokenizer.tokenize(parsed.model, promptInputOf(parsed.body, text), tokenizerPod?.address);
    return t.then((r) => ({ ...base, tokens: r.tokens, tokenizerMode: r.mode }));
  }

  /** Requests held because room was reserved for other replicas' unseen admissions. */
  get rateWaits(): number {
    return this.admission.waits;
  }

  /**
   * Admits a prepared request against the shared rate limits (stages/admission.ts), then calls
   * `then` (which charges) in the same synchronous step as the last verdict.
   */
  admit<T>(input: RouteInput, prepared: Prepared, then: () => T): T | Promise<T> {
    return this.admission.admit({ model: prepared.parsed.model, user: input.headers.user || undefined, tokens: prepared.tokens?.length ?? prepared.parsed.promptTokens, rps: prepared.rps }, then);
  }

  /**
   * Selects without charging: the candidates, the pick and the prefix match (for /debug/explain
   * too). `stagger: false` breaks ties with `random` alone, as /debug/explain does so that every
   * replica explains a request the same way.
   */
  select(input: RouteInput, prepared: Prepared, random?: () => number, stagger = true, chargeId = ""): Selection {
    const { parsed, strategy } = prepared;
    const requestId = input.headers["x-request-id"] || randomUUID();
    const now = this.now();
    const t0 = performance.now();
    const rank = stagger ? this.views.ledger.rank(this.opts.serverNow?.() ?? now) : undefined;
    const prefix = this.opts.prefix;
    const tokens = prepared.tokens;
    const request = routingRequestOf(parsed.model, requestId, input.headers, tokens?.length ?? parsed.promptTokens, () => this.views.pods.readyPods(parsed.model));
    const { pick, prefixMatch } = schedule({
      views: this.views,
      strategy,
      request,
      ...(input.subset ? { subset: input.subset } : {}),
      now,
      random: random ?? decisionRandom(requestId, this.gatewayId, chargeId),
      ...(rank && rank.count > 1 ? { rank } : {}),
      ...(tokens && prefix ? { prefix: (candidates: readonly PodInfo[]) => prefix.match(parsed.model, candidates, tokens, now, prepared.tokenizerMode, parsed.cacheSalt) } : {}),
      ...(prepared.slo ? { slo: prepared.slo } : {}),
    });
    this.opts.onPick?.(strategy.name, (performance.now() - t0) / 1000);
    return { requestId, now, pick, request, ...(rank && rank.count > 1 ? { rank } : {}), ...(prefixMatch ? { prefixMatch } : {}) };
  }

  /**
   * Picks a pod and charges it, in one synchronous call. `publish: false` leaves publishing the
   * charge to the caller (strict mode commits it with a compare-and-set, and may `retract` it).
   */
  charge(input: RouteInput, opts: { publish?: boolean; prepared?: Prepared; carry?: RoutedRequest } = {}): RoutedRequest {
    const prepared = opts.prepared ?? this.prepare(input);
    if (prepared instanceof Promise) throw new Error("charge() needs a prepared request when tokenization is asynchronous; use route()");
    const { parsed, strategy } = prepared;
    // A request that was tokenized or held by a rate limit across a shutdown is not charged.
    if (this.closed) throw new RouteError("notReady", "gateway is shutting down");
    const user = input.headers.user || undefined;
    // Unique within this gateway process (the ledger keys charges by gateway id + charge id), and
    // increasing in routing order: replay orders this gateway's own events by it.
    const chargeId = chargeIdOf(++this.chargeSeq);
    // The views' cursors at the moment of the decision (before this request's own events).
    const cursors = { ...this.opts.state.cursors };
    const sel = this.select(input, prepared, undefined, true, chargeId);
    const { requestId, now, pick, prefixMatch } = sel;
    const plan = pdPlanOf(pick);
    // Before anything is charged: a batch cannot be disaggregated.
    if (plan?.kind === "pd") refuseBatch(parsed.body);
    const promptTokens = prepared.tokens?.length ?? parsed.promptTokens;
    // The latency model's view of the picked pod, before this request's own charge counts on it.
    const features = latencyFeaturesOf(this.views, pick.pod, promptTokens, prefixMatch?.info, now);
    const predicted = this.views.latency?.predict(pick.pod.model, pick.pod.podClass, features, now);
    const charge: ChargeEvent = {
      type: "charge",
      id: chargeId,
      gateway: this.gatewayId,
      model: pick.pod.model,
      pod: pick.pod.pod,
      ts: now,
      ttlMs: this.opts.chargeTtlMs,
      promptTokens,
      ...(parsed.maxTokens !== undefined ? { maxTokens: parsed.maxTokens } : {}),
      ...(user ? { user } : {}),
      ...(plan?.kind === "pd" ? { phase: "decode" as const } : {}),
    };
    // A strict-mode retry (`carry`) is the same request: counted once, by its first attempt.
    const countedAt = opts.carry?.countedAt ?? now;
    let admission = opts.carry?.admission;
    if (!opts.carry) {
      // Own admissions are remembered only where a limit can read them (the burst guard).
      // A request without a user is limited (and remembered) under the shared anonymous bucket.
      const userLimited = this.opts.config?.userLimits(user) !== undefined;
      if (userLimited || prepared.rps !== undefined) {
        admission = { ...(userLimited ? { user: rateUserOf(user) } : {}), ...(prepared.rps !== undefined ? { model: charge.model } : {}), tokens: promptTokens, ts: now };
      }
    }
    this.opts.state.ownCharge(charge, now, { ...(opts.carry ? { counted: false } : admission ? { admission } : {}) });
    if (opts.publish !== false) this.opts.sink.charge(charge);
    const routed: RoutedRequest = {
      chargeId,
      charge,
      requestId,
      model: parsed.model,
      pod: pick.pod,
      strategy: strategy.name,
      candidates: pick.candidates,
      ...(pick.better ? { better: pick.better } : {}),
      ...(pick.fallback ? { fallback: pick.fallback } : {}),
      ...(pick.responseHeaders || prepared.semantic ? { responseHeaders: { ...pick.responseHeaders, ...(prepared.semantic ? { [DECISION_HEADER]: prepared.semantic.decision } : {}) } } : {}),
      ...(user ? { user } : {}),
      startedAt: now,
      promptTokens,
      countedAt,
      ...(parsed.body.stream === true ? { stream: true } : {}),
      ...(admission ? { admission } : {}),
      latency: { x: featureVector(features), ...(pick.pod.podClass ? { cls: pick.pod.podClass } : {}) },
      ...(predicted ? { prediction: recordedPrediction(predicted, pick.pod) } : {}),
      ...(prepared.upstreamBody ? { body: prepared.upstreamBody } : {}),
      context: {
        cursors,
        ...(sel.rank ? { rank: sel.rank } : {}),
        ...(sel.request.session ? { session: sel.request.session } : {}),
        ...(input.subset ? { subset: input.subset } : {}),
        ...(prefixMatch && prefixMatch.hashes.length > 0
          ? { blocks: { size: prefixMatch.info.blockSize, mode: prepared.tokenizerMode === "approximate" ? "approximate" : "precise", hashes: prefixMatch.hashes } }
          : {}),
        ...(prepared.profile && prepared.profile.length <= 256 ? { profile: prepared.profile } : {}),
        ...(prepared.strategyParams ? { strategyParams: prepared.strategyParams } : {}),
        ...(opts.publish === false ? { consistency: "strict" as const } : this.opts.consistency === "off" ? { consistency: "off" as const } : {}),
        ...(prepared.slo ? { slo: prepared.slo } : {}),
        ...(prepared.flow ? { flow: prepared.flow } : {}),
        ...(prepared.semantic ? { semantic: prepared.semantic } : {}),
        ...(parsed.maxTokens !== undefined && Number.isSafeInteger(parsed.maxTokens) && parsed.maxTokens >= 0 ? { maxTokens: parsed.maxTokens } : {}),
      },
      finished: false,
    };
    if (plan) this.pd.planned(routed, plan);
    this.inFlight.set(chargeId, routed);
    // The routed prefix names the pod the charge goes to: at once when it is published now, at
    // `committed` when the committer publishes it (a strict charge may lose and be re-selected).
    if (prefixMatch && prefixMatch.hashes.length > 0) {
      if (opts.publish !== false) this.opts.prefix?.recordRouted(pick.pod, prefixMatch.hashes, now, chargeId);
      else this.routedPending.set(routed, prefixMatch.hashes);
    }
    const prefix = this.opts.prefix;
    // Approximate-mode hashes match only other gateways' routed prefixes, which traffic under a
    // non-prefix strategy never publishes: recording them would cost every request and tell replay nothing.
    if (!routed.context.blocks && prefix && this.opts.recordPromptBlocks !== false && parsed.promptTokenIds) {
      routed.recordedBlocks = prefix.blocks(parsed.model, pick.pod, parsed.promptTokenIds, now, "ids", parsed.cacheSalt);
      this.learnCached(routed, parsed.promptTokenIds, "ids", parsed.cacheSalt, now);
    } else if (!routed.context.blocks && prefix && this.opts.recordPromptBlocks !== false && prefix.tokenizer.modeFor?.(parsed.model) !== "approximate") {
      const pod = pick.pod;
      // After the reply to Envoy has gone out: tokenizing runs synchronously up to its first await.
      setImmediate(() => {
        if (routed.finished) return;
        prefix.tokenizer.tokenize(parsed.model, promptInputOf(parsed.body, input.body), pod.address).then(
          (t) => {
            if (routed.finished) return;
            routed.recordedBlocks = prefix.blocks(parsed.model, pod, t.tokens, now, t.mode, parsed.cacheSalt);
            this.learnCached(routed, t.tokens, t.mode, parsed.cacheSalt, now);
          },
          () => undefined,
        );
      });
    }
    return routed;
  }

  /**
   * A strategy that did not match prefixes routed the request: its latency sample learns the
   * prompt's token count and the tokens the picked pod held from the tokenization and match made
   * after routing (a few ms later), instead of an estimate and "none cached", which would teach
   * the model that cached prompts are fast for no reason it can see.
   */
  private learnCached(r: RoutedRequest, tokens: readonly number[], mode: string | undefined, salt: string | undefined, now: number): void {
    const prefix = this.opts.prefix;
    if (!prefix || !r.latency || r.latency.x[1] !== 0) return;
    const m = prefix.match(r.model, [r.pod], tokens, now, mode, salt);
    // The tokenizer's count replaces the estimate the strategy routed with.
    const x = r.latency.x;
    x[0] = tokens.length;
    x[1] = Math.min(tokens.length, Math.floor(m.info.matched(r.pod.pod) * m.info.blockSize));
    const p = this.views.latency?.predict(r.model, r.pod.podClass, { promptTokens: x[0], cachedTokens: x[1], prefillTokens: x[2] ?? 0, decoding: x[3] ?? 0, waiting: x[4] ?? 0, kvPermille: x[5] ?? 0 }, r.startedAt);
    if (p) r.prediction = recordedPrediction(p, r.pod);
  }

  /**
   * The request path: parse and plan (prepare, awaiting tokenization when the strategy needs
   * it), then the committer of the model's consistency mode admits, schedules and charges.
   */
  route(input: RouteInput): RoutedRequest | Promise<RoutedRequest> {
    const prepared = this.prepare(input);
    const commit = (p: Prepared, inp: RouteInput = input) => {
      const r = this.committerFor(p).commit(inp, p);
      if (!p.strategy.traits?.disaggregated) return r;
      return r instanceof Promise ? r.then((x) => this.runLegs(x, inp, p)) : this.runLegs(r, inp, p);
    };
    const gated = (p: Prepared) => this.flowGate(input, p, commit);
    return prepared instanceof Promise ? prepared.then(gated) : gated(prepared);
  }

  /**
   * Flow control's gate (routing/flow/): a request for a model with flow control goes on at once
   * when a pod has room and nothing of its band or higher is held, else it is held and committed
   * when `pump` dispatches it (or answered 429/503 when it expires or is shed).
   */
  private flowGate(input: RouteInput, p: Prepared, commit: (p: Prepared, input?: RouteInput) => RoutedRequest | Promise<RoutedRequest>): RoutedRequest | Promise<RoutedRequest> {
    const model = p.parsed.model;
    // A prompt no ready pod's context can take: 400 now, before it is held or routed.
    const tooLong = contextRefusal(model, p, this.views.pods.readyPods(model), this.views.load);
    if (tooLong) throw tooLong;
    const s = this.flow.settingsFor(model);
    if (!s) return commit(p);
    if (this.closed) throw new RouteError("notReady", "gateway is shutting down");
    const cls = classify(s, input.headers, input.keyObjective, input.headers.user || undefined, this.now());
    const record = (waitMs: number) => ({ band: cls.band, ...(cls.objective !== undefined ? { objective: cls.objective } : {}), enqueuedAt: cls.enqueuedAt, waitMs });
    // Scheduled among the pods with room only (the subset is recorded, so replay re-decides the same way).
    // (Not for P/D: its prefill and decode pods are chosen by roles the subset would cut across.)
    const withRoom = (roomy: string[] | undefined): RouteInput => {
      if (!roomy || p.strategy.traits?.disaggregated) return input;
      const allowed = input.subset ? roomy.filter((a) => input.subset?.includes(a)) : roomy;
      return allowed.length > 0 ? { ...input, subset: allowed } : input;
    };
    // What the request retains while held (flow/held-bytes.ts); the body's decoded text was only
    // needed to plan, so it is not kept (every closure below sees this `p`).
    const bytes = heldBytesOf({ bodyBytes: input.body.length, ...(p.parsed.text !== undefined ? { textChars: p.parsed.text.length } : {}), ...(p.upstreamBody ? { upstreamBytes: p.upstreamBody.length } : {}), ...(p.tokens ? { tokens: p.tokens.length } : {}) });
    if (p.parsed.text !== undefined) p = { ...p, parsed: { ...p.parsed, text: undefined } };
    let settle: { resolve: (r: RoutedRequest) => void; reject: (e: unknown) => void } | undefined;
    const signal = input.signal;
    let onAbort: (() => void) | undefined;
    const held: Held = {
      model,
      cls,
      dispatch: (waitMs, subset) => {
        if (onAbort) signal?.removeEventListener("abort", onAbort);
        try {
          const r = commit({ ...p, flow: record(waitMs) }, withRoom(subset));
          if (r instanceof Promise) r.then(settle?.resolve, settle?.reject);
          else settle?.resolve(r);
        } catch (err) {
          settle?.reject(err);
        }
      },
      fail: (err) => {
        if (onAbort) signal?.removeEventListener("abort", onAbort);
        settle?.reject(err);
      },
    };
    const offered = this.flow.offer(held, bytes, s);
    if (offered.now) return commit({ ...p, flow: record(0) }, withRoom(offered.subset));
    const id = offered.id as number;
    return new Promise<RoutedRequest>((resolve, reject) => {
      settle = { resolve, reject };
      if (!signal) return;
      onAbort = () => {
        if (this.flow.cancel(model, id)) reject(new RouteError("clientCancelled", "the client went away while the request was held"));
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** P/D: runs the prefill leg (stages/pd-legs.ts) of a request the `pd` strategy disaggregated. */
  private runLegs(r: RoutedRequest, input: RouteInput, p: Prepared): RoutedRequest | Promise<RoutedRequest> {
    if (!r.pd || !this.legs) return r;
    if (r.pd.plan.engine === "sglang" && !r.pd.prefillCharge) return r;
    return this.legs.run(r, input, p.parsed.body, input.headers[":path"]?.split("?")[0] || "/v1/chat/completions");
  }

  private readonly eventual: Committer = new EventualCommitter(this);
  private strict: Committer | undefined;

  /** Strict mode's committer (it needs the director, so it is handed over after construction). */
  useStrictCommitter(c: Committer): void {
    this.strict = c;
  }

  private committerFor(p: Prepared): Committer {
    // P/D charges two pods per request; strict mode's per-pod compare-and-set covers one.
    return this.strict && !p.strategy.traits?.disaggregated && this.opts.strictFor?.(p.parsed.model) ? this.strict : this.eventual;
  }

  /** P/D: the decode watchdog fired; SGLang's decode engine is told to stop the request. */
  abortDecode(r: RoutedRequest): void {
    void this.legs?.abortDecode(r);
  }

  /** The request's first response bytes arrived: it moved from prefill to decode. */
  firstToken(r: RoutedRequest, at = this.now()): void {
    if (r.firstChunkAt !== undefined || r.finished) return;
    r.firstChunkAt = at;
    // Which of this replica's routing decisions came before it, exactly (a time cannot say within a millisecond).
    r.firstTokenAfterCharge = this.chargeSeq;
    this.opts.state.ownFirstToken(r.chargeId);
  }

  /**
   * A strict-mode charge was acknowledged (or published after all): other replicas can only see
   * it from now on, so the burst guard counts it as unseen from now (not from when it was made),
   * and its routed prefix is recorded and published now, naming the pod it was committed to.
   */
  committed(r: RoutedRequest): void {
    const now = this.now();
    this.opts.state.ownCommitted(r.admission, now);
    const hashes = this.routedPending.get(r);
    if (!hashes) return;
    this.routedPending.delete(r);
    this.opts.prefix?.recordRouted(r.pod, hashes, now, r.chargeId);
  }

  /** Charges made with `publish: false` whose routed prefix waits for `committed` (dropped with the request if it never is). */
  private readonly routedPending = new WeakMap<RoutedRequest, readonly bigint[]>();

  /** Publishes a charge made with `publish: false` the eventual way. */
  publishCharge(r: RoutedRequest): void {
    this.opts.sink.charge(r.charge);
  }

  /**
   * Undoes a charge that was never published (a strict-mode commit lost its race). With
   * `keepCounts` the request stays counted in the rate windows: it is about to be retried (pass
   * it as `carry`), and its slot must not go to another request meanwhile.
   */
  retract(r: RoutedRequest, keepCounts = false): void {
    if (r.finished) return;
    r.finished = true;
    this.inFlight.delete(r.chargeId);
    this.opts.state.ownRetract(r.charge, r.countedAt, r.admission, keepCounts);
  }

  /** Takes a request that will not be routed after all out of the rate windows. */
  uncount(r: RoutedRequest): void {
    this.opts.state.ownUncount(r.charge, r.countedAt, r.admission);
  }

  /** Ends a routed request: releases its charge and records the decision. Idempotent. */
  finish(r: RoutedRequest, outcome: ReleaseOutcome, info: FinishInfo): boolean {
    if (r.finished) return false;
    r.finished = true;
    this.inFlight.delete(r.chargeId);
    this.pd.requestEnded(r, outcome, info.status);
    const now = this.now();
    const release: ReleaseEvent = {
      type: "release",
      id: r.chargeId,
      gateway: this.gatewayId,
      model: r.pod.model,
      pod: r.pod.pod,
      ts: now,
      outcome,
      // The engine's own counts: other replicas replace the charge's prompt estimate with it.
      ...(info.promptTokens !== undefined ? { promptTokens: info.promptTokens, chargedPromptTokens: r.promptTokens, chargedAt: r.countedAt } : {}),
      ...(info.completionTokens !== undefined ? { completionTokens: info.completionTokens } : {}),
      ...(r.user ? { user: r.user } : {}),
      ...latencySampleOf(r, outcome, info, now),
    };
    this.opts.state.ownRelease(release);
    this.opts.sink.release(release);
    // A pod got room: held requests may go (after this call, not inside the caller's).
    if (this.flow.held > 0 && !this.pumpQueued) {
      // One pump for a burst of releases in the same turn.
      this.pumpQueued = true;
      queueMicrotask(() => {
        this.pumpQueued = false;
        this.flow.pump();
      });
    }
    this.opts.sink.decision(routedRecord(this.gatewayId, r, outcome, info, now));
    return true;
  }

  /** Records a request refused before routing (the decision stream sees rejections too). */
  reject(headers: Readonly<Record<string, string>>, model: string | undefined, err: RouteError): void {
    this.opts.sink.decision(rejectedRecord({ gateway: this.gatewayId, headers, model, err, now: this.now(), defaultStrategy: this.opts.defaultStrategy, newId: randomUUID }));
  }

  /** A flow-control pump is queued for this turn (releases coalesce into one). */
  private pumpQueued = false;

  /** Set by `drain`: the gateway is shutting down and routes nothing more. */
  private closed = false;

  /** Releases everything still in flight (clean shutdown); later routing attempts get a 503. */
  drain(): number {
    this.closed = true;
    this.flow.drain(new RouteError("notReady", "gateway is shutting down"));
    let n = 0;
    for (const r of [...this.inFlight.values()]) if (this.finish(r, "shutdown", { status: 503 })) n++;
    this.pd.drain();
    return n;
  }
}
