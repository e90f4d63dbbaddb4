/**
 * Priority inversions, as the flow-control contract defines them: a dispatch of band B of a model
 * at time t is an inversion when some request of a band > B of the same model, enqueued before
 * t - boundMs, was still held (anywhere in the fleet) at t. Both comparisons are strict: a request
 * enqueued exactly at t - boundMs does not count, nor one that left (was dispatched, expired,
 * dropped or cancelled) exactly at t. Used by the gateway's metric and by the benchmark, which
 * rebuild the held intervals from decision records and rejections.
 *
 * Cost: O((d + h) log(d + h)) for d dispatches and h held intervals (sorts, then one sweep per
 * model with a max-Fenwick tree over its distinct bands).
 */
import { DEFAULT_INVERSION_BOUND_MS } from "./fleet.js";

export interface Dispatch {
  model: string;
  band: number;
  /** ms. */
  at: number;
}

export interface HeldInterval {
  model: string;
  band: number;
  enqueuedAt: number;
  /** When it left the queue: dispatch, expiry, drop or cancel time (ms). */
  leftAt: number;
}

/** Indexes (into `dispatches`, ascending) of the dispatches that are inversions. */
export function findInversions(dispatches: readonly Dispatch[], held: readonly HeldInterval[], boundMs: number = DEFAULT_INVERSION_BOUND_MS): number[] {
  const dByModel = groupIndexes(dispatches);
  const hByModel = groupIndexes(held);
  const out: number[] = [];
  for (const [model, ds] of dByModel) {
    const hs = hByModel.get(model);
    if (hs === undefined) continue;
    const bands = [...new Set(hs.map((i) => held[i]!.band))].sort((a, b) => b - a);
    // Fenwick position of a band: 1 = the highest. A prefix max over positions 1..k = the latest
    // leftAt among the added intervals of the k highest bands.
    const position = new Map(bands.map((b, i) => [b, i + 1]));
    const tree = new Array<number>(bands.length + 1).fill(Number.NEGATIVE_INFINITY);
    hs.sort((a, b) => held[a]!.enqueuedAt - held[b]!.enqueuedAt);
    ds.sort((a, b) => dispatches[a]!.at - dispatches[b]!.at);
    let next = 0;
    for (const di of ds) {
      const d = dispatches[di]!;
      const cutoff = d.at - boundMs;
      for (; next < hs.length && held[hs[next]!]!.enqueuedAt < cutoff; next++) {
        const h = held[hs[next]!]!;
        for (let i = position.get(h.band)!; i <= bands.length; i += i & -i) tree[i] = Math.max(tree[i]!, h.leftAt);
      }
      // Bands strictly above d.band: the first `k` positions.
      const k = countAbove(bands, d.band);
      let latest = Number.NEGATIVE_INFINITY;
      for (let i = k; i > 0; i -= i & -i) latest = Math.max(latest, tree[i]!);
      if (latest > d.at) out.push(di);
    }
  }
  return out.sort((a, b) => a - b);
}

export function countInversions(dispatches: readonly Dispatch[], held: readonly HeldInterval[], boundMs: number = DEFAULT_INVERSION_BOUND_MS): number {
  return findInversions(dispatches, held, boundMs).length;
}

function groupIndexes(xs: readonly { model: string }[]): Map<string, number[]> {
  const m = new Map<string, number[]>();
  xs.forEach((x, i) => {
    const l = m.get(x.model);
    if (l === undefined) m.set(x.model, [i]);
    else l.push(i);
  });
  return m;
}

/** How many of `desc` (sorted highest first) are > band. */
function countAbove(desc: readonly number[], band: number): number {
  let lo = 0;
  let hi = desc.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (desc[mid]! > band) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
