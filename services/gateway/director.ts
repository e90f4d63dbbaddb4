/**
 * The director: everything between "a request body arrived" and "these headers go back to Envoy",
 * and the request's end. It never imports Envoy, NATS or HTTP types: the ext_proc adapter calls
 * it, and it speaks to the streams only through an `EventSink`.
 *
 * Selection and charging happen in one synchronous call: no await between reading the ledger and
 * recording the charge, so two requests in this replica can never both see a pod as idle.
 */
import { randomUUID } from "node:crypto";
import { type ChargeEvent, DECISION_MAX_BLOCKS, DECISION_RECORD_VERSION, type DecisionRecord, type ReleaseEvent, type ReleaseOutcome } from "../../schemas/events.js";
import type { ChargeLedger } from "../views/charge-ledger.js";
import type { LoadView } from "../views/load-view.js";
import type { PodInfo, PodSet } from "../views/pod-set.js";
import { RouteError } from "./errors.js";
import { type ParsedRequest, parseRequestBody } from "./request-body.js";
import { promptInputOf } from "../tokenizer/prompt-tokens.js";
import type { UsageView } from "../views/usage-view.js";
import type { ConfigReader } from "../views/model-config.js";
import type { RateView } from "../views/rate-view.js";
import type { GatewayState, OwnAdmission, StateStream } from "../views/gateway-state.js";
import { encodeBlockHashes } from "../views/packed-hashes.js";
import { findStrategy, isStrategySpecError, parseStrategy, strategyNames } from "./strategies/registry.js";
import { routingRequestOf } from "./strategies/request.js";
import type { Pick, RoutingRequest, Scored, SessionHint, Strategy } from "./strategies/types.js";
import { decisionRandom, type PrefixMatchResult, type Rank, schedule } from "./stages/scheduling.js";

export type { PrefixMatchResult } from "./stages/scheduling.js";

/** Longest `user` header accepted (the charge and decision schemas' bound). */
export const MAX_USER_LENGTH = 256;
/** Longest `x-request-id` accepted (decision records carry it as their id). */
export const MAX_REQUEST_ID_LENGTH = 253;
const HEADER_BOUNDS: ReadonlyArray<readonly [string, number]> = [
  ["user", MAX_USER_LENGTH],
  ["x-request-id", MAX_REQUEST_ID_LENGTH],
];

export interface GatewayViews {
  pods: PodSet;
  load: LoadView;
  ledger: ChargeLedger;
  /** Per-user token usage across all replicas (vtc-basic fairness). */
  usage: UsageView;
  /** Request and token counts for rate limits, across all replicas. */
  rates: RateView;
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
  random?: () => number;
  prefix?: PrefixSupport;
  /** Model configs (locked strategy, profiles); absent: header, then the default. */
  config?: ConfigReader;
  /** Observes how long each pick took (seconds). */
  onPick?: (strategy: string, seconds: number) => void;
  /**
   * Tokenize and hash every prompt for its decision record, also under strategies that do not
   * need it (after routing, off its path), so replay can ask "what would prefix-cache have hit".
   * Default true; with `remote` tokenization it costs an engine /tokenize call per uncached prompt.
   */
  recordPromptBlocks?: boolean;
  /** `off`: this replica counts only its own charges (recorded in decision records). */
  consistency?: "eventual" | "strict" | "off";
}

export interface RouteInput {
  /** Lower-cased request headers. */
  headers: Readonly<Record<string, string>>;
  body: Uint8Array;
  /** Endpoints the proxy allows (Inference Extension subset hint); undefined = no restriction. */
  subset?: readonly string[];
}

