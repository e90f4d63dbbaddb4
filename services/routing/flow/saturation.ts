/**
 * When a pod has room for one more request (flow control's dispatch gate). Pure.
 *
 * A pod is full when any configured limit is reached:
 * - its queue: waiting requests / `queueDepth` >= 1, where waiting is the engine's own count at its
 *   last scrape plus the change in the ledger's in-flight count since that sample was first seen
 *   (every replica's charges minus releases; never below 0), so dispatches between two scrapes
 *   count at once, and so does the room a finished request leaves;
 * - its KV cache: usage / `kvCacheUsage` >= 1;
 * - in-flight requests or prompt tokens over `maxInFlightPerPod` / `maxTokensPerPod` (the ledger's
 *   counts across every replica; they never go stale).
 * Stale metrics (no fresh LOAD sample): the metric limits cannot be read. If a ledger limit is
 * configured, it alone decides; otherwise the pod counts as full (fail closed, as the peers do) —
 * except a pod with nothing in flight in the ledger, which always has room: a scraper outage
 * then costs concurrency, never availability.
 * The model has room when any of its candidate pods has (the scheduler then picks among them).
 *
 * Per band (issue 36, `queueDepthFor`): on a pod whose engine schedules by priority, the queue
 * limit grows with the request's band — `queueDepth` plus `perBand.depth` for every band in play
 * below its own — because the engine runs a waiting request before every lower-band one: lower
 * bands' waiting requests do not delay it, so holding it at the gateway behind them would only
 * add a wait the engine would not impose. The ledger's in-flight limit grows the same way
 * (`inFlightLimitFor`: what is in flight past the running slots is the engine's queue); the KV and
 * token limits stay the same for every band (they are physical). Within a band nothing changes, so
 * fairness between its flows does not either.
 */
import type { LedgerReader } from "../../views/charge-ledger.js";
import type { LoadReader } from "../../views/load-view.js";
import type { PodInfo } from "../../views/pod-set.js";
import type { SchedulingPolicy } from "../../../schemas/events.js";
import type { SaturationSettings } from "./settings.js";

export interface SaturationViews {
  readonly ledger: LedgerReader;
  readonly load: LoadReader;
}

export type FullReason = "queue" | "kv" | "in-flight" | "tokens" | "stale";

export interface PodRoom {
  /** The largest of the limits' ratios (>= 1: full); NaN when stale metrics alone decided. */
  readonly utilization: number;
  readonly full: boolean;
  readonly reason?: FullReason;
}

interface Baseline {
  /** The sample's scrape time. */
  ts: number;
  /** The ledger's in-flight requests on the pod when the sample was first seen. */
  inFlight: number;
}

/** What room needs to know of a pod: its identity, and whether its engine schedules by priority. */
export type RoomPod = Pick<PodInfo, "model" | "pod"> & { readonly schedulingPolicy?: SchedulingPolicy };

/**
 * The waiting requests at which `pod` is full for a request of `band` (undefined: band-blind, the
 * base `queueDepth`). Pure.
 */
export function queueDepthFor(pod: { readonly schedulingPolicy?: SchedulingPolicy }, band: number | undefined, s: SaturationSettings): number {
  return s.queueDepth + (s.perBand?.depth ?? 0) * bandsBelow(pod, band, s);
}

/**
 * The ledger's in-flight requests at which `pod` is full for a request of `band`:
 * `maxInFlightPerPod` plus the same per-band budget as the queue (`perBand.depth` for every band in
 * play below its own) on a pod that schedules by priority. The requests in flight beyond the
 * engine's running slots are its waiting queue, which such an engine serves most urgent first (an
 * SGLang pod preempts a running request for it past its threshold), so lower bands filling the
 * limit must not hold a higher band's request at the gateway. Undefined when no limit is set.
 */
