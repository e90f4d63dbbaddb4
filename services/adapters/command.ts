/**
 * `jetroute adapter-controller`: places the declared LoRA adapters on the fleet's pods
 * (controller.ts). `jetroute adapters list`: every adapter's placement as its last ADAPTERS record
 * says (phase, pods loaded, desired replicas, demand, the last reason), beside the declarations.
 */
import type { Command } from "commander";
import { type AdapterPlacement, AdapterPlacement as AdapterPlacementSchema } from "../../schemas/adapters.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { withBucket } from "../admin/config-bucket.js";
import { loadKubeConfig } from "../pod-watcher/kubernetes.js";
import { addNamespaceOptions, intOption, type NamespaceOptionValues, namespaceFlags, untilSignal } from "../shared/cli-options.js";
import { createLogger } from "../shared/log.js";
import { readVerifier } from "../shared/signing-keys.js";
import { connectNats } from "../shared/nats.js";
import { DEFAULT_ADAPTER_LEASE_MS, DEFAULT_ADAPTER_TICK_MS, DEFAULT_FAILURE_BACKOFF_MS, DEFAULT_LOAD_TIMEOUT_MS, DEFAULT_MAX_LORAS, DEFAULT_UNLOAD_GRACE_MS, startAdapterController } from "./controller.js";
import { pollKubeDeclarations } from "./declarations.js";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { ADAPTER_KEY_PREFIX } from "../../schemas/adapters.js";
import { decodeToken } from "../../streams/tokens.js";

