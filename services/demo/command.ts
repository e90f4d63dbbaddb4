import path from "node:path";
import type { Command } from "commander";
import { floatOption, intOption, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { demoBanner, startDemo } from "./demo.js";

export function registerDemoCommand(program: Command): void {
  program
    .command("demo")
    .description("run NATS, a simulated engine fleet, the publishers, 2 gateway replicas and the dev front")
    .option("--port <port>", "dev front HTTP port", intOption(1, 65535), 8080)
    .option("--pods <n>", "simulated pods", intOption(1, 64), 4)
    .option("--model <name>", "model the simulated pods serve", "demo/llama-3.1-8b")
    .option("--time-scale <x>", "simulated engine speed-up", floatOption(0), 1)
    .option("--gateway-port <port>", "first gateway's ext_proc port (the second is +10; admin ports +88, +89)", intOption(1, 65000), 9002)
    .option("--sim-port <port>", "first simulated pod's port", intOption(1, 65000), 8100)
    .option("--batch-api-port <port>", "the Batch API's port (the front forwards /v1/files and /v1/batches to it)", intOption(1, 65535), 8090)
    .option("--batch-workers <n>", "batch workers", intOption(0, 16), 2)
    .option("--state-dir <dir>", "where logs and the generated pod list go", ".jetroute/demo")
    .action(async (o) => {
      const log = createLogger("demo");
      const opts = { port: o.port, pods: o.pods, model: o.model, timeScale: o.timeScale, stateDir: path.resolve(o.stateDir), gatewayBasePort: o.gatewayPort, simBasePort: o.simPort, batchApiPort: o.batchApiPort, batchWorkers: o.batchWorkers, log };
      const demo = await startDemo(opts);
      console.log(demoBanner(demo, opts));
      await untilSignal();
      console.log("stopping...");
      await demo.stop();
      process.exit(0);
    });
}
