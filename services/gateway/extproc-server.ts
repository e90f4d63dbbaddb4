/**
 * The ext_proc adapter: one Envoy gRPC stream per HTTP request, translated into calls on the
 * request path (a `RequestRouter`: the Director in the gateway).
 *
 * Phase order (envoy-extproc.md): request headers -> request body (BUFFERED) -> response headers
 * -> response body chunks (STREAMED). Routing happens on the request body, so the header mutation
 * that names the pod is sent in the request-body reply. Whatever way the stream ends — last body
 * chunk, an error status, Envoy cancelling because the client left, or the gateway shutting
 * down — the request's charge is released exactly once (the router guarantees the "once").
 *
 * With `auth`, the request-headers phase checks the bearer API key before anything else: a
 * request without a valid one gets 401 there (no routing, no charge, no rate-limit count, no
 * decision record — unauthenticated traffic writes nothing to the shared streams). The key's user
 * replaces any client-sent `user` header, for the router and for the upstream request; a key
 * with a `cacheSalt` puts the request under that salt (the body Envoy forwards carries it).
 */
import type * as grpc from "@grpc/grpc-js";
import { type AuthFailureReason, type AuthResult, authFailureMessage } from "./auth.js";
import { apiOfPath, errorBodyFor, type RequestApi, RouteError, reshapeError, type FinishInfo, type RoutedRequest, type RouteInput, ROUTED_PATHS, type ResponseRoute, responseRouteOf } from "../routing/mod.js";
import type { ReleaseOutcome } from "../../schemas/events.js";
import { ResponseTracker } from "./response-tracker.js";
import { ResponseCapture } from "./response-capture.js";
import type { ResponsesHandler } from "./responses-handler.js";
import { normaliseUpstreamError } from "./upstream-error.js";
import type { HeaderMutation, HeaderValueOption, ProcessingRequest, ProcessingResponse, ProtoStruct } from "../extproc/types.js";
import {
  fromProtoStruct,
  Headers,
  headersToRecord,
  destinationList,
  LB_METADATA_NAMESPACE,
  ROUTING_CONTROLLED_HEADERS,
  SERVED_ENDPOINT_KEY,
  setHeader,
  SUBSET_HINT_KEY,
  SUBSET_HINT_NAMESPACE,
  toProtoStruct,
} from "../extproc/wire.js";
import { preEncoded } from "../extproc/protos.js";
import { DEFAULT_PD_WATCHDOG, DecodeGuard, type PdWatchdog } from "./pd-decode-guard.js";
import type { Logger } from "../shared/log.js";
import { type AuthOk, type Delegation, modelsVisibleTo, ON_BEHALF_OF_HEADER } from "../views/api-keys.js";

type Stream = grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>;

/** What the ext_proc adapter needs of the request path (the Director implements it). */
export interface RequestRouter {
  /** Selection + charge, synchronous when nothing needs waiting for. Throws/rejects RouteError. */
  route(input: RouteInput): RoutedRequest | Promise<RoutedRequest>;
  /** The request's first response bytes arrived (now, on the router's clock). */
  firstToken(r: RoutedRequest): void;
  /** Ends a routed request: releases its charge and records the decision. Idempotent. */
  finish(r: RoutedRequest, outcome: ReleaseOutcome, info: FinishInfo): boolean;
  /** Records a request refused before routing. */
  reject(headers: Readonly<Record<string, string>>, model: string | undefined, err: RouteError): void;
  /** P/D: the decode watchdog fired; asks the decode engine to stop the request (SGLang `/abort_request`). */
  abortDecode?(r: RoutedRequest): void;
}

export { DEFAULT_PD_WATCHDOG, type PdWatchdog } from "./pd-decode-guard.js";
/** Largest buffered request body the adapter accepts unless told otherwise (bytes); Envoy's client buffer limit must be at least this. */
export const DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024;

/**
 * Where one Envoy stream is, as one value (not a flag per fact): `start` until the request headers
 * passed (authentication included), `body` while the body is buffered, `routing` while the request
 * path runs, `routed` once Envoy was told where it goes, `response` once the response started
 * (an error can then only travel in the body), and `ended` / `cancelled` when the stream is over
 * (a routing result arriving later is released at once).
 */
export const ExchangePhase = { start: "start", body: "body", routing: "routing", routed: "routed", response: "response", ended: "ended", cancelled: "cancelled" } as const;
export type ExchangePhase = (typeof ExchangePhase)[keyof typeof ExchangePhase];

