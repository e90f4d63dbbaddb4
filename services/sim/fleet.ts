/**
 * Programmatic entry point: many simulated pods in one process, each on its own port, so tests,
 * the demo and load tests get a "cluster" without GPUs.
 */
import type { PodRole, SchedulingPolicy } from "../../schemas/events.js";
import type { Logger } from "../shared/log.js";
import type { PodFaults } from "./faults.js";
import type { KvEventWire, ReplayLayout } from "./kv-events.js";
import type { EngineKind } from "./metrics.js";
import { resolveFleetOptions, schedulingFor, type SimFleetOptions } from "./options.js";
import { type KvEventsInfo, type SimPod, type SimPodCacheListing, startSimPod } from "./pod.js";
import { loadSimTokenizer } from "./real-tokenizer.js";

export type { KvEventEncoding, ReplayLayout } from "./kv-events.js";
export type { SimFleetOptions, SimPodClass, SimSchedulingPolicy } from "./options.js";
export { SimOptionsError } from "./options.js";
export type { KvEventsInfo, SimPodCacheListing } from "./pod.js";
export type { PodFaults } from "./faults.js";

export interface SimFleetPod {
  name: string;
  /** "host:port", what a pod list or the gateway dials. */
  address: string;
  port: number;
  engine: EngineKind;
  /** The pod event schema's `kvEvents` field; absent when the pod publishes no KV events. */
  kvEvents?: KvEventsInfo;
  kvEventsEncoding?: KvEventWire;
  kvEventsReplayLayout?: ReplayLayout;
  role: PodRole;
  roleset?: string;
  /** SGLang prefill pods: the bootstrap server's port (a static pod list's `bootstrapPort`). */
  bootstrapPort?: number;
  /** The pod's speed class (`podClasses`), what a pod list's `podClass` carries. */
  podClass?: string;
  /** Set when the pod schedules by priority (`schedulingPolicy`), what a pod list's `schedulingPolicy` carries. */
  schedulingPolicy?: SchedulingPolicy;
}

export interface SimFleet {
  pods: SimFleetPod[];
  /** Simulates an engine restart on one pod (see SimPod.restart). */
  restart(pod: string): void;
  /** The pod's current prefix-cache contents, what `GET /debug/cache` returns. */
  cacheListing(pod: string): SimPodCacheListing;
  /** Replaces the pod's injected faults (what `POST /debug/faults` does); `{}` clears them. */
  setFaults(pod: string, faults: PodFaults): void;
  /** Closes the pod's listeners so connections are refused; its engine state stays. */
  stop(pod: string): Promise<void>;
  /** Listens again on the same ports after `stop`. */
  start(pod: string): Promise<void>;
  close(): Promise<void>;
}

export async function startSimFleet(options: SimFleetOptions & { logger?: Logger }): Promise<SimFleet> {
  const o = resolveFleetOptions(options);
  // Loaded once for all pods (before any port is taken): a bad directory fails the start, naming the file.
  const tokenizer = o.tokenizer ? await loadSimTokenizer(o.tokenizer) : undefined;
  const started: SimPod[] = [];
  try {
    for (let i = 0; i < o.pods; i++) {
      const engine = o.engines[i % o.engines.length] ?? "vllm";
      const role = o.roles[i % o.roles.length] ?? "combined";
      const podClass = o.podClasses.length > 0 ? o.podClasses[i % o.podClasses.length] : undefined;
      const scheduling = schedulingFor(engine, o.schedulingPolicies[i % o.schedulingPolicies.length] ?? "fcfs", o.sglangPriority);
      const engineConfig = podClass?.engineConfig ?? o.engineConfig;
      const kv = o.kvEvents;
      // SGLang pods publish only in the SGLang mode (sglangKvEvents): SGLang's own wire, "old" replay layout.
      const wire =
        engine === "vllm"
          ? { encoding: kv?.encodings[i % kv.encodings.length] ?? ("map" as const), replayLayout: kv?.replayLayouts[i % kv.replayLayouts.length] ?? ("new" as const) }
          : o.sglangKvEvents
            ? { encoding: "sglang" as const, replayLayout: "old" as const }
            : undefined;
      started.push(
        await startSimPod({
          name: `${o.namePrefix}${i}`,
          host: o.host,
          port: o.basePort === 0 ? 0 : o.basePort + i,
          model: o.model,
          engine,
          timeScale: o.timeScale,
          maxModelLen: o.maxModelLen,
          engineConfig: scheduling ? { ...engineConfig, scheduling } : engineConfig,
          ...(o.abortOnPriorityWhenDisabled ? { abortOnPriorityWhenDisabled: true } : {}),
          ...(podClass ? { podClass: podClass.name } : {}),
          ...(tokenizer ? { tokenizer } : {}),
          kvEvents: kv && wire
            ? {
                port: kv.basePort === 0 ? 0 : kv.basePort + 2 * i,
                replayPort: kv.basePort === 0 ? 0 : kv.basePort + 2 * i + 1,
                topic: kv.topic,
                ...wire,
                bufferSteps: kv.bufferSteps,
              }
            : undefined,
          role,
          roleset: o.rolesets.length > 0 ? o.rolesets[i % o.rolesets.length] : undefined,
          pd: o.pd,
          bootstrapPort: o.bootstrapBasePort === 0 ? 0 : o.bootstrapBasePort + i,
          ...(o.lora ? { lora: o.lora } : {}),
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
  const byName = (name: string): SimPod => {
    const pod = started.find((p) => p.name === name);
    if (!pod) throw new Error(`no simulated pod named ${name}`);
    return pod;
  };
  return {
    pods: started.map((p) => {
      const kv = p.state().kvEvents;
      return {
        name: p.name,
        address: p.address,
        port: p.port,
        engine: p.engine,
        role: p.role,
        ...(p.roleset !== undefined ? { roleset: p.roleset } : {}),
        ...(p.bootstrapPort !== undefined ? { bootstrapPort: p.bootstrapPort } : {}),
        ...(p.podClass !== undefined ? { podClass: p.podClass } : {}),
        ...(p.schedulingPolicy !== undefined ? { schedulingPolicy: p.schedulingPolicy } : {}),
        ...(p.kvEvents && kv ? { kvEvents: p.kvEvents, kvEventsEncoding: kv.encoding, kvEventsReplayLayout: kv.replayLayout } : {}),
      };
    }),
    restart: (name) => byName(name).restart(),
    cacheListing: (name) => byName(name).cacheListing(),
    setFaults: (name, faults) => byName(name).setFaults(faults),
    stop: (name) => byName(name).stop(),
    start: (name) => byName(name).start(),
    close() {
      closing ??= Promise.all(started.map((p) => p.close())).then(() => undefined);
      return closing;
    },
  };
}
