/** `jetroute front`: the dev front, Envoy's stand-in for local use. */
import { type Command, InvalidArgumentError, Option } from "commander";
import { intOption } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { startFront } from "./front.js";

function targetList(v: string): string[] {
  const targets = v
    .split(",")
    .map((t) => t.trim())
    .filter(Boolean);
  if (targets.length === 0) throw new InvalidArgumentError("at least one gateway host:port is required");
  for (const t of targets) {
    if (!/^(\[[^\]]+\]|[^:]+):\d+$/.test(t)) throw new InvalidArgumentError(`gateway must be host:port, got ${t}`);
  }
  return targets;
}

export function registerFrontCommand(program: Command): void {
  program
    .command("front")
    .description("Dev front: an HTTP proxy that speaks ext_proc to the gateway as Envoy does (local use only)")
    .option("--port <port>", "HTTP listen port", intOption(0, 65_535), 8080)
    .option("--host <host>", "HTTP listen address", "127.0.0.1")
    .addOption(
      new Option("--gateway <list>", "gateway ext_proc targets, comma-separated host:port")
        .argParser(targetList)
        .default(["127.0.0.1:9002"], "127.0.0.1:9002"),
    )
    .option("--message-timeout-ms <ms>", "per-message ext_proc timeout (Envoy's message_timeout); above the longest flow-control queue TTL", intOption(1), 90_000)
    .option("--max-body-bytes <n>", "request body buffer limit", intOption(1), 4 * 1024 * 1024)
    .addOption(new Option("--failure-mode <mode>", "what the proxy does when the picker fails (an InferencePool's endpointPickerRef.failureMode): FailClose answers an error, FailOpen forwards to a --pool-endpoints entry").choices(["FailOpen", "FailClose"]).default("FailClose"))
    .option("--pool-endpoints <list>", "FailOpen: the pool's endpoints (ip:port, comma separated) to forward to when the picker fails", (v: string) => v.split(",").map((s) => s.trim()).filter(Boolean))
    .option("--batch-api <host:port>", "forward /v1/files and /v1/batches to this `jetroute batch-api` (Envoy's route does the same in production)")
    .action(async (o: { port: number; host: string; gateway: string[]; messageTimeoutMs: number; maxBodyBytes: number; failureMode: "FailOpen" | "FailClose"; poolEndpoints?: string[]; batchApi?: string }) => {
      const logger = createLogger("front");
      const front = await startFront({
        port: o.port,
        host: o.host,
        gateways: o.gateway,
        messageTimeoutMs: o.messageTimeoutMs,
        maxRequestBodyBytes: o.maxBodyBytes,
        failureMode: o.failureMode,
        ...(o.poolEndpoints ? { poolEndpoints: o.poolEndpoints } : {}),
        ...(o.batchApi ? { batchApi: o.batchApi } : {}),
        logger,
      });
      const stop = () => {
        logger.info("dev front stopping");
        front.close().then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.once("SIGINT", stop);
      process.once("SIGTERM", stop);
    });
}