export interface ExtProcHandlerOptions {
  router: RequestRouter;
  log: Logger;
  /** False until every view caught up: requests get 503 rather than a decision on a partial view. */
  isReady: () => boolean;
  /** Largest buffered request body accepted (bytes). */
  maxBodyBytes?: number;
  /** Answers GET /v1/models from the pod set. */
  listModels: () => string[];
  /** Decode watchdog for P/D requests (default DEFAULT_PD_WATCHDOG). */
  pdWatchdog?: PdWatchdog;
  /** Counts a response whose engine-reported usage was out of range and was clamped. */
  usageClamped?: () => void;
  /**
   * The engines' own key (`JETROUTE_ENGINE_API_KEY`): the upstream request carries it as its
   * `authorization` instead of the client's. Without it, a client's `authorization` is removed
   * under `auth` (a jetroute key is never an engine's) and passed through otherwise.
   */
  engineApiKey?: string;
  /**
   * Echo the pod's address on the response (`target-pod`, and `prefill-target-pod-ip` for P/D), as
   * AIBrix does. Off by default: internal addresses stay inside; the strategy, request id and P/D
   * prefill pod name are echoed either way.
   */
  exposePodAddresses?: boolean;
  /**
   * Endpoint picker protocol: how many fallback endpoints follow the chosen one in
   * `x-gateway-destination-endpoint` and its `envoy.lb` metadata (0, the default: the chosen one
   * alone). The proxy tries them in order when its retry policy allows. Never for P/D requests.
   */
  destinationFallbacks?: number;
  /** The proxy reported (`x-gateway-destination-endpoint-served`) that an endpoint other than the chosen one served the request. */
  servedElsewhere?: (routed: RoutedRequest, served: string) => void;
  /**
   * The Responses API's state (docs/stateful-apis.md): the routes under `/v1/responses/{id}`, the
   * replies recorded, a pinned continuation its pod did not know recovered from the store. Absent:
   * those routes answer 404 `unsupported_path` and nothing is recorded.
   */
  responses?: Pick<ResponsesHandler, "route" | "started" | "finished" | "recover" | "retrieveStored">;
  /** Bearer API-key authentication (`--auth required`); absent: every request is let through. */
  auth?: {
    /** Checks the `authorization` header value (never logged). */
    authenticate(authorization: string | undefined): AuthResult;
    /** Counts a refusal. */
    failed?(reason: AuthFailureReason, requestId: string | undefined): void;
    /** What `x-jetroute-on-behalf-of` decides for the authenticated key (absent: the header is refused). */
    delegation?(caller: AuthOk, onBehalfOf: string): Delegation;
    /** Counts a refused delegation. */
    delegationRefused?(reason: "malformed" | "not-permitted" | "owner-invalid", requestId: string | undefined): void;
  };
}

/** The header that carries the request's user identity (rate limits, vtc-basic, decision records). */
const USER_HEADER = "user";
const AUTHENTICATE_CHALLENGE = { "www-authenticate": 'Bearer realm="jetroute"' };

const CONTINUE = { response: { status: "CONTINUE" as const } };
const STRIP_CLIENT_ROUTING: HeaderMutation = { remove_headers: [...ROUTING_CONTROLLED_HEADERS, ON_BEHALF_OF_HEADER] };

function immediate(status: number, body: unknown, extra: Readonly<Record<string, string>> = {}): ProcessingResponse {
  return {
    immediate_response: {
      status: { code: status },
      headers: { set_headers: [setHeader(Headers.contentType, "application/json"), ...Object.entries(extra).map(([k, v]) => setHeader(k, v))] },
      body: Buffer.from(JSON.stringify(body)),
      details: `jetroute_${status}`,
    },
  };
}

function subsetHint(req: ProcessingRequest): string[] | undefined {
  const ns = req.metadata_context?.filter_metadata?.[SUBSET_HINT_NAMESPACE];
  if (!ns) return undefined;
  const v = fromProtoStruct(ns)[SUBSET_HINT_KEY];
  if (Array.isArray(v)) return v.filter((x): x is string => typeof x === "string");
  if (typeof v === "string") return v.split(",").map((s) => s.trim()).filter(Boolean);
  return undefined;
}

export function createExtProcHandler(opts: ExtProcHandlerOptions): grpc.handleBidiStreamingCall<ProcessingRequest, ProcessingResponse> {
  const requestHeadersMutation = requestHeadersMutationOf(opts);
  const shared: ExchangeShared = {
    opts,
    maxBody: opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
    watchdog: opts.pdWatchdog ?? DEFAULT_PD_WATCHDOG,
    targets: new TargetCache(),
    requestHeadersMutation,
    replies: {
      requestHeaders: preEncoded({ request_headers: { response: { status: "CONTINUE", header_mutation: requestHeadersMutation, clear_route_cache: true } } }),
      requestBodyContinue: preEncoded({ request_body: CONTINUE }),
      responseBodyContinue: preEncoded({ response_body: CONTINUE }),
    },
  };
  return (call: Stream) => new Exchange(call, shared).attach();
}

/**
 * The header entries and metadata that name a pod are the same for every request to it: built
 * once per (endpoint, strategy), bounded by pods x strategies.
 */
class TargetCache {
  private readonly targets = new Map<string, { headers: HeaderValueOption[]; echo: HeaderValueOption[]; echoNoAddress: HeaderValueOption[]; metadata: ProtoStruct }>();

