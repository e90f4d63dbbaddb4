/**
 * LoRA adapters of one simulated pod, served the way vLLM serves them:
 * - `POST /v1/load_lora_adapter {lora_name, lora_path}` and `POST /v1/unload_lora_adapter
 *   {lora_name}` (vLLM needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING`; the simulator always allows it),
 *   with vLLM's 400s for an adapter loaded twice, unknown, or beyond `--max-loras`;
 * - `/v1/models` lists each adapter with `parent` = the base model;
 * - `vllm:lora_requests_info{running_lora_adapters, waiting_lora_adapters, max_lora}`, a gauge
 *   whose value is the time of the update (vLLM's convention), once LoRA is in use;
 * - a request whose `model` is an adapter runs on the base model with the adapter's name hashed
 *   into every KV block (and so in the KV events' `lora_name`).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { ApiError, badRequest } from "./errors.js";

type Handler = (req: IncomingMessage, res: ServerResponse) => Promise<void> | void;

export interface SimLoraOptions {
  base: string;
  /** vLLM's `--max-loras` (adapters loaded at once). */
  maxLoras?: number;
  /** Adapters loaded at start (vLLM's `--lora-modules`). */
  initial?: readonly string[];
  /** How long a runtime load takes (reading the weights), real milliseconds; default 0. */
  loadMs?: number;
}

export const DEFAULT_MAX_LORAS = 4;
const MAX_NAME = 253;

export class SimLora {
  private readonly loaded = new Map<string, { path: string; createdAt: number }>();
  private readonly running = new Map<string, number>();
  private used: boolean;
  /** Runtime loads in progress (they hold a slot: a second load of the same name is refused). */
  private readonly loading = new Set<string>();
  readonly maxLoras: number;

  constructor(private readonly o: SimLoraOptions) {
    this.maxLoras = o.maxLoras ?? DEFAULT_MAX_LORAS;
    for (const name of o.initial ?? []) this.load(name, `/adapters/${name}`);
    this.used = this.loaded.size > 0;
  }

  /** An engine restart: only the adapters of the command line are loaded again. */
  reset(): void {
    this.loaded.clear();
    this.running.clear();
    this.loading.clear();
    for (const name of this.o.initial ?? []) this.load(name, `/adapters/${name}`);
  }

  names(): string[] {
    return [...this.loaded.keys()];
  }

  load(name: string, path: string): void {
    if (typeof name !== "string" || name === "" || name.length > MAX_NAME) throw badRequest("lora_name must be a non-empty string", "lora_name");
    if (name === this.o.base) throw badRequest(`The lora adapter '${name}' has the base model's name.`, "lora_name");
    if (this.loaded.has(name)) throw badRequest(`The lora adapter '${name}' has already been loaded.`, "lora_name");
    if (this.loading.has(name)) throw badRequest(`The lora adapter '${name}' is being loaded.`, "lora_name");
    if (this.loaded.size + this.loading.size >= this.maxLoras) throw badRequest(`Cannot load more than ${this.maxLoras} LoRA adapters (--max-loras).`, "lora_name");
    this.loaded.set(name, { path, createdAt: Math.floor(Date.now() / 1000) });
    this.used = true;
  }

  unload(name: string): void {
    if (!this.loaded.delete(name)) throw new ApiError(404, "NotFoundError", `The lora adapter '${name}' cannot be found.`, "lora_name");
  }

  /** The adapter a request names, or undefined for the base model (anything else is the caller's 404). */
  adapterOf(body: unknown): string | undefined {
    const model = (body as { model?: unknown } | null)?.model;
    return typeof model === "string" && this.loaded.has(model) ? model : undefined;
  }

  /** Counts a request on `adapter` as running until the response closes. */
  track(adapter: string, res: ServerResponse): void {
    this.running.set(adapter, (this.running.get(adapter) ?? 0) + 1);
    res.once("close", () => {
      const n = (this.running.get(adapter) ?? 1) - 1;
      if (n <= 0) this.running.delete(adapter);
      else this.running.set(adapter, n);
    });
  }

  modelEntries(engine: string, maxModelLen: number): Array<Record<string, unknown>> {
    return [...this.loaded].map(([id, a]) => ({ id, object: "model", created: a.createdAt, owned_by: engine, root: a.path, parent: this.o.base, max_model_len: maxModelLen, permission: [] }));
  }

  /** The exposition lines of `vllm:lora_requests_info` (empty until LoRA was used). */
  metricsText(): string {
    if (!this.used) return "";
    const esc = (s: string) => s.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
    const running = [...this.running.keys()].join(",");
    return [
      "# HELP vllm:lora_requests_info Running stats on lora requests.",
      "# TYPE vllm:lora_requests_info gauge",
      `vllm:lora_requests_info{max_lora="${this.maxLoras}",running_lora_adapters="${esc(running)}",waiting_lora_adapters=""} ${Date.now() / 1000}`,
      "",
    ].join("\n");
  }

  routes(readJson: (req: IncomingMessage) => Promise<unknown>): Record<string, Record<string, Handler>> {
    const text = (res: ServerResponse, body: string) => void res.writeHead(200, { "content-type": "text/plain; charset=utf-8" }).end(body);
    const field = (body: unknown, k: string): string => {
      const v = (body as Record<string, unknown> | null)?.[k];
      if (typeof v !== "string" || v === "") throw badRequest(`${k} is required`, k);
      return v;
    };
    return {
      "/v1/load_lora_adapter": {
        POST: async (req, res) => {
          const body = await readJson(req);
          const name = field(body, "lora_name");
          const path = field(body, "lora_path");
          // vLLM reads a local path or a Hugging Face repository; object stores need a resolver plugin.
          if (/^(s3|gcs|tos):\/\//.test(path)) throw new ApiError(404, "NotFoundError", `No adapter found for ${path.slice(0, 200)}: no LoRA resolver for this scheme.`, "lora_path");
          const ms = this.o.loadMs ?? 0;
          if (ms > 0) {
            // Checked now (so a load beyond max_loras fails at once), held while "reading the weights".
            this.load(name, path);
            this.loaded.delete(name);
            this.loading.add(name);
            await new Promise((r) => setTimeout(r, ms));
            if (!this.loading.delete(name)) throw badRequest(`The lora adapter '${name}' was dropped while loading (engine restart).`, "lora_name");
            this.loaded.set(name, { path, createdAt: Math.floor(Date.now() / 1000) });
          } else this.load(name, path);
          text(res, `Success: LoRA adapter '${name}' added successfully.`);
        },
      },
      "/v1/unload_lora_adapter": {
        POST: async (req, res) => {
          const name = field(await readJson(req), "lora_name");
          this.unload(name);
          text(res, `Success: LoRA adapter '${name}' removed successfully.`);
        },
      },
    };
  }
}
