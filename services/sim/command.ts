/**
 * `jetroute sim`: a fleet of simulated engines. Prints one JSON line per pod on stdout
 * (`{"pod","address","engine","model","role","roleset"?,"bootstrapPort"?,"podClass"?,"schedulingPolicy"?,"kvEvents"?}`) for the demo and scripts to parse; `kvEvents`
 * has the pod event schema's shape, so it can go into a pod list as it is.
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import { floatOption, intOption, untilSignal } from "../shared/cli-options.js";
import { createLogger, type Logger } from "../shared/log.js";
import { type SimFleet, type SimFleetOptions, type SimFleetPod, startSimFleet } from "./fleet.js";
import { KV_EVENT_ENCODINGS, type KvEventEncoding, REPLAY_LAYOUTS, type ReplayLayout } from "./kv-events.js";
import { ENGINE_KINDS, type EngineKind } from "./metrics.js";
import { FLEET_DEFAULTS as D, parsePodClasses, POD_ROLES, SCHEDULING_POLICIES, type SimPodClass, type SimSchedulingPolicy, SimOptionsError } from "./options.js";
import { SGLANG_PREEMPTION_THRESHOLD } from "./engine.js";
import type { PodRole } from "../../schemas/events.js";
import { TokenizerFilesError } from "../tokenizer/hf-tokenizer.js";

function nonNegative(value: string): number {
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < 0) throw new InvalidArgumentError(`expected a number >= 0, got ${JSON.stringify(value)}`);
  return n;
}

/** A comma list of `allowed` values, cycled over the pods. */
function cycledList<T extends string>(allowed: readonly T[]) {
  return (value: string): T[] => {
    const items = value.split(",").map((s) => s.trim()).filter(Boolean);
    const bad = items.filter((k) => !(allowed as readonly string[]).includes(k));
    if (items.length === 0 || bad.length > 0) {
      throw new InvalidArgumentError(`expected ${allowed.join(" or ")} (comma list cycles over pods), got ${JSON.stringify(value)}`);
    }
    return items as T[];
  };
}

const engineList = cycledList<EngineKind>(ENGINE_KINDS);
const encodingList = cycledList<KvEventEncoding>(KV_EVENT_ENCODINGS);
const layoutList = cycledList<ReplayLayout>(REPLAY_LAYOUTS);
const roleList = cycledList<PodRole>(POD_ROLES);
const policyList = cycledList<SimSchedulingPolicy>(SCHEDULING_POLICIES);
function podClassList(value: string): SimPodClass[] {
  try {
    return parsePodClasses(value);
  } catch (err) {
    if (err instanceof SimOptionsError) throw new InvalidArgumentError(err.detail);
    throw err;
  }
}
const nameList = (value: string): string[] => value.split(",").map((s) => s.trim()).filter(Boolean);

export function registerSimCommand(program: Command): void {
  addSimOptions(
    program.command("sim").description("run simulated vLLM/SGLang engines (OpenAI API, /tokenize, /metrics), one port per pod"),
  ).action(runSim);
}