  of(endpoint: string, strategy: string) {
    const key = `${endpoint} ${strategy}`;
    let t = this.targets.get(key);
    if (!t) {
      if (this.targets.size > 100_000) this.targets.clear();
      t = {
        headers: [setHeader(Headers.destinationEndpoint, endpoint), setHeader(Headers.targetPod, endpoint), setHeader(Headers.routingStrategy, strategy)],
        // Echoed on the response so clients and logs see where the request went.
        echo: [setHeader(Headers.targetPod, endpoint), setHeader(Headers.routingStrategy, strategy)],
        echoNoAddress: [setHeader(Headers.routingStrategy, strategy)],
        metadata: toProtoStruct({ [LB_METADATA_NAMESPACE]: { [Headers.destinationEndpoint]: endpoint } }),
      };
      this.targets.set(key, t);
    }
    return t;
  }
}

/** What every stream's exchange shares: the options and the per-pod header cache. */
interface ExchangeShared {
  readonly opts: ExtProcHandlerOptions;
  readonly maxBody: number;
  readonly watchdog: PdWatchdog;
  readonly targets: TargetCache;
  /** What every request-headers reply changes (the `user` header is added per request under `auth`). */
  readonly requestHeadersMutation: HeaderMutation;
  /** The replies that are the same for every request, serialised once (extproc/protos.ts `preEncoded`). */
  readonly replies: { readonly requestHeaders: ProcessingResponse; readonly requestBodyContinue: ProcessingResponse; readonly responseBodyContinue: ProcessingResponse };
}

/** Anthropic clients send their API key in this header (accepted as the jetroute key on /v1/messages). */
const X_API_KEY = "x-api-key";

/** Why a stream's work is aborted: one object for every stream (an AbortError made per request costs a stack capture). */
const STREAM_GONE = new Error("the ext_proc stream ended");
STREAM_GONE.name = "AbortError";

/**
 * Headers removed or set on every upstream request: the ones only routing may set, and the
 * client's `authorization` (and `x-api-key`) replaced by the engines' key, or removed when it is a
 * jetroute key.
 */
export function requestHeadersMutationOf(o: Pick<ExtProcHandlerOptions, "auth" | "engineApiKey">): HeaderMutation {
  // `x-api-key` (Anthropic clients' key header) goes wherever a client's `authorization` goes.
  if (o.engineApiKey) return { remove_headers: [...ROUTING_CONTROLLED_HEADERS, X_API_KEY, ON_BEHALF_OF_HEADER], set_headers: [setHeader(Headers.authorization, `Bearer ${o.engineApiKey}`)] };
  if (o.auth) return { remove_headers: [...ROUTING_CONTROLLED_HEADERS, Headers.authorization, X_API_KEY, ON_BEHALF_OF_HEADER] };
  return STRIP_CLIENT_ROUTING;
}

/** One Envoy stream, i.e. one HTTP request: its phases, in order, and its single release. */
class Exchange {
  private readonly opts: ExtProcHandlerOptions;
  private readonly router: RequestRouter;
  private headers: Record<string, string> = {};
  private subset: string[] | undefined;
  private bodyParts: Buffer[] = [];
  private bodyBytes = 0;
  private routed: RoutedRequest | undefined;
  private status = 0;
  private tracker: ResponseTracker | undefined;
  /** The request's API by path: its errors' shape, its usage events. */
  private api: RequestApi = "chat";
  private phase: ExchangePhase = ExchangePhase.start;
  /** The response is an upstream error being collected and answered OpenAI-shaped at its end. */
  private normalising = false;
  /** Flow control: the objective the request's API key carries (`auth` only). */
  private keyObjective: string | undefined;
  /** The authenticated key's cache salt: the request runs under it (tenant isolation). */
  private tenantSalt: string | undefined;
  /** The authenticated key's class and allowed models (virtual models' `user` signals, permissions). */
  private keyClass: string | undefined;
  private keyModels: readonly string[] | undefined;
  private readonly errorBodyParts: Buffer[] = [];
  private errorBytes = 0;
  /**
   * Aborted when the stream is over: work for this request (a P/D prefill leg, a request held by
   * flow control) stops. Made only when routing asks for the signal (most requests never do).
   */
  private goneCtl: AbortController | undefined;
  /** The response is a server-sent event stream. */
  private sse = false;
  /** P/D: the decode watchdog and the gateway's error in the stream (pd-decode-guard.ts). */
  private guard: DecodeGuard | undefined;
  /** The authenticated key's owner: the Responses API's tenant (`auth` only). */
  private owner: string | undefined;
  /** A route under `/v1/responses/{id}` sent straight to a pod (no routing, no charge). */
  private direct: ResponseRoute | undefined;
  /** The client's body, kept for a Responses continuation its pod may not know (`recover`). */
  private clientBody: Buffer | undefined;
  /** A Responses API reply's id and output items, for the store. */
  private capture: ResponseCapture | undefined;

  constructor(
    private readonly call: Stream,
    private readonly shared: ExchangeShared,
  ) {
    this.opts = shared.opts;
    this.router = shared.opts.router;
  }

