/**
 * Envoy's side of ext_proc: a client that drives an ext_proc server exactly as Envoy's
 * `envoy.filters.http.ext_proc` filter does with the processing mode jetroute deploys
 * (request headers SEND, request body BUFFERED, response headers SEND, response body STREAMED,
 * trailers SKIP, `failure_mode_allow: false`).
 *
 * Used by the dev front, by integration tests that play Envoy against the gateway, and by the
 * load generator. One {@link ExtProcExchange} is one gRPC stream is one HTTP request.
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { EXT_PROC_METHOD_PATH, envoyProtoIncludeDirs, loadExtProc } from "./protos.js";
import type {
  CommonResponse,
  HeaderMutation,
  HeaderValue,
  ImmediateResponse,
  ProcessingRequest,
  ProcessingResponse,
  ProtoStruct,
} from "./types.js";
import { fromProtoStruct, toProtoStruct } from "./wire.js";

/** The four phases this processing mode sends; each reply names the same phase. */
export type Phase = "request_headers" | "request_body" | "response_headers" | "response_body";

/** How a `set_headers` entry changes a header map (Envoy's HeaderAppendAction, resolved). */
export type HeaderSetAction = "append" | "add-if-absent" | "overwrite-or-add" | "overwrite-if-exists";

export interface HeaderSetEntry {
  /** Lower-cased, as Envoy stores header names. */
  key: string;
  value: string;
  action: HeaderSetAction;
}

export interface HeaderMutationResult {
  /** Convenience view: the last value each key is set to. Use `entries` to apply faithfully. */
  set: Record<string, string>;
  /** Lower-cased names to remove; Envoy removes before it sets. */
  remove: string[];
  /** Every `set_headers` entry in order, with the append semantics Envoy gives it. */
  entries: HeaderSetEntry[];
}

export type PhaseResult =
  | {
      kind: "continue";
      headerMutation: HeaderMutationResult;
      /** Replacement body; an empty Buffer when the server sent `clear_body`. */
      bodyMutation?: Buffer;
      clearRouteCache: boolean;
      /** `dynamic_metadata` decoded to plain JSON, keyed by namespace (e.g. `envoy.lb`). */
      dynamicMetadata?: Record<string, unknown>;
    }
  | {
      kind: "immediate";
      status: number;
      headers: Record<string, string>;
      body: Buffer;
      details?: string;
      dynamicMetadata?: Record<string, unknown>;
    };

/** Header maps as callers hold them; an array value becomes one header entry per element, as Envoy sends duplicates. */
export type HeaderInput = Record<string, string | readonly string[] | undefined>;

export interface ExtProcClientOptions {
  /** Channel credentials (TLS / mutual TLS, as Envoy's ext_proc cluster can be set up); default insecure. */
  credentials?: grpc.ChannelCredentials;
  /**
   * Envoy's `message_timeout`: how long one message may wait for its reply. Generous by default
   * because a gateway may call a remote tokenizer (Envoy Gateway's 200 ms default is too short).
   */
  messageTimeoutMs?: number;
  /**
   * How an exchange ends after its last phase. `graceful`: half-close, then wait for the server's
   * status (Envoy with the `ext_proc_graceful_grpc_close` runtime guard). `reset`: half-close and
   * cancel at once, so the server sees CANCELLED on every request (older Envoy). A gateway must
   * release its charges correctly under both.
   */
  closeMode?: "graceful" | "reset";
  /** In graceful mode, cancel a stream whose server has not finished this long after the half-close. */
  gracefulCloseTimeoutMs?: number;
  channelOptions?: grpc.ChannelOptions;
}

export interface OpenOptions {
  /**
   * `metadata_context.filter_metadata`: namespace -> plain JSON object. Envoy attaches the
   * forwarded namespaces to every message of the stream; this client does the same. The
   * Inference Extension subset hint lives at
   * `{"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": ["ip:port", ...]}}`.
   */
  metadataContext?: Record<string, Record<string, unknown>>;
}

