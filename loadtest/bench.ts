/**
 * `npm run bench -- <name> [options]`: runs one benchmark and prints its result as the final
 * JSON line (progress and tables go to stderr).
 */
import { Command, InvalidArgumentError } from "commander";
import { runExtProcBench } from "./benches/extproc.js";
import { runIndexBench } from "./benches/index.js";

const ints = (v: string) =>
  v.split(",").map((x) => {
    const n = Number(x);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`expected positive integers, got ${JSON.stringify(v)}`);
    return n;
  });
const int = (v: string) => ints(v)[0] as number;

const program = new Command("bench").description("jetroute benchmarks; each prints one final JSON line").showHelpAfterError();

program
  .command("extproc")
  .description("gateway (least-request, 4 pods, charges on) vs a no-op ext_proc server under the same gRPC load")
  .option("--duration-ms <ms>", "measured window per run", int, 5_000)
  .option("--warmup-ms <ms>", "unmeasured warm-up per run", int, 1_000)
  .option("--concurrency <list>", "concurrent streams, comma separated; the last is the headline", ints, [1, 64])
  .option("--rounds <n>", "runs per server and concurrency (median reported)", int, 1)
  .option("--mode <mode>", "charge consistency mode: eventual | strict", "eventual")
  .action(async (o) => {
    if (o.mode !== "eventual" && o.mode !== "strict") throw new InvalidArgumentError("--mode must be eventual or strict");
    const result = await runExtProcBench({ durationMs: o.durationMs, warmupMs: o.warmupMs, concurrencies: o.concurrency, rounds: o.rounds, mode: o.mode });
    console.log(JSON.stringify(result));
  });

program
  .command("index")
  .description("prefix index: ingest rate, longest-match latency for a 512-block prompt over 32 pods, bytes per entry")
  .option("--lookups <n>", "lookups per case and round", int, 20_000)
  .option("--rounds <n>", "rounds per lookup case (median reported)", int, 3)
  .action(async (o) => {
    console.log(JSON.stringify(await runIndexBench({ lookups: o.lookups, rounds: o.rounds })));
  });

await program.parseAsync(process.argv);
