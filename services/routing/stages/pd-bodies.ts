/**
 * The request bodies of a disaggregated request's two legs, and the rules for when a failed
 * prefill is tried again — pure functions of the client's body and the legs' answers (wire facts:
 * engines.md §5, pd-legs.md).
 *
 * vLLM (synchronous, "context first"): the prefill leg is the client's request asking for one token
 * with `kv_transfer_params.do_remote_decode`; its answer's `kv_transfer_params` go into the decode
 * leg, with `remote_host` overwritten by the prefill pod's address (the engine reports whatever
 * host it bound). SGLang (asynchronous bootstrap): both legs carry the same
 * `bootstrap_host/port/room` and `rid` and are sent at once.
 */
import { randomBytes } from "node:crypto";
import { RouteError } from "../errors.js";

/** Body fields that steer the handoff: only the gateway sets them (a client could point a decode at any host). */
export const PD_CONTROLLED_FIELDS = ["kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"] as const;

/** 400 when the client's body already carries a handoff field. */
export function refuseControlledFields(body: Readonly<Record<string, unknown>>): void {
  for (const f of PD_CONTROLLED_FIELDS) {
    if (Object.hasOwn(body, f)) throw new RouteError("pdControlledField", `\`${f}\` is set by the gateway for prefill/decode disaggregation and must not be sent by clients`, f);
  }
}

/**
 * `n > 1` and batched completion prompts would need one handoff per sequence (SGLang takes arrays
 * of bootstrap fields, vLLM one `kv_transfer_params` per request): not disaggregated, refused.
 */
export function refuseBatch(body: Readonly<Record<string, unknown>>, api?: "responses" | "messages"): void {
  // The engines' handoff fields (kv_transfer_params, bootstrap_*) are chat and completions request fields.
  if (api) throw new RouteError("invalidBody", `prefill/decode disaggregation (routing-strategy pd) is not supported for /v1/${api}; route this model with another strategy or send /v1/chat/completions`, "routing-strategy");
  if (typeof body.n === "number" && body.n > 1) throw new RouteError("invalidBody", "`n` > 1 is not supported with prefill/decode disaggregation (routing-strategy pd); send n = 1", "n");
  const p = body.prompt;
  if (Array.isArray(p) && p.length > 1 && typeof p[0] !== "number") throw new RouteError("invalidBody", "batched prompts are not supported with prefill/decode disaggregation (routing-strategy pd); send one prompt per request", "prompt");
}

/** vLLM's prefill leg: one token, no streaming, the KV kept for a remote decode. */
export function vllmPrefillBody(body: Readonly<Record<string, unknown>>): Buffer {
  const b: Record<string, unknown> = { ...body };
  b.kv_transfer_params = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
  b.stream = false;
  b.max_tokens = 1;
  if (Object.hasOwn(b, "max_completion_tokens")) b.max_completion_tokens = 1;
  delete b.stream_options;
  delete b.min_tokens;
  delete b.min_completion_tokens;
  return Buffer.from(JSON.stringify(b));
}

/** The four fields a vLLM decode engine needs, or it silently computes the prefill itself. */
export const VLLM_REQUIRED_PARAMS = ["remote_engine_id", "remote_request_id", "remote_host", "remote_port"] as const;

export type PrefillAnswer = { ok: true; params: Record<string, unknown> } | { ok: false; reason: "not-json" | "no-params" | "incomplete-params" };

/** Reads the `kv_transfer_params` out of a vLLM prefill answer. */
export function vllmTransferParams(answer: Buffer): PrefillAnswer {
  let parsed: unknown;
  try {
    parsed = JSON.parse(answer.toString("utf8"));
  } catch {
    return { ok: false, reason: "not-json" };
  }
  const params = (parsed as { kv_transfer_params?: unknown } | null)?.kv_transfer_params;
  if (typeof params !== "object" || params === null || Array.isArray(params)) return { ok: false, reason: "no-params" };
  const p = params as Record<string, unknown>;
  if (VLLM_REQUIRED_PARAMS.some((k) => k !== "remote_host" && (p[k] === null || p[k] === undefined))) return { ok: false, reason: "incomplete-params" };
  return { ok: true, params: p };
}