export interface RoutedRequest {
  readonly chargeId: string;
  /** The charge as recorded in this replica's ledger (and published unless the caller commits it). */
  readonly charge: ChargeEvent;
  readonly requestId: string;
  readonly model: string;
  readonly pod: PodInfo;
  readonly strategy: string;
  readonly candidates: readonly Scored[];
  readonly better?: Pick["better"];
  readonly fallback?: string;
  /** Headers the strategy wants on the response (e.g. `x-session-id`). */
  readonly responseHeaders?: Readonly<Record<string, string>>;
  readonly user?: string;
  readonly startedAt: number;
  readonly promptTokens: number;
  /** When the request was counted in the rate windows (its first attempt, for a strict retry). */
  readonly countedAt: number;
  /** The own admission the burst guard remembers for it (only where a limit applies). */
  readonly admission?: OwnAdmissionKey;
  /** What the decision record keeps so replay can re-decide the request. */
  readonly context: DecisionContext;
  /** The prompt's blocks, computed after routing for a strategy that did not need them (recorded for counterfactuals). */
  recordedBlocks?: PromptBlocks;
  firstChunkAt?: number;
  finished: boolean;
}

/** The inputs of a decision beyond the views, recorded for replay (schemas/events.ts, DecisionRecord v2). */
export interface DecisionContext {
  readonly cursors: Readonly<Record<StateStream, number>>;
  readonly rank?: Rank;
  readonly session?: SessionHint;
  readonly subset?: readonly string[];
  readonly blocks?: { readonly size: number; readonly mode: "precise" | "approximate"; readonly hashes: readonly bigint[] };
  readonly profile?: string;
  readonly slo?: { ttftMs?: number; tpotMs?: number };
  readonly maxTokens?: number;
  readonly consistency?: "strict" | "off";
}

/** Which own-admission entries (rate-view.ts) a routed request holds. */
export type OwnAdmissionKey = OwnAdmission;

export interface Prepared {
  parsed: ParsedRequest;
  strategy: Strategy;
  /** Prompt token ids, when a prefix strategy needs them. */
  tokens?: number[];
  tokenizerMode?: string;
  /** The model profile that applied, and its latency targets (slo* strategies). */
  profile?: string;
  slo?: { ttftMs?: number; tpotMs?: number };
  /** The profile's per-model request rate limit. */
  rps?: number;
}

/** What the director needs for prefix-aware routing (absent: prefix strategies fall back). */
export interface PrefixSupport {
  tokenizer: { tokenize(model: string, input: ReturnType<typeof promptInputOf>, address: string | undefined): Promise<{ tokens: number[]; mode: string }> };
  match(model: string, candidates: readonly PodInfo[], tokens: readonly number[], now: number, tokenizerMode?: string): PrefixMatchResult;
  recordRouted(pod: PodInfo, hashes: readonly bigint[], now: number, chargeId: string): void;
  /** The prompt's block hashes for `pod` (decision records of strategies that do not match prefixes). */
  blocks(model: string, pod: PodInfo, tokens: readonly number[], now: number, tokenizerMode: string | undefined): PromptBlocks;
}

export interface PromptBlocks {
  readonly size: number;
  readonly mode: "precise" | "approximate";
  readonly hashes: bigint[];
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

export interface FinishInfo {
  status: number;
  promptTokens?: number;
  completionTokens?: number;
}

export class Director {
  readonly gatewayId: string;
  /** The views routing reads (the state's). */
  readonly views: GatewayViews;
  private readonly now: () => number;
  private readonly random: () => number;
  /** Requests routed and not yet finished, by charge id (drained on shutdown). */
  readonly inFlight = new Map<string, RoutedRequest>();
  private chargeSeq = 0;

  constructor(private readonly opts: DirectorOptions) {
    if (!findStrategy(opts.defaultStrategy)) {
      throw new Error(`unknown default strategy ${JSON.stringify(opts.defaultStrategy)}; known: ${strategyNames().join(", ")}`);
    }
    this.gatewayId = opts.gatewayId;
    this.views = opts.state;
    this.now = opts.now ?? Date.now;
    this.random = opts.random ?? Math.random;
  }

