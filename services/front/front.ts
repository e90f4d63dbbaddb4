/**
 * The dev front (`jetroute front`): a small HTTP server that plays Envoy's part for local use.
 * Per request it runs the ext_proc exchange jetroute deploys (request headers, BUFFERED request
 * body, response headers, STREAMED response body) against a gateway and forwards to the endpoint
 * the gateway chose. It follows Envoy's semantics and adds nothing; production runs real Envoy.
 */
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { Readable } from "node:stream";
import {
  ExtProcError,
  type ExtProcExchange,
  ExtProcSpuriousResponseError,
  ExtProcStreamClosedError,
  ExtProcStreamError,
  ExtProcTimeoutError,
  type PhaseResult,
} from "../extproc/envoy-client.js";
import { createLogger, type Logger } from "../shared/log.js";
import { LB_METADATA_NAMESPACE, SERVED_ENDPOINT_KEY } from "../extproc/wire.js";
import { GatewayPool } from "./gateways.js";
import { type HeaderList, applyMutation, destinationEndpoints, first, fromNodeHeaders, parseEndpoint, toHeaderInput, toNodeHeaders } from "./headers.js";

export interface FrontOptions {
  /** 0 picks a free port. */
  port?: number;
  host?: string;
  /** ext_proc targets (`host:port`), used round-robin. */
  gateways: readonly string[];
  /** Envoy's `message_timeout` for each ext_proc message. */
  messageTimeoutMs?: number;
  /** Envoy's buffer limit for the BUFFERED request body (AIBrix raises it to 4 MiB). */
  maxRequestBodyBytes?: number;
  /**
   * An InferencePool's `endpointPickerRef.failureMode` (docs/inference-pool.md): when the picker
   * cannot be reached or fails, `FailClose` (the default, as in the InferencePool API) answers the
   * request with an error; `FailOpen` forwards it unprocessed to one of `poolEndpoints`, chosen
   * round-robin (the proxy's own load balancing over the pool), ignoring any destination header.
   */
  failureMode?: "FailOpen" | "FailClose";
  /** The pool's endpoints (`ip:port`) FailOpen forwards to. */
  poolEndpoints?: readonly string[];
  /**
   * The Batch API (`jetroute batch-api`, `host:port`): /v1/files and /v1/batches go there, as
   * Envoy's route sends them in production (deploy/envoy-gateway/httproute.yaml), without ext_proc.
   */
  batchApi?: string;
  logger?: Logger;
}

/** Paths the Batch API serves (and the front forwards to it when configured). */
export const BATCH_API_PATH = /^\/v1\/(files|batches)(\/|\?|$)/;

export interface FrontServer {
  port: number;
  close(): Promise<void>;
}

export const DEFAULT_MAX_REQUEST_BODY_BYTES = 4 * 1024 * 1024;

/** The OpenAI error shape clients of an inference gateway parse. */
export function openAiError(status: number, message: string): Buffer {
  const type = status >= 500 ? "api_error" : "invalid_request_error";
  return Buffer.from(JSON.stringify({ error: { message, type, code: status, param: null } }));
}

/** Unwinds a request whose client went away or whose connection had to be reset; nothing to answer. */
class Abandoned extends Error {}

/** The processor failed: Envoy (failure_mode_allow false) answers with a local reply, processing over. */
class ProcessorFailed extends Error {
  constructor(
    readonly status: number,
    readonly details: string,
    options?: ErrorOptions,
  ) {
    super(details, options);
  }
}

interface RequestState {
  req: http.IncomingMessage;
  res: http.ServerResponse;
  exchange: ExtProcExchange | undefined;
  /** False once the processor is out of the picture (closed its stream or sent a spurious reply). */
  processing: boolean;
  /** The processor failed and the request goes on without it (FailOpen). */
  failedOpen: boolean;
  /** The endpoint that answered (reported to the processor on the response path). */
  served?: string;
  gone: boolean;
  upstream: AbortController;
  failure: FailurePolicy;
}

/** What the proxy does when the picker fails, and its own round-robin over the pool for FailOpen. */
interface FailurePolicy {
  open: boolean;
  pool: string[];
  next: number;
}

