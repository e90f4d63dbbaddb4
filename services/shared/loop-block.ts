/**
 * The event loop's longest block, measured as CPU rather than wall lag: a 1 ms interval timer
 * reads the main thread's own CPU time (Linux schedstat, nanoseconds) at each tick, and the most
 * CPU spent between two consecutive ticks is the longest run of this thread's work that kept the
 * timer waiting. Unlike the wall lateness (`nodejs_eventloop_lag_*`), it does not count time the
 * process waited for a core that other processes held, so it is the process's own figure on a
 * loaded or shared host. Both are returned; on a dedicated core they agree.
 *
 * It costs a file read per millisecond (about 0.5-1 % of a core), so it runs only where asked:
 * benches and profiling, not production defaults.
 */
import { readFileSync } from "node:fs";

/** CPU time (ms) this thread has used, or NaN where the kernel has no schedstat. */
export function threadCpuMs(): number {
  try {
    return Number(readFileSync("/proc/thread-self/schedstat", "utf8").split(" ")[0]) / 1e6;
  } catch {
    return Number.NaN;
  }
}

export interface LoopBlock {
  /** Longest CPU run of the main thread between two ticks (ms). */
  cpuMs: number;
  /** Longest lateness of the 1 ms timer past its interval (ms): what a waiting request saw. */
  wallMs: number;
}

export interface LoopBlockProbe {
  /** The longest block since the last call (or since the start), then starts a new window. */
  take(): LoopBlock;
  stop(): LoopBlock;
}

/** Starts the probe on the calling thread's event loop. */
export function startLoopBlockProbe(intervalMs = 1): LoopBlockProbe {
  let last = performance.now();
  let lastCpu = threadCpuMs();
  let wall = 0;
  let cpu = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    const c = threadCpuMs();
    wall = Math.max(wall, now - last - intervalMs);
    cpu = Math.max(cpu, c - lastCpu);
    last = now;
    lastCpu = c;
  }, intervalMs);
  timer.unref();
  const take = (): LoopBlock => {
    const out = { cpuMs: Number(cpu.toFixed(3)), wallMs: Number(Math.max(0, wall).toFixed(3)) };
    cpu = 0;
    wall = 0;
    return out;
  };
  return {
    take,
    stop() {
      clearInterval(timer);
      return take();
    },
  };
}