  /** The stream is over (Envoy ended or cancelled it). */
  private get over(): boolean {
    return this.phase === ExchangePhase.ended || this.phase === ExchangePhase.cancelled;
  }

  /** Moves to `next` unless the stream is already over. */
  private enter(next: ExchangePhase): void {
    if (!this.over) this.phase = next;
  }

  attach() {
    const call = this.call;
    call.on("data", (req: ProcessingRequest) => {
      try {
        this.onMessage(req);
      } catch (err) {
        this.opts.log.error({ err }, "ext_proc handler failed");
        this.send(immediate(500, this.errorBody(new RouteError("internal", "internal gateway error"))));
      }
    });
    call.on("end", () => {
      // Not an abort: Envoy half-closes after the response (or early when it skips response
      // phases), and a SGLang prefill leg in flight must go on.
      // Envoy half-closed. grpc-js reports a client cancel as "end" followed by "cancelled", and
      // emits "cancelled" after clean closes too, so neither event alone tells them apart:
      // decide one tick later, when `call.cancelled` is settled. The release happens once either way.
      setImmediate(() => {
        this.enter(ExchangePhase.ended);
        const ended = this.status >= 400 ? "error" : this.status && !call.cancelled ? "completed" : "cancelled";
        this.finish(ended);
        if (!call.cancelled) call.end();
      });
    });
    const cancelled = () => {
      this.phase = ExchangePhase.cancelled;
      this.goneCtl?.abort(STREAM_GONE);
      this.finish("cancelled");
    };
    call.on("cancelled", cancelled);
    call.on("error", cancelled);
  }

  private onMessage(req: ProcessingRequest) {
    switch (req.request) {
      case "request_headers":
        return this.onRequestHeaders(req);
      case "request_body":
        // Current Envoy may attach the metadata (the subset hint) to body messages too.
        if (req.metadata_context) this.subset = subsetHint(req) ?? this.subset;
        return this.onRequestBody(req.request_body?.body, req.request_body?.end_of_stream === true);
      case "response_headers":
        return this.onResponseHeaders(req);
      case "response_body":
        return this.onResponseBody(req);
      case "request_trailers":
        return this.send({ request_trailers: {} });
      case "response_trailers":
        this.send({ response_trailers: {} });
        return this.finish(this.status >= 400 ? "error" : "completed");
      default:
        this.opts.log.warn({ request: req.request }, "unknown ext_proc message");
    }
  }

  /** The stream's abort signal (made on first use; already aborted if the stream is gone). */
  private goneSignal(): AbortSignal {
    if (!this.goneCtl) {
      this.goneCtl = new AbortController();
      if (this.phase === ExchangePhase.cancelled) this.goneCtl.abort(STREAM_GONE);
    }
    return this.goneCtl.signal;
  }

  private finish(outcome: "completed" | "error" | "cancelled") {
    this.guard?.stop();
    const routed = this.routed;
    if (!routed || routed.finished) return;
    if (routed.responses && this.capture && outcome === "completed" && this.status >= 200 && this.status < 300) this.opts.responses?.finished(routed, this.capture.end());
    this.capture = undefined;
    const usage = this.endUsage();
    this.router.finish(routed, outcome, { status: this.status || (outcome === "cancelled" ? 499 : 502), ...usage });
  }

  /** The engine's usage report, once the response ended (clamped counts counted, then dropped from the record's inputs). */
  private endUsage(): { promptTokens?: number; completionTokens?: number } {
    const { clamped, ...usage } = this.tracker?.end() ?? {};
    if (clamped) this.opts.usageClamped?.();
    return usage;
  }

  private send(msg: ProcessingResponse) {
    if (!this.call.cancelled && this.call.writable) this.call.write(msg);
  }

  /** An error body in the request's API's shape (Anthropic's on /v1/messages). */
  private errorBody(err: RouteError) {
    return errorBodyFor(this.api, err);
  }

  /** 401: counted by reason; nothing is routed, charged or recorded. */
  private refuseAuth(reason: AuthFailureReason) {
    this.opts.auth?.failed?.(reason, this.headers[Headers.requestId]);
    const err = new RouteError("invalidApiKey", authFailureMessage(reason), null, AUTHENTICATE_CHALLENGE);
    this.send(immediate(err.status, this.errorBody(err), err.headers));
  }

  /** 403 (400 for a malformed header): nothing is routed, charged or recorded; the header value is never logged. */
  private refuseDelegation(reason: "malformed" | "not-permitted" | "owner-invalid") {
    this.opts.auth?.delegationRefused?.(reason, this.headers[Headers.requestId]);
    const err =
      reason === "malformed"
        ? new RouteError("invalidHeader", `${ON_BEHALF_OF_HEADER} must be the SHA-256 (64 lower-case hex digits) of an API key`, ON_BEHALF_OF_HEADER)
        : new RouteError("delegationNotAllowed", reason === "not-permitted" ? `This API key may not send ${ON_BEHALF_OF_HEADER}: only a key created with \`jetroute config add-key --delegate\` may run requests on behalf of another key.` : `The key named by ${ON_BEHALF_OF_HEADER} is unknown or revoked.`, ON_BEHALF_OF_HEADER);
    this.send(immediate(err.status, this.errorBody(err), err.headers));
  }