export interface ExtProcExchange {
  /**
   * Sends `request_headers`. The map must carry `:method`, `:path` and `:authority` (as Envoy's
   * always does); `:scheme` defaults to `http`. Pseudo headers go first; values travel as `raw_value`.
   */
  requestHeaders(headers: HeaderInput, endOfStream?: boolean): Promise<PhaseResult>;
  /** BUFFERED: the whole body in one message with `end_of_stream: true`. */
  requestBody(body: Buffer): Promise<PhaseResult>;
  /** Sends `response_headers` with `:status` first. */
  /**
   * `metadata`: filter metadata for this message only, merged over the exchange's (the proxy's
   * `envoy.lb` / `x-gateway-destination-endpoint-served` report of the endpoint that served).
   */
  responseHeaders(status: number, headers: HeaderInput, endOfStream?: boolean, metadata?: Record<string, Record<string, unknown>>): Promise<PhaseResult>;
  /** STREAMED: one message per chunk, resolved by that chunk's own reply. */
  responseBodyChunk(chunk: Buffer, endOfStream: boolean): Promise<PhaseResult>;
  /**
   * Low-level send for callers that pre-serialize (the load generator): `message` is sent as is,
   * so it must already carry any `metadata_context` the exchange was opened with.
   */
  send(phase: Phase, message: ProcessingRequest | Buffer): Promise<PhaseResult>;
  /** What Envoy does when the downstream client goes away: cancel the gRPC stream. */
  cancel(): void;
  /** Ends the stream after the last phase per `closeMode`. Never rejects. */
  end(): Promise<void>;
  /** True once the stream is finished from this side (immediate response, error, cancel or end). */
  readonly closed: boolean;
  /**
   * Called with an immediate response the processor sent while no phase awaited a reply (e.g. a
   * gateway watchdog ending a request whose upstream stalled). Envoy acts on one at any time:
   * before response headers it sends it to the client, after them it can only reset the stream.
   */
  onUnsolicitedImmediate?: (result: Extract<PhaseResult, { kind: "immediate" }>) => void;
}

/** Base class of every failure an exchange reports; `cause` carries the underlying error. */
export class ExtProcError extends Error {
  override name = "ExtProcError";
}
/** The gRPC stream failed (connection refused, server error, ...). Envoy answers 500. */
export class ExtProcStreamError extends ExtProcError {
  override name = "ExtProcStreamError";
  constructor(
    readonly code: grpc.status,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}
/** No reply within the message timeout. Envoy answers 504. */
export class ExtProcTimeoutError extends ExtProcError {
  override name = "ExtProcTimeoutError";
}
/** A reply for a phase other than the one awaited, or a reply nobody awaited. */
export class ExtProcSpuriousResponseError extends ExtProcError {
  override name = "ExtProcSpuriousResponseError";
}
/**
 * The server finished the stream with OK while a reply was still awaited. Envoy then stops
 * processing and lets the request continue unmodified; callers that emulate Envoy do the same.
 */
export class ExtProcStreamClosedError extends ExtProcError {
  override name = "ExtProcStreamClosedError";
}
/** A send after the exchange was cancelled, ended or answered with an immediate response. */
export class ExtProcExchangeEndedError extends ExtProcError {
  override name = "ExtProcExchangeEndedError";
}

const DEFAULT_MESSAGE_TIMEOUT_MS = 30_000;
const DEFAULT_GRACEFUL_CLOSE_TIMEOUT_MS = 5_000;
/** Envoy sends pseudo headers first; servers that index headers positionally rely on it. */
const REQUEST_PSEUDO_ORDER = [":authority", ":path", ":method", ":scheme"] as const;
/** Envoy turns an immediate response without a valid (>= 200) status into 200. */
const DEFAULT_IMMEDIATE_STATUS = 200;

export class ExtProcClient {
  readonly target: string;
  private readonly client: grpc.Client;
  private readonly serialize: (m: ProcessingRequest | Buffer) => Buffer;
  private readonly deserialize: (b: Buffer) => ProcessingResponse;
  private readonly messageTimeoutMs: number;
  private readonly closeMode: "graceful" | "reset";
  private readonly gracefulCloseTimeoutMs: number;

