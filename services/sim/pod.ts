/**
 * One simulated engine pod: an engine model behind its own HTTP server speaking vLLM's API, and
 * (vLLM pods, when enabled) a KV-events publisher fed by the engine's prefix cache. Prefill-capable
 * pods also serve a KV channel (vLLM side channel or SGLang bootstrap server, see pd-legs.ts).
 */
import { randomUUID } from "node:crypto";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "../shared/log.js";
import type { Static } from "@sinclair/typebox";
import type { KvEventsEndpoint, PodRole, SchedulingPolicy } from "../../schemas/events.js";
import { type SimClock, scaledClock } from "./clock.js";
import { type EngineConfig, type EngineSnapshot, SimEngine } from "./engine.js";
import { FaultState, type PodFaults, parseFaults } from "./faults.js";
import { HeldKvRegistry } from "./held-kv.js";
import { KvChannelServer } from "./kv-channel.js";
import { type CacheListing, engineHashSeed } from "./kv-cache.js";
import { KvEventPublisher, type KvEventPublisherOptions, type KvEventWire, type ReplayLayout } from "./kv-events.js";
import { SimLora } from "./lora.js";
import { createPodMetrics, type EngineKind, type PodMetrics } from "./metrics.js";
import { FLEET_DEFAULTS } from "./options.js";
import { answerKvChannel, channelFault, type PdPod, type PdTimings } from "./pd-legs.js";
import { type PdSnapshot, PdStats } from "./pd-stats.js";
import { closeServer, listen, routeServer } from "./pod-http.js";
import { podRoutes } from "./pod-routes.js";
import type { SimRealTokenizer } from "./real-tokenizer.js";
import type { ServedModel } from "./requests.js";
import { GenerationSessions } from "./sessions.js";
import { SimResponseStore } from "./response-store.js";

export interface SimPodOptions {
  name: string;
  host: string;
  /** 0 picks a free port. */
  port: number;
  model: string;
  engine: EngineKind;
  timeScale: number;
  maxModelLen: number;
  engineConfig: EngineConfig;
  /** A real model's tokenizer (sim --tokenizer hf:<dir>) instead of the built-in one. */
  tokenizer?: SimRealTokenizer;
  /** KV events publisher settings; absent = no publisher. */
  kvEvents?: SimPodKvEventsOptions;
  /** Prefill/decode role (default combined). */
  role?: PodRole;
  /** The P/D group the pod belongs to; only reported. */
  roleset?: string;
  /** The pod's speed class (fleet `podClasses`); only reported. */
  podClass?: string;
  /** P/D timeouts and transfer cost; defaults in DEFAULT_PD_TIMINGS. */
  pd?: Partial<PdTimings>;
  /** SGLang prefill pods: the bootstrap server's port (0 = free port). */
  bootstrapPort?: number;
  /** SGLang pods without priority scheduling: a request carrying `priority` is aborted with a 503. */
  abortOnPriorityWhenDisabled?: boolean;
  /** LoRA: adapters loaded at start and `--max-loras` (services/sim/lora.ts). */
  lora?: { initial?: readonly string[]; maxLoras?: number; loadMs?: number };
  logger?: Logger;
}

export const DEFAULT_PD_TIMINGS: PdTimings = {
  kvAbortTimeoutMs: FLEET_DEFAULTS.kvAbortTimeoutMs,
  disaggTimeoutMs: FLEET_DEFAULTS.disaggTimeoutMs,
  kvReadTimeoutMs: FLEET_DEFAULTS.kvReadTimeoutMs,
  kvTransferMsPerBlock: FLEET_DEFAULTS.kvTransferMsPerBlock,
};

/** The KV-events publisher's options; the pod supplies the host and the logger. */
export type SimPodKvEventsOptions = Omit<KvEventPublisherOptions, "host" | "logger">;

