import { type Command, InvalidArgumentError } from "commander";
import { addNamespaceOptions, applyDlqPayloads, dlqPayloadsOption, intOption, modelListOption, namespaceFlags, podCidrsOption, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { DEFAULT_ADMIN_PORT, DEFAULT_EXTPROC_PORT, GATEWAY_DEFAULTS as D, GatewayConfigError, MAX_FOLD_PACE_MS, MAX_RELEASE_BATCH_MS } from "./config.js";
import { startGateway } from "./gateway.js";
import { strategyNames } from "../routing/mod.js";
import { TokenizerFilesError } from "../tokenizer/hf-tokenizer.js";
import type { TokenizerSetting } from "../tokenizer/prompt-tokens.js";
import type { AuthMode } from "./auth.js";
import { otlpEndpointError } from "./trace-spans.js";

function consistencyOption(v: string): "eventual" | "strict" | "off" {
  if (v !== "eventual" && v !== "strict" && v !== "off") throw new InvalidArgumentError(`expected eventual, strict or off, got ${JSON.stringify(v)}`);
  return v;
}

function authOption(v: string): AuthMode {
  if (v !== "off" && v !== "required") throw new InvalidArgumentError(`expected off or required, got ${JSON.stringify(v)}`);
  return v;
}

const TOKENIZER_MODES = ["remote", "local", "approximate"] as const;
function tokenizerOption(v: string): TokenizerSetting {
  if (v.startsWith("hf:") && v.length > 3) return v as TokenizerSetting;
  if (!(TOKENIZER_MODES as readonly string[]).includes(v)) throw new InvalidArgumentError(`expected one of ${TOKENIZER_MODES.join(", ")} or hf:<dir>, got ${JSON.stringify(v)}`);
  return v as TokenizerSetting;
}

function tokenizerModelOption(v: string, acc: Record<string, TokenizerSetting>): Record<string, TokenizerSetting> {
  // A directory may contain "=": split at the first "=hf:" when there is one, else at the last "=".
  const hf = v.indexOf("=hf:");
  const i = hf > 0 ? hf : v.lastIndexOf("=");
  if (i <= 0) throw new InvalidArgumentError(`expected <model>=<mode>, got ${JSON.stringify(v)}`);
  acc[v.slice(0, i)] = tokenizerOption(v.slice(i + 1));
  return acc;
}

function otlpEndpointOption(v: string): string {
  const err = otlpEndpointError(v);
  if (err) throw new InvalidArgumentError(err);
  return v;
}

function tlsOption(cert: string | undefined, key: string | undefined, clientCa: string | undefined): { certFile: string; keyFile: string; clientCaFile?: string } {
  if (!cert || !key) throw new InvalidArgumentError("--tls-cert and --tls-key go together (and --tls-client-ca needs them)");
  return { certFile: cert, keyFile: key, ...(clientCa ? { clientCaFile: clientCa } : {}) };
}

export function registerGatewayCommand(program: Command): void {
  addNamespaceOptions(program.command("gateway").description("Envoy ext_proc gateway replica: folds the streams into views and picks a pod per request"), {
    pool: "gateway pool: fold and route only this pool's models (its namespace <prefix>.pool.<name>); other models get 421 naming their pool",
  })
    .option("--models <list>", "with --pool: the pool's models (comma separated), instead of the config bucket's `pool.<name>` entry", modelListOption)
    .option("--port <port>", "ext_proc gRPC port", intOption(0, 65535), DEFAULT_EXTPROC_PORT)
    .option("--host <host>", "ext_proc listen address", D.host)
    .option("--admin-port <port>", "admin HTTP port (/healthz /readyz /metrics /debug/*); -1 = off", intOption(-1, 65535), DEFAULT_ADMIN_PORT)
    // Loopback by default: /debug/* dumps the views, and without --auth required it is open to
    // whoever reaches the port. Kubernetes passes --admin-host=0.0.0.0 for probes and Prometheus.
    .option("--admin-host <host>", "admin HTTP listen address (0.0.0.0 for probes and Prometheus from other hosts)", D.adminHost)
    .option("--id <id>", "gateway replica id (default: hostname-pid-random)")
    .option("--strategy <name>", `default routing strategy (${strategyNames().join(", ")})`, D.defaultStrategy)
    .option("--consistency <mode>", "charges: eventual (publish, apply on delivery), strict (per-pod compare-and-set), off (own charges only)", consistencyOption, D.consistency)
    .option("--tokenizer <mode>", "prompt tokens for prefix routing: remote (engine /tokenize), local (simulator's tokenizer), approximate, or hf:<dir> (a Hugging Face tokenizer directory: tokenizer.json + tokenizer_config.json)", tokenizerOption, D.tokenizerMode as TokenizerSetting)
    .option("--tokenizer-model <model=mode>", "tokenizer mode for one model, e.g. Qwen/Qwen3-8B=hf:/models/qwen3 (repeatable)", tokenizerModelOption, {} as Record<string, TokenizerSetting>)
    .option("--tokenizer-prefix-cache-bytes <n>", "hf: tokenizers: bound on cached conversation prefixes (ids and their block hashes, ~8 bytes a token); 0 = off", intOption(0), D.tokenizerPrefixCacheBytes)
    .option("--tokenizer-render-cache-bytes <n>", "hf: tokenizers with a message-local template: bound on cached conversation renders (~4 bytes a character of conversation); 0 = render every request whole", intOption(0), D.tokenizerRenderCacheBytes)
    .option("--prefix-max-entries <n>", "bound on the prefix index, in (block, pod) entries", intOption(1), D.prefixMaxEntries)
    .option("--response-locations <n>", "bound on the Responses API locations held (response id -> pod, ~200 bytes each); past it the oldest lose their affinity, not their store", intOption(1), D.responseLocations)
    .option("--no-snapshots", "neither boot from nor write prefix-index snapshots")
    .option("--turn-budget-ms <ms>", "a large request's parse/tokenize/hash work hands the event loop back after this much synchronous work, so other requests run between its slices (0 = off)", intOption(0), D.turnBudgetMs)
    .option("--snapshot-interval-ms <ms>", "how often the lease holder writes a prefix-index snapshot", intOption(1_000), D.snapshotIntervalMs)
    .option("--charge-ttl-ms <ms>", "a charge stops counting after this long even without a release", intOption(1), D.chargeTtlMs)
    .option("--heartbeat-ms <ms>", "heartbeat interval", intOption(10), D.heartbeatIntervalMs)
    // On (5 ms) since every gateway and replay tool of the previous release reads `releases`; a
    // fleet still running builds older than that sets 0 until they are gone (they dead-letter it).
    .option("--release-batch-ms <ms>", "releases are sent per pod in batches over this window, at most 20 (0 = each on its own, for fleets still running builds that predate the `releases` event)", intOption(0, MAX_RELEASE_BATCH_MS), D.releaseBatchMs)
    .option("--fold-pace-ms <ms>", "read the other replicas' charges in batches this far apart while they flow, at most 100 (0 = one delivery per message: a wake-up each); keep it below --rate-confirm-ms", intOption(0, MAX_FOLD_PACE_MS), D.foldPaceMs)
    .option("--pod-cidrs <list>", "pod networks allowed, comma separated (e.g. 10.0.0.0/8,fd00::/8): a pod published with an address outside them is never routed to (default: any)", podCidrsOption)
    .option("--config-public-key <file>", "the operator's PEM Ed25519 public key(s): act only on API keys, limits, pools and model configs signed with one (jetroute config --signing-key); never a pod-watcher's key")
    .option("--pod-public-key <file>", "the pod-watchers' PEM Ed25519 public key(s): act only on PODS events and InferencePool policies signed with one (pod-watcher --signing-key)")
    .option("--destination-fallbacks <n>", "endpoint picker protocol: name up to n fallback endpoints (the strategy's next best) after the chosen one in x-gateway-destination-endpoint, for a proxy that retries down the list (0-8)", intOption(0, 8), 0)
    .option("--expose-pod-addresses", "echo pod addresses to clients on the response (target-pod, prefill-target-pod-ip), as AIBrix does; off: internal addresses stay inside")
    .option("--rejection-records-per-s <n>", "decision records of rejected requests this replica publishes per second, in bursts up to twice that (the rest are only counted; unknown paths never recorded)", intOption(0), D.rejectionRecordsPerS)
    .option("--heartbeat-timeout-ms <ms>", "a gateway silent this long loses its charges (default 3 x interval)", intOption(10))
    .option("--pod-source-timeout-ms <ms>", "pods of a pod-watcher source silent this long stop being routable (0 = never)", intOption(0), D.podSourceTimeoutMs)
    .option("--load-stale-ms <ms>", "a load sample older than this is ignored", intOption(1), D.loadStaleAfterMs)
    .option("--max-charges <n>", "bound on tracked charges", intOption(1), D.maxCharges)
    .option("--rate-confirm-ms <ms>", "rate limits: how long this replica's admissions may be unseen by the others (room is reserved for theirs meanwhile); 0 = no reservation", intOption(0), D.rateConfirmMs)
    .option("--usage-summary-ms <ms>", "per-user rate limits across pools: publish this replica's per-user admissions of the minute this often (0 = publish none; it still counts the other pools')", intOption(0), D.usageSummaryMs)
    .option("--auth <mode>", "off, or required: every request needs `authorization: Bearer <key>` (keys: jetroute config add-key), else 401", authOption, D.auth)
    .option("--tls-cert <file>", "PEM certificate for TLS on the ext_proc port (with --tls-key)")
    .option("--tls-key <file>", "PEM private key for --tls-cert")
    .option("--tls-client-ca <file>", "PEM CA: mutual TLS, only clients (Envoy) with a certificate it signed may connect")
    .option("--no-record-prompt-blocks", "do not tokenize prompts for decision records under strategies that do not need them (replay cannot then ask what prefix-cache would have hit)")
    .option("--shutdown-grace-ms <ms>", "on SIGTERM, how long in-flight requests may finish before being cancelled", intOption(0), D.shutdownGraceMs)
    .option("--flow-max-held-bytes <n>", "flow control: bytes this replica may hold across every model, counted as what held requests retain (about twice the body); the excess gets 429 queue_full", intOption(0), D.flowMaxHeldBytes)
    .option("--flow-max-held <n>", "flow control: requests this replica may hold across every model", intOption(0), D.flowMaxHeld)
    .option("--pd-prefill-timeout-ms <ms>", "P/D: timeout of one prefill leg attempt", intOption(1), D.pd.prefillTimeoutMs)
    .option("--pd-prefill-budget-ms <ms>", "P/D: all vLLM prefill attempts together (keep below Envoy's ext_proc messageTimeout)", intOption(1), D.pd.prefillBudgetMs)
    .option("--pd-sglang-prefill-timeout-ms <ms>", "P/D: an SGLang prefill leg (it answers only once its decode took the KV)", intOption(1), D.pd.sglangPrefillTimeoutMs)
    .option("--pd-prefill-retries <n>", "P/D: retries of a failed prefill leg (502/503/504, connection errors) on other prefill pods", intOption(0, 16), D.pd.maxRetries)
    .option("--pd-first-chunk-timeout-ms <ms>", "P/D decode watchdog: time to the decode's first chunk", intOption(1), D.pd.firstChunkTimeoutMs)
    .option("--pd-idle-timeout-ms <ms>", "P/D decode watchdog: time between the decode's chunks", intOption(1), D.pd.idleTimeoutMs)
    .option("--otlp-endpoint <url>", "OpenTelemetry traces: the OTLP/HTTP receiver's base URL (spans are POSTed as JSON to <url>/v1/traces); default: no traces", otlpEndpointOption)
    .option("--otlp-service-name <name>", "OpenTelemetry traces: the service.name of the spans", "jetroute-gateway")
    .addOption(dlqPayloadsOption())
    .action(async (o, cmd: Command) => {
      applyDlqPayloads(o.dlqPayloads);
      if (o.models !== undefined && o.pool === undefined) cmd.error("error: --models names a pool's models: it needs --pool");
      const log = createLogger("gateway");
      const { nats, prefix, pool } = namespaceFlags(o);
      const gw = await startGateway({
        nats,
        prefix,
        ...(pool !== undefined ? { pool } : {}),
        ...(o.models !== undefined ? { poolModels: o.models } : {}),
        port: o.port,
        host: o.host,
        adminPort: o.adminPort,
        adminHost: o.adminHost,
        id: o.id,
        defaultStrategy: o.strategy,
        chargeTtlMs: o.chargeTtlMs,
        heartbeatIntervalMs: o.heartbeatMs,
        releaseBatchMs: o.releaseBatchMs,
        foldPaceMs: o.foldPaceMs,
        rejectionRecordsPerS: o.rejectionRecordsPerS,
        exposePodAddresses: o.exposePodAddresses === true,
        destinationFallbacks: o.destinationFallbacks,
        ...(o.podCidrs ? { podCidrs: o.podCidrs } : {}),
        ...(o.configPublicKey ? { configPublicKeyFile: o.configPublicKey } : {}),
        ...(o.podPublicKey ? { podPublicKeyFile: o.podPublicKey } : {}),
        heartbeatTimeoutMs: o.heartbeatTimeoutMs,
        podSourceTimeoutMs: o.podSourceTimeoutMs,
        loadStaleAfterMs: o.loadStaleMs,
        maxCharges: o.maxCharges,
        rateConfirmMs: o.rateConfirmMs,
        usageSummaryMs: o.usageSummaryMs,
        consistency: o.consistency,
        tokenizerMode: o.tokenizer,
        tokenizerModes: o.tokenizerModel,
        tokenizerPrefixCacheBytes: o.tokenizerPrefixCacheBytes,
        tokenizerRenderCacheBytes: o.tokenizerRenderCacheBytes,
        prefixMaxEntries: o.prefixMaxEntries,
        responseLocations: o.responseLocations,
        snapshots: o.snapshots !== false,
        snapshotIntervalMs: o.snapshotIntervalMs,
        shutdownGraceMs: o.shutdownGraceMs,
        flowMaxHeldBytes: o.flowMaxHeldBytes,
        flowMaxHeld: o.flowMaxHeld,
        recordPromptBlocks: o.recordPromptBlocks !== false,
        turnBudgetMs: o.turnBudgetMs,
        ...(o.otlpEndpoint ? { otlpEndpoint: o.otlpEndpoint } : {}),
        otlpServiceName: o.otlpServiceName,
        ...(o.tlsCert || o.tlsKey || o.tlsClientCa ? { tls: tlsOption(o.tlsCert, o.tlsKey, o.tlsClientCa) } : {}),
        // From the environment (a Kubernetes Secret), never a flag: flags show in `ps`.
        ...(process.env.JETROUTE_SESSION_SECRET ? { sessionSecret: process.env.JETROUTE_SESSION_SECRET } : {}),
        ...(process.env.JETROUTE_ENGINE_API_KEY ? { engineApiKey: process.env.JETROUTE_ENGINE_API_KEY } : {}),
        auth: o.auth,
        pd: { prefillTimeoutMs: o.pdPrefillTimeoutMs, prefillBudgetMs: o.pdPrefillBudgetMs, sglangPrefillTimeoutMs: o.pdSglangPrefillTimeoutMs, maxRetries: o.pdPrefillRetries, firstChunkTimeoutMs: o.pdFirstChunkTimeoutMs, idleTimeoutMs: o.pdIdleTimeoutMs },
        log,
      }).catch((err: unknown) => {
        if (err instanceof TokenizerFilesError || err instanceof GatewayConfigError) cmd.error(`error: ${err.message}`);
        throw err;
      });
      console.log(JSON.stringify({ gateway: gw.id, port: gw.port, adminPort: gw.adminPort, ...(pool !== undefined ? { pool } : {}) }));
      await untilSignal();
      await gw.close();
      process.exit(0);
    });
}
