/** Fleet options, their defaults and validation, shared by the programmatic API and the CLI. */
import type { PodRole } from "../../schemas/events.js";
import { type EngineConfig, type PriorityScheduling, SGLANG_PREEMPTION_THRESHOLD } from "./engine.js";
import { KV_EVENT_ENCODINGS, type KvEventEncoding, REPLAY_LAYOUTS, type ReplayLayout } from "./kv-events.js";
import { ENGINE_KINDS, type EngineKind } from "./metrics.js";
import type { PdTimings } from "./pd-legs.js";

export const POD_ROLES: readonly PodRole[] = ["combined", "prefill", "decode"];

/** A pod's scheduling policy, as vLLM's `--scheduling-policy` names it (on SGLang pods `priority` = `--enable-priority-scheduling`). */
export type SimSchedulingPolicy = "fcfs" | "priority";
export const SCHEDULING_POLICIES: readonly SimSchedulingPolicy[] = ["fcfs", "priority"];

export interface SimFleetOptions {
  pods: number;
  /** LoRA: vLLM's `--max-loras` (default 4) and how long a runtime load takes (default 0 ms, real time). */
  lora?: { maxLoras?: number; loadMs?: number };
  /** First pod's port; pod i listens on basePort + i. 0 (default) gives every pod a free port. */
  basePort?: number;
  host?: string;
  model: string;
  /** One kind for all pods, or a list cycled over the pods (["vllm","sglang"] alternates). */
  engine?: EngineKind | readonly EngineKind[];
  /** Simulated time runs this many times faster than wall time. */
  timeScale?: number;
  maxBatch?: number;
  /** Per-step token budget shared by decodes and prefill chunks (vLLM max_num_batched_tokens). */
  maxNumBatchedTokens?: number;
  prefillMsPerToken?: number;
  decodeMsPerStep?: number;
  /** Relative decode slowdown per extra request in the batch. */
  decodeBatchSlope?: number;
  kvCapacityTokens?: number;
  /** KV cache capacity in blocks (vLLM num_gpu_blocks); when set, kvCapacityTokens = kvCacheBlocks × blockSize. */
  kvCacheBlocks?: number;
  blockSize?: number;
  /** Longest prompt + max_tokens accepted; defaults to min(8192, kvCapacityTokens). */
  maxModelLen?: number;
  namePrefix?: string;
  /** vLLM pods publish KV cache events over ZMQ (default true). SGLang pods never do. */
  kvEvents?: boolean;
  /** Event encoding, one for all pods or a list cycled over the pods. Default "map" (vLLM >= 0.26). */
  kvEventsEncoding?: KvEventEncoding | readonly KvEventEncoding[];
  /** Replay reply layout, one for all pods or a list cycled over the pods. Default "new" (vLLM >= 0.26). */
  kvEventsReplayLayout?: ReplayLayout | readonly ReplayLayout[];
  kvEventsTopic?: string;
  /** Pod i publishes on basePort + 2i and replays on basePort + 2i + 1; 0 (default) = free ports. */
  kvEventsBasePort?: number;
  /** Batches kept for replay (vLLM buffer_steps). */
  kvEventsBufferSteps?: number;
  /** Prefill/decode role, one for all pods or a list cycled over the pods. Default "combined". */
  role?: PodRole | readonly PodRole[];
  /** P/D group name(s), cycled over the pods like `role`; only reported (pod line, /debug/state). */
  roleset?: string | readonly string[];
  /** vLLM prefill: longest hold of a finished prefill's blocks for its decode (VLLM_NIXL_ABORT_REQUEST_TIMEOUT), simulated ms. */
  kvAbortTimeoutMs?: number;
  /** SGLang: how long a decode waits for its room's KV and a prefill for its decode, simulated ms. */
  disaggTimeoutMs?: number;
  /** SGLang prefill pod i serves its bootstrap server on bootstrapBasePort + i; 0 (default) = free ports. */
  bootstrapBasePort?: number;
  /** vLLM decode: a KV side-channel read gives up after this many wall ms. */
  kvReadTimeoutMs?: number;
  /** Simulated ms to transfer one KV block from prefill to decode. */
  kvTransferMsPerBlock?: number;
  /** SGLang pods publish KV events too, in SGLang's wire format (default false: they publish none). */
  sglangKvEvents?: boolean;
  /** `hf:<dir>`: a real model's Hugging Face tokenizer instead of the built-in one (services/sim/real-tokenizer.ts). */
  tokenizer?: string;
  /**
   * Per-pod speed classes ("GPU types"), cycled over the pods like `engine`: each names its class
   * (reported as the pod's `podClass`) and overrides the fleet's prefill cost, decode step and KV
   * capacity. Absent: every pod runs the fleet's engine settings and has no class.
   */
  podClasses?: readonly SimPodClass[];
  /**
   * `fcfs` (default) or `priority`, one for all pods or a list cycled over the pods like `engine`.
   * vLLM pods then order their queue by the body's `priority` (lower first) and pick KV victims
   * as vLLM does; SGLang pods as `--enable-priority-scheduling` (docs/engine-priority.md).
   */
  schedulingPolicy?: SimSchedulingPolicy | readonly SimSchedulingPolicy[];
  /** SGLang pods with priority scheduling: `--schedule-low-priority-values-first`. */
  scheduleLowPriorityValuesFirst?: boolean;
  /** SGLang pods: `--priority-scheduling-preemption-threshold` (default 10). */
  prioritySchedulingPreemptionThreshold?: number;
  /** SGLang pods: `--disable-priority-preemption`. */
  disablePriorityPreemption?: boolean;
  /** SGLang pods without priority scheduling: `--abort-on-priority-when-disabled` (a request carrying `priority` gets a 503). */
  abortOnPriorityWhenDisabled?: boolean;
}