  private reject(err: RouteError, model?: string) {
    this.router.reject(this.headers, model, err);
    this.send(immediate(err.status, this.errorBody(err), err.headers));
  }

  private onRequestHeaders(req: ProcessingRequest) {
    const headers = headersToRecord(req.request_headers?.headers);
    this.headers = headers;
    this.api = apiOfPath(headers[Headers.path]);
    let mutation = this.shared.requestHeadersMutation;
    if (this.opts.auth) {
      // Anthropic clients send the key as `x-api-key`: taken on /v1/messages when there is no bearer token.
      const apiKey = headers[X_API_KEY];
      const authorization = headers.authorization ?? (this.api === "messages" && apiKey ? `Bearer ${apiKey}` : undefined);
      const caller = this.opts.auth.authenticate(authorization);
      if (!caller.ok) return this.refuseAuth(caller.reason);
      // A delegate key (the batch-worker's) may run the request under another key's settings.
      const onBehalfOf = headers[ON_BEHALF_OF_HEADER];
      const d = onBehalfOf === undefined ? ({ kind: "self" } as const) : (this.opts.auth.delegation?.(caller, onBehalfOf) ?? ({ kind: "refused", reason: "not-permitted" } as const));
      if (d.kind === "refused") return this.refuseDelegation(d.reason);
      const a = d.kind === "owner" ? d.owner : caller;
      // The key says who this is: a client-sent `user` header cannot borrow another user's quota.
      headers[USER_HEADER] = a.user;
      this.owner = a.user;
      this.keyObjective = a.objective;
      this.tenantSalt = a.cacheSalt;
      this.keyClass = a.keyClass;
      this.keyModels = a.models;
      mutation = { ...mutation, set_headers: [...(mutation.set_headers ?? []), setHeader(USER_HEADER, a.user)] };
    }
    this.subset = subsetHint(req);
    const rawPath = headers[Headers.path] ?? "";
    if (this.opts.responses && rawPath.startsWith("/v1/responses/")) return this.onResponseRoute(rawPath, mutation, req.request_headers?.end_of_stream === true);
    if (req.request_headers?.end_of_stream) {
      // No body: only model listing is served here; everything else needs a body to route.
      if ((headers[Headers.method] ?? "GET") === "GET" && (headers[Headers.path] ?? "").split("?")[0] === "/v1/models") {
        const data = modelsVisibleTo(this.opts.listModels(), this.keyModels).map((id) => ({ id, object: "model", owned_by: "jetroute" }));
        return this.send({ ...immediate(200, { object: "list", data }) });
      }
      const path = (headers[Headers.path] ?? "").split("?")[0] ?? "";
      if (path.startsWith("/v1/responses/")) {
        // Retrieve, cancel, delete and input_items need the response store (absent: its streams were never applied).
        return this.reject(new RouteError("unsupportedPath", `${(headers[Headers.method] ?? "").slice(0, 16)} /v1/responses/{id} is not served without the RESPONSE_STORE stream (run \`jetroute streams apply\`); POST /v1/responses is`));
      }
      return this.reject(new RouteError("unsupportedPath", `${headers[Headers.method] ?? ""} ${headers[Headers.path] ?? ""} has no body to route on`));
    }
    this.enter(ExchangePhase.body);
    this.send(mutation === this.shared.requestHeadersMutation ? this.shared.replies.requestHeaders : { request_headers: { response: { status: "CONTINUE", header_mutation: mutation, clear_route_cache: true } } });
  }

  /**
   * A route under `/v1/responses/{id}`: answered here from the store, or sent to the pod holding
   * the response (the request-headers reply names it; nothing is charged or recorded).
   */
  private onResponseRoute(rawPath: string, mutation: HeaderMutation, endOfStream: boolean) {
    const responses = this.opts.responses;
    const route = responseRouteOf(this.headers[Headers.method] ?? "GET", rawPath);
    if (!responses || !route) {
      return this.reject(new RouteError("unsupportedPath", `${(this.headers[Headers.method] ?? "").slice(0, 16)} ${rawPath.split("?")[0]?.slice(0, 128)} is not routed; under /v1/responses/{id}: GET, DELETE, POST …/cancel, GET …/input_items`));
    }
    if (!this.opts.isReady()) return this.reject(new RouteError("notReady", "gateway is catching up with the streams; retry shortly"));
    this.enter(ExchangePhase.routing);
    responses.route(route, this.owner).then(
      (r) => {
        if (this.over || this.call.cancelled) return;
        if (r.kind === "error") return this.send(immediate(r.error.status, this.errorBody(r.error), r.error.headers));
        if (r.kind === "answer") return this.send(immediate(r.status, r.body));
        this.direct = route;
        this.enter(endOfStream ? ExchangePhase.routed : ExchangePhase.body);
        const set = [...(mutation.set_headers ?? []), setHeader(Headers.destinationEndpoint, r.address), setHeader(Headers.targetPod, r.address)];
        this.send({ request_headers: { response: { status: "CONTINUE", header_mutation: { ...mutation, set_headers: set }, clear_route_cache: true } }, dynamic_metadata: toProtoStruct({ [LB_METADATA_NAMESPACE]: { [Headers.destinationEndpoint]: r.address } }) });
      },
      (err: unknown) => {
        if (this.over || this.call.cancelled) return;
        this.opts.log.warn({ err }, "response store unavailable");
        const e = new RouteError("notReady", "the response store cannot be read; retry shortly");
        this.send(immediate(e.status, this.errorBody(e), e.headers));
      },
    );
  }

