/**
 * What the other gateway replicas hold, from the summaries they publish (`<prefix>.flow.<gateway>`,
 * every DEFAULT_SUMMARY_INTERVAL_MS while they hold anything, once more when they empty), and the
 * fleet-wide dispatch gate built on it: a replica does not dispatch band B of a model while another
 * live replica holds a band > B of that model whose oldest request has waited more than `boundMs`.
 * Pure: the caller passes receive times and `now`.
 *
 * Clocks: a request's age is measured without comparing two hosts' clocks. At publication the
 * oldest request had waited `ts - oldest` (both on the publisher's clock); since then
 * `now - receivedAt` has passed (both on ours). The age is underestimated by the propagation delay
 * only, which the bound (about one propagation delay plus one interval) absorbs.
 *
 * Liveness: a summary not refreshed within `staleMs` (default 3 intervals, by our receive time) is
 * ignored and then swept, so a dead replica blocks nobody for longer than that, and takes only its
 * own held requests with it.
 *
 * Bounds: at most `maxReplicas` replicas (a new one beyond it is refused while the others are
 * live), `maxModels` models per summary and MAX_BANDS bands per model (extra models are cut,
 * extra bands cut from the bottom, since only higher bands gate); every cut and refusal is counted
 * in `stats()`. A malformed summary is ignored and counted, never thrown.
 *
 * Trust (`applyFrom`): a summary is refused, counted and reported (the shell dead-letters it) when
 * the gateway it names is not the one its subject names (one gateway's credentials cannot speak
 * for another's subject, so they cannot shadow its summaries), when a band is outside [-16, 16],
 * when its `ts` is more than `maxFutureMs` ahead of our receive time (a future ts would make the
 * real gateway's later summaries look old and be ignored), or when its oldest request is older
 * than `maxAgeMs` at publication (no request is held that long: the longest TTL is far shorter).
 */

export interface BandSummary {
  band: number;
  count: number;
  /** enqueuedAt of the band's oldest held request, on the publisher's clock. */
  oldest: number;
}

export interface ReplicaSummary {
  gateway: string;
  /** Publication time, on the publisher's clock. */
  ts: number;
  models: Record<string, BandSummary[]>;
}

export const DEFAULT_SUMMARY_INTERVAL_MS = 100;
export const DEFAULT_INVERSION_BOUND_MS = 250;
/** Priorities are integers in [-16, 16]. */
export const MAX_BANDS = 33;
export const DEFAULT_MAX_REPLICAS = 1024;
export const DEFAULT_MAX_MODELS = 1024;
/** Longest gateway id and model name a summary may carry. */
export const MAX_NAME_LENGTH = 1024;
export const MIN_BAND = -16;
export const MAX_BAND = 16;
/** How far a summary's `ts` may be ahead of its receive time (hosts' clocks agree within this, NTP-synced). */
export const DEFAULT_MAX_FUTURE_MS = 10_000;
/** The longest a summary's band may have waited at publication (a request is never held an hour). */
export const DEFAULT_MAX_AGE_MS = 3_600_000;

export interface FleetQueuesOptions {
  /** This gateway's id: its own summaries (echoed back by NATS) are ignored. */
  self: string;
  boundMs?: number;
  /** Default 3 x DEFAULT_SUMMARY_INTERVAL_MS. */
  staleMs?: number;
  maxReplicas?: number;
  maxModels?: number;
  /** See the header: default DEFAULT_MAX_FUTURE_MS. */
  maxFutureMs?: number;
  /** See the header: default DEFAULT_MAX_AGE_MS. */
  maxAgeMs?: number;
}

/** Why `applyFrom` refused a summary (each counted in `stats()`). */
export type SummaryRefusal = "malformed" | "wrong-gateway" | "future-ts" | "too-old";

export type ApplyResult = { stored: boolean; refused?: undefined } | { stored: false; refused: SummaryRefusal };

export interface Blocker {
  gateway: string;
  band: number;
  /** enqueuedAt of that band's oldest request, on the blocking gateway's clock. */
  oldest: number;
  /** How long it has waited by now, clock-skew free (see the header). */
  ageMs: number;
}

export interface FleetStats {
  replicas: number;
  /** Summaries ignored because malformed. */
  malformed: number;
  /** Summaries stored with models or bands cut. */
  truncated: number;
  /** Summaries of a new replica refused because maxReplicas live replicas are known. */
  refused: number;
  /** Summaries naming another gateway than their subject does. */
  wrongGateway: number;
  /** Summaries whose ts was more than maxFutureMs ahead of their receive time. */
  futureTs: number;
  /** Summaries with a band held longer than maxAgeMs at publication. */
  tooOld: number;
}

interface Replica {
  ts: number;
  receivedAt: number;
  /** Bands with count > 0, highest first. */
  models: Map<string, BandSummary[]>;
}

const isName = (x: unknown): x is string => typeof x === "string" && x.length > 0 && x.length <= MAX_NAME_LENGTH;