export async function startFront(opts: FrontOptions): Promise<FrontServer> {
  const log = opts.logger ?? createLogger("front");
  const pool = new GatewayPool(opts.gateways, { messageTimeoutMs: opts.messageTimeoutMs ?? 90_000 });
  const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });
  const maxBody = opts.maxRequestBodyBytes ?? DEFAULT_MAX_REQUEST_BODY_BYTES;
  const failure: FailurePolicy = { open: opts.failureMode === "FailOpen", pool: [...(opts.poolEndpoints ?? [])], next: 0 };
  const batchApi = opts.batchApi ? parseEndpoint(opts.batchApi) : undefined;
  if (opts.batchApi && !batchApi) throw new Error(`batchApi must be host:port, got ${opts.batchApi}`);

  const server = http.createServer({ noDelay: true }, (req, res) => {
    const st: RequestState = { req, res, exchange: undefined, processing: true, failedOpen: false, gone: false, upstream: new AbortController(), failure };
    res.on("close", () => {
      if (res.writableFinished) return;
      st.gone = true;
      st.exchange?.cancel();
      st.upstream.abort();
    });
    const t0 = performance.now();
    if (batchApi && BATCH_API_PATH.test(req.url ?? "")) {
      proxyRaw(req, res, batchApi, agent, st.upstream.signal, log);
      return;
    }
    handle(st, pool, agent, maxBody).then(
      () => log.debug({ method: req.method, path: req.url, status: res.statusCode, ms: performance.now() - t0 }, "request"),
      (err: unknown) => {
        st.exchange?.cancel();
        st.upstream.abort();
        if (err instanceof Abandoned || st.gone) {
          if (!res.writableEnded) res.destroy();
          return;
        }
        if (err instanceof ProcessorFailed) {
          log.warn({ err: err.cause, method: req.method, path: req.url, status: err.status }, err.details);
          sendPlain(res, err.status, openAiError(err.status, err.details));
          return;
        }
        log.error({ err, method: req.method, path: req.url }, "front request failed");
        if (!res.headersSent) sendPlain(res, 500, openAiError(500, "internal error in the dev front"));
        else res.destroy();
      },
    );
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 8080, opts.host ?? "127.0.0.1", () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  log.info({ port, gateways: opts.gateways }, "dev front listening");
  return {
    port,
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await closed;
      agent.destroy();
      pool.close();
    },
  };
}

