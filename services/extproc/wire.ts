/**
 * Wire helpers for ext_proc: header reading, header mutations and protobuf Struct building.
 * Every header name and metadata namespace Envoy and the Inference Extension agree on lives here.
 */
import type { HeaderMap, HeaderValueOption, ProtoStruct, ProtoValue } from "./types.js";

export const Headers = {
  /** Gateway API Inference Extension: the endpoint(s) Envoy must send the request to. */
  destinationEndpoint: "x-gateway-destination-endpoint",
  /** AIBrix: the pod an ORIGINAL_DST cluster routes to. */
  targetPod: "target-pod",
  routingStrategy: "routing-strategy",
  requestId: "x-request-id",
  /** Set by the gateway on the request it forwards, so the engine and logs agree on one id. */
  gatewayRequestId: "request-id",
  /** P/D (AIBrix): the pod that ran the prefill leg, and its address, echoed on the response. */
  prefillTargetPod: "prefill-target-pod",
  prefillTargetPodIp: "prefill-target-pod-ip",
  contentType: "content-type",
  contentLength: "content-length",
  authorization: "authorization",
  path: ":path",
  method: ":method",
  status: ":status",
} as const;

/** Dynamic metadata namespace read by Envoy's endpoint-override load balancing. */
export const LB_METADATA_NAMESPACE = "envoy.lb";
/** Namespace and key of the proxy's subset hint (Inference Extension protocol). */
export const SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint";
export const SUBSET_HINT_KEY = "x-gateway-destination-endpoint-subset";
/**
 * The endpoint that actually served the request, reported by the proxy on the response path in
 * `metadata_context.filter_metadata["envoy.lb"]` (endpoint picker protocol v1.0.0).
 */
export const SERVED_ENDPOINT_KEY = "x-gateway-destination-endpoint-served";
/** Most fallback endpoints named after the primary one. */
export const MAX_DESTINATION_FALLBACKS = 8;

/**
 * The ordered destination list of the endpoint picker protocol: the chosen endpoint first, then up
 * to `fallbacks` other candidates, best first by the strategy's own scores (`better`: which end of
 * the score is better), each at most once and only from `subset` when the proxy sent one. The
 * header and the `envoy.lb` metadata carry this same value, comma separated.
 */
export function destinationList(primary: string, candidates: readonly { pod: { address: string }; score: number }[], better: "lower" | "higher" | undefined, fallbacks: number, subset?: readonly string[]): string[] {
  const out = [primary];
  const n = Math.min(Math.max(0, Math.floor(fallbacks)), MAX_DESTINATION_FALLBACKS);
  if (n === 0) return out;
  const sign = better === "higher" ? -1 : 1;
  const key = (c: { score: number }) => (Number.isFinite(c.score) ? sign * c.score : Number.POSITIVE_INFINITY);
  const ranked = [...candidates].sort((a, b) => key(a) - key(b) || 0);
  for (const c of ranked) {
    if (out.length > n) break;
    const a = c.pod.address;
    if (out.includes(a) || (subset && !subset.includes(a))) continue;
    out.push(a);
  }
  return out;
}

/**
 * Headers a client must never be able to set: the gateway overwrites or strips them on every
 * request so a client cannot pick its own endpoint.
 */
export const ROUTING_CONTROLLED_HEADERS = [Headers.destinationEndpoint, Headers.targetPod] as const;

/** Header values as a lower-cased-name map; `raw_value` (bytes) wins over `value`. */
export function headersToRecord(map: HeaderMap | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const h of map?.headers ?? []) {
    const raw = h.raw_value;
    const v = raw && raw.length > 0 ? Buffer.from(raw).toString("utf8") : (h.value ?? "");
    out[h.key.toLowerCase()] = v;
  }
  return out;
}

/** A set-header mutation entry that overwrites any existing value, written with `raw_value`. */
export function setHeader(key: string, value: string): HeaderValueOption {
  return { header: { key, raw_value: Buffer.from(value) }, append_action: "OVERWRITE_IF_EXISTS_OR_ADD" };
}

export function toProtoValue(v: unknown): ProtoValue {
  if (v === null || v === undefined) return { nullValue: 0 };
  if (typeof v === "string") return { stringValue: v };
  if (typeof v === "number") return { numberValue: v };
  if (typeof v === "boolean") return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toProtoValue) } };
  return { structValue: toProtoStruct(v as Record<string, unknown>) };
}

/** Builds a google.protobuf.Struct in protobufjs' camelCase form (snake_case silently encodes as empty). */
export function toProtoStruct(obj: Record<string, unknown>): ProtoStruct {
  const fields: Record<string, ProtoValue> = {};
  for (const [k, v] of Object.entries(obj)) fields[k] = toProtoValue(v);
  return { fields };
}

export function fromProtoValue(v: ProtoValue | undefined): unknown {
  if (!v) return undefined;
  if ("stringValue" in v) return v.stringValue;
  if ("numberValue" in v) return v.numberValue;
  if ("boolValue" in v) return v.boolValue;
  if ("structValue" in v) return fromProtoStruct(v.structValue);
  if ("listValue" in v) return (v.listValue.values ?? []).map(fromProtoValue);
  return null;
}

export function fromProtoStruct(s: ProtoStruct | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(s?.fields ?? {})) out[k] = fromProtoValue(v);
  return out;
}