/**
 * Most requests one band of one model may claim to hold: far above any replica's bound on held
 * requests (`--flow-max-held`, 10,000 by default), so no honest summary reaches it, while a forged
 * count cannot inflate the autoscaler's queue signal or the adapter controller's demand without
 * limit.
 */
export const MAX_BAND_COUNT = 1_000_000;

function isBand(x: unknown): x is BandSummary {
  if (typeof x !== "object" || x === null) return false;
  const b = x as Record<string, unknown>;
  return (
    Number.isSafeInteger(b.band) &&
    (b.band as number) >= MIN_BAND &&
    (b.band as number) <= MAX_BAND &&
    Number.isSafeInteger(b.count) &&
    (b.count as number) >= 0 &&
    (b.count as number) <= MAX_BAND_COUNT &&
    Number.isFinite(b.oldest)
  );
}

export interface SummaryLimits {
  maxModels?: number;
  maxFutureMs?: number;
  maxAgeMs?: number;
}

/**
 * The trust check of a summary read off `<prefix>.flow.<gateway>` (see the header): the summary,
 * or why it is refused. `from` is the gateway the subject names. Every reader of flow summaries
 * (gateways, the autoscaler, the adapter controller) goes through it.
 */
export function checkSummary(from: string | undefined, s: unknown, receivedAt: number, limits: SummaryLimits = {}): { parsed: { summary: ReplicaSummary; truncated: boolean }; refused?: undefined } | { parsed?: undefined; refused: SummaryRefusal } {
  const parsed = Number.isFinite(receivedAt) ? parseSummary(s, limits.maxModels ?? DEFAULT_MAX_MODELS) : undefined;
  if (parsed === undefined) return { refused: "malformed" };
  const { summary } = parsed;
  if (summary.gateway !== from) return { refused: "wrong-gateway" };
  if (summary.ts - receivedAt > (limits.maxFutureMs ?? DEFAULT_MAX_FUTURE_MS)) return { refused: "future-ts" };
  const maxAgeMs = limits.maxAgeMs ?? DEFAULT_MAX_AGE_MS;
  for (const bands of Object.values(summary.models)) if (bands.some((b) => summary.ts - b.oldest > maxAgeMs)) return { refused: "too-old" };
  return { parsed };
}

/**
 * Checks an untrusted summary (decoded from the wire) and copies what it keeps: undefined when it
 * is malformed, else the summary cut to `maxModels` models and MAX_BANDS bands per model, with empty
 * bands left out and bands highest first.
 */
export function parseSummary(x: unknown, maxModels = DEFAULT_MAX_MODELS): { summary: ReplicaSummary; truncated: boolean } | undefined {
  if (typeof x !== "object" || x === null) return undefined;
  const s = x as Record<string, unknown>;
  if (!isName(s.gateway) || !Number.isFinite(s.ts)) return undefined;
  const models = s.models;
  if (typeof models !== "object" || models === null || Array.isArray(models)) return undefined;
  const kept: Array<[string, BandSummary[]]> = [];
  let truncated = false;
  for (const [model, bands] of Object.entries(models)) {
    if (!isName(model) || !Array.isArray(bands) || !bands.every(isBand)) return undefined;
    if (kept.length >= maxModels) {
      truncated = true;
      continue;
    }
    const live = bands
      .filter((b) => b.count > 0)
      .map((b) => ({ band: b.band, count: b.count, oldest: b.oldest }))
      .sort((a, b) => b.band - a.band);
    if (live.length > MAX_BANDS) {
      truncated = true;
      live.length = MAX_BANDS;
    }
    kept.push([model, live]);
  }
  return { summary: { gateway: s.gateway, ts: s.ts as number, models: Object.fromEntries(kept) }, truncated };
}

export class FleetQueues {
  readonly self: string;
  readonly boundMs: number;
  readonly staleMs: number;
  private readonly maxReplicas: number;
  private readonly maxModels: number;
  private readonly maxFutureMs: number;
  private readonly maxAgeMs: number;
  private readonly replicas = new Map<string, Replica>();
  private counts = { malformed: 0, truncated: 0, refused: 0, wrongGateway: 0, futureTs: 0, tooOld: 0 };

  constructor(opts: FleetQueuesOptions) {
    this.self = opts.self;
    this.boundMs = opts.boundMs ?? DEFAULT_INVERSION_BOUND_MS;
    this.staleMs = opts.staleMs ?? 3 * DEFAULT_SUMMARY_INTERVAL_MS;
    this.maxReplicas = opts.maxReplicas ?? DEFAULT_MAX_REPLICAS;
    this.maxModels = opts.maxModels ?? DEFAULT_MAX_MODELS;
    this.maxFutureMs = opts.maxFutureMs ?? DEFAULT_MAX_FUTURE_MS;
    this.maxAgeMs = opts.maxAgeMs ?? DEFAULT_MAX_AGE_MS;
  }