async function handle(st: RequestState, pool: GatewayPool, agent: http.Agent, maxBody: number): Promise<void> {
  const { req, res } = st;
  const headers = requestHeaderList(req);
  // Like Envoy's HTTP/1 codec: no length and not chunked means the headers end the stream.
  const hasBody = req.headers["transfer-encoding"] !== undefined || (req.headers["content-length"] ?? "0") !== "0";
  const body = hasBody ? readBody(req, maxBody) : Promise.resolve(Buffer.alloc(0));
  body.catch(() => {});

  let headersReply: PhaseResult;
  try {
    const opened = await pool.openWithHeaders(toHeaderInput(headers), !hasBody, {}, (ex) => {
      st.exchange = ex;
      if (st.gone) ex.cancel();
    });
    st.exchange = opened.exchange;
    headersReply = opened.first;
  } catch (err) {
    headersReply = processorFailure(st, err);
  }
  if (headersReply.kind === "immediate") return sendImmediate(st, headersReply);
  if (st.processing) applyMutation(headers, headersReply.headerMutation);

  let upstreamBody: Buffer | undefined;
  if (hasBody) {
    let buffered: Buffer;
    try {
      buffered = await body;
    } catch (err) {
      if (!(err instanceof BodyTooLarge)) throw err;
      st.exchange?.cancel();
      res.setHeader("connection", "close");
      return sendPlain(res, 413, openAiError(413, `request body exceeds the ${maxBody}-byte buffer limit`));
    }
    upstreamBody = buffered;
    if (st.processing) {
      const r = await phase(st, (ex) => ex.requestBody(buffered));
      if (r?.kind === "immediate") return sendImmediate(st, r);
      if (r) {
        applyMutation(headers, r.headerMutation);
        if (r.bodyMutation) upstreamBody = r.bodyMutation;
      }
    }
    headers.set("content-length", [String(upstreamBody.length)]);
  }

  // While the upstream works, the processor may end the request itself (the gateway's P/D
  // watchdog or a failed prefill leg): before response headers that reply goes to the client,
  // after them the stream can only be reset — what Envoy does.
  if (st.exchange) {
    st.exchange.onUnsolicitedImmediate = (r) => {
      st.processing = false;
      if (st.res.headersSent) {
        st.upstream.abort();
        st.res.destroy();
      } else sendImmediate(st, r);
      // Nothing more goes to this client: what the upstream still does is abandoned.
      st.gone = true;
    };
  }
  // The picker's ordered list (fallbacks after the first); FailOpen without a picker: the proxy's own pick from the pool.
  const endpoints = st.failedOpen ? failOpenEndpoint(st.failure) : destinationEndpoints(headers);
  if (endpoints.length === 0) {
    return localReply(st, 503, openAiError(503, "no healthy upstream: the gateway named no endpoint"));
  }

  let upstreamRes: http.IncomingMessage | undefined;
  let reason = "";
  // Down the list on a connect failure, as Envoy's retry policy does with the protocol's fallbacks.
  for (const endpoint of endpoints) {
    try {
      upstreamRes = await forward(st, agent, endpoint, headers, upstreamBody).catch((err: unknown) => {
        // A kept-alive connection the engine closed while it sat idle (its keep-alive timeout; a
        // busy host reads the close late) fails the request written on it before any answer: the
        // request is sent again, once, on a fresh connection.
        if (!(err instanceof ReusedSocketReset) || st.gone) throw err;
        return forward(st, false, endpoint, headers, upstreamBody);
      });
      st.served = `${endpoint.host}:${endpoint.port}`;
      break;
    } catch (err) {
      if (st.gone) throw new Abandoned();
      reason = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    }
  }
  if (!upstreamRes) return localReply(st, 502, openAiError(502, `upstream connect error or disconnect/reset before headers: ${reason}`));
  await sendResponse(st, upstreamRes.statusCode ?? 502, fromNodeHeaders(upstreamRes.headersDistinct), upstreamRes);
}

/** Streams a request to the Batch API and its answer back, unbuffered (uploads reach 200 MB). */
function proxyRaw(req: http.IncomingMessage, res: http.ServerResponse, to: { host: string; port: number }, agent: http.Agent, signal: AbortSignal, log: Logger): void {
  const up = http.request({ host: to.host, port: to.port, method: req.method, path: req.url, headers: { ...req.headers, "x-forwarded-for": req.socket.remoteAddress ?? "" }, agent, signal }, (r) => {
    res.writeHead(r.statusCode ?? 502, r.headers);
    r.pipe(res);
  });
  up.once("error", (err) => {
    if (res.headersSent) return void res.destroy();
    log.warn({ err: (err as NodeJS.ErrnoException).code ?? err.message }, "batch API unreachable");
    sendPlain(res, 502, openAiError(502, "upstream connect error: the batch API is unreachable"));
  });
  req.pipe(up);
}

function requestHeaderList(req: http.IncomingMessage): HeaderList {
  const h: HeaderList = new Map([
    [":authority", [req.headers.host ?? `${req.socket.localAddress}:${req.socket.localPort}`]],
    [":path", [req.url ?? "/"]],
    [":method", [req.method ?? "GET"]],
    [":scheme", ["http"]],
  ]);
  for (const [k, v] of fromNodeHeaders(req.headersDistinct, ["host"])) h.set(k, v);
  const peer = req.socket.remoteAddress;
  if (peer) h.set("x-forwarded-for", [...(h.get("x-forwarded-for") ?? []), peer]);
  h.set("x-forwarded-proto", ["http"]);
  // Envoy's connection manager generates a request id unless one is present.
  if (!h.has("x-request-id")) h.set("x-request-id", [randomUUID()]);
  return h;
}

class BodyTooLarge extends Error {}

