/**
 * OpenTelemetry spans of the request path, built from what the driver observed (pure: no I/O, no
 * clock, no randomness; the ids and times are handed in). One span per request, named after the
 * OpenTelemetry GenAI semantic conventions (`{operation} {model}`), and one child span per stage the
 * request visited, in order. The W3C `traceparent` the client sent makes the request span its child.
 * Tracing is observation only: nothing here feeds back into routing or replay.
 */

/** Longest client-supplied string a span attribute carries. */
export const MAX_ATTRIBUTE_CHARS = 256;

export interface TraceParent {
  readonly traceId: string;
  readonly parentSpanId: string;
  readonly sampled: boolean;
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * A W3C trace context `traceparent` header (version 00), validated strictly: lowercase hex, a
 * 32-digit trace id and 16-digit parent id, neither all zeros. Anything else is ignored (undefined):
 * the request starts a new trace.
 */
export function parseTraceparent(header: string | undefined): TraceParent | undefined {
  if (header === undefined || header.length !== 55) return undefined;
  const m = TRACEPARENT.exec(header);
  if (!m) return undefined;
  const [, traceId, parentSpanId, flags] = m as unknown as [string, string, string, string];
  if (/^0+$/.test(traceId) || /^0+$/.test(parentSpanId)) return undefined;
  return { traceId, parentSpanId, sampled: (parseInt(flags, 16) & 1) === 1 };
}

/** Checks an OTLP endpoint flag: an http(s) URL without credentials, query or fragment. */
export function otlpEndpointError(endpoint: string): string | undefined {
  let u: URL;
  try {
    u = new URL(endpoint);
  } catch {
    return `--otlp-endpoint ${JSON.stringify(endpoint.slice(0, 256))} is not a URL`;
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return `--otlp-endpoint must be an http or https URL, not ${u.protocol}`;
  if (u.username || u.password) return "--otlp-endpoint must not carry credentials";
  if (u.search || u.hash) return "--otlp-endpoint must not carry a query or fragment";
  return undefined;
}

/** A client string cut to the attribute bound. */
export function bounded(s: string): string {
  return s.length > MAX_ATTRIBUTE_CHARS ? s.slice(0, MAX_ATTRIBUTE_CHARS) : s;
}

/** The GenAI operation a routed path performs. */
export function operationOf(path: string | undefined): "chat" | "text_completion" | "embeddings" | undefined {
  const p = (path ?? "").split("?")[0];
  // The Responses and Messages APIs are chat operations (a conversation in, an assistant message out).
  if (p === "/v1/chat/completions" || p === "/v1/responses" || p === "/v1/messages") return "chat";
  if (p === "/v1/completions") return "text_completion";
  if (p === "/v1/embeddings") return "embeddings";
  return undefined;
}

/** One stage as the driver timed it: wall-clock start and end, in epoch milliseconds. */
export interface StageTiming {
  readonly stage: string;
  readonly startMs: number;
  readonly endMs: number;
}

/** What one request's routing left to trace. */
export interface RequestTrace {
  readonly traceId: string;
  readonly spanId: string;
  readonly parentSpanId?: string;
  /** One id per stage, in the order of `stages`. */
  readonly stageSpanIds: readonly string[];
  readonly startMs: number;
  readonly endMs: number;
  readonly path?: string;
  /** The model the client asked for. */
  readonly requestModel?: string;
  readonly maxTokens?: number;
  readonly stages: readonly StageTiming[];
  readonly routed?: { readonly model: string; readonly pod: string; readonly strategy: string };
  readonly refusal?: { readonly stage?: string; readonly type: string; readonly message?: string };
}

export type AnyValue = { stringValue: string } | { intValue: string } | { doubleValue: number } | { boolValue: boolean };
export interface KeyValue {
  key: string;
  value: AnyValue;
}

/** An OTLP/JSON span (opentelemetry-proto trace.v1.Span, JSON mapping). */
export interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  /** 1 internal, 2 server. */
  kind: number;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: KeyValue[];
  /** code 0 unset, 2 error. */
  status: { code: number; message?: string };
}

/** Epoch milliseconds (fractional) as integer nanoseconds, in a string (OTLP/JSON's 64-bit form). */
export function unixNanos(ms: number): string {
  const whole = Math.floor(ms);
  const frac = Math.min(999_999, Math.max(0, Math.round((ms - whole) * 1e6)));
  return (BigInt(whole) * 1_000_000n + BigInt(frac)).toString();
}

const str = (key: string, v: string): KeyValue => ({ key, value: { stringValue: v } });
const int = (key: string, v: number): KeyValue => ({ key, value: { intValue: String(Math.trunc(v)) } });

/** The request span and its stage spans, in visiting order. */
export function requestSpans(t: RequestTrace): OtlpSpan[] {
  const op = operationOf(t.path);
  const model = t.requestModel !== undefined ? bounded(t.requestModel) : undefined;
  const attrs: KeyValue[] = [];
  if (op) attrs.push(str("gen_ai.operation.name", op));
  if (model !== undefined) attrs.push(str("gen_ai.request.model", model));
  if (t.maxTokens !== undefined && Number.isFinite(t.maxTokens)) attrs.push(int("gen_ai.request.max_tokens", t.maxTokens));
  if (t.routed) {
    attrs.push(str("gen_ai.response.model", bounded(t.routed.model)), str("server.address", bounded(t.routed.pod)), str("jetroute.strategy", bounded(t.routed.strategy)), str("jetroute.pod", bounded(t.routed.pod)));
  }
  if (t.refusal) {
    attrs.push(str("error.type", bounded(t.refusal.type)));
    if (t.refusal.stage !== undefined) attrs.push(str("jetroute.refusal.stage", bounded(t.refusal.stage)));
  }
  const name = `${op ?? "route"}${model !== undefined ? ` ${model}` : ""}`;
  const root: OtlpSpan = {
    traceId: t.traceId,
    spanId: t.spanId,
    ...(t.parentSpanId ? { parentSpanId: t.parentSpanId } : {}),
    name,
    kind: 2,
    startTimeUnixNano: unixNanos(t.startMs),
    endTimeUnixNano: unixNanos(Math.max(t.startMs, t.endMs)),
    attributes: attrs,
    status: t.refusal ? { code: 2, ...(t.refusal.message ? { message: bounded(t.refusal.message) } : {}) } : { code: 0 },
  };
  const spans = [root];
  t.stages.forEach((s, i) => {
    const id = t.stageSpanIds[i];
    if (id === undefined) return;
    const refused = t.refusal?.stage === s.stage && i === t.stages.length - 1;
    spans.push({
      traceId: t.traceId,
      spanId: id,
      parentSpanId: t.spanId,
      name: s.stage,
      kind: 1,
      startTimeUnixNano: unixNanos(s.startMs),
      endTimeUnixNano: unixNanos(Math.max(s.startMs, s.endMs)),
      attributes: [str("jetroute.stage", s.stage)],
      status: refused ? { code: 2 } : { code: 0 },
    });
  });
  return spans;
}

/** An OTLP ExportTraceServiceRequest (JSON mapping) carrying spans of one service. */
export function exportRequest(serviceName: string, spans: readonly OtlpSpan[], version?: string): unknown {
  return {
    resourceSpans: [
      {
        resource: { attributes: [str("service.name", bounded(serviceName))] },
        scopeSpans: [{ scope: { name: "jetroute.gateway", ...(version ? { version } : {}) }, spans }],
      },
    ],
  };
}
