/**
 * Pinning for the benches that time the gateway (issue "the gateway's cost on its own core"): the
 * gateway process(es) on one CPU, everything else (this driver, its load generators, nats-server,
 * the simulated pods) on the others, with Linux `taskset` (util-linux). A pinned figure is the
 * gateway's own cost on a core of its own; a shared figure is the same run on a box where all
 * processes compete for all cores, as the benches measured before.
 *
 * Affinity is inherited: the driver pins itself to the "others" set before it spawns anything for a
 * pinned run, and moves each gateway (all its threads, `taskset -a`) to the gateway CPU once it has
 * a pid. A process's later threads (libuv's pool, V8 helpers) inherit from the thread that makes
 * them, so they stay on the gateway's CPU.
 */
import { execFileSync } from "node:child_process";
import os from "node:os";

export interface PinningPlan {
  /** Whether pinning applies on this host. */
  available: boolean;
  /** The CPU list (taskset -c syntax) of the gateway processes. */
  gatewayCpus: string;
  /** The CPU list of everything else. */
  otherCpus: string;
  /** Every CPU, to undo a pin. */
  allCpus: string;
  /** Why pinning does not apply (no taskset, one CPU, not Linux). */
  note?: string;
}

/** The plan for `cpus` usable CPUs: the last CPU for the gateway, the rest for everything else. */
export function pinningPlan(cpus: number, hasTaskset: boolean, platform: string = process.platform): PinningPlan {
  const allCpus = cpus > 1 ? `0-${cpus - 1}` : "0";
  if (platform !== "linux") return { available: false, gatewayCpus: allCpus, otherCpus: allCpus, allCpus, note: `pinning needs Linux (this is ${platform}): figures are shared-box only` };
  if (!hasTaskset) return { available: false, gatewayCpus: allCpus, otherCpus: allCpus, allCpus, note: "taskset (util-linux) not found: figures are shared-box only" };
  if (cpus < 2) return { available: false, gatewayCpus: allCpus, otherCpus: allCpus, allCpus, note: "one CPU: nothing to pin apart, figures are shared-box only" };
  const gw = cpus - 1;
  return { available: true, gatewayCpus: String(gw), otherCpus: gw === 1 ? "0" : `0-${gw - 1}`, allCpus };
}

function hasTaskset(): boolean {
  try {
    execFileSync("taskset", ["-p", String(process.pid)], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

let cached: PinningPlan | undefined;

/** This host's plan (CPUs this process may use, taskset present). */
export function hostPinningPlan(): PinningPlan {
  cached ??= pinningPlan(os.availableParallelism(), hasTaskset());
  return cached;
}

/** Sets every thread of `pid` to `cpus` (taskset -c list). */
export function setAffinity(pid: number, cpus: string): void {
  execFileSync("taskset", ["-a", "-p", "-c", cpus, String(pid)], { stdio: "ignore" });
}

/** The summary a bench line carries: where the gateway ran, or why it was not pinned. */
export function pinningSummary(plan: PinningPlan): { gateway_cpus: string; other_cpus: string } | { note: string } {
  return plan.available ? { gateway_cpus: plan.gatewayCpus, other_cpus: plan.otherCpus } : { note: plan.note ?? "not pinned" };
}

/**
 * Runs `fn` with this process (and so everything it spawns meanwhile) on the plan's "other" CPUs;
 * `pinGateway(pid)` moves a gateway onto the gateway CPU. Affinity is restored after.
 */
export async function withPinning<T>(plan: PinningPlan, fn: (pinGateway: (pid: number) => void) => Promise<T>): Promise<T> {
  if (!plan.available) return fn(() => {});
  setAffinity(process.pid, plan.otherCpus);
  try {
    return await fn((pid) => setAffinity(pid, plan.gatewayCpus));
  } finally {
    setAffinity(process.pid, plan.allCpus);
  }
}
