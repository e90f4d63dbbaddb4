/**
 * The flow bench's figures, pure: fairness (Jain's index, max-min fair shares), priority inversions
 * between bands across gateways, and the fleet's capacity from the simulator's timing model.
 */
import { tokenizeChat } from "../../services/tokenizer/sim-tokenizer.js";
import type { FlowRequest } from "../workloads/flow-mix.js";
import type { PrefixQualityEngineOptions } from "../assembly.js";

/** The contract's fleet-wide bound: a lower band may not pass a higher one held longer than this. */
export const INVERSION_BOUND_MS = 250;


/** Jain's fairness index (Σx)² / (n Σx²); null when there is nothing to compare. */
export function jainIndex(xs: readonly number[]): number | null {
  if (xs.length === 0) return null;
  const sum = xs.reduce((a, b) => a + b, 0);
  const sq = xs.reduce((a, b) => a + b * b, 0);
  return sq > 0 ? (sum * sum) / (xs.length * sq) : null;
}

/**
 * Max-min fair shares of `total` among demands (water-filling): every demand below the common
 * level gets all it asked, the rest share what remains equally. Σ shares = min(total, Σ demands).
 */
export function maxMinFairShares(demands: readonly number[], total: number): number[] {
  const shares = demands.map(() => 0);
  const order = demands.map((d, i) => ({ d, i })).sort((a, b) => a.d - b.d);
  let left = Math.max(0, total);
  for (let k = 0; k < order.length; k++) {
    const { d, i } = order[k] as { d: number; i: number };
    const level = left / (order.length - k);
    const give = Math.min(d, level);
    shares[i] = give;
    left -= give;
  }
  return shares;
}

export interface BandDispatch {
  model: string;
  band: number;
  /** Dispatch time (ms). */
  at: number;
}

export interface BandHold {
  model: string;
  band: number;
  enqueuedAt: number;
  /** When the request left the queue: dispatched, expired, dropped or cancelled (ms). */
  leftAt: number;
}

/**
 * Dispatches that are priority inversions: band B dispatched at t while a request of a higher band
 * of the same model, enqueued before t - boundMs, was still held at t (both strict). A hold counts
 * over the open interval (enqueuedAt + boundMs, leftAt); one sort of its ends and the dispatches,
 * then one sweep with a held count per band. O((d + h) log(d + h) + d k), k distinct bands.
 */
export function countInversions(dispatches: readonly BandDispatch[], holds: readonly BandHold[], boundMs = INVERSION_BOUND_MS): number {
  // Event kinds in tie order: a hold that ends at t is no longer held at t; one that starts
  // counting at t (enqueued exactly at t - boundMs) does not count yet.
  const END = 0;
  const QUERY = 1;
  const START = 2;
  type Ev = { t: number; kind: number; band: number };
  const byModel = new Map<string, { events: Ev[]; bands: Set<number> }>();
  const model = (m: string) => {
    let e = byModel.get(m);
    if (!e) byModel.set(m, (e = { events: [], bands: new Set() }));
    return e;
  };
  for (const d of dispatches) {
    const e = model(d.model);
    e.events.push({ t: d.at, kind: QUERY, band: d.band });
    e.bands.add(d.band);
  }
  for (const h of holds) {
    const from = h.enqueuedAt + boundMs;
    if (!(h.leftAt > from)) continue;
    const e = model(h.model);
    e.events.push({ t: from, kind: START, band: h.band }, { t: h.leftAt, kind: END, band: h.band });
    e.bands.add(h.band);
  }
  let inversions = 0;
  for (const { events, bands } of byModel.values()) {
    const sorted = [...bands].sort((a, b) => a - b);
    const rank = new Map(sorted.map((b, i) => [b, i]));
    const held = new Array<number>(sorted.length).fill(0);
    events.sort((a, b) => a.t - b.t || a.kind - b.kind);
    for (const ev of events) {
      const r = rank.get(ev.band) as number;
      if (ev.kind === START) held[r] = (held[r] as number) + 1;
      else if (ev.kind === END) held[r] = (held[r] as number) - 1;
      else {
        for (let k = sorted.length - 1; k > r; k--) {
          if ((held[k] as number) > 0) {
            inversions++;
            break;
          }
        }
      }
    }
  }
  return inversions;
}

// Capacity

/** Prompt tokens of a request as the simulator counts them (chat template, generation prompt). */
function promptTokens(r: FlowRequest): number {
  return tokenizeChat([{ role: "user", content: r.prompt }], { addGenerationPrompt: true }).length;
}

export interface CapacityModel {
  /** Wall requests per second the pods complete when saturated. */
  rps: number;
  engineMsPerRequest: number;
  batchSize: number;
  meanPromptTokens: number;
  meanMaxTokens: number;
}

/** The timing model of the header, over a sample of the mix (the same for every rate). */
export function modelCapacity(sample: readonly FlowRequest[], e: PrefixQualityEngineOptions): CapacityModel {
  const p = sample.map(promptTokens);
  const meanP = p.reduce((a, b) => a + b, 0) / sample.length;
  const meanM = sample.reduce((a, r) => a + r.maxTokens, 0) / sample.length;
  const kvTokens = e.kvCacheBlocks * e.blockSize;
  const batchSize = Math.max(1, Math.min(e.maxBatch, Math.floor(kvTokens / (meanP + meanM))));
  const stepMs = e.decodeMsPerStep * (1 + e.decodeBatchSlope * (batchSize - 1));
  const engineMs = sample.reduce((a, r, i) => a + (p[i] as number) * e.prefillMsPerToken + (r.maxTokens * stepMs) / batchSize, 0) / sample.length;
  return { rps: (e.pods * e.timeScale * 1000) / engineMs, engineMsPerRequest: engineMs, batchSize, meanPromptTokens: meanP, meanMaxTokens: meanM };
}