  private onRequestBody(chunk: Buffer | Uint8Array | undefined, endOfStream: boolean) {
    // A route under /v1/responses/{id} already sent to its pod: its body (a cancel's) goes as it is.
    if (this.direct) {
      if (endOfStream) this.enter(ExchangePhase.routed);
      return this.send(this.shared.replies.requestBodyContinue);
    }
    const { maxBody } = this.shared;
    if (chunk?.length) {
      this.bodyBytes += chunk.length;
      // grpc-js hands each message its own Buffer: kept as it is, not copied.
      if (this.bodyBytes <= maxBody) this.bodyParts.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
    }
    // A stream that skipped the request-headers phase (a proxy set to SKIP it) never showed a key.
    if (this.opts.auth && this.phase === ExchangePhase.start) return this.refuseAuth("missing");
    if (!endOfStream) return this.send(this.shared.replies.requestBodyContinue);
    if (this.bodyBytes > maxBody) return this.reject(new RouteError("bodyTooLarge", `request body exceeds ${maxBody} bytes`));
    const headers = this.headers;
    const path = (headers[Headers.path] ?? "").split("?")[0] ?? "";
    if (path.startsWith("/v1/responses/")) {
      return this.reject(new RouteError("unsupportedPath", `${(headers[Headers.method] ?? "").slice(0, 16)} /v1/responses/{id}/... is not served without the RESPONSE_STORE stream (run \`jetroute streams apply\`); POST /v1/responses is`));
    }
    if (!(ROUTED_PATHS as readonly string[]).includes(path)) {
      return this.reject(new RouteError("unsupportedPath", `${(headers[Headers.method] ?? "").slice(0, 16)} ${path.slice(0, 128)} is not routed; routed paths: ${ROUTED_PATHS.join(", ")}, and GET /v1/models`));
    }
    if (!this.opts.isReady()) return this.reject(new RouteError("notReady", "gateway is catching up with the streams; retry shortly"));
    const body = this.bodyParts.length === 1 ? (this.bodyParts[0] as Buffer) : Buffer.concat(this.bodyParts);
    this.bodyParts = [];
    if (this.opts.responses && path === "/v1/responses") this.clientBody = body;
    this.enter(ExchangePhase.routing);
    let result: RoutedRequest | Promise<RoutedRequest>;
    try {
      const exchange = this;
      result = this.router.route({
        headers,
        body,
        subset: this.subset,
        get signal() {
          return exchange.goneSignal();
        },
        ...(this.keyObjective ? { keyObjective: this.keyObjective } : {}),
        ...(this.tenantSalt ? { tenantSalt: this.tenantSalt } : {}),
        ...(this.keyClass ? { keyClass: this.keyClass } : {}),
        ...(this.keyModels ? { keyModels: this.keyModels } : {}),
        ...(this.owner !== undefined ? { tenant: this.owner } : {}),
      });
    } catch (err) {
      return this.routeFailed(err);
    }
    if (result instanceof Promise) {
      result.then(
        (r) => {
          this.routed = r;
          // The client may have left (or the stream ended) while the request was being tokenized,
          // held by a rate limit or committed.
          if (this.call.cancelled || this.over) return this.finish("cancelled");
          this.replyRouted(r);
        },
        (err) => this.routeFailed(err),
      );
      return;
    }
    this.routed = result;
    this.replyRouted(result);
  }

  private routeFailed(err: unknown) {
    // The client left while the request was being worked on: nobody to answer.
    if (this.over || this.call.cancelled) return;
    if (err instanceof RouteError && err.afterRouting) return this.send(immediate(err.status, this.errorBody(err), err.headers));
    // The refusal names the model the request path parsed (the body is not parsed again here).
    if (err instanceof RouteError) return this.reject(err, err.refusal?.model);
    this.opts.log.error({ err }, "routing failed");
    this.reject(new RouteError("internal", "internal routing error"));
  }

