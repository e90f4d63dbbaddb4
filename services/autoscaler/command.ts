/**
 * `jetroute autoscaler`: evaluates the config bucket's autoscaling policies against the fleet's
 * streams and publishes every evaluation on the AUTOSCALE stream (docs/autoscaling.md).
 */
import type { Command } from "commander";
import { addNamespaceOptions, intOption, namespaceFlags, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { loadKubeConfig } from "../pod-watcher/kubernetes.js";
import { startMetricsServer } from "../shared/metrics-server.js";
import { readVerifier } from "../shared/signing-keys.js";
import { kubeWorkloadClient } from "./kube-apply.js";
import { parseWorkloadRef } from "./workload-guard.js";
import { autoscalerRegistry } from "./metrics.js";
import { DEFAULT_AUTOSCALER_LEASE_MS, DEFAULT_TICK_MS, startAutoscaler } from "./service.js";

export function registerAutoscalerCommand(program: Command): void {
  addNamespaceOptions(
    program
      .command("autoscaler")
      .description("evaluate the autoscaling policies (config bucket `autoscale.<name>`) on the fleet's streams; publish every recommendation on AUTOSCALE")
      .option("--id <id>", "this instance's identity in the lease and its records (default: <hostname>-<pid>-<random>)")
      .option("--tick-ms <ms>", "evaluation round interval (each policy also keeps its own intervalMs)", intOption(100), DEFAULT_TICK_MS)
      .option("--leader-election", "run as one of an HA pair: only the holder of the lease publishes (NATS KV lease `autoscaler`)")
      .option("--lease-ms <ms>", "lease duration; the standby takes over within it", intOption(1000), DEFAULT_AUTOSCALER_LEASE_MS)
      .option("--apply", "write each recommendation to its policy's scaleTarget (the workload's scale subresource), through the drain handshake")
      .option("--kubeconfig <file>", "with --apply: kubeconfig file (default: in-cluster, else $KUBECONFIG / ~/.kube/config)")
      .option("--no-drain", "with --apply: set replicas directly and let Kubernetes pick the pods (no drain handshake: requests on removed pods are cut)")
      .option("--config-public-key <file>", "the operator's PEM Ed25519 public key(s): act only on autoscaling policies and pool assignments signed with one (jetroute config --signing-key)")
      .option("--pod-public-key <file>", "the pod-watchers' PEM Ed25519 public key(s): count only pods and heartbeats signed with one (pod-watcher --signing-key)")
      .option("--allow-workload <ref>", "with --apply: Kind/namespace/name of a workload that may be scaled although its pods are not the policy model's pods in PODS (repeatable; e.g. a workload at zero replicas after a restart)", (v: string, acc: string[]) => [...acc, v], [] as string[])
      .option("--metrics-port <port>", "Prometheus /metrics and /healthz port (-1 = off)", intOption(-1, 65535), -1)
      .option("--metrics-host <host>", "metrics listen address", "0.0.0.0"),
    { pool: "gateway pool: fold the pool's namespace (<prefix>.pool.<name>) and publish there; policies still come from the shared config bucket" },
  ).action(async (o) => {
    const log = createLogger("autoscaler");
    const { nats, namespace, pool } = namespaceFlags(o);
    let handle: Awaited<ReturnType<typeof startAutoscaler>>;
    try {
      const allowWorkloads: string[] = [];
      for (const v of o.allowWorkload as string[]) {
        const r = parseWorkloadRef(v);
        if (!r.ok) throw new Error(`--allow-workload ${r.error}`);
        allowWorkloads.push(r.ref);
      }
      const signatures = {
        ...(o.configPublicKey ? { operator: readVerifier(o.configPublicKey, "--config-public-key") } : {}),
        ...(o.podPublicKey ? { podWatcher: readVerifier(o.podPublicKey, "--pod-public-key") } : {}),
      };
      const apply = o.apply ? kubeWorkloadClient(loadKubeConfig(o.kubeconfig)) : undefined;
      handle = await startAutoscaler({ nats, prefix: namespace.prefix, configPrefix: namespace.configPrefix, ...(pool !== undefined ? { pool } : {}), ...(o.id !== undefined ? { id: o.id } : {}), tickMs: o.tickMs, leaderElection: o.leaderElection === true, leaseMs: o.leaseMs, log, signatures, allowWorkloads, ...(apply ? { apply, drain: o.drain !== false } : {}) });
    } catch (err) {
      log.error((err as Error).message);
      process.exit(2);
    }
    const metrics = o.metricsPort >= 0 ? await startMetricsServer(o.metricsPort, o.metricsHost, autoscalerRegistry(handle), log) : undefined;
    await untilSignal();
    metrics?.close();
    await handle.close();
    process.exit(0);
  });
}
