/**
 * The gateway's error catalogue: every client-visible error, its HTTP status and OpenAI-shaped
 * body. One place maps codes to statuses, so the ext_proc adapter and the dev front agree.
 */
import type { DecisionRecord } from "../../schemas/events.js";

export const ErrorCodes = {
  invalidJson: { status: 400, code: "invalid_json" },
  invalidBody: { status: 400, code: "invalid_request_body" },
  missingModel: { status: 400, code: "model_required" },
  /** `--auth required`: no bearer token, a malformed one, or an unknown or revoked key. */
  invalidApiKey: { status: 401, code: "invalid_api_key" },
  invalidStrategy: { status: 400, code: "invalid_routing_strategy" },
  invalidHeader: { status: 400, code: "invalid_header" },
  unknownModel: { status: 404, code: "model_not_found" },
  /** A virtual model (docs/semantic.md): no decision's rule holds for the request, and there is no default. */
  noMatchingDecision: { status: 400, code: "no_matching_decision" },
  /** The request's API key may not use the model (its `models` list), including one a virtual model's decision chose. */
  modelNotAllowed: { status: 403, code: "model_not_allowed" },
  /**
   * `x-jetroute-on-behalf-of` from a key without the `delegate` permission, or naming a key that
   * is unknown, revoked or refused (docs/batch.md, Tenancy).
   */
  delegationNotAllowed: { status: 403, code: "delegation_not_allowed" },
  unsupportedPath: { status: 404, code: "unsupported_path" },
  /**
   * The API key's tenant has a cache salt (tenant prefix-cache isolation) and the request's API
   * cannot carry one to the engine (`/v1/messages`: the engines' Messages request has no
   * `cache_salt`): refused rather than routed without the isolation.
   */
  cacheIsolationUnavailable: { status: 400, code: "cache_isolation_unavailable" },
  /**
   * Responses API: `previous_response_id` (or the id of GET/DELETE/cancel/input_items) names no
   * response the caller's tenant holds: unknown, deleted, expired, another tenant's (404, never 403:
   * ids do not leak), or a chain broken by a missing turn (docs/stateful-apis.md).
   */
  responseNotFound: { status: 404, code: "response_not_found" },
  /** Gateway pools: the model is served by another pool's gateways (the `x-jetroute-pool` header names it). */
  wrongPool: { status: 421, code: "wrong_pool" },
  bodyTooLarge: { status: 413, code: "request_too_large" },
  /** The prompt is longer than the context every ready pod of the model reports (`max_model_len`): refused before it is held or routed. */
  contextLengthExceeded: { status: 400, code: "context_length_exceeded" },
  rateLimited: { status: 429, code: "rate_limit_exceeded" },
  /** Flow control: the request was held for its whole queue TTL while the model's pods stayed saturated. */
  queueTimeout: { status: 429, code: "queue_timeout" },
  /** Flow control: the request's priority band is full, or it was shed for a higher band. */
  queueFull: { status: 429, code: "queue_full" },
  noReadyPod: { status: 503, code: "no_ready_pod" },
  noPodInSubset: { status: 503, code: "no_ready_pod_in_subset" },
  notReady: { status: 503, code: "gateway_not_ready" },
  internal: { status: 500, code: "internal_error" },
  /** P/D: the client's body carries a handoff field only the gateway may set. */
  pdControlledField: { status: 400, code: "pd_controlled_field" },
  /** P/D: the prefill leg failed on every prefill pod tried (5xx, refused connection). */
  prefillFailed: { status: 502, code: "prefill_failed" },
  /** P/D: the prefill engine refused the request itself (its 4xx status is passed on). */
  prefillRejected: { status: 400, code: "prefill_rejected" },
  prefillTimeout: { status: 504, code: "prefill_timeout" },
  /** P/D: the decode watchdog saw no first chunk, or no next one, in time. */
  decodeTimeout: { status: 504, code: "decode_timeout" },
  /** The client left while the gateway was still working on the request (nothing is sent). */
  clientCancelled: { status: 499, code: "client_cancelled" },
} as const;
export type ErrorCode = keyof typeof ErrorCodes;

