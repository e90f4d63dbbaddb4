/**
 * `jetroute batch-api`, `jetroute batch-worker` and `jetroute batch status`: the OpenAI Batch API
 * (docs/batch.md).
 */
import { type Command, Option } from "commander";
import { readVerifier } from "../shared/signing-keys.js";
import { addNamespaceOptions, intOption, namespaceFlags, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { connectNats } from "../shared/nats.js";
import { startBatchApi } from "./api.js";
import { FINAL, isBatchId } from "./model.js";
import { BatchStore } from "./store.js";
import { progressLine } from "./view.js";
import { startBatchWorker } from "./worker.js";

export function registerBatchCommands(program: Command): void {
  addNamespaceOptions(
    program
      .command("batch-api")
      .description("serve OpenAI's /v1/files and /v1/batches from JetStream (stateless: run any number of replicas)")
      .option("--port <port>", "HTTP listen port", intOption(0, 65_535), 8090)
      .option("--host <host>", "HTTP listen address", "127.0.0.1")
      .addOption(new Option("--auth <mode>", "off: one shared tenant; required: every call needs an API key (config add-key), and a key sees only its user's files and batches").choices(["off", "required"]).default("off"))
      .option("--id <id>", "this replica's name in claims and logs")
      .option("--cancel-grace-ms <ms>", "a cancelled batch's in-flight items may finish this long before its output is closed", intOption(0), 30_000)
      .option("--reclaim-after-ms <ms>", "a closing or queueing another replica left unfinished this long is taken over", intOption(1_000), 60_000)
      .option("--config-public-key <file>", "the operator's PEM Ed25519 public key(s): act only on API keys signed with one (jetroute config --signing-key), as gateways started with it do"),
  ).action(async (o) => {
    const log = createLogger("batch-api");
    const { nats, prefix } = namespaceFlags(o);
    const api = await startBatchApi({ nats, prefix, port: o.port, host: o.host, auth: o.auth, log, ...(o.id ? { id: o.id } : {}), cancelGraceMs: o.cancelGraceMs, reclaimAfterMs: o.reclaimAfterMs, ...(o.configPublicKey ? { configPublicKey: readVerifier(o.configPublicKey, "--config-public-key") } : {}) });
    console.log(JSON.stringify({ service: "batch-api", port: api.port }));
    await untilSignal();
    await api.close();
    process.exit(0);
  });

  addNamespaceOptions(
    program
      .command("batch-worker")
      .description("run batch items: pull them from the work queue and send each through Envoy (or the dev front) in a low flow-control band")
      .option("--target <url>", "base URL requests go to (Envoy, or the dev front)", "http://127.0.0.1:8080")
      .option("--objective <name>", "flow-control objective of batch requests, sent as x-gateway-inference-objective (define it below every interactive band, e.g. priority -1)", "batch")
      .option("--concurrency <n>", "items in flight in this worker", intOption(1, 4096), 16)
      .option("--ack-wait-ms <ms>", "the work consumer's ack wait (heartbeats go at a third of it)", intOption(1_000), 30_000)
      .option("--max-attempts <n>", "deliveries of an item answered 429/5xx or not at all before it is recorded failed", intOption(1, 1000), 10)
      .option("--request-timeout-ms <ms>", "one request's timeout", intOption(1_000), 600_000)
      .option("--api-key-env <var>", "environment variable holding the bearer key the worker authenticates with", "JETROUTE_BATCH_API_KEY")
      .option("--metrics-port <port>", "Prometheus /metrics and /healthz port (-1 = off)", intOption(-1, 65_535), -1)
      .option("--metrics-host <host>", "metrics listen address", "0.0.0.0")
      .option("--id <id>", "this worker's name in logs"),
  ).action(async (o) => {
    const log = createLogger("batch-worker");
    const { nats, prefix } = namespaceFlags(o);
    const apiKey = process.env[o.apiKeyEnv];
    const w = await startBatchWorker({
      nats,
      prefix,
      target: o.target,
      objective: o.objective,
      concurrency: o.concurrency,
      ackWaitMs: o.ackWaitMs,
      maxAttempts: o.maxAttempts,
      requestTimeoutMs: o.requestTimeoutMs,
      metricsPort: o.metricsPort,
      metricsHost: o.metricsHost,
      log,
      ...(apiKey ? { apiKey } : {}),
      ...(o.id ? { id: o.id } : {}),
    });
    console.log(JSON.stringify({ service: "batch-worker", metricsPort: w.metricsPort ?? null }));
    await untilSignal();
    await w.close();
    process.exit(0);
  });

  const batch = program.command("batch").description("the Batch API's jobs, read from the job-events stream");
  addNamespaceOptions(
    batch
      .command("status [batch-id]")
      .description("one progress line per batch (every tenant's): status, items done, completed, failed, time left")
      .option("--all", "also list finished batches")
      .option("--watch <ms>", "print again every <ms> until every listed batch is finished", intOption(100)),
  ).action(async (id: string | undefined, o) => {
    const log = createLogger("batch", "warn");
    const { nats, prefix } = namespaceFlags(o);
    if (id !== undefined && !isBatchId(id)) {
      console.error(`not a batch id: ${JSON.stringify(id.slice(0, 64))} (batch_ and 24 hex digits)`);
      process.exit(2);
    }
    const h = await connectNats(nats, "jetroute-batch-status");
    const store = new BatchStore({ nats: h, prefix, log, name: "batch-status" });
    await store.start();
    for (;;) {
      const rows = [...store.view.batches.values()].filter((b) => (id ? b.id === id : o.all || !FINAL.has(b.status))).sort((a, b) => a.created_at - b.created_at);
      if (id && rows.length === 0) {
        console.error(`no batch ${id}`);
        process.exit(1);
      }
      for (const b of rows) console.log(progressLine(b, store.view.live.get(b.id), Date.now()));
      if (rows.length === 0) console.log("no running batches");
      if (!o.watch || rows.every((b) => FINAL.has(b.status))) break;
      await new Promise((r) => setTimeout(r, o.watch));
    }
    store.close();
    await h.nc.close();
    process.exit(0);
  });
}
