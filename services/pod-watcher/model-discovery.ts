/**
 * Which models an endpoint serves, asked of its engine (`GET /v1/models`), for InferencePool
 * endpoints whose pods carry no model label (inference-pool.ts). One cache entry per `ip:port`,
 * bounded by the endpoints the pool has (entries of endpoints that left are dropped); answers are
 * re-asked every `refreshMs` (LoRA adapters load and unload at run time); a failed ask is retried
 * after `retryMs`; at most `concurrency` asks at once.
 */
import { discardBody, readBodyCapped } from "../shared/http-body.js";
import { type ServedModels, servedModelsOf } from "./inference-pool.js";

/** Bound on one `/v1/models` answer (bytes): 256 adapters fit many times over. */
export const MODELS_ANSWER_BYTES = 1024 * 1024;

export interface ModelDiscoveryOptions {
  /** Something learnt changed what an endpoint serves. */
  changed: () => void;
  timeoutMs?: number;
  refreshMs?: number;
  retryMs?: number;
  concurrency?: number;
  /** Bearer key for the engines (the gateway's `JETROUTE_ENGINE_API_KEY`). */
  apiKey?: string;
  clock?: () => number;
}

interface Entry {
  served?: ServedModels;
  at: number;
  failedAt?: number;
  inFlight: boolean;
}

/**
 * Most endpoints remembered (a pool has at most its pods x 8). Measured 198 bytes per entry with
 * a base model and two adapters (100,000 entries, heap after GC; the address strings are the
 * informer's): 20,000 entries are about 4 MB.
 */
const MAX_ENTRIES = 20_000;

export class ModelDiscovery {
  private readonly entries = new Map<string, Entry>();
  private inFlight = 0;
  private readonly queue: string[] = [];
  private stopped = false;
  readonly stats = { asked: 0, failed: 0 };

  constructor(private readonly o: ModelDiscoveryOptions) {}

  private now(): number {
    return (this.o.clock ?? Date.now)();
  }

  /** What each address serves, as far as known. */
  get known(): ReadonlyMap<string, ServedModels> {
    const out = new Map<string, ServedModels>();
    for (const [a, e] of this.entries) if (e.served) out.set(a, e.served);
    return out;
  }

  /**
   * The endpoints the pool has now: unknown ones (and known ones due a refresh) are asked, those
   * no longer listed are forgotten.
   */
  track(addresses: Iterable<string>): void {
    const now = this.now();
    const keep = new Set(addresses);
    for (const a of this.entries.keys()) if (!keep.has(a)) this.entries.delete(a);
    for (const a of keep) {
      let e = this.entries.get(a);
      if (!e) {
        if (this.entries.size >= MAX_ENTRIES) continue;
        e = { at: 0, inFlight: false };
        this.entries.set(a, e);
      }
      if (e.inFlight) continue;
      const due = e.served ? now - e.at >= (this.o.refreshMs ?? 30_000) : e.failedAt === undefined || now - e.failedAt >= (this.o.retryMs ?? 2_000);
      if (due && !this.queue.includes(a)) this.queue.push(a);
    }
    this.pump();
  }

  /** Whether the address was asked at least once (answered or failed). */
  attempted(address: string): boolean {
    const e = this.entries.get(address);
    return e !== undefined && (e.served !== undefined || e.failedAt !== undefined);
  }

  stop(): void {
    this.stopped = true;
    this.queue.length = 0;
  }

  private pump(): void {
    while (!this.stopped && this.inFlight < (this.o.concurrency ?? 16) && this.queue.length > 0) {
      const a = this.queue.shift() as string;
      const e = this.entries.get(a);
      if (!e) continue;
      e.inFlight = true;
      this.inFlight++;
      void this.ask(a).then((served) => {
        this.inFlight--;
        e.inFlight = false;
        if (this.stopped || this.entries.get(a) !== e) return this.pump();
        const before = JSON.stringify(e.served ?? null);
        if (served) {
          e.served = served;
          e.at = this.now();
          e.failedAt = undefined;
        } else {
          e.failedAt = this.now();
          this.stats.failed++;
        }
        if (JSON.stringify(e.served ?? null) !== before) this.o.changed();
        this.pump();
      });
    }
  }

  private async ask(address: string): Promise<ServedModels | undefined> {
    this.stats.asked++;
    try {
      const res = await fetch(`http://${address}/v1/models`, {
        signal: AbortSignal.timeout(this.o.timeoutMs ?? 2_000),
        redirect: "error",
        ...(this.o.apiKey ? { headers: { authorization: `Bearer ${this.o.apiKey}` } } : {}),
      });
      if (!res.ok) {
        await discardBody(res);
        return undefined;
      }
      // Read up to the bound, never past it: refused on its content-length, or cut when it streams more.
      return servedModelsOf(JSON.parse(await readBodyCapped(res, MODELS_ANSWER_BYTES, "/v1/models answer")));
    } catch {
      return undefined;
    }
  }
}
