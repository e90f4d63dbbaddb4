/**
 * The director: the routing core's composition. It wires the stages' environment (views, config,
 * admission, flow control, P/D), runs the request path (request-path.ts) with the driver
 * (pipeline.ts), and hands a routed request's life to the lifecycle (lifecycle.ts). It never
 * imports Envoy, NATS or HTTP types: the ext_proc adapter calls it, and it speaks to the streams
 * only through an `EventSink`.
 *
 * Selection and charging happen in one synchronous call (the commit section): no await between
 * reading the ledger and recording the charge, so two requests in this replica can never both see
 * a pod as idle.
 */
import type { TurnSlicing } from "./turn-budget.js";
import type { ReleaseOutcome } from "../../schemas/events.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { ConfigReader } from "../views/model-config.js";
import type { PodInfo } from "../views/pod-set.js";
import type { PlannedContext, SelectedContext } from "./context.js";
import type { RouteError } from "./errors.js";
import { FlowController, type FlowHooks, type FlowLimits } from "./flow/controller.js";
import type { FleetQueues } from "./flow/fleet.js";
import { RequestLifecycle } from "./lifecycle.js";
import { type Committer, type CommitPort, RequestPathDriver, type StageEnv, type StageObserver } from "./pipeline.js";
import type { EmbeddingSource, EventSink, GatewayViews, ModelRewrites, PoolIdentity, PrefixSupport, ResponseState } from "./ports.js";
import type { FinishInfo, RoutedRequest, RouteInput } from "./request.js";
import { REQUEST_PATH } from "./request-path.js";
import { Admission, type AdmissionClock } from "./stages/admission.js";
import { EventualCommitter } from "./stages/commit.js";
import { PdCoordinator } from "./stages/pd-coordinator.js";
import { type LegClient, type PdLegOptions, PdLegs } from "./stages/pd-legs.js";
import { selectPod } from "./stages/select.js";
import { findStrategy, strategyNames } from "./strategies/registry.js";

export type { PrefixMatchResult } from "./stages/scheduling.js";
export type { FinishInfo, OwnAdmissionKey, PromptBlocks, RoutedRequest, RouteInput } from "./request.js";
export type { DecisionInputs } from "./decision-inputs.js";
export type { PlannedContext, RequestContext } from "./context.js";
export type { EmbeddingSource, EventSink, GatewayViews, ModelRewrites, PrefixSupport } from "./ports.js";
export { MAX_REQUEST_ID_LENGTH, MAX_USER_LENGTH } from "./stages/parse.js";

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
  /** Observes how long each stage took (seconds), in the order a request visits them. */
  onStage?: StageObserver;
  /**
   * Tokenize and hash every prompt for its decision record, also under strategies that do not
   * need it (after routing, off its path), so replay can ask "what would prefix-cache have hit".
   * Default true; with `remote` tokenization it costs an engine /tokenize call per uncached prompt.
   */
  recordPromptBlocks?: boolean;
  /** Slices a large request's prepare work into short turns of the loop (turn-budget.ts); absent: stages run back to back. */
  turns?: TurnSlicing;
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
  /** InferenceModelRewrites of the pools (the model-rewrite stage); absent: none. */
  modelRewrites?: ModelRewrites;
  /** The Responses API's response store (the response-affinity stage); absent: `previous_response_id` is left to the engine. */
  responses?: ResponseState;
}

export class Director {
  readonly gatewayId: string;
  /** The views routing reads (the state's). */
  readonly views: GatewayViews;
  /** P/D: the prefill legs' charges and records (stages/pd-coordinator.ts). */
  readonly pd: PdCoordinator;
  /** Flow control: the requests this replica holds while their model's pods are saturated. */
  readonly flow: FlowController;
  /** The P/D legs stage (absent without a leg client). */
  readonly legs: PdLegs | undefined;
  /** A routed request's life: first token, finish, reject, drain, retract. */
  readonly lifecycle: RequestLifecycle;
  private readonly admission: Admission;
  private readonly env: StageEnv;
  private readonly driver: RequestPathDriver;
  private readonly eventual: Committer = new EventualCommitter();
  private strict: Committer | undefined;

