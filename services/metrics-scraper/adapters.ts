/**
 * LoRA adapters an engine reports about itself. Pure.
 * - vLLM's `/v1/models`: the base model, then one entry per loaded adapter with `parent` = the
 *   base model (SGLang lists only the base model).
 * - `vllm:lora_requests_info`: the adapters running and waiting right now.
 * Names are validated like any name on the wire and the list is bounded.
 */
export const MAX_ENGINE_ADAPTERS = 256;
const NAME = /^[^\s]{1,253}$/;

/** Adapter ids in a `/v1/models` body; undefined when the body is not a model list. */
export function adaptersFromModels(body: unknown, base: string): string[] | undefined {
  const data = (body as { data?: unknown } | null)?.data;
  if (!Array.isArray(data)) return undefined;
  const out: string[] = [];
  for (const m of data) {
    const id = (m as { id?: unknown } | null)?.id;
    const parent = (m as { parent?: unknown } | null)?.parent;
    if (typeof id !== "string" || !NAME.test(id) || id === base) continue;
    if (typeof parent !== "string" || parent === "") continue;
    out.push(id);
  }
  return out;
}

/**
 * The context length a `/v1/models` body reports for the base model (vLLM's `max_model_len` on
 * its entry); undefined when absent or not a whole number in [1, 2^31].
 */
export function maxModelLenFromModels(body: unknown, base: string): number | undefined {
  const data = (body as { data?: unknown } | null)?.data;
  if (!Array.isArray(data)) return undefined;
  const entries = data.slice(0, 1_000) as Array<{ id?: unknown; parent?: unknown; max_model_len?: unknown } | null>;
  // The base model's entry; else the first entry without a parent (an engine serving under another name).
  const e = entries.find((m) => m?.id === base) ?? entries.find((m) => m !== null && typeof m === "object" && (typeof m.parent !== "string" || m.parent === ""));
  const n = e?.max_model_len;
  return typeof n === "number" && Number.isInteger(n) && n >= 1 && n <= 2 ** 31 ? n : undefined;
}

/**
 * The adapters to publish with a load sample: the model list plus what the LoRA metric shows
 * running or waiting; undefined whenever `/v1/models` was not read. The sample's list replaces the
 * pod's previous one in the gateways, so a list from the metric alone would drop every adapter
 * loaded but idle right now (404s for a model the engine serves): the metric only adds.
 */
export function engineAdapters(fromModels: readonly string[] | undefined, running: readonly string[], waiting: readonly string[], base: string): string[] | undefined {
  if (fromModels === undefined) return undefined;
  const all = new Set<string>();
  for (const a of [...(fromModels ?? []), ...running, ...waiting]) if (NAME.test(a) && a !== base && all.size < MAX_ENGINE_ADAPTERS) all.add(a);
  return [...all].sort();
}
