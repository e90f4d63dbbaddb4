/**
 * CPU time of other processes and of the host, from /proc (Linux), for benches that measure
 * gateway and nats-server child processes from outside.
 *
 * `/proc/<pid>/stat` counts in clock ticks (10 ms): over a few seconds, a process that folds a few
 * thousand events would be measured to ±20 %. The scheduler's own runtime per thread,
 * `/proc/<pid>/task/<tid>/schedstat` (nanoseconds), summed over the process's threads, has no such
 * rounding; a thread that exits between two readings takes its time with it, which a Node process
 * (long-lived V8 and libuv threads) does not do in practice. Where the kernel has no schedstat,
 * the tick counts are used.
 */
import { readdirSync, readFileSync } from "node:fs";

/** Linux clock ticks per second for /proc/<pid>/stat (USER_HZ; 100 on every mainstream kernel). */
const TICK_US = 10_000;

/** CPU time (µs, every thread, user + system) a process has used so far. */
export function processCpuUs(pid: number): number {
  try {
    let ns = 0;
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      try {
        ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]);
      } catch {
        /* the thread exited while listed */
      }
    }
    if (ns > 0) return ns / 1000;
  } catch {
    /* no schedstat: ticks below */
  }
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * TICK_US;
}

/** The host's CPU counters (all cores, ticks): busy and total, for a busy fraction between two readings. */
export interface HostCpu {
  busy: number;
  total: number;
}

export function hostCpu(): HostCpu {
  const line = readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "";
  // cpu user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user).
  const v = line.trim().split(/\s+/).slice(1, 9).map(Number);
  const total = v.reduce((a, b) => a + b, 0);
  const idle = (v[3] ?? 0) + (v[4] ?? 0);
  return { busy: total - idle, total };
}

/** Fraction (0-1) of all the host's cores busy between two readings, every process counted. */
export function busyFraction(a: HostCpu, b: HostCpu): number {
  const total = b.total - a.total;
  return total > 0 ? (b.busy - a.busy) / total : 0;
}

/** The 1-minute load average. */
export function loadAverage1m(): number {
  return Number(readFileSync("/proc/loadavg", "utf8").split(" ")[0]);
}

/** CPU µs of a process's main thread (the event loop) alone, from /proc schedstat. */
export function mainThreadCpuUs(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, "utf8").split(" ")[0]) / 1000;
}

/**
 * Times a process's main thread went to sleep and was woken (its voluntary context switches): for
 * a Node process, about one per event-loop wake-up. What a live fold costs at low rates is mostly
 * per wake-up, not per message, and this counts them.
 */
export function mainThreadWakeups(pid: number): number {
  const status = readFileSync(`/proc/${pid}/task/${pid}/status`, "utf8");
  return Number(/^voluntary_ctxt_switches:\s+(\d+)$/m.exec(status)?.[1] ?? Number.NaN);
}
