/**
 * `jetroute sim`: a fleet of simulated engines. Prints one JSON line per pod on stdout
 * (`{"pod","address","engine","model"}`) for the demo and scripts to parse.
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import { floatOption, intOption, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { startSimFleet } from "./fleet.js";
import { ENGINE_KINDS, type EngineKind } from "./metrics.js";
import { FLEET_DEFAULTS as D, SimOptionsError } from "./options.js";

function nonNegative(value: string): number {
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < 0) throw new InvalidArgumentError(`expected a number >= 0, got ${JSON.stringify(value)}`);
  return n;
}

function engineList(value: string): EngineKind[] {
  const kinds = value.split(",").map((s) => s.trim()).filter(Boolean);
  const bad = kinds.filter((k) => !(ENGINE_KINDS as readonly string[]).includes(k));
  if (kinds.length === 0 || bad.length > 0) {
    throw new InvalidArgumentError(`expected ${ENGINE_KINDS.join(" or ")} (comma list cycles over pods), got ${JSON.stringify(value)}`);
  }
  return kinds as EngineKind[];
}

export function registerSimCommand(program: Command): void {
  program
    .command("sim")
    .description("run simulated vLLM/SGLang engines (OpenAI API, /tokenize, /metrics), one port per pod")
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
    .option("--kv-capacity-tokens <n>", "KV cache capacity per pod, in tokens", intOption(1), D.kvCapacityTokens)
    .option("--block-size <n>", "KV block size in tokens", intOption(1), D.blockSize)
    .option("--max-model-len <n>", "longest prompt + max_tokens accepted (default min(8192, KV capacity))", intOption(2))
    .option("--name-prefix <prefix>", "pod names are <prefix><index>", D.namePrefix)
    .action(async (o, cmd: Command) => {
      const log = createLogger("sim");
      let fleet: Awaited<ReturnType<typeof startSimFleet>>;
      try {
        fleet = await startSimFleet({
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
          blockSize: o.blockSize,
          maxModelLen: o.maxModelLen,
          namePrefix: o.namePrefix,
          logger: log,
        });
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (err instanceof SimOptionsError) {
          cmd.error(`error: --${err.option.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)} ${err.detail}`);
        }
        if (code === "EADDRINUSE" || code === "EACCES" || code === "EADDRNOTAVAIL") {
          cmd.error(`error: cannot listen on ${o.host} from port ${o.basePort}: ${(err as Error).message}`);
        }
        throw err;
      }
      for (const p of fleet.pods) {
        process.stdout.write(`${JSON.stringify({ pod: p.name, address: p.address, engine: p.engine, model: o.model })}\n`);
      }
      log.info({ pods: fleet.pods.length, model: o.model, timeScale: o.timeScale }, "sim fleet ready");
      const signal = await untilSignal();
      log.info({ signal }, "sim fleet shutting down");
      await fleet.close();
      process.exit(0);
    });
}
