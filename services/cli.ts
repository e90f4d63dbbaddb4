/**
 * `jetroute` command line: one binary, one sub-command per process kind.
 * Each service registers its own sub-command in its `command.ts`.
 */
import { Command } from "commander";
import { registerConfigCommand } from "./admin/config-command.js";
import { registerAutoscalerCommand } from "./autoscaler/command.js";
import { registerKeysCommand } from "./admin/keys-command.js";
import { registerStreamsCommand } from "./admin/streams-command.js";
import { registerDemoCommand } from "./demo/command.js";
import { registerFrontCommand } from "./front/command.js";
import { registerGatewayCommand } from "./gateway/command.js";
import { registerKvBridgeCommand } from "./kv-bridge/command.js";
import { registerMetricsScraperCommand } from "./metrics-scraper/command.js";
import { registerPodWatcherCommand } from "./pod-watcher/command.js";
import { registerReplayCommands } from "./replay/command.js";
import { registerSimCommand } from "./sim/command.js";

const program = new Command("jetroute")
  .description("Event-sourced routing control plane for LLM inference on NATS JetStream")
  .showHelpAfterError();

registerStreamsCommand(program);
registerConfigCommand(program);
registerKeysCommand(program);
registerSimCommand(program);
registerPodWatcherCommand(program);
registerMetricsScraperCommand(program);
registerKvBridgeCommand(program);
registerGatewayCommand(program);
registerFrontCommand(program);
registerDemoCommand(program);
registerReplayCommands(program);
registerAutoscalerCommand(program);

try {
  await program.parseAsync(process.argv);
} catch (err) {
  // An operator gets one line saying what failed (the stack only with JETROUTE_LOG_LEVEL=debug).
  const e = err as Error;
  console.error(`jetroute: ${e?.message ?? String(err)}`);
  if (process.env.JETROUTE_LOG_LEVEL === "debug" && e?.stack) console.error(e.stack);
  process.exit(1);
}