/** The pod event schema's `kvEvents` field, so a pod list can carry it unchanged. */
export type KvEventsInfo = Static<typeof KvEventsEndpoint>;

export interface SimPodCacheListing extends CacheListing {
  pod: string;
  /** Sequence number of the next KV event batch; null without a publisher. */
  nextSeq: number | null;
}

export interface SimPodState extends EngineSnapshot {
  pod: string;
  engine: EngineKind;
  role: PodRole;
  roleset?: string;
  podClass?: string;
  bootstrapPort?: number;
  schedulingPolicy?: SchedulingPolicy;
  /** vLLM prefill-capable pods: the KV side channel's address. */
  sideChannel?: { host: string; port: number };
  pd: PdSnapshot;
  faults: PodFaults;
  /** Completion requests held by a `hang` fault right now. */
  hungRequests: number;
  /** The Responses API store: responses kept, their bytes (JSON text), responses evicted by the bounds. */
  responseStore: { size: number; bytes: number; evicted: number };
  model: string;
  config: EngineConfig & { maxModelLen: number; timeScale: number };
  kvEvents: (KvEventsInfo & { encoding: KvEventWire; replayLayout: ReplayLayout; nextSeq: number }) | null;
}

export interface SimPod {
  readonly name: string;
  readonly engine: EngineKind;
  readonly port: number;
  readonly address: string;
  readonly kvEvents: KvEventsInfo | undefined;
  readonly role: PodRole;
  readonly roleset: string | undefined;
  readonly podClass: string | undefined;
  /** SGLang prefill pods only. */
  readonly bootstrapPort: number | undefined;
  /** The pod event's `schedulingPolicy`: set when the engine schedules by priority. */
  readonly schedulingPolicy: SchedulingPolicy | undefined;
  state(): SimPodState;
  /** Replaces the pod's injected faults; `{}` clears them. */
  setFaults(faults: PodFaults): void;
  /** Closes the pod's listeners (HTTP, side channel, bootstrap) and drops its connections: clients get connection refused. */
  stop(): Promise<void>;
  /** Listens again on the same ports after `stop()`. */
  start(): Promise<void>;
  cacheListing(): SimPodCacheListing;
  /** vLLM's reset_prefix_cache (AllBlocksCleared); false while requests hold blocks. */
  resetPrefixCache(): boolean;
  /**
   * A simulated engine restart: in-flight requests are dropped, the prefix cache, counters and
   * histograms start empty and KV event batches are numbered from 0 again. Nothing is announced:
   * subscribers must notice the sequence going backwards.
   */
  restart(): void;
  close(): Promise<void>;
}

/** What a simulated restart replaces: the engine, its clock, and everything counted or held for it. */
interface EngineRun {
  clock: SimClock;
  held: HeldKvRegistry;
  pdStats: PdStats;
  /** Identifies this incarnation of the engine (vLLM's engine id). */
  engineId: string;
  metrics: PodMetrics;
  engine: SimEngine;
}

function bootEngine(opts: SimPodOptions, hashSeed: bigint, publisher: KvEventPublisher | undefined): EngineRun {
  const clock = scaledClock(opts.timeScale);
  const held = new HeldKvRegistry(clock);
  const pdStats = new PdStats();
  const engineId = `${opts.name}-${randomUUID()}`;
  const metrics = createPodMetrics(opts.engine, {
    model: opts.model,
    maxModelLen: opts.maxModelLen,
    blockSize: opts.engineConfig.blockSize,
    numGpuBlocks: Math.floor(opts.engineConfig.kvCapacityTokens / opts.engineConfig.blockSize),
    prefixCaching: true,
  });
  const engine = new SimEngine(opts.engineConfig, clock, metrics.observer, {
    hashSeed,
    onEvents: publisher ? (events) => publisher.publish(events) : undefined,
  });
  return { clock, held, pdStats, engineId, metrics, engine };
}