  constructor(private readonly opts: DirectorOptions) {
    if (!findStrategy(opts.defaultStrategy)) {
      throw new Error(`unknown default strategy ${JSON.stringify(opts.defaultStrategy)}; known: ${strategyNames().join(", ")}`);
    }
    this.gatewayId = opts.gatewayId;
    this.views = opts.state;
    const now = opts.now ?? Date.now;
    const serverNow = opts.serverNow;
    // Peers' liveness (the rank the burst guard counts) on the broker's time; windows on ours.
    const admissionViews = serverNow ? { rates: opts.state.rates, pods: opts.state.pods, ledger: { rank: () => opts.state.ledger.rank(serverNow()) } } : opts.state;
    this.admission = new Admission(admissionViews, opts.config, opts.clock ?? { now, setTimeout: (fn, ms) => void setTimeout(fn, ms) });
    this.flow = new FlowController({ views: opts.state, config: opts.config, fleet: opts.flow?.fleet, now, ...(opts.flow?.hooks ? { hooks: opts.flow.hooks } : {}), ...(opts.flow?.limits ? { limits: opts.flow.limits } : {}) });
    const recordRouted = opts.prefix ? (pod: PodInfo, hashes: readonly bigint[], at: number, id: string) => opts.prefix?.recordRouted(pod, hashes, at, id) : undefined;
    this.pd = new PdCoordinator({ gatewayId: opts.gatewayId, state: opts.state, views: opts.state, sink: opts.sink, now, ...(recordRouted ? { recordRouted } : {}), defer: opts.defer ?? ((fn) => void setImmediate(fn)) });
    this.lifecycle = new RequestLifecycle({ gatewayId: opts.gatewayId, defaultStrategy: opts.defaultStrategy, state: opts.state, sink: opts.sink, now, pd: this.pd, flow: this.flow, ...(recordRouted ? { recordRouted } : {}) });
    const lc = this.lifecycle;
    this.legs = opts.pdLegClient
      ? new PdLegs(
          opts.pdLegClient,
          {
            endPrefill: (r, outcome, status, afterReply) => this.pd.endPrefill(r, outcome, status, afterReply),
            retryPrefill: (r) => this.pd.retryPrefill(r),
            fail: (r, err) => void lc.finish(r, err.kind === "clientCancelled" ? "cancelled" : "error", { status: err.status, errorCode: err.code }),
            now,
          },
          opts.pdLegOptions,
        )
      : undefined;
    this.env = {
      gatewayId: opts.gatewayId,
      defaultStrategy: opts.defaultStrategy,
      chargeTtlMs: opts.chargeTtlMs,
      state: opts.state,
      views: opts.state,
      sink: opts.sink,
      now,
      ...(serverNow ? { serverNow } : {}),
      ...(opts.config ? { config: opts.config } : {}),
      ...(opts.pool ? { pool: opts.pool } : {}),
      ...(opts.prefix ? { prefix: opts.prefix } : {}),
      ...(opts.embeddings ? { embeddings: opts.embeddings } : {}),
      ...(opts.modelRewrites ? { modelRewrites: opts.modelRewrites } : {}),
      ...(opts.responses ? { responses: opts.responses } : {}),
      admission: this.admission,
      flow: this.flow,
      pd: this.pd,
      ...(this.legs ? { legs: this.legs } : {}),
      lifecycle: lc,
      ...(opts.consistency ? { consistency: opts.consistency } : {}),
      recordPromptBlocks: opts.recordPromptBlocks !== false,
      ...(opts.turns ? { turns: opts.turns } : {}),
      ...(opts.onPick ? { onPick: opts.onPick } : {}),
    };
    this.driver = new RequestPathDriver(REQUEST_PATH, this.env, (ctx) => this.committerFor(ctx), opts.onStage);
  }

  /** The request path: prepare stages -> flow gate -> commit (admit -> select -> charge) -> after-routing stages. */
  route(input: RouteInput): RoutedRequest | Promise<RoutedRequest> {
    return this.driver.route(input);
  }

  /** The prepare stages alone (/debug/explain): the request parsed and planned, nothing counted. Throws RouteError. */
  prepare(input: RouteInput): PlannedContext | Promise<PlannedContext> {
    return this.driver.prepare(input);
  }

  /**
   * Selects without charging (/debug/explain). `stagger: false` breaks ties with `random` alone, so
   * every replica explains a request the same way.
   */
  select(ctx: PlannedContext, random?: () => number, stagger = true): SelectedContext {
    return selectPod(ctx, this.env, { ...(random ? { random } : {}), stagger, chargeId: "" });
  }

  /** What a committer needs of the core (the strict committer's port). */
  get commitPort(): CommitPort {
    return this.driver.port;
  }

  /** Strict mode's committer (handed over after construction: it is built on the commit port). */
  useStrictCommitter(c: Committer): void {
    this.strict = c;
  }

  private committerFor(ctx: PlannedContext): Committer {
    // P/D charges two pods per request; strict mode's per-pod compare-and-set covers one.
    return this.strict && !ctx.strategy.traits?.disaggregated && this.opts.strictFor?.(ctx.parsed.model) ? this.strict : this.eventual;
  }

  /** Requests held because room was reserved for other replicas' unseen admissions. */
  get rateWaits(): number {
    return this.admission.waits;
  }

  /** P/D plans made: disaggregated, prefill skipped by the decider, combined fallbacks, unusable rolesets seen. */
  get pdStats(): PdCoordinator["stats"] {
    return this.pd.stats;
  }

  // The request's lifecycle (lifecycle.ts), as the adapters call it.
  get inFlight(): Map<string, RoutedRequest> {
    return this.lifecycle.inFlight;
  }
  /** Finished requests whose SGLang prefill leg is still out (its charge is released when it returns). */
  get lingering(): ReadonlySet<RoutedRequest> {
    return this.pd.lingering;
  }
  holdingCharges(): Iterable<RoutedRequest> {
    return this.lifecycle.holdingCharges();
  }
  get chargesMade(): number {
    return this.lifecycle.chargesMade;
  }
  firstToken(r: RoutedRequest, at?: number): void {
    this.lifecycle.firstToken(r, at);
  }
  finish(r: RoutedRequest, outcome: ReleaseOutcome, info: FinishInfo): boolean {
    return this.lifecycle.finish(r, outcome, info);
  }
  reject(headers: Readonly<Record<string, string>>, model: string | undefined, err: RouteError): void {
    this.lifecycle.reject(headers, model, err);
  }
  drain(): number {
    return this.lifecycle.drain();
  }
  committed(r: RoutedRequest): void {
    this.lifecycle.committed(r);
  }
  retract(r: RoutedRequest, keepCounts = false): void {
    this.lifecycle.retract(r, keepCounts);
  }
  uncount(r: RoutedRequest): void {
    this.lifecycle.uncount(r);
  }
  /** P/D: the decode watchdog fired; SGLang's decode engine is told to stop the request. */
  abortDecode(r: RoutedRequest): void {
    void this.legs?.abortDecode(r);
  }
}
