/**
 * `jetroute` command line: one binary, one sub-command per process kind.
 * Each service registers its own sub-command in its `command.ts`.
 */
import { Command } from "commander";
import { CLI_COMMANDS } from "./cli-commands.js";

const program = new Command("jetroute")
  .description("Event-sourced routing control plane for LLM inference on NATS JetStream")
  .showHelpAfterError();

const asked = process.argv[2];
// Only the module of the sub-command asked for is loaded; help, an unknown name or none loads all.
const one = CLI_COMMANDS.find((c) => asked !== undefined && c.names.includes(asked));
for (const c of one ? [one] : CLI_COMMANDS) (await c.load())(program);

try {
  await program.parseAsync(process.argv);
} catch (err) {
  // An operator gets one line saying what failed (the stack only with JETROUTE_LOG_LEVEL=debug).
  const e = err as Error;
  console.error(`jetroute: ${e?.message ?? String(err)}`);
  if (process.env.JETROUTE_LOG_LEVEL === "debug" && e?.stack) console.error(e.stack);
  process.exit(1);
}