  constructor(target: string, opts: ExtProcClientOptions = {}) {
    this.target = target;
    const method = loadExtProc().client.service.Process;
    if (!method) throw new Error("ext_proc service definition has no Process method");
    const requestSerialize = method.requestSerialize as (m: ProcessingRequest) => Buffer;
    this.serialize = (m) => (Buffer.isBuffer(m) ? m : requestSerialize(m));
    this.deserialize = method.responseDeserialize as (b: Buffer) => ProcessingResponse;
    this.messageTimeoutMs = opts.messageTimeoutMs ?? DEFAULT_MESSAGE_TIMEOUT_MS;
    this.closeMode = opts.closeMode ?? "graceful";
    this.gracefulCloseTimeoutMs = opts.gracefulCloseTimeoutMs ?? DEFAULT_GRACEFUL_CLOSE_TIMEOUT_MS;
    this.client = new grpc.Client(target, opts.credentials ?? grpc.credentials.createInsecure(), {
      // A body mutation may be as large as the buffered body (4 MiB in AIBrix's setup) plus framing.
      "grpc.max_receive_message_length": 64 * 1024 * 1024,
      "grpc.max_send_message_length": 64 * 1024 * 1024,
      ...opts.channelOptions,
    });
  }

  /** Serializes a request once, for callers that send the same message many times. */
  encode(message: ProcessingRequest): Buffer {
    return this.serialize(message);
  }

  /** The channel's connectivity, e.g. to skip a gateway in TRANSIENT_FAILURE. */
  connectivityState(): grpc.connectivityState {
    return this.client.getChannel().getConnectivityState(false);
  }

  open(opts: OpenOptions = {}): ExtProcExchange {
    const call = this.client.makeBidiStreamRequest<ProcessingRequest | Buffer, ProcessingResponse>(
      EXT_PROC_METHOD_PATH,
      this.serialize,
      this.deserialize,
      new grpc.Metadata(),
    );
    return new ExchangeImpl(call, {
      messageTimeoutMs: this.messageTimeoutMs,
      closeMode: this.closeMode,
      gracefulCloseTimeoutMs: this.gracefulCloseTimeoutMs,
      metadataContext: opts.metadataContext,
    });
  }

  close(): void {
    this.client.close();
  }
}

interface Pending {
  phase: Phase;
  resolve: (r: PhaseResult) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

interface ExchangeConfig {
  messageTimeoutMs: number;
  closeMode: "graceful" | "reset";
  gracefulCloseTimeoutMs: number;
  metadataContext: Record<string, Record<string, unknown>> | undefined;
}

class ExchangeImpl implements ExtProcExchange {
  private readonly pending: Pending[] = [];
  private readonly metadataContext: ProcessingRequest["metadata_context"];
  /**
   * Set once no further message may be sent: the error later sends reject with, or for an
   * ordinary end just its message, turned into an error only if someone sends after all
   * (building an Error per request costs the load generator measurably).
   */
  private finished: ExtProcError | string | undefined;
  private serverDone = false;
  private readonly serverDoneWaiters: Array<() => void> = [];
  private closing: Promise<void> | undefined;
  onUnsolicitedImmediate?: (result: Extract<PhaseResult, { kind: "immediate" }>) => void;

  constructor(
    private readonly call: grpc.ClientDuplexStream<ProcessingRequest | Buffer, ProcessingResponse>,
    private readonly cfg: ExchangeConfig,
  ) {
    if (cfg.metadataContext) {
      const filter_metadata: Record<string, ProtoStruct> = {};
      for (const [ns, obj] of Object.entries(cfg.metadataContext)) filter_metadata[ns] = toProtoStruct(obj);
      this.metadataContext = { filter_metadata };
    }
    call.on("data", (m: ProcessingResponse) => this.onResponse(m));
    call.on("status", (s: grpc.StatusObject) => this.onStatus(s));
    // Errors also arrive as a non-OK status; this listener only keeps them from being unhandled.
    call.on("error", () => {});
  }

  get closed(): boolean {
    return this.finished !== undefined;
  }

