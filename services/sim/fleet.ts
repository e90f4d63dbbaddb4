/**
 * Programmatic entry point: many simulated pods in one process, each on its own port, so tests,
 * the demo and load tests get a "cluster" without GPUs.
 */
import type { Logger } from "../shared/log.js";
import type { EngineKind } from "./metrics.js";
import { resolveFleetOptions, type SimFleetOptions } from "./options.js";
import { type SimPod, startSimPod } from "./pod.js";

export type { SimFleetOptions } from "./options.js";
export { SimOptionsError } from "./options.js";

export interface SimFleetPod {
  name: string;
  /** "host:port", what a pod list or the gateway dials. */
  address: string;
  port: number;
  engine: EngineKind;
}

export interface SimFleet {
  pods: SimFleetPod[];
  close(): Promise<void>;
}

export async function startSimFleet(options: SimFleetOptions & { logger?: Logger }): Promise<SimFleet> {
  const o = resolveFleetOptions(options);
  const started: SimPod[] = [];
  try {
    for (let i = 0; i < o.pods; i++) {
      started.push(
        await startSimPod({
          name: `${o.namePrefix}${i}`,
          host: o.host,
          port: o.basePort === 0 ? 0 : o.basePort + i,
          model: o.model,
          engine: o.engines[i % o.engines.length] ?? "vllm",
          timeScale: o.timeScale,
          maxModelLen: o.maxModelLen,
          engineConfig: o.engineConfig,
          logger: options.logger,
        }),
      );
    }
  } catch (err) {
    // A port clash half way through must not leave the earlier pods listening.
    await Promise.all(started.map((p) => p.close()));
    throw err;
  }
  let closing: Promise<void> | undefined;
  return {
    pods: started.map((p) => ({ name: p.name, address: p.address, port: p.port, engine: p.engine })),
    close() {
      closing ??= Promise.all(started.map((p) => p.close())).then(() => undefined);
      return closing;
    },
  };
}
