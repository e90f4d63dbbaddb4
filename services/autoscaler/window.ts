/**
 * A sliding time window of samples, bucketed by time. Pure: the caller passes `now` (ms).
 *
 * Samples that land in the same bucket (`granularityMs` wide) are averaged into it. The window's
 * `average` is the mean of the non-empty buckets whose start lies in `(now - windowMs, now]`; its
 * `max` is the largest single sample there. An empty window answers `undefined`, never 0, so "no
 * data yet" never reads as "no load".
 *
 * Bounded: at most `ceil(windowMs / granularityMs) + 1` buckets are kept (older ones are dropped on
 * every record and read), 4 numbers each.
 */

interface Bucket {
  start: number;
  sum: number;
  count: number;
  max: number;
}

export class TimeWindow {
  private readonly buckets: Bucket[] = [];

  constructor(
    readonly windowMs: number,
    readonly granularityMs = 1000,
  ) {
    if (!(windowMs > 0) || !(granularityMs > 0)) throw new Error("window and granularity must be > 0 ms");
  }

  /** Bucket bound: buckets the window can hold at once. */
  get capacity(): number {
    return Math.ceil(this.windowMs / this.granularityMs) + 1;
  }

  record(now: number, value: number): void {
    if (!Number.isFinite(value)) return;
    const start = Math.floor(now / this.granularityMs) * this.granularityMs;
    const last = this.buckets[this.buckets.length - 1];
    if (!last || start > last.start) {
      this.buckets.push({ start, sum: value, count: 1, max: value });
    } else {
      // The newest bucket, or a sample older than it (a clock step back): folded into the newest.
      last.sum += value;
      last.count++;
      if (value > last.max) last.max = value;
    }
    this.evict(now);
  }

  average(now: number): number | undefined {
    this.evict(now);
    if (this.buckets.length === 0) return undefined;
    let total = 0;
    for (const b of this.buckets) total += b.sum / b.count;
    return total / this.buckets.length;
  }

  max(now: number): number | undefined {
    this.evict(now);
    let best: number | undefined;
    for (const b of this.buckets) if (best === undefined || b.max > best) best = b.max;
    return best;
  }

  /** Buckets with data in the window (tests and the recommendation's inputs). */
  size(now: number): number {
    this.evict(now);
    return this.buckets.length;
  }

  clear(): void {
    this.buckets.length = 0;
  }

  private evict(now: number): void {
    const oldest = now - this.windowMs;
    let drop = 0;
    while (drop < this.buckets.length && (this.buckets[drop] as Bucket).start <= oldest) drop++;
    if (drop > 0) this.buckets.splice(0, drop);
    if (this.buckets.length > this.capacity) this.buckets.splice(0, this.buckets.length - this.capacity);
  }
}