  requestHeaders(headers: HeaderInput, endOfStream = false): Promise<PhaseResult> {
    for (const p of [":method", ":path", ":authority"]) {
      if (headerValues(headers, p).length === 0) {
        return Promise.reject(new TypeError(`requestHeaders: ${p} is required (Envoy always sends it)`));
      }
    }
    const withScheme: HeaderInput = headerValues(headers, ":scheme").length ? headers : { ...headers, ":scheme": "http" };
    return this.sendPhase("request_headers", {
      request_headers: { headers: { headers: toHeaderValues(withScheme, REQUEST_PSEUDO_ORDER) }, end_of_stream: endOfStream },
    });
  }

  requestBody(body: Buffer): Promise<PhaseResult> {
    return this.sendPhase("request_body", { request_body: { body, end_of_stream: true } });
  }

  responseHeaders(status: number, headers: HeaderInput, endOfStream = false, metadata?: Record<string, Record<string, unknown>>): Promise<PhaseResult> {
    const all: HeaderInput = { ...headers, ":status": String(status) };
    const message: ProcessingRequest = { response_headers: { headers: { headers: toHeaderValues(all, [":status"]) }, end_of_stream: endOfStream } };
    if (!metadata) return this.sendPhase("response_headers", message);
    const filter_metadata: Record<string, ProtoStruct> = { ...(this.metadataContext?.filter_metadata ?? {}) };
    for (const [ns, obj] of Object.entries(metadata)) filter_metadata[ns] = toProtoStruct(obj);
    message.metadata_context = { filter_metadata };
    return this.send("response_headers", message);
  }

  responseBodyChunk(chunk: Buffer, endOfStream: boolean): Promise<PhaseResult> {
    return this.sendPhase("response_body", { response_body: { body: chunk, end_of_stream: endOfStream } });
  }

  send(phase: Phase, message: ProcessingRequest | Buffer): Promise<PhaseResult> {
    if (this.finished !== undefined) return Promise.reject(this.endedError());
    return new Promise<PhaseResult>((resolve, reject) => {
      const timer = setTimeout(() => this.onTimeout(), this.cfg.messageTimeoutMs);
      this.pending.push({ phase, resolve, reject, timer });
      this.call.write(message);
    });
  }

  cancel(): void {
    this.finish("exchange cancelled");
    this.call.cancel();
  }

  end(): Promise<void> {
    this.finish("exchange ended");
    return this.closeStream();
  }

  private sendPhase(phase: Phase, message: ProcessingRequest): Promise<PhaseResult> {
    if (this.metadataContext) message.metadata_context = this.metadataContext;
    return this.send(phase, message);
  }

  /** Envoy's stream close: half-close, then reset at once or wait for the server's status. */
  private closeStream(): Promise<void> {
    this.closing ??= this.startClose();
    return this.closing;
  }

  private startClose(): Promise<void> {
    if (this.serverDone) return Promise.resolve();
    this.call.end();
    if (this.cfg.closeMode === "reset") {
      this.call.cancel();
      return Promise.resolve();
    }
    return new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.call.cancel();
        resolve();
      }, this.cfg.gracefulCloseTimeoutMs);
      timer.unref();
      this.serverDoneWaiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  private onResponse(m: ProcessingResponse & { response?: string; override_message_timeout?: unknown }): void {
    if (this.finished !== undefined) return;
    const which = m.response;
    if (!which) {
      // `override_message_timeout` alone is legal; Envoy honours it only up to a configured
      // `max_message_timeout` (0 by default), so with the default config it changes nothing.
      if (m.override_message_timeout !== undefined) return;
      this.fail(new ExtProcSpuriousResponseError("ProcessingResponse without a response"));
      return;
    }
    const head = this.pending[0];
    if (which === "immediate_response" && m.immediate_response) {
      const result = decodeImmediate(m.immediate_response, m.dynamic_metadata);
      if (head) {
        this.pending.shift();
        clearTimeout(head.timer);
        head.resolve(result);
      }
      this.finish("exchange ended by an immediate response");
      if (!head) this.onUnsolicitedImmediate?.(result as Extract<PhaseResult, { kind: "immediate" }>);
      // Envoy stops talking to the processor once it has an immediate response.
      void this.closeStream();
      return;
    }
    if (!head) {
      this.fail(new ExtProcSpuriousResponseError(`unexpected ${which} reply: no message awaits one`));
      return;
    }
    if (head.phase !== which) {
      this.fail(new ExtProcSpuriousResponseError(`expected a ${head.phase} reply, got ${which}`));
      return;
    }
    this.pending.shift();
    clearTimeout(head.timer);
    const body = (m as Record<string, { response?: CommonResponse } | undefined>)[which];
    head.resolve(decodeCommon(body?.response, m.dynamic_metadata));
  }

