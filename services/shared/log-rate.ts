/**
 * A log rate rule on an injected clock: of a run of like events (dead letters), the first
 * `linesPerInterval` of each interval are logged one line each; the rest are only counted, and the
 * count is reported in one summary line when the interval is over. So any interval writes at most
 * `linesPerInterval + 1` lines, however many events it saw. Pure: the caller owns the clock and
 * the timer that calls `flush` (see `dueAt`).
 *
 * An interval starts at the first event after the previous one ended (not on a fixed grid), so a
 * quiet process logs its next event at once.
 */
export interface LogRateDecision {
  /** Log this event on its own line. */
  log: boolean;
  /** Events held back in an interval that has ended, to report (in one line) before this one; 0 = none. */
  summary: number;
}

export class LogRate {
  private windowEnd = Number.NEGATIVE_INFINITY;
  private lines = 0;
  private held = 0;

  constructor(
    readonly linesPerInterval: number,
    readonly intervalMs: number,
  ) {
    if (!Number.isInteger(linesPerInterval) || linesPerInterval < 0) throw new RangeError(`lines per interval must be an integer >= 0, got ${linesPerInterval}`);
    if (!Number.isFinite(intervalMs) || intervalMs <= 0) throw new RangeError(`log interval must be > 0 ms, got ${intervalMs}`);
  }

  /** One more event at `now` (ms). */
  admit(now: number): LogRateDecision {
    let summary = 0;
    if (now >= this.windowEnd) {
      summary = this.held;
      this.held = 0;
      this.lines = 0;
      this.windowEnd = now + this.intervalMs;
    }
    if (this.lines < this.linesPerInterval) {
      this.lines++;
      return { log: true, summary };
    }
    this.held++;
    return { log: false, summary };
  }

  /** When the held-back count is due for its summary line; undefined when nothing is held. */
  get dueAt(): number | undefined {
    return this.held > 0 ? this.windowEnd : undefined;
  }

  /** At or after `dueAt`: the count held back (reported now, so it is forgotten); else 0. */
  flush(now: number): number {
    if (this.held === 0 || now < this.windowEnd) return 0;
    const n = this.held;
    this.held = 0;
    return n;
  }
}
