import type { Command } from "commander";
import { startMetricsServer, statsRegistry } from "../shared/metrics-server.js";
import { addNamespaceOptions, applyDlqPayloads, dlqPayloadsOption, intOption, modelListOption, namespaceFlags, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { readSigner, SIGNING_KEY_ENV } from "../shared/signing-keys.js";
import type { RecordSigner } from "../../streams/signatures.js";
import { ApiNotServedError, startInferencePoolWatcher } from "./k8s-inference-pool.js";
import { DEFAULT_BLIND_AFTER_MS, DEFAULT_LABEL_SELECTOR, startKubernetesWatcher } from "./kubernetes.js";
import { DEFAULT_HEARTBEAT_MS, DEFAULT_LEASE_MS, DEFAULT_REASSERT_MS, DEFAULT_STEP_DOWN_AFTER_MS, type PodWatcherHandle, startPodWatcher } from "./pod-watcher.js";

export function registerPodWatcherCommand(program: Command): void {
  const cmd = program
    .command("pod-watcher")
    .description("publish the pods of one source (a static list, or a Kubernetes cluster) to the PODS stream")
    .option("--static <file>", "YAML/JSON pod list: [{name, model, address, engine?, role?, metricsAddress?, adapters?}]")
    .option("--kubernetes", "watch pods in Kubernetes (in-cluster config, or --kubeconfig)")
    .option("--inference-pool <namespace/name>", "watch one Gateway API Inference Extension InferencePool and the pods its selector matches (docs/inference-pool.md)")
    .option("--inference-pool-api-version <v>", "InferencePool mode: the pool's API version (implemented: inference.networking.k8s.io/v1)", "inference.networking.k8s.io/v1")
    .option("--model-label <key>", "InferencePool mode: pod label naming the model an endpoint serves (pods without it: asked with GET /v1/models when --inference-pool-models is given, else skipped)")
    .option("--inference-pool-models <list>", "InferencePool mode: comma-separated models the pool serves; an engine's /v1/models answer (or a label) naming another model is not published (required unless --model-label)")
    .option("--objectives-api-version <v>", "InferencePool mode: API version of InferenceObjective / InferenceModelRewrite (llm-d.ai/v1alpha2, inference.networking.x-k8s.io/v1alpha2, or none)", "llm-d.ai/v1alpha2")
    .option("--models-refresh-ms <ms>", "InferencePool mode: how often each unlabelled endpoint's /v1/models is asked again", intOption(1_000), 30_000)
    .option("--kubeconfig <file>", "Kubernetes and InferencePool modes: kubeconfig file (default: in-cluster, else $KUBECONFIG / ~/.kube/config)")
    .option("--namespaces <list>", "Kubernetes mode: comma-separated namespaces to watch (default: all)")
    .option("--label-selector <selector>", "Kubernetes mode: which pods", DEFAULT_LABEL_SELECTOR)
    .option("--blind-after-ms <ms>", "Kubernetes mode: stop heartbeating (the source goes silent in every gateway) once a pod informer has been failing or unsynced this long", intOption(100), DEFAULT_BLIND_AFTER_MS)
    .option("--lease-namespace <ns>", "Kubernetes mode: namespace of the leader-election Lease (default: $POD_NAMESPACE, else default)")
    .option("--source <name>", "the source this watcher vouches for; watchers remove only their own source's pods (default: static-<file name>; Kubernetes: kubernetes-<kubeconfig context>, required in-cluster)")
    .option("--watcher-id <id>", "this instance's identity in the lease and heartbeats (default: <hostname>-<pid>-<random>)");
  addNamespaceOptions(cmd, { pool: "gateway pool: publish only the pods of this pool's models, into its namespace (<prefix>.pool.<name>)" })
    .option("--models <list>", "with --pool: the pool's models (comma separated), instead of the config bucket's `pool.<name>` entry", modelListOption)
    .option("--heartbeat-ms <ms>", "source heartbeat interval (gateways: --pod-source-timeout-ms)", intOption(10), DEFAULT_HEARTBEAT_MS)
    .option("--reassert-ms <ms>", "republish every pod at least this often, so PODS retention never ages a healthy pod out", intOption(100), DEFAULT_REASSERT_MS)
    .option("--leader-election", "run as one of an HA pair: only the holder of the source's lease publishes (Kubernetes Lease, or NATS KV in static mode)")
    .option("--adopt-unowned", "also remove pods published without a source (by a pod-watcher from before sources) that this watcher does not list: run once per fleet when upgrading")
    .option("--lease-ms <ms>", "lease duration; the standby takes over within it after the leader dies", intOption(30), DEFAULT_LEASE_MS)
    .option("--step-down-after-ms <ms>", "with --leader-election: a leader whose NATS publishes have failed this long releases the lease (keep it below a third of the gateways' --pod-source-timeout-ms)", intOption(100), DEFAULT_STEP_DOWN_AFTER_MS)
    .option("--probe-interval-ms <ms>", "static mode: how often each pod's /health is probed", intOption(50), 1_000)
    .option("--probe-timeout-ms <ms>", "static mode: a probe slower than this fails", intOption(10), 1_000)
    .option("--no-probe", "static mode: treat every listed pod as ready without probing")
    .option("--signing-key <file>", `PEM Ed25519 private key: sign every pod event and heartbeat, for gateways started with --pod-public-key (default: $${SIGNING_KEY_ENV}, a PEM or a file; neither = unsigned)`)
    .addOption(dlqPayloadsOption())
    .option("--metrics-port <port>", "Prometheus /metrics port (-1 = off)", intOption(-1, 65535), -1)
    .option("--metrics-host <host>", "metrics listen address", "0.0.0.0")
    .action(async (o) => {
      applyDlqPayloads(o.dlqPayloads);
      const log = createLogger("pod-watcher");
      if ([o.static !== undefined, o.kubernetes === true, o.inferencePool !== undefined].filter(Boolean).length !== 1) {
        log.error("give exactly one of --static <file>, --kubernetes or --inference-pool <namespace/name>");
        process.exit(2);
      }
      if (o.models !== undefined && o.pool === undefined) {
        log.error("--models names a pool's models: it needs --pool");
        process.exit(2);
      }
      const { nats, prefix, pool } = namespaceFlags(o);
      let signer: RecordSigner | undefined;
      try {
        signer = readSigner(o.signingKey);
      } catch (err) {
        log.error((err as Error).message);
        process.exit(2);
      }
      const common = {
        ...(signer ? { signer } : {}),
        nats, prefix, ...(pool !== undefined ? { pool } : {}), ...(o.models !== undefined ? { poolModels: o.models } : {}), source: o.source, watcherId: o.watcherId, heartbeatMs: o.heartbeatMs, reassertMs: o.reassertMs,
        leaderElection: o.leaderElection === true, leaseMs: o.leaseMs, stepDownAfterMs: o.stepDownAfterMs, adoptUnowned: o.adoptUnowned === true, log,
      };
      // Listening before anything is awaited: a SIGTERM during start or the first round still closes (and releases the lease).
      const signal = untilSignal();
      let w: PodWatcherHandle;
      try {
        if (o.inferencePool !== undefined) {
          w = await startInferencePoolWatcher({
            ...common, kubeconfig: o.kubeconfig, leaseNamespace: o.leaseNamespace, blindAfterMs: o.blindAfterMs, inferencePool: o.inferencePool,
            poolApiVersion: o.inferencePoolApiVersion, modelLabel: o.modelLabel, ...(typeof o.inferencePoolModels === "string" ? { inferencePoolModels: o.inferencePoolModels.split(",") } : {}), objectivesApiVersion: o.objectivesApiVersion, modelsRefreshMs: o.modelsRefreshMs,
          });
        } else if (o.kubernetes) {
          w = await startKubernetesWatcher({
            ...common, kubeconfig: o.kubeconfig, labelSelector: o.labelSelector, leaseNamespace: o.leaseNamespace, blindAfterMs: o.blindAfterMs,
            namespaces: typeof o.namespaces === "string" ? o.namespaces.split(",").map((s: string) => s.trim()).filter(Boolean) : undefined,
          });
        } else w = await startPodWatcher({ ...common, file: o.static, probeIntervalMs: o.probeIntervalMs, probeTimeoutMs: o.probeTimeoutMs, noProbe: o.probe === false });
      } catch (err) {
        // A bad flag or a cluster without the InferencePool API: one clear line, exit 2.
        if (!(err instanceof RangeError || err instanceof ApiNotServedError)) throw err;
        log.error(err.message);
        process.exit(2);
      }
      log.info({ source: w.source, watcher: w.watcherId }, "pod-watcher started");
      if (o.metricsPort >= 0) await startMetricsServer(o.metricsPort, o.metricsHost, statsRegistry("pod-watcher", () => w.stats), log);
      const first = await Promise.race([w.firstRound.then(() => "round" as const), signal.then(() => "signal" as const)]);
      if (first === "round") {
        log.info({ leader: w.isLeader() }, w.isLeader() ? "first round published" : "first round observed (standby: publishing when it holds the lease)");
        await signal;
      }
      await w.close();
      process.exit(0);
    });
}