function readBody(req: http.IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let over = false;
    req.on("data", (c: Buffer) => {
      if (over) return;
      size += c.length;
      if (size > limit) {
        over = true;
        chunks.length = 0;
        // Keep draining so the 413 reaches a client that is still sending.
        reject(new BodyTooLarge());
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => {
      if (!over) resolve(Buffer.concat(chunks));
    });
    req.on("error", reject);
  });
}

/**
 * Runs one ext_proc phase. `undefined` means the processor is out of the picture and the request
 * continues unmodified, which is what Envoy does when the processor closes its stream early or
 * sends a reply out of order.
 */
async function phase(st: RequestState, send: (ex: ExtProcExchange) => Promise<PhaseResult>): Promise<PhaseResult | undefined> {
  const ex = st.exchange;
  if (!ex || !st.processing) return undefined;
  try {
    return await send(ex);
  } catch (err) {
    return processorFailure(st, err);
  }
}

/** Maps an ext_proc failure to what Envoy does next: continue without the processor, or fail the request. */
function processorFailure(st: RequestState, err: unknown): PhaseResult {
  if (st.gone) throw new Abandoned();
  if (err instanceof ExtProcStreamClosedError || err instanceof ExtProcSpuriousResponseError) {
    st.processing = false;
    return continueUnmodified();
  }
  if (st.failure.open && err instanceof ExtProcError) {
    // FailOpen: the picker is unreachable or failed; the request goes on without it.
    st.exchange?.cancel();
    st.processing = false;
    st.failedOpen = true;
    return continueUnmodified();
  }
  if (err instanceof ExtProcTimeoutError) {
    throw new ProcessorFailed(504, "ext_proc_error_per-message_timeout_exceeded", { cause: err });
  }
  if (err instanceof ExtProcStreamError) {
    throw new ProcessorFailed(500, `ext_proc_error_gRPC_error_${err.code}`, { cause: err });
  }
  if (err instanceof ExtProcError) throw new ProcessorFailed(500, `ext_proc_error: ${err.message}`, { cause: err });
  throw err;
}

/** FailOpen's pick: the next pool endpoint, round-robin. */
function failOpenEndpoint(f: FailurePolicy): { host: string; port: number }[] {
  if (f.pool.length === 0) return [];
  const e = parseEndpoint(f.pool[f.next++ % f.pool.length] as string);
  return e ? [e] : [];
}

function continueUnmodified(): PhaseResult {
  return { kind: "continue", headerMutation: { set: {}, remove: [], entries: [] }, clearRouteCache: false };
}

/** A request failed on a reused keep-alive connection that the upstream had closed (see `handle`). */
class ReusedSocketReset extends Error {
  readonly code: string | undefined;
  constructor(cause: NodeJS.ErrnoException) {
    super(cause.message, { cause });
    this.code = cause.code;
  }
}

function forward(
  st: RequestState,
  /** `false`: a connection of its own (not from the pool), closed after the answer. */
  agent: http.Agent | false,
  endpoint: { host: string; port: number },
  headers: HeaderList,
  body: Buffer | undefined,
): Promise<http.IncomingMessage> {
  return new Promise((resolve, reject) => {
    const up = http.request({
      host: endpoint.host,
      port: endpoint.port,
      method: first(headers, ":method"),
      path: first(headers, ":path"),
      headers: { ...toNodeHeaders(headers), host: first(headers, ":authority") ?? endpoint.host },
      agent,
      signal: st.upstream.signal,
    });
    up.once("response", resolve);
    up.once("error", (err: NodeJS.ErrnoException) => reject(up.reusedSocket && (err.code === "ECONNRESET" || err.code === "EPIPE") ? new ReusedSocketReset(err) : err));
    up.end(body);
  });
}

/**
 * Sends a response through the response phases: the upstream's, or a local reply generated after
 * the processor saw the request (Envoy runs its router's 502/503 through the encoder filters too).
 */
