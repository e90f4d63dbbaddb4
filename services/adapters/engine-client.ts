/**
 * The engines' runtime LoRA API, one call at a time, with a timeout:
 * - vLLM (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`): `POST /v1/load_lora_adapter {lora_name,
 *   lora_path}`, `POST /v1/unload_lora_adapter {lora_name}`; `/v1/models` lists the loaded adapters
 *   (entries with a `parent`).
 * - SGLang (`--enable-lora`): `POST /load_lora_adapter {lora_name, lora_path, pinned}`, `POST
 *   /unload_lora_adapter {lora_name}`; its `/v1/models` lists only the base model, so what an
 *   SGLang pod holds is what the controller loaded there.
 * An adapter loaded already (a load the previous leader finished) counts as loaded; one already
 * gone counts as unloaded: both calls are idempotent from the controller's side.
 */
import type { EngineKind } from "../../schemas/events.js";
import { adaptersFromModels } from "../metrics-scraper/adapters.js";

export interface EngineCallResult {
  ok: boolean;
  status: number;
  /** The engine's message (bounded), for the record and the Failed condition. */
  message: string;
}

export interface EngineTarget {
  address: string;
  engine: EngineKind;
  /** `Authorization: Bearer` (the ModelAdapter's `additionalConfig["api-key"]`, or the controller's). */
  apiKey?: string;
}

const MAX_MESSAGE = 300;

async function post(t: EngineTarget, path: string, body: object, timeoutMs: number): Promise<EngineCallResult> {
  try {
    const res = await fetch(`http://${t.address}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(t.apiKey ? { authorization: `Bearer ${t.apiKey}` } : {}) },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = (await res.text()).slice(0, 4096);
    let message = text;
    try {
      const j = JSON.parse(text) as { message?: unknown; error?: { message?: unknown } };
      const m = j.error?.message ?? j.message;
      if (typeof m === "string") message = m;
    } catch {
      // plain text (vLLM's success answers are)
    }
    return { ok: res.ok, status: res.status, message: message.slice(0, MAX_MESSAGE) };
  } catch (err) {
    const e = err as Error;
    return { ok: false, status: 0, message: (e.name === "TimeoutError" ? `no answer within ${timeoutMs} ms` : e.message).slice(0, MAX_MESSAGE) };
  }
}

export async function loadAdapter(t: EngineTarget, name: string, path: string, o: { pinned?: boolean; timeoutMs: number }): Promise<EngineCallResult> {
  const r = t.engine === "sglang"
    ? await post(t, "/load_lora_adapter", { lora_name: name, lora_path: path, ...(o.pinned ? { pinned: true } : {}) }, o.timeoutMs)
    : await post(t, "/v1/load_lora_adapter", { lora_name: name, lora_path: path }, o.timeoutMs);
  if (!r.ok && r.status === 400 && /already (been )?loaded/i.test(r.message)) return { ...r, ok: true };
  return r;
}

export async function unloadAdapter(t: EngineTarget, name: string, o: { timeoutMs: number }): Promise<EngineCallResult> {
  const r = await post(t, t.engine === "sglang" ? "/unload_lora_adapter" : "/v1/unload_lora_adapter", { lora_name: name }, o.timeoutMs);
  if (!r.ok && (r.status === 404 || (r.status === 400 && /cannot be found|not found/i.test(r.message)))) return { ...r, ok: true };
  return r;
}

/** The adapters a vLLM pod has loaded (`/v1/models`); undefined when it cannot tell (SGLang, no answer). */
export async function listAdapters(t: EngineTarget, base: string, timeoutMs: number): Promise<string[] | undefined> {
  if (t.engine !== "vllm") return undefined;
  try {
    const res = await fetch(`http://${t.address}/v1/models`, { headers: t.apiKey ? { authorization: `Bearer ${t.apiKey}` } : {}, signal: AbortSignal.timeout(timeoutMs) });
    if (!res.ok) return undefined;
    return adaptersFromModels(await res.json(), base);
  } catch {
    return undefined;
  }
}