/** Where on the request path a refusal happened (set by the driver, pipeline.ts), and what the record of it keeps. */
export interface Refusal {
  /** The stage that refused (a name of the stage list). */
  readonly stage: string;
  readonly phase: "prepare" | "flow" | "commit" | "after";
  /** The model the client asked for (after a model rewrite), when the body was parsed. */
  readonly model?: string;
  /** A virtual model's classification, when one was made (its rejected record keeps it). */
  readonly semantic?: DecisionRecord["semantic"];
}

export class RouteError extends Error {
  override name = "RouteError";
  /** Where the request path refused (absent: refused outside it, e.g. by the ext_proc adapter). */
  refusal?: Refusal;
  /** The request was routed (charged, recorded) before this error ended it: the adapter only answers. */
  get afterRouting(): boolean {
    return this.refusal?.phase === "after";
  }
  constructor(
    readonly kind: ErrorCode,
    message: string,
    readonly param: string | null = null,
    /** Extra response headers (e.g. rate-limit headers on a 429). */
    readonly headers: Readonly<Record<string, string>> = {},
    /** A status other than the code's (an engine's own 4xx passed on). */
    private readonly statusOverride?: number,
  ) {
    super(message);
  }
  get status(): number {
    return this.statusOverride ?? ErrorCodes[this.kind].status;
  }
  get code(): string {
    return ErrorCodes[this.kind].code;
  }
}

/** OpenAI error `type` by HTTP status. */
export function errorType(status: number): string {
  if (status === 400 || status === 404 || status === 413) return "invalid_request_error";
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 429) return "rate_limit_error";
  if (status === 503) return "overloaded_error";
  return "api_error";
}

export interface OpenAIErrorBody {
  error: { message: string; type: string; code: string | number; param: string | null };
}

export function openAIError(status: number, code: string | number, message: string, param: string | null = null): OpenAIErrorBody {
  return { error: { message, type: errorType(status), code, param } };
}

export function routeErrorBody(err: RouteError): OpenAIErrorBody {
  return openAIError(err.status, err.code, err.message, err.param);
}

/**
 * Anthropic's error `type` by HTTP status (the Messages API's catalogue: invalid_request_error,
 * authentication_error, permission_error, not_found_error, request_too_large, rate_limit_error,
 * api_error, overloaded_error). Statuses it has no type for (421, 499, 5xx but 503) are `api_error`,
 * as in the OpenAI mapping (`errorType`).
 */
export function anthropicErrorType(status: number): string {
  if (status === 400 || status === 422) return "invalid_request_error";
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 413) return "request_too_large";
  if (status === 429) return "rate_limit_error";
  if (status === 503 || status === 529) return "overloaded_error";
  return "api_error";
}

export interface AnthropicErrorBody {
  type: "error";
  error: { type: string; message: string };
}

export function anthropicError(status: number, message: string): AnthropicErrorBody {
  return { type: "error", error: { type: anthropicErrorType(status), message } };
}

/**
 * A RouteError's body in the request's API: Anthropic's shape on `/v1/messages` (the catalogue's
 * code, which that shape has no field for, leads the message), OpenAI's everywhere else.
 */
export function errorBodyFor(api: string | undefined, err: RouteError): OpenAIErrorBody | AnthropicErrorBody {
  return api === "messages" ? anthropicError(err.status, `${err.code}: ${err.message}`) : routeErrorBody(err);
}

/** An OpenAI-shaped error body in the request's API (an upstream error normalised, then reshaped for `/v1/messages`). */
export function reshapeError(api: string | undefined, status: number, body: OpenAIErrorBody): OpenAIErrorBody | AnthropicErrorBody {
  return api === "messages" ? anthropicError(status, body.error.message) : body;
}