  private onStatus(s: grpc.StatusObject): void {
    this.serverDone = true;
    for (const w of this.serverDoneWaiters.splice(0)) w();
    if (this.pending.length === 0) {
      this.finished ??= `stream finished by the server (${grpc.status[s.code]})`;
      return;
    }
    if (s.code === grpc.status.OK) {
      this.fail(new ExtProcStreamClosedError("ext_proc server closed the stream while a reply was awaited"));
    } else {
      this.fail(new ExtProcStreamError(s.code, `ext_proc stream failed: ${grpc.status[s.code]} ${s.details}`));
    }
  }

  private onTimeout(): void {
    this.fail(new ExtProcTimeoutError(`no ext_proc reply within ${this.cfg.messageTimeoutMs} ms`));
  }

  /** Rejects everything awaited with `err` and cancels the stream, as Envoy abandons a failed processor. */
  private fail(err: ExtProcError): void {
    this.finish(err);
    if (!this.serverDone) this.call.cancel();
  }

  private finish(reason: ExtProcError | string): void {
    this.finished ??= reason;
    if (this.pending.length === 0) return;
    const err = typeof reason === "string" ? new ExtProcExchangeEndedError(reason) : reason;
    for (const p of this.pending.splice(0)) {
      clearTimeout(p.timer);
      p.reject(err);
    }
  }

