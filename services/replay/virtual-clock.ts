/**
 * A virtual clock for offline simulation (`jetroute replay --simulate`): time is a number that
 * moves only when a timer fires, so a simulated hour of traffic costs what its events cost, not
 * an hour. Implements the simulator's `SimClock`, so an unmodified `SimEngine` runs on it.
 *
 * Why not `ManualClock` (services/sim/clock.ts): it filters and sorts its timer array on every
 * step, which is quadratic in the number of pending timers and too slow for 100k requests. Here
 * timers live in a binary min-heap keyed by (time, insertion order), so a timer costs O(log n) and
 * timers due at the same instant fire in the order they were set (the engine relies on that to be
 * deterministic). Cancelled timers are left in the heap and skipped when they surface (the engine
 * cancels and re-arms its wake-up on every submit); the heap is compacted when they dominate.
 */
import { MinHeap } from "../shared/min-heap.js";
import type { SimClock } from "../sim/clock.js";

interface Timer {
  readonly atMs: number;
  readonly seq: number;
  /** Undefined once fired or cancelled. */
  fn: (() => void) | undefined;
}

/** Below this many dead entries a compaction is not worth its O(n). */
const COMPACT_MIN_DEAD = 1024;

export class VirtualClock implements SimClock {
  private current: number;
  private readonly heap = new MinHeap<Timer>((a, b) => before(a, b) < 0);
  private seq = 0;
  private dead = 0;

  constructor(startMs = 0) {
    this.current = startMs;
  }

  now(): number {
    return this.current;
  }

  /**
   * Calls `fn` when time reaches `atMs`. A time already past fires at the next opportunity
   * (time never runs backwards, so `now()` then reads the current time, not `atMs`).
   */
  at(atMs: number, fn: () => void): () => void {
    const timer: Timer = { atMs, seq: this.seq++, fn };
    this.heap.push(timer);
    return () => {
      if (timer.fn === undefined) return;
      timer.fn = undefined;
      this.dead++;
      if (this.dead >= COMPACT_MIN_DEAD && this.dead * 2 > this.heap.size) this.compact();
    };
  }

  /** Live timers not yet fired. */
  get pending(): number {
    return this.heap.size - this.dead;
  }

  /** Time of the next live timer, or undefined when none is set. */
  nextAt(): number | undefined {
    this.dropDeadTop();
    return this.heap.peek()?.atMs;
  }

  /**
   * Fires, in (time, insertion) order, every timer due at or before `untilMs`, including timers
   * those timers set for that span; then moves time to `untilMs` (if it is ahead). Returns how
   * many timers fired.
   */
  runUntil(untilMs: number): number {
    let fired = 0;
    for (;;) {
      this.dropDeadTop();
      const top = this.heap.peek();
      if (top === undefined || top.atMs > untilMs) break;
      this.fire();
      fired++;
    }
    if (untilMs > this.current) this.current = untilMs;
    return fired;
  }

  /** Fires timers until none is left (a timer that always re-arms itself makes this endless). */
  run(): number {
    let fired = 0;
    for (;;) {
      this.dropDeadTop();
      if (this.heap.size === 0) return fired;
      this.fire();
      fired++;
    }
  }

  /** Pops the (live) top timer, moves time to it and calls it. */
  private fire(): void {
    const timer = this.heap.pop() as Timer;
    const fn = timer.fn as () => void;
    timer.fn = undefined;
    if (timer.atMs > this.current) this.current = timer.atMs;
    fn();
  }

  private dropDeadTop(): void {
    while (this.heap.size > 0 && (this.heap.peek() as Timer).fn === undefined) {
      this.heap.pop();
      this.dead--;
    }
  }

  private compact(): void {
    this.heap.retain((t) => t.fn !== undefined);
    this.dead = 0;
  }
}

/** Heap order: earlier time first, then earlier insertion. */
function before(a: Timer, b: Timer): number {
  return a.atMs - b.atMs || a.seq - b.seq;
}
