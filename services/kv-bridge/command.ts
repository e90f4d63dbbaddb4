import { type Command, InvalidArgumentError } from "commander";
import { startMetricsServer, statsRegistry } from "../shared/metrics-server.js";
import { addNamespaceOptions, applyDlqPayloads, dlqPayloadsOption, intOption, namespaceFlags, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { redactNatsUrl } from "../shared/nats.js";
import { DEFAULTS, startKvBridge } from "./bridge.js";
import { formatShard, parseShard, type Shard } from "./shard.js";

const shardOption = (value: string): Shard => {
  try {
    return parseShard(value);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
};

export function registerKvBridgeCommand(program: Command): void {
  addNamespaceOptions(
    program
      .command("kv-bridge")
      .description("bridge engines' ZMQ KV cache events (vLLM, SGLang) to the KV stream, with gap repair and engine-restart detection"),
    { pool: "gateway pool: bridge the pods of this pool's namespace (<prefix>.pool.<name>) into its KV stream" },
  )
    .option("--shard <i/n>", "this replica's shard: it bridges the pods that rendezvous-hash to i of n", shardOption, { index: 0, count: 1 })
    .option("--replay-timeout-ms <ms>", "wait this long for each replay reply before giving the replay up", intOption(10), DEFAULTS.replayTimeoutMs)
    .option("--max-frame-bytes <bytes>", "engine frames larger than this are dead-lettered, not decoded", intOption(1024), DEFAULTS.maxFrameBytes)
    .option("--window <n>", "JetStream acks in flight per pod", intOption(1, 65_536), DEFAULTS.window)
    .option("--max-tracked-blocks <n>", "engine-hash -> router-hash entries kept per pod", intOption(1_024), DEFAULTS.maxTrackedBlocks)
    .addOption(dlqPayloadsOption())
    .option("--metrics-port <port>", "Prometheus /metrics port (-1 = off)", intOption(-1, 65535), -1)
    .option("--metrics-host <host>", "metrics listen address", "0.0.0.0")
    .action(async (o) => {
      applyDlqPayloads(o.dlqPayloads);
      const log = createLogger("kv-bridge");
      const { nats, namespace } = namespaceFlags(o);
      const bridge = await startKvBridge({
        nats,
        prefix: namespace.prefix,
        shard: o.shard,
        replayTimeoutMs: o.replayTimeoutMs,
        maxFrameBytes: o.maxFrameBytes,
        window: o.window,
        maxTrackedBlocks: o.maxTrackedBlocks,
        log,
      });
      const metrics = o.metricsPort >= 0 ? await startMetricsServer(o.metricsPort, o.metricsHost, statsRegistry("kv-bridge", () => bridge.stats), log) : undefined;
      console.log(JSON.stringify({ kvBridge: formatShard(bridge.shard), prefix: namespace.prefix, nats: nats.map(redactNatsUrl), ...(metrics ? { metricsPort: metrics.port } : {}) }));
      const signal = await untilSignal();
      log.info({ signal, stats: bridge.stats }, "shutting down");
      await bridge.close();
      process.exit(0);
    });
}