  private replyRouted(routed: RoutedRequest) {
    let target = this.shared.targets.of(routed.pod.address, routed.strategy);
    const fallbacks = routed.pd ? 0 : (this.opts.destinationFallbacks ?? 0);
    if (fallbacks > 0) {
      // The protocol's ordered list: header and metadata carry the same value (AIBrix's target-pod stays the chosen one).
      const list = destinationList(routed.pod.address, routed.candidates, routed.better, fallbacks, this.subset).join(",");
      if (list !== routed.pod.address) {
        target = {
          ...target,
          headers: [setHeader(Headers.destinationEndpoint, list), ...target.headers.slice(1)],
          metadata: toProtoStruct({ [LB_METADATA_NAMESPACE]: { [Headers.destinationEndpoint]: list } }),
        };
      }
    }
    const set = [...target.headers, setHeader(Headers.requestId, routed.requestId)];
    // The gateway's body goes out instead of the client's: a tenant's cache salt, a rewritten model, a semantic action, P/D's decode leg.
    const upstream = routed.body;
    if (upstream) set.push(setHeader(Headers.contentLength, String(upstream.length)));
    this.send({
      request_body: {
        response: {
          status: "CONTINUE",
          header_mutation: { set_headers: set },
          ...(upstream ? { body_mutation: { body: upstream } } : {}),
          clear_route_cache: true,
        },
      },
      dynamic_metadata: target.metadata,
    });
    this.enter(ExchangePhase.routed);
    if (routed.pd) {
      const guard = new DecodeGuard(routed, {
        watchdog: this.shared.watchdog,
        over: () => this.over,
        responseStarted: () => this.phase === ExchangePhase.response,
        immediate: (err) => this.send(immediate(err.status, this.errorBody(err), err.headers)),
        fail: (r, err) => void this.router.finish(r, "error", { status: err.status, errorCode: err.code }),
        abortDecode: (r) => this.router.abortDecode?.(r),
      });
      this.guard = guard;
      routed.pd.onFailure = (err) => guard.end(err);
      // The prefill may have failed before Envoy was even told where decode goes.
      if (routed.pd.failure) return guard.end(routed.pd.failure);
      guard.routed();
    }
  }

  private onResponseHeaders(req: ProcessingRequest) {
    const h = headersToRecord(req.response_headers?.headers);
    const routed = this.routed;
    const status = Number.parseInt(h[Headers.status] ?? "0", 10) || 0;
    // A pinned continuation its pod does not know (404): expanded from the store, answered here.
    if (status === 404 && routed?.responses?.affinity?.action === "pin" && this.opts.responses && this.clientBody) return this.recoverContinuation(routed, this.clientBody);
    // A retrieval its pod does not know (its engine keeps no responses): answered from the store.
    if (status === 404 && this.direct?.kind === "retrieve" && this.opts.responses) return this.retrieveFromStore(this.direct.id);
    const served = servedEndpoint(req);
    if (routed && served !== undefined && served !== routed.pod.address) this.opts.servedElsewhere?.(routed, served);
    this.status = Number.parseInt(h[Headers.status] ?? "0", 10) || 0;
    this.enter(ExchangePhase.response);
    this.sse = (h[Headers.contentType] ?? "").includes("text/event-stream");
    this.tracker = new ResponseTracker(h[Headers.contentType], this.api);
    if (routed?.responses && this.status >= 200 && this.status < 300) this.capture = new ResponseCapture(h[Headers.contentType]);
    const expose = this.opts.exposePodAddresses === true;
    const target = routed ? this.shared.targets.of(routed.pod.address, routed.strategy) : undefined;
    const set = routed && target ? [...(expose ? target.echo : target.echoNoAddress), setHeader(Headers.gatewayRequestId, routed.requestId)] : [];
    for (const [k, v] of Object.entries(routed?.responseHeaders ?? {})) set.push(setHeader(k, v));
    if (routed?.pd && !routed.pd.plan.skipPrefill) {
      const a = routed.pd.prefillPod.address;
      set.push(setHeader(Headers.prefillTargetPod, routed.pd.prefillPod.pod));
      if (expose) set.push(setHeader(Headers.prefillTargetPodIp, a.slice(0, a.lastIndexOf(":"))));
    }
    // An upstream error gets an OpenAI-shaped body: collect it, answer at its last chunk.
    this.normalising = this.status >= 400 && !req.response_headers?.end_of_stream;
    if (this.normalising) set.push(setHeader(Headers.contentType, "application/json"));
    this.send({
      response_headers: {
        response: { status: "CONTINUE", header_mutation: { set_headers: set, ...(this.normalising ? { remove_headers: [Headers.contentLength] } : {}) } },
      },
    });
    if (req.response_headers?.end_of_stream) this.finish(this.status >= 400 ? "error" : "completed");
  }