  /**
   * Everything about a request that does not depend on the views: the parsed body, the strategy,
   * and — for prefix strategies — the prompt's token ids (which may take a call to an engine's
   * /tokenize, hence a promise). Throws RouteError for anything the client must be told.
   */
  prepare(input: RouteInput): Prepared | Promise<Prepared> {
    const parsed = parseRequestBody(input.body);
    // The user and the request id travel in every charge and decision record; the event schemas bound them.
    for (const [name, max] of HEADER_BOUNDS) {
      const value = input.headers[name];
      if (value !== undefined && value.length > max) {
        throw new RouteError("invalidHeader", `the \`${name}\` header is ${value.length} characters long; at most ${max} are allowed`, name);
      }
    }
    const choice = this.opts.config
      ? this.opts.config.choose(parsed.model, input.headers, { promptTokens: parsed.promptTokens, maxTokens: parsed.maxTokens }, this.opts.defaultStrategy)
      : { spec: input.headers["routing-strategy"] || this.opts.defaultStrategy, source: "default" as const };
    const strategyName = choice.spec;
    let strategy: Strategy;
    try {
      strategy = parseStrategy(strategyName);
    } catch (err) {
      if (isStrategySpecError(err)) throw new RouteError("invalidStrategy", `${err.message}; known: ${strategyNames().join(", ")}`, "routing-strategy");
      throw err;
    }
    const rps = "profileConfig" in choice ? choice.profileConfig?.requestsPerSecond : undefined;
    const slo = "profileConfig" in choice ? choice.profileConfig?.slo : undefined;
    const base: Prepared = { parsed, strategy, ...(slo ? { slo } : {}), ...(rps !== undefined ? { rps } : {}), ...("profile" in choice && choice.profile ? { profile: choice.profile } : {}) };
    // Over a limit already: refuse now (also for /debug/explain, and before any tokenization work).
    // The limits are decided in admit(), right before the charge.
    const early = this.limitVerdict(parsed.model, input.headers.user || undefined, parsed.promptTokens, rps, this.now(), false);
    if (early instanceof RouteError) throw early;
    const prefix = this.opts.prefix;
    if (!prefix || !strategy.name.includes("prefix-cache")) return base;
    const anyPod = this.views.pods.readyPods(parsed.model)[0];
    const t = prefix.tokenizer.tokenize(parsed.model, promptInputOf(parsed.body), anyPod?.address);
    return t.then((r) => ({ ...base, tokens: r.tokens, tokenizerMode: r.mode }));
  }

  /** Requests held because room was reserved for other replicas' unseen admissions. */
  rateWaits = 0;

  /**
   * Admits a prepared request against the shared rate limits, then calls `then` (which charges)
   * in the same synchronous step as the last verdict, so no other request can be admitted in
   * between. When the burst guard says wait, the request is held (a timer) until this replica's
   * recent admissions are old enough for the others to have seen them, and asked again; after
   * `4 x unconfirmedMs` the plain limit decides. Throws/rejects with a 429 RouteError.
   */
  admit<T>(input: RouteInput, prepared: Prepared, then: () => T): T | Promise<T> {
    const user = input.headers.user || undefined;
    const tokens = prepared.tokens?.length ?? prepared.parsed.promptTokens;
    const model = prepared.parsed.model;
    const first = this.limitVerdict(model, user, tokens, prepared.rps, this.now(), true);
    if (first === undefined) return then();
    if (first instanceof RouteError) throw first;
    this.rateWaits++;
    const deadline = this.now() + 4 * this.views.rates.unconfirmedMs;
    return new Promise<T>((resolve, reject) => {
      const ask = () => {
        try {
          const now = this.now();
          const v = this.limitVerdict(model, user, tokens, prepared.rps, now, now < deadline);
          if (v === undefined) resolve(then());
          else if (v instanceof RouteError) reject(v);
          else setTimeout(ask, Math.max(1, v));
        } catch (err) {
          reject(err);
        }
      };
      setTimeout(ask, Math.max(1, first));
    });
  }