  /**
   * A summary received on the subject of gateway `from` (decoded from the subject): refused when
   * malformed, when it names another gateway, when its ts is too far ahead of `receivedAt`, or a
   * band too old (see the header); else as `apply`. Never throws.
   */
  applyFrom(from: string | undefined, s: unknown, receivedAt: number): ApplyResult {
    const r = checkSummary(from, s, receivedAt, { maxModels: this.maxModels, maxFutureMs: this.maxFutureMs, maxAgeMs: this.maxAgeMs });
    if (r.refused !== undefined) {
      if (r.refused === "malformed") this.counts.malformed++;
      else if (r.refused === "wrong-gateway") this.counts.wrongGateway++;
      else if (r.refused === "future-ts") this.counts.futureTs++;
      else this.counts.tooOld++;
      return { stored: false, refused: r.refused };
    }
    return { stored: this.store(r.parsed, receivedAt) };
  }

  /**
   * Stores a replica's summary (received at `receivedAt` on our clock) if it is newer (by `ts`)
   * than the one held, or that one is stale. Returns whether it was stored: false for our own,
   * an older or a malformed summary, or a new replica beyond maxReplicas. Never throws.
   */
  apply(s: ReplicaSummary | unknown, receivedAt: number): boolean {
    const parsed = parseSummary(s, this.maxModels);
    if (parsed === undefined || !Number.isFinite(receivedAt)) {
      this.counts.malformed++;
      return false;
    }
    return this.store(parsed, receivedAt);
  }

  private store(parsed: { summary: ReplicaSummary; truncated: boolean }, receivedAt: number): boolean {
    const { summary, truncated } = parsed;
    if (summary.gateway === this.self) return false;
    const held = this.replicas.get(summary.gateway);
    if (held !== undefined && summary.ts <= held.ts && !this.isStale(held, receivedAt)) return false;
    if (held === undefined && this.replicas.size >= this.maxReplicas) {
      this.sweep(receivedAt);
      if (this.replicas.size >= this.maxReplicas) {
        this.counts.refused++;
        return false;
      }
    }
    if (truncated) this.counts.truncated++;
    this.replicas.set(summary.gateway, { ts: summary.ts, receivedAt, models: new Map(Object.entries(summary.models)) });
    return true;
  }

  /**
   * Is there, on another live replica, a band > `band` of `model` whose oldest request is older than
   * now - boundMs? Returns the blocker (the highest such band, then the longest wait) or undefined.
   */
  blocker(model: string, band: number, now: number): Blocker | undefined {
    let best: Blocker | undefined;
    for (const [gateway, r] of this.replicas) {
      if (this.isStale(r, now)) continue;
      const bands = r.models.get(model);
      if (bands === undefined) continue;
      const since = Math.max(0, now - r.receivedAt);
      for (const b of bands) {
        if (b.band <= band) break;
        if (best !== undefined && b.band < best.band) break;
        const ageMs = r.ts - b.oldest + since;
        if (ageMs <= this.boundMs) continue;
        if (best === undefined || b.band > best.band || ageMs > best.ageMs) best = { gateway, band: b.band, oldest: b.oldest, ageMs };
        break;
      }
    }
    return best;
  }

  /** Drops summaries not refreshed within staleMs. */
  sweep(now: number): void {
    for (const [gateway, r] of this.replicas) if (this.isStale(r, now)) this.replicas.delete(gateway);
  }

  /** The summaries held (copies; bands with count > 0, highest first), for /debug/state. */
  dump(): ReplicaSummary[] {
    return [...this.replicas].map(([gateway, r]) => ({
      gateway,
      ts: r.ts,
      models: Object.fromEntries([...r.models].map(([m, bands]) => [m, bands.map((b) => ({ ...b }))])),
    }));
  }

  stats(): FleetStats {
    return { replicas: this.replicas.size, ...this.counts };
  }

  /** The summaries held with their receive times (our clock), for a reader that ages held requests on one clock (the autoscaler). */
  received(): Array<{ gateway: string; ts: number; receivedAt: number; models: Record<string, BandSummary[]> }> {
    return [...this.replicas].map(([gateway, r]) => ({ gateway, ts: r.ts, receivedAt: r.receivedAt, models: Object.fromEntries(r.models) }));
  }

  private isStale(r: Replica, now: number): boolean {
    return now - r.receivedAt > this.staleMs;
  }
}

/** This gateway's summary of its queues (one per model; models holding nothing are left out). */
export function summaryOf(gateway: string, ts: number, queues: ReadonlyMap<string, { summary(): Array<{ band: number; count: number; oldest: number }> }>): ReplicaSummary {
  const models: Array<[string, BandSummary[]]> = [];
  for (const [model, q] of queues) {
    const bands = q.summary().filter((b) => b.count > 0);
    if (bands.length > 0) models.push([model, bands.map((b) => ({ band: b.band, count: b.count, oldest: b.oldest }))]);
  }
  // fromEntries, not assignment: a model named "__proto__" must stay a plain key.
  return { gateway, ts, models: Object.fromEntries(models) };
}