/** One simulated "GPU type": a class name and the engine speeds that differ from the fleet's. */
export interface SimPodClass {
  /** 1-63 letters, digits, '.', '_' or '-' (the PODS `podClass` bound). */
  name: string;
  prefillMsPerToken?: number;
  decodeMsPerStep?: number;
  kvCapacityTokens?: number;
}

/** A pod class name as PODS carries it (schemas/events.ts `PodClass`). */
export const POD_CLASS_PATTERN = /^[A-Za-z0-9._-]{1,63}$/;

export interface ResolvedKvEventsOptions {
  encodings: KvEventEncoding[];
  replayLayouts: ReplayLayout[];
  topic: string;
  basePort: number;
  bufferSteps: number;
}

export interface ResolvedFleetOptions {
  pods: number;
  lora?: { maxLoras?: number; loadMs?: number };
  basePort: number;
  host: string;
  model: string;
  engines: EngineKind[];
  timeScale: number;
  maxModelLen: number;
  namePrefix: string;
  engineConfig: EngineConfig;
  /** Undefined when KV events are off. */
  kvEvents: ResolvedKvEventsOptions | undefined;
  roles: PodRole[];
  /** Empty when no roleset is given. */
  rolesets: string[];
  pd: PdTimings;
  bootstrapBasePort: number;
  /** `hf:<dir>`, or undefined for the built-in tokenizer. */
  tokenizer: string | undefined;
  sglangKvEvents: boolean;
  /** Per class (cycled over pods): its name and its engine settings; empty = no classes. */
  podClasses: Array<{ name: string; engineConfig: EngineConfig }>;
  /** Cycled over pods. */
  schedulingPolicies: SimSchedulingPolicy[];
  /** What `priority` means on an SGLang pod (flavour, sign, preemption). */
  sglangPriority: Extract<PriorityScheduling, { flavour: "sglang" }>;
  abortOnPriorityWhenDisabled: boolean;
}

/** The engine's priority scheduling for a pod of this kind and policy; undefined = FCFS. */
export function schedulingFor(engine: EngineKind, policy: SimSchedulingPolicy, sglang: ResolvedFleetOptions["sglangPriority"]): PriorityScheduling | undefined {
  if (policy !== "priority") return undefined;
  return engine === "vllm" ? { flavour: "vllm" } : sglang;
}

export const FLEET_DEFAULTS = {
  basePort: 0,
  host: "127.0.0.1",
  engine: "vllm" as EngineKind,
  timeScale: 1,
  maxBatch: 8,
  maxNumBatchedTokens: 2048,
  // Roughly an 8B model on one modern GPU: ~4k prefill tokens/s, ~65 decode steps/s.
  prefillMsPerToken: 0.25,
  decodeMsPerStep: 15,
  decodeBatchSlope: 0.05,
  kvCapacityTokens: 65_536,
  blockSize: 16,
  maxModelLen: 8192,
  namePrefix: "sim-",
  kvEvents: true,
  kvEventsEncoding: "map" as KvEventEncoding,
  kvEventsReplayLayout: "new" as ReplayLayout,
  kvEventsTopic: "kv-events",
  kvEventsBasePort: 0,
  kvEventsBufferSteps: 10_000,
  role: "combined" as PodRole,
  kvAbortTimeoutMs: 480_000,
  disaggTimeoutMs: 300_000,
  bootstrapBasePort: 0,
  kvReadTimeoutMs: 2_000,
  // ~128 KiB of KV per token (8B model, bf16) over a ~25 GB/s link: ~0.08 ms per 16-token block.
  kvTransferMsPerBlock: 0.08,
} as const;

