import type { Command } from "commander";
import { startMetricsServer, statsRegistry } from "../shared/metrics-server.js";
import { addNamespaceOptions, applyDlqPayloads, dlqPayloadsOption, intOption, namespaceFlags, podCidrsOption, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { startScraper } from "./scraper.js";

export function registerMetricsScraperCommand(program: Command): void {
  addNamespaceOptions(program.command("metrics-scraper").description("scrape each ready pod's /metrics (vLLM and SGLang names) and publish load samples to LOAD"), {
    pool: "gateway pool: scrape the pods of this pool's namespace (<prefix>.pool.<name>) and publish their load there",
  })
    .option("--interval-ms <ms>", "scrape interval per pod", intOption(10), 100)
    .option("--timeout-ms <ms>", "a scrape slower than this fails (default max(500, 5 x interval))", intOption(10))
    .option("--stale-after-ms <ms>", "failing this long marks a pod stale", intOption(10), 1_000)
    .option("--pod-cidrs <list>", "pod networks allowed, comma separated (e.g. 10.0.0.0/8,fd00::/8): a pod published with an address outside them is never scraped (default: any)", podCidrsOption)
    .option("--no-read-models", "do not read each engine's /v1/models for its loaded LoRA adapters (engine-reported adapters are then not known: use a pod annotation or the pod list)")
    .addOption(dlqPayloadsOption())
    .option("--metrics-port <port>", "Prometheus /metrics port (-1 = off)", intOption(-1, 65535), -1)
    .option("--metrics-host <host>", "metrics listen address", "0.0.0.0")
    .action(async (o) => {
      applyDlqPayloads(o.dlqPayloads);
      const log = createLogger("metrics-scraper");
      const { nats, namespace } = namespaceFlags(o);
      const s = await startScraper({ nats, prefix: namespace.prefix, intervalMs: o.intervalMs, timeoutMs: o.timeoutMs, staleAfterMs: o.staleAfterMs, readModels: o.readModels !== false, ...(o.podCidrs ? { podCidrs: o.podCidrs } : {}), log });
      if (o.metricsPort >= 0) await startMetricsServer(o.metricsPort, o.metricsHost, statsRegistry("metrics-scraper", () => ({ ...s.stats, pods: s.pods.size })), log);
      log.info({ intervalMs: o.intervalMs }, "scraping");
      await untilSignal();
      await s.close();
      process.exit(0);
    });
}
