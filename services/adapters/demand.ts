/**
 * Each managed adapter's demand, pure: requests routed to it (DECISIONS) over a sliding window, in
 * one-second buckets, and requests waiting for it in flow control's waiting room (the gateways'
 * queue summaries). Bounded: only declared adapters are counted (the caller filters), each with
 * WINDOW_BUCKETS counters; summaries of at most MAX_GATEWAYS gateways are kept.
 */
export const DEFAULT_DEMAND_WINDOW_MS = 60_000;
const BUCKET_MS = 1_000;
/** A gateway's queue summary older than this no longer counts (they come every 100 ms while requests wait). */
export const SUMMARY_STALE_MS = 1_500;
const MAX_GATEWAYS = 1024;

export class DemandWindow {
  private readonly counts = new Map<string, { buckets: Float64Array; epoch: Float64Array }>();
  private readonly queues = new Map<string, { at: number; models: Record<string, Array<{ count: number }>> }>();
  private readonly n: number;

  constructor(readonly windowMs = DEFAULT_DEMAND_WINDOW_MS) {
    this.n = Math.max(1, Math.ceil(windowMs / BUCKET_MS));
  }

  /** One request for `adapter` decided at `ts`. */
  add(adapter: string, ts: number): void {
    let c = this.counts.get(adapter);
    if (!c) this.counts.set(adapter, (c = { buckets: new Float64Array(this.n), epoch: new Float64Array(this.n).fill(-1) }));
    const b = Math.floor(ts / BUCKET_MS);
    const i = b % this.n;
    if (c.epoch[i] !== b) {
      c.epoch[i] = b;
      c.buckets[i] = 0;
    }
    c.buckets[i] = (c.buckets[i] ?? 0) + 1;
  }

  /** Requests per second over the window ending at `now`. */
  rps(adapter: string, now: number): number {
    const c = this.counts.get(adapter);
    if (!c) return 0;
    const nowB = Math.floor(now / BUCKET_MS);
    let sum = 0;
    for (let i = 0; i < this.n; i++) if ((c.epoch[i] ?? -1) > nowB - this.n && (c.epoch[i] ?? -1) <= nowB) sum += c.buckets[i] ?? 0;
    return sum / (this.n * (BUCKET_MS / 1000));
  }

  /** A gateway's flow-control summary (models -> bands with counts), received at `at`. */
  applySummary(gateway: string, models: Record<string, Array<{ count: number }>>, at: number): void {
    if (!this.queues.has(gateway) && this.queues.size >= MAX_GATEWAYS) return;
    this.queues.set(gateway, { at, models });
  }

  /** Requests for `adapter` held by the gateways right now. */
  queued(adapter: string, now: number): number {
    let n = 0;
    for (const [g, q] of this.queues) {
      if (now - q.at > SUMMARY_STALE_MS) {
        this.queues.delete(g);
        continue;
      }
      for (const b of q.models[adapter] ?? []) n += b.count;
    }
    return n;
  }

  /** Forgets adapters no longer declared. */
  retain(declared: (adapter: string) => boolean): void {
    for (const a of this.counts.keys()) if (!declared(a)) this.counts.delete(a);
  }
}
