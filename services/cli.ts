/**
 * `jetroute` command line: one binary, one sub-command per process kind.
 * Each service registers its own sub-command in its `command.ts`.
 */
import { Command } from "commander";

type Register = (program: Command) => void;

/**
 * Every sub-command's module, in help order. Only the module of the sub-command asked for is
 * loaded (a gateway does not load the replay engine, nor `replay` the gateway); help, an unknown
 * name or none loads them all.
 */
const COMMANDS: ReadonlyArray<{ names: readonly string[]; load: () => Promise<Register> }> = [
  { names: ["streams"], load: async () => (await import("./admin/streams-command.js")).registerStreamsCommand },
  { names: ["config"], load: async () => (await import("./admin/config-command.js")).registerConfigCommand },
  { names: ["keys"], load: async () => (await import("./admin/keys-command.js")).registerKeysCommand },
  { names: ["sim"], load: async () => (await import("./sim/command.js")).registerSimCommand },
  { names: ["pod-watcher"], load: async () => (await import("./pod-watcher/command.js")).registerPodWatcherCommand },
  { names: ["metrics-scraper"], load: async () => (await import("./metrics-scraper/command.js")).registerMetricsScraperCommand },
  { names: ["kv-bridge"], load: async () => (await import("./kv-bridge/command.js")).registerKvBridgeCommand },
  { names: ["gateway"], load: async () => (await import("./gateway/command.js")).registerGatewayCommand },
  { names: ["front"], load: async () => (await import("./front/command.js")).registerFrontCommand },
  { names: ["demo"], load: async () => (await import("./demo/command.js")).registerDemoCommand },
  { names: ["replay", "export"], load: async () => (await import("./replay/command.js")).registerReplayCommands },
  { names: ["autoscaler"], load: async () => (await import("./autoscaler/command.js")).registerAutoscalerCommand },
];

const program = new Command("jetroute")
  .description("Event-sourced routing control plane for LLM inference on NATS JetStream")
  .showHelpAfterError();

const asked = process.argv[2];
const one = COMMANDS.find((c) => asked !== undefined && c.names.includes(asked));
for (const c of one ? [one] : COMMANDS) (await c.load())(program);

try {
  await program.parseAsync(process.argv);
} catch (err) {
  // An operator gets one line saying what failed (the stack only with JETROUTE_LOG_LEVEL=debug).
  const e = err as Error;
  console.error(`jetroute: ${e?.message ?? String(err)}`);
  if (process.env.JETROUTE_LOG_LEVEL === "debug" && e?.stack) console.error(e.stack);
  process.exit(1);
}
