/**
 * Load view: the newest load sample per pod, folded from LOAD events. Pure: no I/O.
 * A sample is usable while fresh; strategies treat stale or missing samples by their documented fallback.
 */
import type { EngineLoadFields, LoadSample } from "../../schemas/events.js";

export interface PodLoad {
  readonly load: EngineLoadFields | null;
  /** Scrape time reported by the scraper (ms). */
  readonly ts: number;
  readonly stale: boolean;
  /** The engine's context length, from the newest sample that carried one (a scrape that could not read `/v1/models` keeps it). */
  readonly maxModelLen?: number;
}

export interface LoadReader {
  /** The pod's load if a fresh (non-stale, younger than the staleness bound) sample exists. */
  fresh(model: string, pod: string, now: number): EngineLoadFields | undefined;
  get(model: string, pod: string): PodLoad | undefined;
}

const key = (model: string, pod: string) => `${model}\u0000${pod}`;

/** A load sample older than this is ignored (ms). */
export const DEFAULT_LOAD_STALE_MS = 2_000;

export class LoadView implements LoadReader {
  private readonly samples = new Map<string, PodLoad>();
  lastSeq = 0;

  /** @param staleAfterMs a sample older than this no longer counts (peers use 2 s). */
  constructor(readonly staleAfterMs = DEFAULT_LOAD_STALE_MS) {}

  apply(s: LoadSample, seq = 0): void {
    if (seq) this.lastSeq = seq;
    const k = key(s.model, s.pod);
    const prev = this.samples.get(k);
    // Samples of one pod arrive in order on one subject; the guard only protects against clock-less replays.
    if (prev && prev.ts > s.ts) return;
    const maxModelLen = s.maxModelLen ?? prev?.maxModelLen;
    this.samples.set(k, { load: s.load, ts: s.ts, stale: s.stale, ...(maxModelLen !== undefined ? { maxModelLen } : {}) });
  }

  /** Drops a pod's sample (pod removed). */
  forget(model: string, pod: string): void {
    this.samples.delete(key(model, pod));
  }

  get(model: string, pod: string): PodLoad | undefined {
    return this.samples.get(key(model, pod));
  }

  fresh(model: string, pod: string, now: number): EngineLoadFields | undefined {
    const s = this.samples.get(key(model, pod));
    if (!s || s.stale || !s.load || now - s.ts > this.staleAfterMs) return undefined;
    return s.load;
  }

  get size(): number {
    return this.samples.size;
  }

  /** Every sample, in a canonical order (state comparison). */
  dump(): Array<[string, PodLoad]> {
    return [...this.samples.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  }
}