  /**
   * Shared rate limits: per user requests and tokens per minute (config key `limits`), per model
   * requests per second (the profile's `requestsPerSecond`). Counts come from every replica's
   * charges, so spreading requests over replicas does not multiply the limit.
   *
   * Returns undefined to admit, a RouteError (429) to refuse, or a number of ms to wait. The
   * wait is the burst guard (`share`): this replica's own admissions of the last
   * `unconfirmedMs` may not have reached the other R - 1 live replicas yet, and they may have
   * admitted as many that we have not seen; so a request is held while count + (R - 1) x
   * unconfirmed would reach the limit, until our admissions are old enough to have been seen.
   */
  private limitVerdict(model: string, user: string | undefined, promptTokens: number, rps: number | undefined, now: number, share: boolean): RouteError | number | undefined {
    const { rates, pods, ledger } = this.views;
    const others = share ? ledger.rank(now).count - 1 : 0;
    let wait = 0;
    const base = pods.readyPods(model)[0]?.model ?? model;
    if (rps !== undefined) {
      const seen = rates.modelRequests(base, now);
      if (seen >= rps) {
        const reset = (1000 - (now % 1000)) / 1000;
        return new RouteError("rateLimited", `model \`${model}\` is limited to ${rps} requests per second`, null, { "retry-after": String(Math.ceil(reset)), "x-ratelimit-limit-requests": String(rps), "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": `${reset.toFixed(3)}s` });
      }
      if (others > 0 && seen + others * rates.ownRecent("model", base, now).requests >= rps) wait = Math.max(wait, rates.ownConfirmedAt("model", base, now) - now);
    }
    const limits = this.opts.config?.userLimits(user);
    if (!limits || !user) return wait > 0 ? wait : undefined;
    const reset = (60_000 - (now % 60_000)) / 1000;
    const headers = (kind: "requests" | "tokens", limit: number) => ({
      "retry-after": String(Math.ceil(reset)),
      [`x-ratelimit-limit-${kind}`]: String(limit),
      [`x-ratelimit-remaining-${kind}`]: "0",
      [`x-ratelimit-reset-${kind}`]: `${reset.toFixed(1)}s`,
    });
    const mine = others > 0 ? rates.ownRecent("user", user, now) : { requests: 0, tokens: 0 };
    if (limits.rpm !== undefined) {
      const seen = rates.userRequests(user, now);
      if (seen >= limits.rpm) return new RouteError("rateLimited", `user \`${user}\` exceeded ${limits.rpm} requests per minute`, null, headers("requests", limits.rpm));
      if (seen + others * mine.requests >= limits.rpm) wait = Math.max(wait, rates.ownConfirmedAt("user", user, now) - now);
    }
    if (limits.tpm !== undefined) {
      const seen = rates.userTokens(user, now);
      if (seen + promptTokens > limits.tpm) return new RouteError("rateLimited", `user \`${user}\` exceeded ${limits.tpm} tokens per minute`, null, headers("tokens", limits.tpm));
      if (seen + promptTokens + others * mine.tokens > limits.tpm) wait = Math.max(wait, rates.ownConfirmedAt("user", user, now) - now);
    }
    return wait > 0 ? wait : undefined;
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
    const rank = stagger ? this.views.ledger.rank(now) : undefined;
    const prefix = this.opts.prefix;
    const tokens = prepared.tokens;
    const request = routingRequestOf(parsed.model, requestId, input.headers, tokens?.length ?? parsed.promptTokens);
    const { pick, prefixMatch } = schedule({
      views: this.views,
      strategy,
      request,
      ...(input.subset ? { subset: input.subset } : {}),
      now,
      random: random ?? decisionRandom(requestId, this.gatewayId, chargeId),
      ...(rank && rank.count > 1 ? { rank } : {}),
      ...(tokens && prefix ? { prefix: (candidates: readonly PodInfo[]) => prefix.match(parsed.model, candidates, tokens, now, prepared.tokenizerMode) } : {}),
      ...(prepared.slo ? { slo: prepared.slo } : {}),
    });
    this.opts.onPick?.(strategy.name, (performance.now() - t0) / 1000);
    return { requestId, now, pick, request, ...(rank && rank.count > 1 ? { rank } : {}), ...(prefixMatch ? { prefixMatch } : {}) };
  }