export function registerAdapterCommands(program: Command): void {
  addNamespaceOptions(
    program
      .command("adapter-controller")
      .description("place the declared LoRA adapters (config bucket `adapter.<name>`, ModelAdapters with --kubernetes) on the pods through the engines' runtime LoRA API; publish every placement on ADAPTERS")
      .option("--id <id>", "this instance's identity in the lease and its records (default: <hostname>-<pid>-<random>)")
      .option("--tick-ms <ms>", "placement round interval", intOption(50), DEFAULT_ADAPTER_TICK_MS)
      .option("--leader-election", "run as one of an HA pair: only the holder of the lease places (NATS KV lease `adapter-controller`)")
      .option("--lease-ms <ms>", "lease duration; the standby takes over within it", intOption(1000), DEFAULT_ADAPTER_LEASE_MS)
      .option("--max-loras <n>", "a pod's max_loras until its engine's LoRA metric says (set it to the engines' --max-loras)", intOption(1, 1024), DEFAULT_MAX_LORAS)
      .option("--load-timeout-ms <ms>", "one load or unload call's timeout", intOption(100), DEFAULT_LOAD_TIMEOUT_MS)
      .option("--unload-grace-ms <ms>", "after an unload is recorded (gateways stop routing there), wait this long before the engine call", intOption(0), DEFAULT_UNLOAD_GRACE_MS)
      .option("--failure-backoff-ms <ms>", "a pod where an adapter failed maxAttempts loads is not tried for it again for this long", intOption(0), DEFAULT_FAILURE_BACKOFF_MS)
      .option("--kubernetes", "also place the ModelAdapters (model.aibrix.ai/v1alpha1) of the API server, and write their status")
      .option("--kubeconfig <file>", "with --kubernetes: kubeconfig file (default: in-cluster, else $KUBECONFIG / ~/.kube/config)")
      .option("--namespaces <list>", "with --kubernetes: comma-separated namespaces (default: all)")
      .option("--kube-poll-ms <ms>", "with --kubernetes: how often ModelAdapters are listed", intOption(100), 2_000)
      .option("--config-public-key <file>", "the operator's PEM Ed25519 public key(s): place only adapter declarations of the config bucket signed with one (jetroute config set-adapter --signing-key)"),
  ).action(async (o) => {
    const log = createLogger("adapter-controller");
    const { nats, namespace } = namespaceFlags(o);
    let handle: Awaited<ReturnType<typeof startAdapterController>>;
    try {
      const signatures = o.configPublicKey ? { operator: readVerifier(o.configPublicKey, "--config-public-key") } : {};
      const kube = o.kubernetes ? pollKubeDeclarations(loadKubeConfig(o.kubeconfig), { ...(o.namespaces ? { namespaces: String(o.namespaces).split(",").map((s: string) => s.trim()).filter(Boolean) } : {}), pollMs: o.kubePollMs, log }) : undefined;
      handle = await startAdapterController({
        nats, prefix: namespace.prefix, configPrefix: namespace.configPrefix, ...(o.id !== undefined ? { id: o.id } : {}), tickMs: o.tickMs, leaderElection: o.leaderElection === true, leaseMs: o.leaseMs,
        maxLoras: o.maxLoras, loadTimeoutMs: o.loadTimeoutMs, unloadGraceMs: o.unloadGraceMs, failureBackoffMs: o.failureBackoffMs,
        ...(kube ? { kube } : {}), signatures, ...(process.env.JETROUTE_ENGINE_API_KEY ? { engineApiKey: process.env.JETROUTE_ENGINE_API_KEY } : {}), log,
      });
    } catch (err) {
      log.error((err as Error).message);
      process.exit(2);
    }
    await untilSignal();
    await handle.close();
    process.exit(0);
  });

  const adapters = program.command("adapters").description("LoRA adapters managed by the adapter controller");
  addNamespaceOptions(adapters.command("list").description("every adapter's placement (its last ADAPTERS record) and the declared adapters not placed yet").option("--json", "one JSON record per line")).action(async (o: NamespaceOptionValues & { json?: boolean }) => {
    const { nats: urls, namespace } = namespaceFlags(o);
    const recs = await readPlacements(urls, namespace.prefix);
    const declared = await withBucket(o, async (kv) => {
      const names: string[] = [];
      for await (const k of await kv.keys(`${ADAPTER_KEY_PREFIX}>`)) {
        try {
          names.push(decodeToken(k.slice(ADAPTER_KEY_PREFIX.length)));
        } catch {
          // not ours
        }
      }
      return names;
    });
    const rows = [...recs.values()].filter((r) => !r.deleted).sort((a, b) => (a.adapter < b.adapter ? -1 : 1));
    if (o.json) {
      for (const r of rows) console.log(JSON.stringify(r));
      return;
    }
    const table = [["ADAPTER", "BASE", "PHASE", "LOADED", "DESIRED", "RPS", "WAITING", "PODS", "REASON"]];
    for (const r of rows) {
      const loaded = r.pods.filter((p) => p.state === "loaded").map((p) => p.pod);
      const other = r.pods.filter((p) => p.state !== "loaded").map((p) => `${p.pod}(${p.state})`);
      const failed = (r.failed ?? []).map((f) => `${f.pod}(failed: ${f.error})`);
      table.push([r.adapter, r.baseModel ?? "-", r.phase, String(loaded.length), String(r.desired), String(r.demand.rps), String(r.demand.queued), [...loaded, ...other, ...failed].join(",") || "-", r.reason]);
    }
    for (const name of declared.sort()) if (!recs.has(name)) table.push([name, "-", "(not placed yet)", "0", "-", "-", "-", "-", "no adapter-controller record yet"]);
    const widths = table[0]?.map((_, i) => Math.min(60, Math.max(...table.map((row) => (row[i] ?? "").length)))) ?? [];
    for (const row of table) console.log(row.map((c, i) => (i === row.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join("  "));
  });
}

const checkRecord = TypeCompiler.Compile(AdapterPlacementSchema);

/** The last ADAPTERS record of every adapter (direct gets of the last message per subject). */
export async function readPlacements(urls: string | string[], prefix: string): Promise<Map<string, AdapterPlacement>> {
  const nats = await connectNats(urls, "jetroute-adapters-list");
  const out = new Map<string, AdapterPlacement>();
  try {
    const subjects = new Subjects(prefix);
    const stream = streamName(prefix, "ADAPTERS");
    const info = await nats.jsm.streams.info(stream, { subjects_filter: subjects.all("adapters") });
    for (const subject of Object.keys(info.state.subjects ?? {})) {
      const m = await nats.jsm.streams.getMessage(stream, { last_by_subj: subject });
      if (!m) continue;
      const rec = m.json() as unknown;
      if (checkRecord.Check(rec)) out.set(rec.adapter, rec);
    }
  } finally {
    await nats.nc.close();
  }
  return out;
}
