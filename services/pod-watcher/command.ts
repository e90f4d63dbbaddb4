import type { Command } from "commander";
import { startMetricsServer, statsRegistry } from "../shared/metrics-server.js";
import { intOption, natsOption, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { startPodWatcher } from "./pod-watcher.js";

export function registerPodWatcherCommand(program: Command): void {
  program
    .command("pod-watcher")
    .description("publish pod readiness to the PODS stream (static file mode; Kubernetes mode is planned)")
    .requiredOption("--static <file>", "YAML/JSON pod list: [{name, model, address, engine?, role?, metricsAddress?, adapters?}]")
    .addOption(natsOption())
    .option("--prefix <prefix>", "subject prefix", "jr")
    .option("--probe-interval-ms <ms>", "how often each pod's /health is probed", intOption(50), 1_000)
    .option("--probe-timeout-ms <ms>", "a probe slower than this fails", intOption(10), 1_000)
    .option("--no-probe", "treat every listed pod as ready without probing")
    .option("--metrics-port <port>", "Prometheus /metrics port (-1 = off)", intOption(-1, 65535), -1)
    .option("--metrics-host <host>", "metrics listen address", "0.0.0.0")
    .action(async (o) => {
      const log = createLogger("pod-watcher");
      const w = await startPodWatcher({
        nats: o.nats, prefix: o.prefix, file: o.static, probeIntervalMs: o.probeIntervalMs, probeTimeoutMs: o.probeTimeoutMs, noProbe: o.probe === false, log,
      });
      if (o.metricsPort >= 0) await startMetricsServer(o.metricsPort, o.metricsHost, statsRegistry("pod-watcher", () => w.stats), log);
      await w.firstRound;
      log.info("first readiness round published");
      await untilSignal();
      await w.close();
      process.exit(0);
    });
}
