/**
 * One request's context as it moves down the request path (pipeline.ts): what the proxy sent, what
 * each stage made of it, and what the decision's inputs were. Stages read and write it; the
 * driver owns it. It replaces the four shapes the path used to hand along (a parsed input, a
 * route plan, a prepared request, a selection).
 */
import type { ParsedRequest } from "./request-body.js";
import type { EngineFields, FlowRecord, ModelRewrite } from "./decision-inputs.js";
import type { ResponseTurn, RoutedRequest, RouteInput } from "./request.js";

export type { ModelRewrite } from "./decision-inputs.js";
import type { SemanticOutcome, SemanticTag } from "./stages/semantic.js";
import type { PrefixMatchResult, Rank } from "./stages/scheduling.js";
import type { StrategyParams } from "./strategies/registry.js";
import type { SignalInput } from "./semantic/signals.js";
import type { StateStream } from "../views/gateway-state.js";
import type { TokenIds } from "../tokenizer/prompt-tokens.js";
import { randomUUID } from "node:crypto";
import type { Pick, RoutingRequest, SloTargets, Strategy } from "./strategies/types.js";

/** How the commit section charges: published now (eventual) or left to a committer (strict), and a lost attempt's counts carried over. */
export interface CommitMode {
  readonly publish: boolean;
  readonly carry?: RoutedRequest;
}

export interface RequestContext {
  readonly input: RouteInput;
  /** The headers the stages read (a semantic decision's profile and strategy written over the client's). */
  headers: Readonly<Record<string, string>>;
  /** The body parsed once (stages/parse.ts); later stages rewrite it, never parse again. */
  parsed?: ParsedRequest;
  /** The parsed body was changed (a tenant's cache salt, a rewritten model, a semantic action): the engine gets it re-serialised. */
  bodyRewritten?: boolean;
  /** That body, serialised once when first needed (`upstreamBodyOf`). */
  upstreamBody?: Buffer;
  rewrite?: ModelRewrite;
  /** A Responses API request: its turn and the affinity verdict (stages/response-affinity.ts). */
  responseTurn?: ResponseTurn;
  /** Semantic model selection: what the semantic stage decided (absent: the client named a real model). */
  semantic?: SemanticOutcome;
  /** A virtual model's classification that refused the request (no decision matched). */
  semanticRefusal?: SemanticTag;
  /** The texts a virtual model's signals read, and their embeddings fetched for its similarity signals. */
  semanticTexts?: SignalInput["texts"];
  embeddings?: ReadonlyMap<string, ArrayLike<number>>;
  // The plan (stages/plan.ts).
  strategy?: Strategy;
  /** The model profile that applied, and its latency targets (slo* strategies). */
  profile?: string;
  slo?: SloTargets;
  /** The profile's per-model request rate limit. */
  rps?: number;
  /** The profile's strategy plugin parameters (recorded for replay). */
  strategyParams?: Readonly<Record<string, StrategyParams>>;
  /** Prompt token ids, when a prefix strategy needs them (stages/tokenize.ts). */
  tokens?: TokenIds;
  tokenizerMode?: string;
  /** Flow control: set when the request passed the flow gate (held or not). */
  flow?: FlowRecord;
  /** Endpoints the request may go to: the proxy's subset, narrowed by the flow gate to pods with room. */
  subset?: readonly string[];
  /** The request's id (the client's `x-request-id`, else made once). */
  requestId?: string;
  // The selection (stages/select.ts); set again by each attempt of a strict commit.
  chargeId?: string;
  /** The views' cursors at the moment of the decision (before this request's own events). */
  cursors?: Readonly<Record<StateStream, number>>;
  now?: number;
  pick?: Pick;
  /** The request as the strategy saw it. */
  routingRequest?: RoutingRequest;
  /** The rank the tie order came from (only with 2 or more live replicas). */
  rank?: Rank;
  prefixMatch?: PrefixMatchResult;
  /** What the engine-fields stage wrote for the picked pod (stages/engine-fields.ts); absent: nothing to record. */
  engineFields?: EngineFields;
  /** The body before the engine-fields stage first ran (a strict commit's next attempt starts from it). */
  beforeEngineFields?: { readonly parsed: ParsedRequest; readonly rewritten: boolean };
  /** The charge stage's result. */
  routed?: RoutedRequest;
  commitMode?: CommitMode;
}

/** A context whose prepare stages ran: its body parsed and its strategy chosen. */
export interface PlannedContext extends RequestContext {
  parsed: ParsedRequest;
  strategy: Strategy;
}

/** A context the select stage ran on. */
export interface SelectedContext extends PlannedContext {
  requestId: string;
  chargeId: string;
  cursors: Readonly<Record<StateStream, number>>;
  now: number;
  pick: Pick;
  routingRequest: RoutingRequest;
}

export function contextOf(input: RouteInput): RequestContext {
  return { input, headers: input.headers, ...(input.subset ? { subset: input.subset } : {}) };
}

/** The parsed body, for a stage that runs after parse (a programming error otherwise). */
export function parsedOf(ctx: RequestContext): ParsedRequest {
  if (!ctx.parsed) throw new Error("stage order: the body is not parsed yet");
  return ctx.parsed;
}

export function isPlanned(ctx: RequestContext): ctx is PlannedContext {
  return ctx.parsed !== undefined && ctx.strategy !== undefined;
}

export function isSelected(ctx: RequestContext): ctx is SelectedContext {
  return isPlanned(ctx) && ctx.pick !== undefined && ctx.requestId !== undefined && ctx.chargeId !== undefined && ctx.cursors !== undefined && ctx.now !== undefined && ctx.routingRequest !== undefined;
}

/** The request's id: the client's `x-request-id`, else one made for it (once). */
export function requestIdOf(ctx: RequestContext): string {
  ctx.requestId ??= ctx.input.headers["x-request-id"] || randomUUID();
  return ctx.requestId;
}

/** The parsed body was changed: the engine gets it re-serialised (once, by `upstreamBodyOf`). */
export function markRewritten(ctx: RequestContext): void {
  ctx.bodyRewritten = true;
  ctx.upstreamBody = undefined;
}

/** The body the engine gets instead of the client's, serialised once; undefined: the client's as sent. */
export function upstreamBodyOf(ctx: RequestContext): Buffer | undefined {
  if (ctx.bodyRewritten && !ctx.upstreamBody && ctx.parsed) ctx.upstreamBody = Buffer.from(JSON.stringify(ctx.parsed.body));
  return ctx.upstreamBody;
}

/** The prompt's size as routing counts it: its token ids when it was tokenized, else the parse's estimate. */
export function promptTokensOf(ctx: PlannedContext): number {
  return ctx.tokens?.length ?? ctx.parsed.promptTokens;
}
