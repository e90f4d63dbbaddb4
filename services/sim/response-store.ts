/**
 * A simulated pod's Responses API store: what vLLM keeps in its API-server process with
 * `VLLM_ENABLE_RESPONSES_API_STORE` on (the response, and the chat messages its input rendered
 * to), so `previous_response_id`, `GET /v1/responses/{id}` and cancel work on the pod that
 * answered and nowhere else. Unlike vLLM's (never evicted), this one is bounded by entries and by
 * bytes (oldest first out); a restart empties it, as a restarted engine's memory is gone.
 */
import type { RenderedMessage } from "../tokenizer/api-messages.js";

export interface StoredResponse {
  id: string;
  /** The response object as `GET /v1/responses/{id}` returns it. */
  response: Record<string, unknown>;
  /** The chain's messages up to and including this request's input, without instructions (the API does not carry them over). */
  history: RenderedMessage[];
  /** The generated text (the assistant turn a follow-up prepends). */
  outputText: string;
}

export interface ResponseStoreOptions {
  /** Most responses kept (default 10,000). */
  maxEntries?: number;
  /** Most bytes kept, as JSON text of the response and its history (default 64 MiB). */
  maxBytes?: number;
}

export class SimResponseStore {
  private readonly entries = new Map<string, { stored: StoredResponse; bytes: number }>();
  private total = 0;
  /** Responses dropped to stay within the bounds. */
  evicted = 0;
  private readonly maxEntries: number;
  private readonly maxBytes: number;

  constructor(o: ResponseStoreOptions = {}) {
    this.maxEntries = o.maxEntries ?? 10_000;
    this.maxBytes = o.maxBytes ?? 64 * 1024 * 1024;
  }

  get size(): number {
    return this.entries.size;
  }

  get bytes(): number {
    return this.total;
  }

  get(id: string): StoredResponse | undefined {
    return this.entries.get(id)?.stored;
  }

  put(stored: StoredResponse): void {
    this.delete(stored.id);
    const bytes = JSON.stringify(stored.response).length + JSON.stringify(stored.history).length + stored.outputText.length;
    this.entries.set(stored.id, { stored, bytes });
    this.total += bytes;
    for (const [id, e] of this.entries) {
      if (this.entries.size <= this.maxEntries && this.total <= this.maxBytes) break;
      // The newest always stays, even alone over the byte bound.
      if (id === stored.id) break;
      this.entries.delete(id);
      this.total -= e.bytes;
      this.evicted++;
    }
  }

  delete(id: string): boolean {
    const e = this.entries.get(id);
    if (!e) return false;
    this.entries.delete(id);
    this.total -= e.bytes;
    return true;
  }

  clear(): void {
    this.entries.clear();
    this.total = 0;
  }
}