/** `option` is the SimFleetOptions key, so the CLI can name the matching flag. */
export class SimOptionsError extends Error {
  constructor(
    readonly option: keyof SimFleetOptions,
    readonly detail: string,
  ) {
    super(`${option} ${detail}`);
  }
}

function check(ok: boolean, option: keyof SimFleetOptions, message: string): void {
  if (!ok) throw new SimOptionsError(option, message);
}

const isInt = (v: number, min: number): boolean => Number.isInteger(v) && v >= min;
const isNum = (v: number, min: number): boolean => Number.isFinite(v) && v >= min;

const cycleList = <T extends string>(v: T | readonly T[] | undefined, fallback: T): T[] =>
  typeof v === "string" ? [v] : [...(v ?? [fallback])];

export function resolveFleetOptions(o: SimFleetOptions): ResolvedFleetOptions {
  const d = FLEET_DEFAULTS;
  const blockSize = o.blockSize ?? d.blockSize;
  if (o.kvCacheBlocks !== undefined) {
    check(isInt(o.kvCacheBlocks, 1), "kvCacheBlocks", `must be an integer >= 1, got ${o.kvCacheBlocks}`);
    check(o.kvCapacityTokens === undefined, "kvCacheBlocks", "and kvCapacityTokens are two ways to set one capacity: give one");
  }
  const engineConfig: EngineConfig = {
    maxBatch: o.maxBatch ?? d.maxBatch,
    maxNumBatchedTokens: o.maxNumBatchedTokens ?? d.maxNumBatchedTokens,
    prefillMsPerToken: o.prefillMsPerToken ?? d.prefillMsPerToken,
    decodeMsPerStep: o.decodeMsPerStep ?? d.decodeMsPerStep,
    decodeBatchSlope: o.decodeBatchSlope ?? d.decodeBatchSlope,
    kvCapacityTokens: o.kvCacheBlocks !== undefined ? o.kvCacheBlocks * blockSize : (o.kvCapacityTokens ?? d.kvCapacityTokens),
    blockSize,
  };
  const basePort = o.basePort ?? d.basePort;
  const timeScale = o.timeScale ?? d.timeScale;
  const engines = typeof o.engine === "string" ? [o.engine] : [...(o.engine ?? [d.engine])];
  const c = engineConfig;

  check(isInt(o.pods, 1), "pods", `must be an integer >= 1, got ${o.pods}`);
  check(typeof o.model === "string" && o.model.length > 0, "model", "must be a non-empty string");
  check(isInt(basePort, 0) && basePort + o.pods - 1 <= 65535, "basePort", `must leave room for ${o.pods} ports below 65536, got ${basePort}`);
  check(engines.length > 0 && engines.every((e) => ENGINE_KINDS.includes(e)), "engine", `must be one of ${ENGINE_KINDS.join(", ")}, got ${engines.join(",")}`);
  check(isNum(timeScale, 0) && timeScale > 0, "timeScale", `must be > 0, got ${timeScale}`);
  check(o.tokenizer === undefined || (o.tokenizer.startsWith("hf:") && o.tokenizer.length > 3), "tokenizer", `must be hf:<dir>, got ${JSON.stringify(o.tokenizer)}`);
  check(isInt(c.maxBatch, 1), "maxBatch", `must be an integer >= 1, got ${c.maxBatch}`);
  check(isInt(c.blockSize, 1), "blockSize", `must be an integer >= 1, got ${c.blockSize}`);
  check(isNum(c.prefillMsPerToken, 0), "prefillMsPerToken", `must be >= 0, got ${c.prefillMsPerToken}`);
  check(isNum(c.decodeMsPerStep, 0), "decodeMsPerStep", `must be >= 0, got ${c.decodeMsPerStep}`);
  check(isNum(c.decodeBatchSlope, 0), "decodeBatchSlope", `must be >= 0, got ${c.decodeBatchSlope}`);
  check(isInt(c.kvCapacityTokens, c.blockSize), "kvCapacityTokens", `must be an integer >= blockSize (${c.blockSize}), got ${c.kvCapacityTokens}`);
  // Every running request must be able to schedule its one decode token in the same step.
  check(isInt(c.maxNumBatchedTokens, c.maxBatch), "maxNumBatchedTokens", `must be an integer >= maxBatch (${c.maxBatch}), got ${c.maxNumBatchedTokens}`);
  const podClasses = resolvePodClasses(o.podClasses, c);
  const capacity = Math.min(...[c, ...podClasses.map((k) => k.engineConfig)].map((e) => Math.floor(e.kvCapacityTokens / e.blockSize) * e.blockSize));
  const maxModelLen = o.maxModelLen ?? Math.min(d.maxModelLen, capacity);
  // As in vLLM, a context that cannot fit in the KV cache on its own is a startup error.
  check(isInt(maxModelLen, 2) && maxModelLen <= capacity, "maxModelLen", `must be an integer in [2, ${capacity}] (the KV capacity), got ${maxModelLen}`);

  let kvEvents: ResolvedKvEventsOptions | undefined;
  if (o.kvEvents ?? d.kvEvents) {
    const encodings = cycleList(o.kvEventsEncoding, d.kvEventsEncoding);
    const replayLayouts = cycleList(o.kvEventsReplayLayout, d.kvEventsReplayLayout);
    const kvBase = o.kvEventsBasePort ?? d.kvEventsBasePort;
    const bufferSteps = o.kvEventsBufferSteps ?? d.kvEventsBufferSteps;
    check(
      encodings.length > 0 && encodings.every((e) => KV_EVENT_ENCODINGS.includes(e)),
      "kvEventsEncoding",
      `must be one of ${KV_EVENT_ENCODINGS.join(", ")}, got ${encodings.join(",")}`,
    );
    check(
      replayLayouts.length > 0 && replayLayouts.every((l) => REPLAY_LAYOUTS.includes(l)),
      "kvEventsReplayLayout",
      `must be one of ${REPLAY_LAYOUTS.join(", ")}, got ${replayLayouts.join(",")}`,
    );
    check(
      isInt(kvBase, 0) && kvBase + 2 * o.pods - 1 <= 65535,
      "kvEventsBasePort",
      `must leave room for ${2 * o.pods} ports below 65536, got ${kvBase}`,
    );
    check(isInt(bufferSteps, 1), "kvEventsBufferSteps", `must be an integer >= 1, got ${bufferSteps}`);
    kvEvents = { encodings, replayLayouts, topic: o.kvEventsTopic ?? d.kvEventsTopic, basePort: kvBase, bufferSteps };
  }

  const roles = cycleList(o.role, d.role);
  check(roles.length > 0 && roles.every((r) => POD_ROLES.includes(r)), "role", `must be one of ${POD_ROLES.join(", ")}, got ${roles.join(",")}`);
  const rolesets = o.roleset === undefined ? [] : cycleList(o.roleset, "");
  check(
    rolesets.every((r) => typeof r === "string" && /^[A-Za-z0-9._-]{1,63}$/.test(r)),
    "roleset",
    `must be names of 1-63 letters, digits, '.', '_' or '-', got ${rolesets.join(",")}`,
  );
  const pd: PdTimings = {
    kvAbortTimeoutMs: o.kvAbortTimeoutMs ?? d.kvAbortTimeoutMs,
    disaggTimeoutMs: o.disaggTimeoutMs ?? d.disaggTimeoutMs,
    kvReadTimeoutMs: o.kvReadTimeoutMs ?? d.kvReadTimeoutMs,
    kvTransferMsPerBlock: o.kvTransferMsPerBlock ?? d.kvTransferMsPerBlock,
  };
  check(isNum(pd.kvAbortTimeoutMs, 0), "kvAbortTimeoutMs", `must be >= 0, got ${pd.kvAbortTimeoutMs}`);
  check(isNum(pd.disaggTimeoutMs, 0), "disaggTimeoutMs", `must be >= 0, got ${pd.disaggTimeoutMs}`);
  check(isNum(pd.kvReadTimeoutMs, 0), "kvReadTimeoutMs", `must be >= 0, got ${pd.kvReadTimeoutMs}`);
  check(isNum(pd.kvTransferMsPerBlock, 0), "kvTransferMsPerBlock", `must be >= 0, got ${pd.kvTransferMsPerBlock}`);
  const schedulingPolicies = cycleList(o.schedulingPolicy, "fcfs");
  check(
    schedulingPolicies.length > 0 && schedulingPolicies.every((p) => SCHEDULING_POLICIES.includes(p)),
    "schedulingPolicy",
    `must be one of ${SCHEDULING_POLICIES.join(", ")}, got ${schedulingPolicies.join(",")}`,
  );
  const threshold = o.prioritySchedulingPreemptionThreshold ?? SGLANG_PREEMPTION_THRESHOLD;
  check(Number.isSafeInteger(threshold) && threshold >= 0, "prioritySchedulingPreemptionThreshold", `must be an integer >= 0, got ${threshold}`);
  const bootstrapBasePort = o.bootstrapBasePort ?? d.bootstrapBasePort;
  check(
    isInt(bootstrapBasePort, 0) && bootstrapBasePort + o.pods - 1 <= 65535,
    "bootstrapBasePort",
    `must leave room for ${o.pods} ports below 65536, got ${bootstrapBasePort}`,
  );

  if (o.lora?.maxLoras !== undefined) check(isInt(o.lora.maxLoras, 1), "lora", `maxLoras must be an integer >= 1, got ${o.lora.maxLoras}`);
  if (o.lora?.loadMs !== undefined) check(isInt(o.lora.loadMs, 0), "lora", `loadMs must be an integer >= 0, got ${o.lora.loadMs}`);
  return {
    pods: o.pods,
    ...(o.lora ? { lora: o.lora } : {}),
    basePort,
    host: o.host ?? d.host,
    model: o.model,
    engines,
    timeScale,
    maxModelLen,
    namePrefix: o.namePrefix ?? d.namePrefix,
    engineConfig,
    kvEvents,
    roles,
    rolesets,
    pd,
    bootstrapBasePort,
    tokenizer: o.tokenizer,
    sglangKvEvents: o.sglangKvEvents ?? false,
    podClasses,
    schedulingPolicies,
    sglangPriority: {
      flavour: "sglang",
      lowValuesFirst: o.scheduleLowPriorityValuesFirst ?? false,
      preemption: !(o.disablePriorityPreemption ?? false),
      preemptionThreshold: threshold,
    },
    abortOnPriorityWhenDisabled: o.abortOnPriorityWhenDisabled ?? false,
  };
}