/** sim's flags, in the order its help lists them. */
function addSimOptions(cmd: Command): Command {
  return cmd
    .option("--pods <n>", "number of simulated pods", intOption(1, 1024), 4)
    .option("--base-port <port>", "first pod's port, pod i gets base+i (0 = free ports)", intOption(0, 65535), D.basePort)
    .option("--host <host>", "address to bind", D.host)
    .option("--model <name>", "served model name", "demo/llama-3.1-8b")
    .addOption(
      new Option("--engine <kinds>", "vllm or sglang metric names; a comma list cycles over pods")
        .argParser(engineList)
        .default([D.engine], D.engine),
    )
    .option("--time-scale <x>", "simulated time runs x times faster than wall time", floatOption(0), D.timeScale)
    .option("--max-batch <n>", "running requests per pod (vLLM max_num_seqs)", intOption(1), D.maxBatch)
    .option("--max-num-batched-tokens <n>", "token budget per engine step", intOption(1), D.maxNumBatchedTokens)
    .option("--prefill-ms-per-token <ms>", "prefill cost per uncached prompt token", nonNegative, D.prefillMsPerToken)
    .option("--decode-ms-per-step <ms>", "decode step time for a batch of one", nonNegative, D.decodeMsPerStep)
    .option("--decode-batch-slope <x>", "decode step grows by this fraction per extra request in the batch", nonNegative, D.decodeBatchSlope)
    .option("--kv-capacity-tokens <n>", `KV cache capacity per pod, in tokens (default ${D.kvCapacityTokens})`, intOption(1))
    .option("--kv-cache-blocks <n>", "KV cache capacity per pod, in blocks (instead of --kv-capacity-tokens)", intOption(1))
    .option("--block-size <n>", "KV block size in tokens", intOption(1), D.blockSize)
    .option("--no-kv-events", "do not publish vLLM KV cache events over ZMQ")
    .addOption(
      new Option("--kv-events-encoding <kinds>", "map (vLLM >= 0.26) or array (<= 0.23); a comma list cycles over pods")
        .argParser(encodingList)
        .default([D.kvEventsEncoding], D.kvEventsEncoding),
    )
    .addOption(
      new Option("--kv-events-replay-layout <kinds>", "replay replies as vLLM >= 0.26 (new) or before (old); a comma list cycles over pods")
        .argParser(layoutList)
        .default([D.kvEventsReplayLayout], D.kvEventsReplayLayout),
    )
    .option("--kv-events-topic <topic>", "ZMQ topic of KV event messages", D.kvEventsTopic)
    .option(
      "--kv-events-base-port <port>",
      "pod i publishes on base+2i and serves replay on base+2i+1 (0 = free ports)",
      intOption(0, 65535),
      D.kvEventsBasePort,
    )
    .option("--kv-events-buffer-steps <n>", "KV event batches kept for replay", intOption(1), D.kvEventsBufferSteps)
    .option("--max-model-len <n>", "longest prompt + max_tokens accepted (default min(8192, KV capacity))", intOption(2))
    .option("--name-prefix <prefix>", "pod names are <prefix><index>", D.namePrefix)
    .addOption(
      new Option("--role <roles>", "combined, prefill or decode (P/D disaggregation); a comma list cycles over pods")
        .argParser(roleList)
        .default([D.role], D.role),
    )
    .option("--roleset <names>", "P/D group name(s) reported in the pod line; a comma list cycles over pods", nameList)
    .option("--kv-abort-timeout-ms <n>", "vLLM prefill holds a finished prefill's KV at most this long for its decode", nonNegative, D.kvAbortTimeoutMs)
    .option("--disagg-timeout-ms <n>", "SGLang: decode waits for the bootstrap handoff, prefill for the decode, this long", nonNegative, D.disaggTimeoutMs)
    .option("--bootstrap-base-port <port>", "SGLang prefill pod i serves bootstrap on base+i (0 = free ports)", intOption(0, 65535), D.bootstrapBasePort)
    .option("--kv-read-timeout-ms <n>", "vLLM decode gives up a KV side-channel read after this many wall ms", nonNegative, D.kvReadTimeoutMs)
    .option("--kv-transfer-ms-per-block <ms>", "simulated time to move one KV block from prefill to decode", nonNegative, D.kvTransferMsPerBlock)
    .option(
      "--pod-classes <list>",
      "speed classes cycled over pods: name[:prefill=<ms/token>][:decode=<ms/step>][:kv=<tokens>],... (e.g. fast,slow:prefill=0.625:decode=37.5)",
      podClassList,
    )
    .addOption(
      new Option(
        "--scheduling-policy <policies>",
        "fcfs or priority (vLLM --scheduling-policy; on SGLang pods --enable-priority-scheduling): priority orders each pod's queue by the body's `priority`; a comma list cycles over pods",
      )
        .argParser(policyList)
        .default(["fcfs"], "fcfs"),
    )
    .option("--schedule-low-priority-values-first", "SGLang pods with priority scheduling: lower priority values are more urgent (SGLang's flag)")
    .option(
      "--priority-scheduling-preemption-threshold <n>",
      `SGLang pods: a waiting request preempts running ones only when more urgent by more than n (default ${SGLANG_PREEMPTION_THRESHOLD})`,
      intOption(0),
    )
    .option("--disable-priority-preemption", "SGLang pods with priority scheduling: never preempt a running request for a waiting one")
    .option("--abort-on-priority-when-disabled", "SGLang pods without priority scheduling: answer 503 to a request that carries `priority`")
    .option("--sglang-kv-events", "SGLang pods publish KV events too, in SGLang's wire format (one event per page, CPython tuple hashes, old replay layout)")
    .option("--tokenizer <hf:dir>", "a real model's tokenizer for /tokenize, prompts and KV events: hf:<dir> with tokenizer.json + tokenizer_config.json (default: the built-in one)");
}

/** Commander's values for sim's flags: the fleet options under the same names. */
type SimFlagValues = SimFleetOptions;