  private onResponseBody(req: ProcessingRequest) {
    const b = req.response_body;
    const routed = this.routed;
    // The first token: the first body bytes, or for the Responses and Messages APIs the first event past the stream's preamble.
    const tokenSeen = b?.body?.length ? (this.tracker?.push(b.body) ?? true) : false;
    if (routed && routed.firstChunkAt === undefined && tokenSeen) this.router.firstToken(routed);
    if (b?.body?.length && this.capture) {
      const known = this.capture.id !== undefined;
      this.capture.push(b.body);
      // A stream's first event names the id: every replica learns where it lives before the reply ends.
      const id = this.capture.id;
      if (!known && id !== undefined && routed && this.sse) this.opts.responses?.started(routed, id);
    }
    const guard = this.guard;
    guard?.chunk(b?.end_of_stream === true, b?.body?.length ?? 0);
    const pdError = guard?.error;
    if (guard && pdError && !this.normalising && this.sse) {
      // The decode was ended by the gateway: its stream closes with the reason as an SSE event.
      this.send(guard.splice(b?.body, b?.end_of_stream === true) as ProcessingResponse);
      if (b?.end_of_stream) {
        this.status = pdError.status;
        if (routed && !routed.finished) this.router.finish(routed, "error", { status: pdError.status, errorCode: pdError.code, ...this.endUsage() });
      }
      return;
    }
    if (guard && pdError && b?.end_of_stream && routed && !routed.finished) {
      // A non-streamed answer that ended after the gateway gave up on it: recorded as the gateway's error.
      this.status = pdError.status;
      this.router.finish(routed, "error", { status: pdError.status, errorCode: pdError.code, ...this.endUsage() });
      guard.stop();
    }
    if (this.normalising) {
      if (b?.body?.length && this.errorBytes < 65_536) {
        this.errorBodyParts.push(Buffer.from(b.body));
        this.errorBytes += b.body.length;
      }
      if (!b?.end_of_stream) this.send({ response_body: { response: { status: "CONTINUE", body_mutation: { clear_body: true } } } });
      else {
        const normal = reshapeError(this.api, this.status, normaliseUpstreamError(this.status, Buffer.concat(this.errorBodyParts)));
        this.send({ response_body: { response: { status: "CONTINUE", body_mutation: { body: Buffer.from(JSON.stringify(normal)) } } } });
      }
    } else this.send(this.shared.replies.responseBodyContinue);
    if (b?.end_of_stream) this.finish(this.status >= 400 ? "error" : "completed");
  }

  /** The response-headers phase of a pinned continuation answered 404: the store's expansion, sent to the same pod, answers instead. */
  private recoverContinuation(routed: RoutedRequest, clientBody: Buffer) {
    this.enter(ExchangePhase.response);
    const responses = this.opts.responses;
    if (!responses) return;
    void responses.recover(routed, clientBody, this.goneSignal()).then((answer) => {
      if (this.over || this.call.cancelled) return;
      if (!answer) {
        this.status = 404;
        const e = new RouteError("responseNotFound", `Response with id '${(routed.responses?.previousResponseId ?? "").slice(0, 128)}' not found.`, "previous_response_id");
        return this.send(immediate(e.status, this.errorBody(e)));
      }
      this.status = answer.status;
      this.tracker = new ResponseTracker(answer.contentType);
      this.tracker.push(answer.body);
      if (routed.firstChunkAt === undefined) this.router.firstToken(routed);
      if (answer.status >= 200 && answer.status < 300) {
        this.capture = new ResponseCapture(answer.contentType);
        this.capture.push(answer.body);
      }
      this.send({
        immediate_response: {
          status: { code: answer.status },
          headers: { set_headers: [setHeader(Headers.contentType, answer.contentType), setHeader(Headers.gatewayRequestId, routed.requestId)] },
          body: answer.body,
          details: "jetroute_response_expanded",
        },
      });
      this.finish(answer.status >= 400 ? "error" : "completed");
    });
  }

  /** A forwarded `GET /v1/responses/{id}` its pod answered 404: the stored response, else the 404 as the gateway's own. */
  private retrieveFromStore(id: string) {
    this.enter(ExchangePhase.response);
    const responses = this.opts.responses;
    if (!responses) return;
    responses.retrieveStored(this.owner, id).then(
      (body) => {
        if (this.over || this.call.cancelled) return;
        if (body !== undefined) return this.send(immediate(200, body));
        const e = new RouteError("responseNotFound", `Response with id '${id.slice(0, 128)}' not found.`);
        this.send(immediate(e.status, this.errorBody(e)));
      },
      () => {
        if (this.over || this.call.cancelled) return;
        const e = new RouteError("notReady", "the response store cannot be read; retry shortly");
        this.send(immediate(e.status, this.errorBody(e), e.headers));
      },
    );
  }
}

/** The endpoint the proxy reports as the one that served the request (response-path metadata), if any. */
function servedEndpoint(req: ProcessingRequest): string | undefined {
  const ns = req.metadata_context?.filter_metadata?.[LB_METADATA_NAMESPACE];
  if (!ns) return undefined;
  const v = fromProtoStruct(ns)[SERVED_ENDPOINT_KEY];
  return typeof v === "string" && v.length <= 300 ? v.trim() : undefined;
}