function resolvePodClasses(classes: readonly SimPodClass[] | undefined, base: EngineConfig): ResolvedFleetOptions["podClasses"] {
  return (classes ?? []).map((k) => {
    check(typeof k.name === "string" && POD_CLASS_PATTERN.test(k.name), "podClasses", `names must be 1-63 letters, digits, '.', '_' or '-', got ${JSON.stringify(k.name)}`);
    const e: EngineConfig = {
      ...base,
      prefillMsPerToken: k.prefillMsPerToken ?? base.prefillMsPerToken,
      decodeMsPerStep: k.decodeMsPerStep ?? base.decodeMsPerStep,
      kvCapacityTokens: k.kvCapacityTokens ?? base.kvCapacityTokens,
    };
    check(isNum(e.prefillMsPerToken, 0) && isNum(e.decodeMsPerStep, 0), "podClasses", `${k.name}: speeds must be numbers >= 0`);
    check(isInt(e.kvCapacityTokens, e.blockSize), "podClasses", `${k.name}: kvCapacityTokens must be an integer >= blockSize (${e.blockSize}), got ${e.kvCapacityTokens}`);
    return { name: k.name, engineConfig: e };
  });
}

/**
 * `--pod-classes`: `name[:prefill=<ms/token>][:decode=<ms/step>][:kv=<tokens>],...`, e.g.
 * `fast,slow:prefill=0.625:decode=37.5` (a missing setting is the fleet's).
 */
export function parsePodClasses(value: string): SimPodClass[] {
  const keys: Record<string, keyof Omit<SimPodClass, "name">> = { prefill: "prefillMsPerToken", decode: "decodeMsPerStep", kv: "kvCapacityTokens" };
  return value.split(",").map((item) => {
    const [name = "", ...settings] = item.trim().split(":");
    const k: SimPodClass = { name };
    for (const kv of settings) {
      const [key = "", v = ""] = kv.split("=");
      const field = Object.hasOwn(keys, key) ? keys[key] : undefined;
      const n = Number(v);
      if (!field || v.trim() === "" || !Number.isFinite(n)) throw new SimOptionsError("podClasses", `entry ${JSON.stringify(item.slice(0, 60))}: expected name[:prefill=ms][:decode=ms][:kv=tokens]`);
      (k as unknown as Record<string, number>)[field] = n;
    }
    return k;
  });
}