/** vLLM's decode leg: the client's body plus the prefill's params, pointed at the prefill pod. */
export function vllmDecodeBody(body: Readonly<Record<string, unknown>>, params: Readonly<Record<string, unknown>>, prefillHost: string): Buffer {
  return Buffer.from(JSON.stringify({ ...body, kv_transfer_params: { ...params, remote_host: prefillHost } }));
}

/** SGLang's default bootstrap port (a prefill pod without the annotation). */
export const SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998;

/** A bootstrap room: uniform in [0, 2^63 - 1], as a decimal string (it does not fit a JS number). */
export function bootstrapRoom(bytes: Buffer = randomBytes(8)): string {
  return (bytes.readBigUInt64BE(0) & 0x7fff_ffff_ffff_ffffn).toString();
}

/**
 * Both SGLang legs' body: the client's with the bootstrap fields and `rid`. The room is written as
 * a bare JSON integer (SGLang reads an int), which JSON.stringify cannot do for 63-bit values.
 */
export function sglangBody(body: Readonly<Record<string, unknown>>, o: { host: string; port: number; room: string; rid: string }): Buffer {
  if (!/^\d{1,19}$/.test(o.room)) throw new Error(`bootstrap room must be a decimal integer, got ${JSON.stringify(o.room)}`);
  const marker = "\u0000room\u0000";
  const text = JSON.stringify({ ...body, bootstrap_host: o.host, bootstrap_port: o.port, bootstrap_room: marker, rid: o.rid });
  // The room comes after every client field: the last occurrence is the gateway's.
  const at = text.lastIndexOf(JSON.stringify(marker));
  return Buffer.from(text.slice(0, at) + o.room + text.slice(at + JSON.stringify(marker).length));
}

/** How one prefill attempt ended, as the legs stage saw it. */
export type LegFailure =
  | { kind: "status"; status: number; body?: Buffer }
  | { kind: "connect"; code: string }
  | { kind: "timeout" }
  | { kind: "cancelled" };

/** Another prefill pod is tried for 502/503/504 and connection failures, at most `maxRetries` times. */
export function retryPrefill(f: LegFailure, retriesSoFar: number, maxRetries: number): boolean {
  if (retriesSoFar >= maxRetries) return false;
  if (f.kind === "connect") return true;
  return f.kind === "status" && (f.status === 502 || f.status === 503 || f.status === 504);
}

/** What the client is told when the prefill leg failed for good. */
export function prefillFailureError(f: LegFailure, pod: string): RouteError {
  switch (f.kind) {
    case "timeout":
      return new RouteError("prefillTimeout", `prefill leg on ${pod} timed out`);
    case "connect":
      return new RouteError("prefillFailed", `prefill leg on ${pod} failed: ${f.code.slice(0, 64)}`);
    case "cancelled":
      return new RouteError("clientCancelled", "the client cancelled the request");
    case "status":
      // The engine refused the request itself (a 4xx): the client's problem, passed on as such.
      if (f.status >= 400 && f.status < 500 && f.status !== 408 && f.status !== 429) return new RouteError("prefillRejected", `prefill leg on ${pod} answered ${f.status}${engineMessage(f.body)}`, null, {}, f.status);
      return new RouteError("prefillFailed", `prefill leg on ${pod} answered ${f.status}`);
  }
}

/** The engine's error message (bounded), for a 4xx passed on to the client. */
function engineMessage(body: Buffer | undefined): string {
  if (!body || body.length === 0) return "";
  try {
    const m = (JSON.parse(body.subarray(0, 65_536).toString("utf8")) as { error?: { message?: unknown }; message?: unknown }) ?? {};
    const msg = typeof m.error?.message === "string" ? m.error.message : typeof m.message === "string" ? m.message : undefined;
    return msg ? `: ${msg.slice(0, 256)}` : "";
  } catch {
    return "";
  }
}