async function sendResponse(st: RequestState, status: number, headers: HeaderList, body: Readable | Buffer): Promise<void> {
  const { req, res } = st;
  const declared = Buffer.isBuffer(body) ? body.length : lengthOf(headers);
  const noBody = req.method === "HEAD" || status === 204 || status === 304 || declared === 0;
  headers.set(":status", [String(status)]);

  if (st.processing) {
    const served = st.served ? { [LB_METADATA_NAMESPACE]: { [SERVED_ENDPOINT_KEY]: st.served } } : undefined;
    const r = await phase(st, (ex) => ex.responseHeaders(status, toHeaderInput(withoutStatus(headers)), noBody, served)).catch(
      (err: unknown) => {
        if (!Buffer.isBuffer(body)) body.destroy();
        throw err;
      },
    );
    if (r?.kind === "immediate") {
      if (!Buffer.isBuffer(body)) body.destroy();
      return sendImmediate(st, r);
    }
    if (r) applyMutation(headers, r.headerMutation);
  }
  const finalStatus = Number(first(headers, ":status"));
  // A processor may rewrite any chunk, so the upstream's length no longer holds.
  if (st.processing && !noBody) headers.delete("content-length");
  res.writeHead(Number.isInteger(finalStatus) && finalStatus >= 100 ? finalStatus : status, toNodeHeaders(headers));
  res.flushHeaders();

  if (noBody) {
    if (!Buffer.isBuffer(body)) body.resume();
    res.end();
    void st.exchange?.end();
    return;
  }
  let sentEnd = false;
  const writeChunk = async (chunk: Buffer, endOfStream: boolean) => {
    let out = chunk;
    if (st.processing) {
      const r = await phase(st, (ex) => ex.responseBodyChunk(chunk, endOfStream));
      // Headers already went out: Envoy can only reset the downstream stream.
      if (r?.kind === "immediate") throw new Abandoned();
      if (r?.bodyMutation) out = r.bodyMutation;
    }
    sentEnd ||= endOfStream;
    if (out.length > 0 && !res.write(out)) await Promise.race([once(res, "drain"), once(res, "close")]);
    if (st.gone) throw new Abandoned();
  };
  try {
    if (Buffer.isBuffer(body)) {
      await writeChunk(body, true);
    } else {
      let received = 0;
      for await (const chunk of body as AsyncIterable<Buffer>) {
        received += chunk.length;
        await writeChunk(chunk, declared !== undefined && received >= declared);
      }
    }
    // A chunked upstream announces its end with an empty final chunk; Envoy forwards that as an
    // empty end_of_stream message.
    if (!sentEnd) await writeChunk(Buffer.alloc(0), true);
  } catch (err) {
    if (!Buffer.isBuffer(body)) body.destroy();
    if (err instanceof ProcessorFailed) throw new Abandoned();
    throw err instanceof Abandoned ? err : new Abandoned("upstream failed mid-response", { cause: err });
  }
  res.end();
  void st.exchange?.end();
}

function withoutStatus(headers: HeaderList): HeaderList {
  const copy = new Map(headers);
  copy.delete(":status");
  return copy;
}

function lengthOf(headers: HeaderList): number | undefined {
  const v = first(headers, "content-length");
  if (v === undefined || !/^\d+$/.test(v)) return undefined;
  return Number(v);
}

async function localReply(st: RequestState, status: number, body: Buffer): Promise<void> {
  const headers: HeaderList = new Map([
    ["content-type", ["application/json"]],
    ["content-length", [String(body.length)]],
  ]);
  await sendResponse(st, status, headers, body);
}

function sendImmediate(st: RequestState, r: Extract<PhaseResult, { kind: "immediate" }>): void {
  st.upstream.abort();
  const headers: Record<string, string> = { ...r.headers };
  // Envoy's local replies are text/plain unless the processor named a content type.
  if (r.body.length > 0 && !Object.keys(headers).some((k) => k.toLowerCase() === "content-type")) {
    headers["content-type"] = "text/plain";
  }
  for (const k of Object.keys(headers)) if (k.startsWith(":")) delete headers[k];
  sendPlain(st.res, r.status, r.body, headers);
}

function sendPlain(res: http.ServerResponse, status: number, body: Buffer, headers: Record<string, string> = {}): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const h: Record<string, string> = { "content-type": "application/json", ...headers, "content-length": String(body.length) };
  res.writeHead(status, h);
  res.end(body);
}