export function inFlightLimitFor(pod: { readonly schedulingPolicy?: SchedulingPolicy }, band: number | undefined, s: SaturationSettings): number | undefined {
  if (s.maxInFlightPerPod === undefined) return undefined;
  return s.maxInFlightPerPod + (s.perBand?.depth ?? 0) * bandsBelow(pod, band, s);
}

/** Distinct engine urgencies in play strictly below the request's band (0 when band-blind). Pure. */
function bandsBelow(pod: { readonly schedulingPolicy?: SchedulingPolicy }, band: number | undefined, s: SaturationSettings): number {
  const per = s.perBand;
  if (band === undefined || per === undefined || pod.schedulingPolicy === undefined) return 0;
  // Bands in play whose engine urgency is strictly below the request's: the engine runs it before
  // their waiting requests. Equal urgencies (a mapping may merge bands) run in arrival order: no room.
  const at = per.bands.indexOf(band);
  const below = new Set<number>();
  for (let i = 0; i < per.bands.length; i++) {
    const lower = at >= 0 ? (per.urgencies[i] as number) < (per.urgencies[at] as number) : (per.bands[i] as number) < band;
    if (lower) below.add(per.urgencies[i] as number);
  }
  return below.size;
}

/** Keeps, per pod, the ledger count at the time its latest sample was first seen (bounded by the pods asked about; `retain` prunes). */
export class SaturationDetector {
  private readonly baselines = new Map<string, Baseline>();

  constructor(private readonly views: SaturationViews) {}

  /** `band`: the request's (its queue limit: `queueDepthFor`); undefined: the base limit. */
  podRoom(pod: RoomPod, s: SaturationSettings, now: number, band?: number): PodRoom {
    const o = this.views.ledger.outstanding(pod.model, pod.pod);
    let u = 0;
    let reason: FullReason | undefined;
    const consider = (ratio: number, r: FullReason) => {
      if (ratio < u) return;
      u = ratio;
      reason = r;
    };
    const inFlightLimit = inFlightLimitFor(pod, band, s);
    if (inFlightLimit !== undefined) consider(o.requests / inFlightLimit, "in-flight");
    if (s.maxTokensPerPod !== undefined) consider(o.promptTokens / s.maxTokensPerPod, "tokens");
    const load = this.views.load.fresh(pod.model, pod.pod, now);
    const key = `${pod.model}\u0000${pod.pod}`;
    const sampleTs = this.views.load.get(pod.model, pod.pod)?.ts;
    if (load && sampleTs !== undefined) {
      let b = this.baselines.get(key);
      if (!b || b.ts !== sampleTs) {
        b = { ts: sampleTs, inFlight: o.requests };
        this.baselines.set(key, b);
      }
      // Net of releases too: a request that finished since the sample let a waiting one run.
      const waiting = Math.max(0, (load.waiting ?? 0) + o.requests - b.inFlight);
      consider(waiting / queueDepthFor(pod, band, s), "queue");
      if (load.kvCacheUsage !== null && load.kvCacheUsage !== undefined) consider(load.kvCacheUsage / s.kvCacheUsage, "kv");
    } else if (s.maxInFlightPerPod === undefined && s.maxTokensPerPod === undefined && o.requests > 0) {
      return { utilization: Number.NaN, full: true, reason: "stale" };
    }
    return { utilization: u, full: u >= 1, ...(u >= 1 && reason ? { reason } : {}) };
  }

  /** Whether any of `pods` has room. */
  hasRoom(pods: readonly RoomPod[], s: SaturationSettings, now: number, band?: number): boolean {
    for (const p of pods) if (!this.podRoom(p, s, now, band).full) return true;
    return false;
  }

  /** Forgets pods not in `alive` (called on the shell's sweep). */
  retain(alive: (model: string, pod: string) => boolean): void {
    for (const k of this.baselines.keys()) {
      const [model = "", pod = ""] = k.split("\u0000");
      if (!alive(model, pod)) this.baselines.delete(k);
    }
  }

  get size(): number {
    return this.baselines.size;
  }
}
