/**
 * `JETROUTE_LOOP_CPU_PROBE=1`: the gateway measures its event loop's longest block as CPU of its
 * own main thread (services/shared/loop-block.ts) and exposes it as
 * `jetroute_gateway_loop_block_cpu_max_seconds` (and the wall lateness of the same 1 ms timer as
 * `jetroute_gateway_loop_block_wall_max_seconds`), each the maximum since the previous scrape. The
 * benches set it to report the gateway's own loop blocks apart from the host's load; it is off by
 * default because the probe reads /proc once per millisecond.
 */
import client from "prom-client";
import { type LoopBlock, startLoopBlockProbe } from "../shared/loop-block.js";

export function registerLoopProbe(r: client.Registry, env: NodeJS.ProcessEnv = process.env): void {
  if (env.JETROUTE_LOOP_CPU_PROBE !== "1") return;
  const probe = startLoopBlockProbe();
  // A scrape collects the CPU gauge first (registration order) and takes the window there; the
  // wall gauge reads the same window.
  let window: LoopBlock | undefined;
  new client.Gauge({
    name: "jetroute_gateway_loop_block_cpu_max_seconds",
    help: "Longest CPU run of the gateway's main thread between two ticks of a 1 ms timer since the last scrape (JETROUTE_LOOP_CPU_PROBE=1): its own loop block, apart from the host's load",
    registers: [r],
    collect() {
      window = probe.take();
      this.set(window.cpuMs / 1000);
    },
  });
  new client.Gauge({
    name: "jetroute_gateway_loop_block_wall_max_seconds",
    help: "Longest lateness of the same 1 ms timer since the last scrape (JETROUTE_LOOP_CPU_PROBE=1): what a request waiting on the loop saw",
    registers: [r],
    collect() {
      this.set((window ?? probe.take()).wallMs / 1000);
      window = undefined;
    },
  });
}