/** What the pod event says of an engine's scheduling: nothing under FCFS. */
export function schedulingPolicyOf(config: EngineConfig): SchedulingPolicy | undefined {
  const s = config.scheduling;
  if (!s) return undefined;
  return s.flavour === "sglang" && s.lowValuesFirst ? "priority-low-values-first" : "priority";
}

/** Where the pod's KV events are published and replayed, as the pod event schema gives it. */
function kvEventsInfo(publisher: KvEventPublisher): KvEventsInfo {
  return { endpoint: publisher.endpoint, replayEndpoint: publisher.replayEndpoint, topic: publisher.topicName };
}

/** The P/D legs' view of the pod; the engine-bound parts read whichever run is current. */
function pdPodFor(opts: SimPodOptions, role: PodRole, faults: FaultState, current: () => EngineRun): PdPod {
  return {
    engine: opts.engine,
    role,
    engineId: () => current().engineId,
    clock: () => current().clock,
    held: () => current().held,
    stats: () => current().pdStats,
    faults,
    timings: { ...DEFAULT_PD_TIMINGS, ...opts.pd },
    sideChannel: undefined,
  };
}

/** vLLM prefill-capable pods serve a KV side channel, SGLang prefill pods a bootstrap server. */
function servesKvChannel(engine: EngineKind, role: PodRole): boolean {
  return engine === "vllm" ? role !== "decode" : role === "prefill";
}

function kvChannelFor(opts: SimPodOptions, pd: PdPod, log: Logger | undefined): KvChannelServer | undefined {
  if (!servesKvChannel(opts.engine, pd.role)) return undefined;
  return new KvChannelServer({
    host: opts.host,
    port: opts.engine === "sglang" ? (opts.bootstrapPort ?? 0) : 0,
    handle: (request, signal) => answerKvChannel(pd, request, signal),
    fault: () => channelFault(pd),
    logger: log,
  });
}

/** The pod's listeners (HTTP and KV channel): `stop()` closes them, `start()` listens again on the same ports. */
function podListeners(server: Server, host: string, port: number, channel: KvChannelServer | undefined) {
  let stopped = false;
  return {
    async stop(): Promise<void> {
      if (stopped) return;
      stopped = true;
      await Promise.all([closeServer(server), channel?.stop()]);
    },
    async start(): Promise<void> {
      if (!stopped) return;
      await Promise.all([listen(server, port, host), channel?.start()]);
      stopped = false;
    },
    /** Closes whatever is still open, for good. */
    close(): Promise<unknown> {
      return Promise.all([stopped ? undefined : closeServer(server), channel?.stop()]);
    },
  };
}