  private endedError(): ExtProcError {
    const f = this.finished ?? "exchange ended";
    return typeof f === "string" ? new ExtProcExchangeEndedError(f) : f;
  }
}

function headerValues(headers: HeaderInput, key: string): readonly string[] {
  const v = headers[key];
  if (v === undefined) return [];
  return typeof v === "string" ? [v] : v;
}

function toHeaderValues(headers: HeaderInput, firstKeys: readonly string[]): HeaderValue[] {
  const out: HeaderValue[] = [];
  const push = (key: string, v: string | readonly string[] | undefined) => {
    if (v === undefined) return;
    for (const one of typeof v === "string" ? [v] : v) out.push({ key, raw_value: Buffer.from(one) });
  };
  for (const k of firstKeys) push(k, headers[k]);
  for (const [k, v] of Object.entries(headers)) {
    const key = k.toLowerCase();
    if (!firstKeys.includes(key)) push(key, v);
  }
  return out;
}

function headerValueText(h: HeaderValue): string {
  // Envoy reads `raw_value` when its runtime guard sends raw values, `value` otherwise.
  if (h.raw_value && h.raw_value.length > 0) return Buffer.from(h.raw_value).toString("utf8");
  return h.value ?? "";
}

type WireHeaderValueOption = Omit<NonNullable<HeaderMutation["set_headers"]>[number], "append_action"> & {
  append?: { value?: boolean } | null;
  append_action?: string | number;
};

function resolveAction(o: WireHeaderValueOption): HeaderSetAction {
  switch (o.append_action) {
    case "ADD_IF_ABSENT":
    case 1:
      return "add-if-absent";
    case "OVERWRITE_IF_EXISTS_OR_ADD":
    case 2:
      return "overwrite-or-add";
    case "OVERWRITE_IF_EXISTS":
    case 3:
      return "overwrite-if-exists";
    default:
      // APPEND_IF_EXISTS_OR_ADD is the enum's zero value, indistinguishable from "unset", so
      // Envoy's ext_proc falls back to the deprecated `append` BoolValue, which defaults to false.
      return o.append?.value ? "append" : "overwrite-or-add";
  }
}

function decodeHeaderMutation(m: HeaderMutation | undefined): HeaderMutationResult {
  const result: HeaderMutationResult = { set: {}, remove: [], entries: [] };
  for (const name of m?.remove_headers ?? []) result.remove.push(name.toLowerCase());
  for (const o of (m?.set_headers ?? []) as WireHeaderValueOption[]) {
    if (!o.header) continue;
    const entry: HeaderSetEntry = { key: o.header.key.toLowerCase(), value: headerValueText(o.header), action: resolveAction(o) };
    result.entries.push(entry);
    result.set[entry.key] = entry.value;
  }
  return result;
}

function decodeMetadata(s: ProtoStruct | undefined): Record<string, unknown> | undefined {
  return s ? fromProtoStruct(s) : undefined;
}

function decodeCommon(c: CommonResponse | undefined, dyn: ProtoStruct | undefined): PhaseResult {
  const result: PhaseResult = {
    kind: "continue",
    headerMutation: decodeHeaderMutation(c?.header_mutation),
    clearRouteCache: c?.clear_route_cache === true,
  };
  const bm = c?.body_mutation as (CommonResponse["body_mutation"] & { mutation?: string }) | undefined;
  if (bm?.mutation === "body" || bm?.body !== undefined) result.bodyMutation = Buffer.from(bm.body ?? Buffer.alloc(0));
  else if (bm?.clear_body) result.bodyMutation = Buffer.alloc(0);
  const dynamicMetadata = decodeMetadata(dyn);
  if (dynamicMetadata) result.dynamicMetadata = dynamicMetadata;
  return result;
}

function decodeImmediate(r: ImmediateResponse, dyn: ProtoStruct | undefined): PhaseResult {
  let status = statusCodeNumber(r.status?.code);
  if (status < 200) status = DEFAULT_IMMEDIATE_STATUS;
  const headers: Record<string, string> = {};
  const mutation = decodeHeaderMutation(r.headers);
  applyHeaderSetEntries(headers, mutation.entries);
  const result: PhaseResult = { kind: "immediate", status, headers, body: Buffer.from(r.body ?? Buffer.alloc(0)) };
  if (r.details) result.details = r.details;
  const dynamicMetadata = decodeMetadata(dyn);
  if (dynamicMetadata) result.dynamicMetadata = dynamicMetadata;
  return result;
}

/**
 * Applies set entries to a single-valued header map; appended values join with ", " as they
 * would on an HTTP/1 wire.
 */
export function applyHeaderSetEntries(headers: Record<string, string>, entries: readonly HeaderSetEntry[]): void {
  for (const e of entries) {
    const present = Object.hasOwn(headers, e.key);
    switch (e.action) {
      case "append":
        headers[e.key] = present ? `${headers[e.key]}, ${e.value}` : e.value;
        break;
      case "add-if-absent":
        if (!present) headers[e.key] = e.value;
        break;
      case "overwrite-or-add":
        headers[e.key] = e.value;
        break;
      case "overwrite-if-exists":
        if (present) headers[e.key] = e.value;
        break;
    }
  }
}

let statusNames: Map<string, number> | undefined;

/**
 * ImmediateResponse's status is the `envoy.type.v3.StatusCode` enum, which the loader (enums as
 * strings) hands us by name ("ServiceUnavailable"); the numbers come from Envoy's own proto.
 */
function statusCodeNumber(code: number | string | undefined): number {
  if (typeof code === "number") return code;
  if (code === undefined) return 0;
  if (/^\d+$/.test(code)) return Number(code);
  if (!statusNames) {
    const def = protoLoader.loadSync("envoy/type/v3/http_status.proto", { includeDirs: envoyProtoIncludeDirs() });
    const values = (def["envoy.type.v3.StatusCode"] as { type?: { value?: Array<{ name: string; number: number }> } }).type?.value ?? [];
    statusNames = new Map(values.map((v) => [v.name, v.number]));
  }
  return statusNames.get(code) ?? 0;
}
