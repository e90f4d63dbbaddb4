/**
 * The `jetroute` sub-commands: each one's names and the module that registers it, in help order.
 * services/cli.ts loads only the module of the sub-command asked for (a gateway does not load the
 * replay engine, nor `replay` the gateway); deploy/manifests.test.ts loads them all to check the
 * manifests' command lines against the flags really registered.
 */
import type { Command } from "commander";

export type Register = (program: Command) => void;

export const CLI_COMMANDS: ReadonlyArray<{ names: readonly string[]; module: string; load: () => Promise<Register> }> = [
  { names: ["streams"], module: "services/admin/streams-command.ts", load: async () => (await import("./admin/streams-command.js")).registerStreamsCommand },
  { names: ["config"], module: "services/admin/config-command.ts", load: async () => (await import("./admin/config-command.js")).registerConfigCommand },
  { names: ["keys"], module: "services/admin/keys-command.ts", load: async () => (await import("./admin/keys-command.js")).registerKeysCommand },
  { names: ["sim"], module: "services/sim/command.ts", load: async () => (await import("./sim/command.js")).registerSimCommand },
  { names: ["pod-watcher"], module: "services/pod-watcher/command.ts", load: async () => (await import("./pod-watcher/command.js")).registerPodWatcherCommand },
  { names: ["metrics-scraper"], module: "services/metrics-scraper/command.ts", load: async () => (await import("./metrics-scraper/command.js")).registerMetricsScraperCommand },
  { names: ["kv-bridge"], module: "services/kv-bridge/command.ts", load: async () => (await import("./kv-bridge/command.js")).registerKvBridgeCommand },
  { names: ["gateway"], module: "services/gateway/command.ts", load: async () => (await import("./gateway/command.js")).registerGatewayCommand },
  { names: ["front"], module: "services/front/command.ts", load: async () => (await import("./front/command.js")).registerFrontCommand },
  { names: ["demo"], module: "services/demo/command.ts", load: async () => (await import("./demo/command.js")).registerDemoCommand },
  { names: ["replay", "export"], module: "services/replay/command.ts", load: async () => (await import("./replay/command.js")).registerReplayCommands },
  { names: ["batch-api", "batch-worker", "batch"], module: "services/batch/command.ts", load: async () => (await import("./batch/command.js")).registerBatchCommands },
  { names: ["autoscaler"], module: "services/autoscaler/command.ts", load: async () => (await import("./autoscaler/command.js")).registerAutoscalerCommand },
  { names: ["adapter-controller", "adapters"], module: "services/adapters/command.ts", load: async () => (await import("./adapters/command.js")).registerAdapterCommands },
];