export async function startSimPod(opts: SimPodOptions): Promise<SimPod> {
  const real = opts.tokenizer;
  const served: ServedModel = { name: opts.model, maxModelLen: opts.maxModelLen, ...(real ? { vocabSize: real.tokenizer.vocabSize } : {}) };
  const lora = new SimLora({ base: opts.model, ...opts.lora });
  const log = opts.logger?.child({ pod: opts.name });
  const publisher = opts.kvEvents
    ? await KvEventPublisher.start({ host: opts.host, ...opts.kvEvents, logger: log })
    : undefined;
  const kvEvents: KvEventsInfo | undefined = publisher && kvEventsInfo(publisher);
  const hashSeed = engineHashSeed(opts.name);

  const role: PodRole = opts.role ?? "combined";
  const faults = new FaultState();
  // Advertised addresses use loopback for a wildcard bind, as the HTTP address does.
  const advertisedHost = opts.host === "0.0.0.0" || opts.host === "::" ? "127.0.0.1" : opts.host;

  // A restart swaps the run for a fresh one; handlers always read the current one.
  let run = bootEngine(opts, hashSeed, publisher);

  const pd = pdPodFor(opts, role, faults, () => run);
  const channel = kvChannelFor(opts, pd, log);
  try {
    await channel?.start();
  } catch (err) {
    await publisher?.close();
    throw err;
  }
  if (channel && opts.engine === "vllm") pd.sideChannel = { host: advertisedHost, port: channel.port };
  const bootstrapPort = channel && opts.engine === "sglang" ? channel.port : undefined;

  const sessions = new GenerationSessions();
  const responses = new SimResponseStore();
  const schedulingPolicy = schedulingPolicyOf(opts.engineConfig);
  const state = (): SimPodState => ({
    pod: opts.name,
    engine: opts.engine,
    role,
    ...(schedulingPolicy ? { schedulingPolicy } : {}),
    ...(opts.roleset !== undefined ? { roleset: opts.roleset } : {}),
    ...(opts.podClass !== undefined ? { podClass: opts.podClass } : {}),
    ...(bootstrapPort !== undefined ? { bootstrapPort } : {}),
    ...(pd.sideChannel ? { sideChannel: pd.sideChannel } : {}),
    pd: run.pdStats.snapshot(run.engine.snapshot().heldRequests),
    faults: faults.current,
    hungRequests: faults.hungRequests,
    responseStore: { size: responses.size, bytes: responses.bytes, evicted: responses.evicted },
    model: opts.model,
    ...run.engine.snapshot(),
    config: { ...opts.engineConfig, maxModelLen: opts.maxModelLen, timeScale: opts.timeScale },
    kvEvents:
      publisher && kvEvents
        ? { ...kvEvents, encoding: publisher.encoding, replayLayout: publisher.replayLayout, nextSeq: publisher.sequence }
        : null,
  });
  const cacheListing = (): SimPodCacheListing => ({
    pod: opts.name,
    nextSeq: publisher ? publisher.sequence : null,
    ...run.engine.cacheListing(),
  });
  const restart = (): void => {
    const old = run;
    run = bootEngine(opts, hashSeed, publisher);
    // Requests outside the engine (a decode waiting for its KV, a prefill waiting for its decode)
    // lose their connection too; then the old engine drops what it still runs or holds.
    sessions.dropAll();
    responses.clear();
    old.held.clear();
    old.engine.abortAll();
    publisher?.reset();
    // A restarted vLLM holds only the adapters of its command line (`--lora-modules`).
    lora.reset();
    log?.info("simulated engine restarted");
  };

  const { name, model, engine, maxModelLen } = opts;
  // SGLang's --abort-on-priority-when-disabled: only a server without priority scheduling refuses the field.
  const refusesPriority = engine === "sglang" && !opts.engineConfig.scheduling && opts.abortOnPriorityWhenDisabled === true;
  const routes = podRoutes({ name, model, engine, maxModelLen, served, real, lora, faults, pd, sessions, responses, refusesPriority, current: () => run, state, cacheListing, restart });
  const server = routeServer(routes, log);
  try {
    await listen(server, opts.port, opts.host);
  } catch (err) {
    await Promise.all([publisher?.close(), channel?.stop()]);
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  // A wildcard bind is reachable on loopback; advertising the wildcard itself would be useless to clients.
  const address = `${advertisedHost}:${port}`;
  const listeners = podListeners(server, opts.host, port, channel);
  log?.info({ address, engine: opts.engine, model: opts.model, role, kvEvents, bootstrapPort, sideChannel: pd.sideChannel }, "simulated pod listening");

  return {
    name: opts.name,
    engine: opts.engine,
    port,
    address,
    kvEvents,
    role,
    roleset: opts.roleset,
    podClass: opts.podClass,
    bootstrapPort,
    schedulingPolicy,
    state,
    setFaults: (f) => faults.set(parseFaults(f)),
    stop: listeners.stop,
    start: listeners.start,
    cacheListing,
    resetPrefixCache: () => run.engine.resetPrefixCache(),
    restart,
    async close() {
      run.engine.close();
      run.held.clear();
      faults.set({});
      await Promise.all([listeners.close(), publisher?.close()]);
    },
  };
}