  /**
   * Picks a pod and charges it, in one synchronous call. `publish: false` leaves publishing the
   * charge to the caller (strict mode commits it with a compare-and-set, and may `retract` it).
   */
  route(input: RouteInput, opts: { publish?: boolean; prepared?: Prepared; carry?: RoutedRequest } = {}): RoutedRequest {
    const prepared = opts.prepared ?? this.prepare(input);
    if (prepared instanceof Promise) throw new Error("route() needs a prepared request when tokenization is asynchronous; use routeAuto()");
    const { parsed, strategy } = prepared;
    // A request that was tokenized or held by a rate limit across a shutdown is not charged.
    if (this.closed) throw new RouteError("notReady", "gateway is shutting down");
    const user = input.headers.user || undefined;
    // Unique within this gateway process (the ledger keys charges by gateway id + charge id), and
    // increasing in routing order: replay orders this gateway's own events by it.
    const chargeId = (++this.chargeSeq).toString(36);
    // The views' cursors at the moment of the decision (before this request's own events).
    const cursors = { ...this.opts.state.cursors };
    const sel = this.select(input, prepared, undefined, true, chargeId);
    const { requestId, now, pick, prefixMatch } = sel;
    const promptTokens = prepared.tokens?.length ?? parsed.promptTokens;
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
    };
    // A strict-mode retry (`carry`) is the same request: counted once, by its first attempt.
    const countedAt = opts.carry?.countedAt ?? now;
    let admission = opts.carry?.admission;
    if (!opts.carry) {
      // Own admissions are remembered only where a limit can read them (the burst guard).
      const userLimited = user !== undefined && this.opts.config?.userLimits(user) !== undefined;
      if (userLimited || prepared.rps !== undefined) {
        admission = { ...(userLimited ? { user } : {}), ...(prepared.rps !== undefined ? { model: charge.model } : {}), tokens: promptTokens, ts: now };
      }
    }
    this.opts.state.ownCharge(charge, now, { ...(opts.carry ? { counted: false } : admission ? { admission } : {}) });
    if (opts.publish !== false) this.opts.sink.charge(charge);
    if (prefixMatch && prefixMatch.hashes.length > 0) this.opts.prefix?.recordRouted(pick.pod, prefixMatch.hashes, now, chargeId);
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
      ...(pick.responseHeaders ? { responseHeaders: pick.responseHeaders } : {}),
      ...(user ? { user } : {}),
      startedAt: now,
      promptTokens,
      countedAt,
      ...(admission ? { admission } : {}),
      context: {
        cursors,
        ...(sel.rank ? { rank: sel.rank } : {}),
        ...(sel.request.session ? { session: sel.request.session } : {}),
        ...(input.subset ? { subset: input.subset } : {}),
        ...(prefixMatch && prefixMatch.hashes.length > 0
          ? { blocks: { size: prefixMatch.info.blockSize, mode: prepared.tokenizerMode === "approximate" ? "approximate" : "precise", hashes: prefixMatch.hashes } }
          : {}),
        ...(prepared.profile ? { profile: prepared.profile } : {}),
        ...(opts.publish === false ? { consistency: "strict" as const } : this.opts.consistency === "off" ? { consistency: "off" as const } : {}),
        ...(prepared.slo ? { slo: prepared.slo } : {}),
        ...(parsed.maxTokens !== undefined && Number.isSafeInteger(parsed.maxTokens) && parsed.maxTokens >= 0 ? { maxTokens: parsed.maxTokens } : {}),
      },
      finished: false,
    };
    this.inFlight.set(chargeId, routed);
    const prefix = this.opts.prefix;
    if (!routed.context.blocks && prefix && this.opts.recordPromptBlocks !== false) {
      const pod = pick.pod;
      prefix.tokenizer.tokenize(parsed.model, promptInputOf(parsed.body), pod.address).then(
        (t) => {
          if (!routed.finished) routed.recordedBlocks = prefix.blocks(parsed.model, pod, t.tokens, now, t.mode);
        },
        () => undefined,
      );
    }
    return routed;
  }

  /** Prepare (awaiting tokenization when the strategy needs it), admit, route: the eventual way. */
  routeAuto(input: RouteInput): RoutedRequest | Promise<RoutedRequest> {
    const prepared = this.prepare(input);
    return prepared instanceof Promise ? prepared.then((p) => this.admitAndRoute(input, p)) : this.admitAndRoute(input, prepared);
  }

  /** Admit against the rate limits, then charge and publish, in one step (see `admit`). */
  admitAndRoute(input: RouteInput, prepared: Prepared): RoutedRequest | Promise<RoutedRequest> {
    return this.admit(input, prepared, () => this.route(input, { prepared }));
  }

  /** The request's first response bytes arrived: it moved from prefill to decode. */
  firstToken(r: RoutedRequest, at: number): void {
    if (r.firstChunkAt !== undefined || r.finished) return;
    r.firstChunkAt = at;
    this.opts.state.ownFirstToken(r.chargeId);
  }

  /**
   * A strict-mode charge was acknowledged: other replicas can only see it from now on, so the
   * burst guard counts it as unseen from now (not from when it was made).
   */
  committed(r: RoutedRequest): void {
    this.opts.state.ownCommitted(r.admission, this.now());
  }

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
    };
    this.opts.state.ownRelease(release);
    this.opts.sink.release(release);
    const c = r.context;
    const blocks = c.blocks ?? (r.recordedBlocks && r.recordedBlocks.hashes.length > 0 ? r.recordedBlocks : undefined);
    this.opts.sink.decision({
      type: "decision",
      v: DECISION_RECORD_VERSION,
      id: r.requestId,
      gateway: this.gatewayId,
      model: r.model,
      ts: r.startedAt,
      strategy: r.strategy,
      candidates: r.candidates.map((c) => ({ pod: c.pod.pod, score: c.score })),
      pick: r.pod.pod,
      ...(r.better ? { better: r.better } : {}),
      ...(r.fallback ? { fallback: r.fallback } : {}),
      ...(r.user ? { user: r.user } : {}),
      status: info.status,
      outcome,
      ...(r.firstChunkAt !== undefined ? { ttftMs: r.firstChunkAt - r.startedAt } : {}),
      ...(r.firstChunkAt !== undefined && info.completionTokens !== undefined && info.completionTokens > 1
        ? { tpotMs: (now - r.firstChunkAt) / (info.completionTokens - 1) }
        : {}),
      durationMs: now - r.startedAt,
      promptTokens: info.promptTokens ?? r.promptTokens,
      ...(info.completionTokens !== undefined ? { completionTokens: info.completionTokens } : {}),
      charge: r.chargeId,
      routedPromptTokens: r.promptTokens,
      cursors: c.cursors,
      ...(c.rank ? { rank: c.rank } : {}),
      ...(c.session ? { session: c.session } : {}),
      ...(c.subset ? { subset: c.subset.slice(0, 256) } : {}),
      ...(blocks ? { blocks: { size: blocks.size, mode: blocks.mode, hashes: encodeBlockHashes(blocks.hashes, DECISION_MAX_BLOCKS), total: blocks.hashes.length } } : {}),
      ...(c.profile ? { profile: c.profile } : {}),
      ...(c.slo ? { slo: c.slo } : {}),
      ...(c.maxTokens !== undefined ? { maxTokens: c.maxTokens } : {}),
      ...(c.consistency ? { consistency: c.consistency } : {}),
    });
    return true;
  }

  /** Records a request refused before routing (the decision stream sees rejections too). */
  reject(headers: Readonly<Record<string, string>>, model: string | undefined, err: RouteError): void {
    this.opts.sink.decision({
      type: "decision",
      v: DECISION_RECORD_VERSION,
      // A rejected request's id may be the reason it was rejected: only a valid one is recorded.
      id: headers["x-request-id"] && headers["x-request-id"].length <= MAX_REQUEST_ID_LENGTH ? headers["x-request-id"] : randomUUID(),
      gateway: this.gatewayId,
      model: model ?? "",
      ts: this.now(),
      strategy: headers["routing-strategy"] || this.opts.defaultStrategy,
      candidates: [],
      pick: null,
      status: err.status,
      outcome: "rejected",
      errorCode: err.code,
    });
  }

  /** Set by `drain`: the gateway is shutting down and routes nothing more. */
  private closed = false;

  /** Releases everything still in flight (clean shutdown); later routing attempts get a 503. */
  drain(): number {
    this.closed = true;
    let n = 0;
    for (const r of [...this.inFlight.values()]) if (this.finish(r, "shutdown", { status: 503 })) n++;
    return n;
  }
}