async function runSim(o: SimFlagValues, cmd: Command): Promise<void> {
  const log = createLogger("sim");
  let fleet: SimFleet;
  try {
    fleet = await startSimFleet(fleetOptions(o, log));
  } catch (err) {
    const message = startFailureMessage(err, o);
    if (message !== undefined) cmd.error(message);
    throw err;
  }
  for (const p of fleet.pods) process.stdout.write(`${JSON.stringify(podLine(p, o.model))}\n`);
  log.info({ pods: fleet.pods.length, model: o.model, timeScale: o.timeScale }, "sim fleet ready");
  const signal = await untilSignal();
  log.info({ signal }, "sim fleet shutting down");
  await fleet.close();
  process.exit(0);
}

function fleetOptions(o: SimFlagValues, logger: Logger): SimFleetOptions & { logger: Logger } {
  return {
    pods: o.pods,
    basePort: o.basePort,
    host: o.host,
    model: o.model,
    engine: o.engine,
    timeScale: o.timeScale,
    maxBatch: o.maxBatch,
    maxNumBatchedTokens: o.maxNumBatchedTokens,
    prefillMsPerToken: o.prefillMsPerToken,
    decodeMsPerStep: o.decodeMsPerStep,
    decodeBatchSlope: o.decodeBatchSlope,
    kvCapacityTokens: o.kvCapacityTokens,
    kvCacheBlocks: o.kvCacheBlocks,
    blockSize: o.blockSize,
    kvEvents: o.kvEvents,
    kvEventsEncoding: o.kvEventsEncoding,
    kvEventsReplayLayout: o.kvEventsReplayLayout,
    kvEventsTopic: o.kvEventsTopic,
    kvEventsBasePort: o.kvEventsBasePort,
    kvEventsBufferSteps: o.kvEventsBufferSteps,
    maxModelLen: o.maxModelLen,
    namePrefix: o.namePrefix,
    role: o.role,
    roleset: o.roleset,
    kvAbortTimeoutMs: o.kvAbortTimeoutMs,
    disaggTimeoutMs: o.disaggTimeoutMs,
    bootstrapBasePort: o.bootstrapBasePort,
    kvReadTimeoutMs: o.kvReadTimeoutMs,
    kvTransferMsPerBlock: o.kvTransferMsPerBlock,
    ...(o.tokenizer ? { tokenizer: o.tokenizer } : {}),
    ...(o.sglangKvEvents ? { sglangKvEvents: true } : {}),
    ...(o.podClasses ? { podClasses: o.podClasses } : {}),
    schedulingPolicy: o.schedulingPolicy,
    ...(o.scheduleLowPriorityValuesFirst ? { scheduleLowPriorityValuesFirst: true } : {}),
    ...(o.prioritySchedulingPreemptionThreshold !== undefined ? { prioritySchedulingPreemptionThreshold: o.prioritySchedulingPreemptionThreshold } : {}),
    ...(o.disablePriorityPreemption ? { disablePriorityPreemption: true } : {}),
    ...(o.abortOnPriorityWhenDisabled ? { abortOnPriorityWhenDisabled: true } : {}),
    logger,
  };
}

/** The one-line error a failed start gets on the command line; undefined = not a user error, rethrown as is. */
function startFailureMessage(err: unknown, o: SimFlagValues): string | undefined {
  const code = (err as NodeJS.ErrnoException).code;
  if (err instanceof TokenizerFilesError) return `error: --tokenizer ${err.message}`;
  if (err instanceof SimOptionsError) return `error: --${err.option.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)} ${err.detail}`;
  if (code === "EADDRINUSE" || code === "EACCES" || code === "EADDRNOTAVAIL") {
    return `error: cannot listen on ${o.host} (HTTP from port ${o.basePort}, KV events from port ${o.kvEventsBasePort}): ${(err as Error).message}`;
  }
  return undefined;
}

/** The JSON line printed for one pod (its shape is in the file's header). */
function podLine(p: SimFleetPod, model: string): Record<string, unknown> {
  return {
    pod: p.name,
    address: p.address,
    engine: p.engine,
    model,
    role: p.role,
    ...(p.roleset !== undefined ? { roleset: p.roleset } : {}),
    ...(p.bootstrapPort !== undefined ? { bootstrapPort: p.bootstrapPort } : {}),
    ...(p.podClass !== undefined ? { podClass: p.podClass } : {}),
    ...(p.schedulingPolicy !== undefined ? { schedulingPolicy: p.schedulingPolicy } : {}),
    ...(p.kvEvents ? { kvEvents: p.kvEvents } : {}),
  };
}
