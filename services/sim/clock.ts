/**
 * Simulated engine time. The engine reasons only in simulated milliseconds; the clock maps them to
 * wall time divided by `timeScale`. Timers are wake-ups, not the source of truth: Node rounds timer
 * delays to whole milliseconds, so at a large time scale one wake-up may cover several engine steps
 * and the engine catches up by reading `now()`.
 */
export interface SimClock {
  /** Simulated milliseconds since the clock started. */
  now(): number;
  /** Calls `fn` once simulated time has reached `atMs` (possibly a little later). Returns a cancel function. */
  at(atMs: number, fn: () => void): () => void;
}

export function scaledClock(timeScale: number): SimClock {
  if (!(timeScale > 0) || !Number.isFinite(timeScale)) throw new RangeError(`timeScale must be a positive number, got ${timeScale}`);
  const origin = performance.now();
  const now = (): number => (performance.now() - origin) * timeScale;
  return {
    now,
    at(atMs, fn) {
      const timer = setTimeout(fn, Math.max(0, (atMs - now()) / timeScale));
      return () => clearTimeout(timer);
    },
  };
}

/** A clock that only moves when told to: makes engine scheduling tests exact and instant. */
export class ManualClock implements SimClock {
  private current = 0;
  private timers: Array<{ atMs: number; fn: () => void; seq: number }> = [];
  private seq = 0;

  now(): number {
    return this.current;
  }

  at(atMs: number, fn: () => void): () => void {
    const timer = { atMs, fn, seq: this.seq++ };
    this.timers.push(timer);
    return () => {
      this.timers = this.timers.filter((t) => t !== timer);
    };
  }

  /** Moves time forward to `now() + ms`, firing due timers in time order. */
  advance(ms: number): void {
    const target = this.current + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.atMs <= target).sort((a, b) => a.atMs - b.atMs || a.seq - b.seq)[0];
      if (!due) break;
      this.timers = this.timers.filter((t) => t !== due);
      this.current = Math.max(this.current, due.atMs);
      due.fn();
    }
    this.current = target;
  }
}
