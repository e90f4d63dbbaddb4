/**
 * InferencePool discovery end to end: the API stand-in serving InferencePools, driven with the
 * real `kubectl`; `pod-watcher --inference-pool` (client-node informers on the pool and its
 * namespace's pods) publishing to a real nats-server; two gateways whose pod sets must mirror the
 * pool. Engines answering `/v1/models` are small HTTP servers on loopback addresses (127.0.0.x,
 * one per "pod"), so models come from the engines when pods carry no model label.
 */
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { KubeStandin } from "../services/kube-standin/server.js";
import { startInferencePoolWatcher } from "../services/pod-watcher/k8s-inference-pool.js";
import type { PodWatcherHandle } from "../services/pod-watcher/pod-watcher.js";
import { cliPath } from "../services/shared/processes.js";
import { fire } from "../services/shared/publish.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const run = promisify(execFile);

/** A fake engine's `/v1/models` on `ip:port`: a base model and its adapters. */
async function engine(ip: string, port: number, model: string, adapters: string[] = []): Promise<http.Server> {
  const s = http.createServer((req, res) => {
    if (req.url !== "/v1/models") {
      res.writeHead(404).end();
      return;
    }
    const data = [{ id: model, object: "model", parent: null }, ...adapters.map((a) => ({ id: a, object: "model", parent: model }))];
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ object: "list", data }));
  });
  await new Promise<void>((r) => s.listen(port, ip, r));
  return s;
}

describe("InferencePool discovery: kubectl -> API stand-in -> pod-watcher --inference-pool -> PODS -> gateways", () => {
  let env: TestEnv;
  let kube: KubeStandin;
  let kubeconfig: string;
  const dir = mkdtempSync(path.join(os.tmpdir(), "jr-infpool-"));
  const gws: GatewayHandle[] = [];
  const watchers: PodWatcherHandle[] = [];
  const engines: http.Server[] = [];
  let portA = 0;
  let portB = 0;
  const kubectl = async (...args: string[]) => (await run("kubectl", args, { env: { ...process.env, KUBECONFIG: kubeconfig }, timeout: 20_000 })).stdout.trim();
  const apply = async (name: string, yaml: string[]) => {
    const file = path.join(dir, `${name}.yaml`);
    writeFileSync(file, `${yaml.join("\n")}\n`);
    return kubectl("apply", "--validate=false", "-f", file);
  };
  const pool = (name: string, labels: Record<string, string>, ports: number[], extra: string[] = []) =>
    apply(`pool-${name}`, [
      "apiVersion: inference.networking.k8s.io/v1", "kind: InferencePool", "metadata:", `  name: ${name}`, "spec:", "  selector:", "    matchLabels:",
      ...Object.entries(labels).map(([k, v]) => `      ${k}: ${JSON.stringify(v)}`),
      "  targetPorts:", ...ports.map((p) => `  - number: ${p}`),
      "  endpointPickerRef:", "    name: jetroute-picker", "    port:", "      number: 9002", "    failureMode: FailClose", ...extra,
    ]);
  const podApply = (name: string, labels: Record<string, string>) =>
    apply(`pod-${name}`, [
      "apiVersion: v1", "kind: Pod", "metadata:", `  name: ${name}`, "  labels:", ...Object.entries(labels).map(([k, v]) => `    ${k}: ${JSON.stringify(v)}`),
      "spec:", "  containers:", "  - name: vllm", "    image: vllm/vllm-openai:latest",
    ]);
  const setStatus = (name: string, ready: boolean, ip: string) =>
    kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p", JSON.stringify({ status: { phase: "Running", podIP: ip, podIPs: [{ ip }], conditions: [{ type: "Ready", status: ready ? "True" : "False" }] } }));
  const every = (pred: (g: GatewayHandle) => boolean) => gws.every(pred);
  const ready = (g: GatewayHandle, model: string) => g.views.pods.readyPods(model).map((p) => `${p.pod}@${p.address}`).sort();

  beforeAll(async () => {
    env = await startTestEnv();
    kube = await new KubeStandin({ bookmarkIntervalMs: 200 }).start();
    kubeconfig = kube.writeKubeconfig(path.join(dir, "kubeconfig"));
    for (const id of ["gw-pool-1", "gw-pool-2"]) gws.push(await env.gateway({ id, podSourceTimeoutMs: 2_000 }));
    // Two ports free on every loopback address used: bind them on 127.0.0.2, reuse on the others.
    const a = await engine("127.0.0.2", 0, "llama-8b", ["sql-lora"]);
    portA = (a.address() as AddressInfo).port;
    const b = await engine("127.0.0.2", 0, "llama-8b", ["sql-lora"]);
    portB = (b.address() as AddressInfo).port;
    engines.push(a, b);
    engines.push(await engine("127.0.0.3", portA, "llama-8b"), await engine("127.0.0.3", portB, "llama-8b"));
    engines.push(await engine("127.0.0.4", portA, "mistral-7b"));
  });
  afterAll(async () => {
    for (const w of watchers) await w.close().catch(() => undefined);
    for (const e of engines) e.close();
    await kube?.stop();
    await env?.stop();
  });

  it("kubectl applies, lists and watches InferencePools on the stand-in (list/watch/resourceVersion, generation)", async () => {
    const seen: string[] = [];
    const watch = spawn("kubectl", ["get", "inferencepools", "-w", "--output-watch-events", "-o", 'jsonpath={.type} {.object.metadata.name} {.object.metadata.generation}{"\\n"}'], { env: { ...process.env, KUBECONFIG: kubeconfig } });
    createInterface({ input: watch.stdout }).on("line", (l) => seen.push(l.trim()));
    try {
      await waitFor(() => kube.stats.watches >= 1, 5_000, "kubectl watching");
      expect(await pool("probe", { app: "x" }, [8000])).toBe("inferencepool.inference.networking.k8s.io/probe created");
      expect(await pool("probe", { app: "x" }, [8000])).toBe("inferencepool.inference.networking.k8s.io/probe unchanged");
      expect(await pool("probe", { app: "x" }, [8000, 8001])).toBe("inferencepool.inference.networking.k8s.io/probe configured");
      expect(await kubectl("get", "infpool", "probe", "-o", "jsonpath={.metadata.generation} {.spec.targetPorts[*].number}")).toBe("2 8000 8001");
      // status is the subresource's: a status written with the object is not stored.
      await kubectl("patch", "infpool", "probe", "--type=merge", "-p", '{"status":{"parents":[{"parentRef":{"name":"gw"}}]}}');
      expect(await kubectl("get", "infpool", "probe", "-o", "jsonpath={.status}")).toBe("");
      await kubectl("patch", "infpool", "probe", "--subresource=status", "--type=merge", "-p", '{"status":{"parents":[{"parentRef":{"name":"gw"}}]}}');
      expect(await kubectl("get", "infpool", "probe", "-o", "jsonpath={.status.parents[0].parentRef.name} {.metadata.generation}")).toBe("gw 2");
      expect(await kubectl("delete", "infpool", "probe")).toBe('inferencepool.inference.networking.k8s.io "probe" deleted');
      await waitFor(() => seen.some((l) => l.startsWith("DELETED probe")), 5_000, "kubectl saw the delete");
      expect(seen.filter((l) => l.includes(" probe ")).map((l) => l.split(" ")[0])).toEqual(["ADDED", "MODIFIED", "MODIFIED", "DELETED"]);
    } finally {
      watch.kill();
    }
    // A watch from a compacted resourceVersion gets 410, as for pods.
    const collection = `${kube.url}/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools`;
    const list = (await (await fetch(collection)).json()) as { kind: string; apiVersion: string; metadata: { resourceVersion: string } };
    expect(list).toMatchObject({ kind: "InferencePoolList", apiVersion: "inference.networking.k8s.io/v1" });
    await pool("probe2", { app: "x" }, [8000]);
    kube.store.compact();
    const res = await fetch(`${collection}?watch=true&resourceVersion=${list.metadata.resourceVersion}`);
    expect((await res.text()).trim()).toContain('"code":410');
    await kubectl("delete", "infpool", "probe2");
  });

  it("pods matching the pool (two ports = two ranks) become routable in every gateway with the engine's models; selector and port changes apply live; the pool deleted -> they leave", async () => {
    await podApply("chat-0", { app: "chat" });
    await podApply("chat-1", { app: "chat" });
    await podApply("other-0", { app: "other" });
    await setStatus("chat-0", true, "127.0.0.2");
    await setStatus("chat-1", true, "127.0.0.3");
    await setStatus("other-0", true, "127.0.0.4");
    await pool("chat", { app: "chat" }, [portA, portB]);
    const w = await startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "default/chat", source: "pool-chat", heartbeatMs: 200, objectivesApiVersion: "none", inferencePoolModels: ["llama-8b", "sql-lora", "mistral-7b"], log: quietLog });
    watchers.push(w);
    await w.firstRound;
    const four = [`chat-0-rank-0.default@127.0.0.2:${portA}`, `chat-0-rank-1.default@127.0.0.2:${portB}`, `chat-1-rank-0.default@127.0.0.3:${portA}`, `chat-1-rank-1.default@127.0.0.3:${portB}`];
    await waitFor(() => every((g) => JSON.stringify(ready(g, "llama-8b")) === JSON.stringify(four)), 8_000, "four ranks routable");
    // The adapter chat-0's engine lists is routable there (on both of its ranks).
    await waitFor(() => every((g) => ready(g, "sql-lora").length === 2), 5_000, "adapter from /v1/models");
    expect(every((g) => ready(g, "mistral-7b").length === 0)).toBe(true);
    // A pod that stops being ready, and one that stops matching.
    await setStatus("chat-1", false, "127.0.0.3");
    await waitFor(() => every((g) => ready(g, "llama-8b").length === 2), 5_000, "chat-1 not ready");
    await kubectl("label", "pod", "chat-0", "app=moved", "--overwrite");
    await waitFor(() => every((g) => ready(g, "llama-8b").length === 0 && g.views.pods.get("llama-8b", "chat-0-rank-0.default") === undefined), 5_000, "chat-0 left the pool");
    await setStatus("chat-1", true, "127.0.0.3");
    // The selector changed live: the pool now selects the moved pod and the other model's pod (no labels: reported, each under its own model).
    await pool("chat", { tier: "x" }, [portA]);
    await kubectl("label", "pod", "chat-0", "tier=x");
    await kubectl("label", "pod", "other-0", "tier=x");
    await waitFor(() => every((g) => JSON.stringify(ready(g, "llama-8b")) === JSON.stringify([`chat-0.default@127.0.0.2:${portA}`]) && ready(g, "mistral-7b").length === 1), 8_000, "new selector, one port");
    await waitFor(() => w.stats.mixedModels === 2, 5_000, "two models without labels reported");
    expect(every((g) => g.views.pods.get("llama-8b", "chat-1-rank-0.default") === undefined)).toBe(true);
    // The pool deleted: its endpoints leave.
    await kubectl("delete", "infpool", "chat");
    await waitFor(() => every((g) => ready(g, "llama-8b").length === 0 && ready(g, "mistral-7b").length === 0), 5_000, "pool gone");
    expect(w.stats.poolPresent).toBe(0);
  });

  it("bad pools are refused with a metric and a log line, never a crash; the last valid spec stays", async () => {
    await pool("bad", { app: "chat" }, [portA]);
    const w = await startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "default/bad", source: "pool-bad", heartbeatMs: 200, modelLabel: "model", objectivesApiVersion: "none", log: quietLog });
    watchers.push(w);
    await w.firstRound;
    await kubectl("label", "pod", "chat-1", "model=llama-8b");
    await waitFor(() => every((g) => ready(g, "llama-8b").includes(`chat-1.default@127.0.0.3:${portA}`)), 5_000, "valid pool routable (model from the label)");
    // Stored directly: the API server's CRD validation would refuse these, a stand-in without it must not crash the watcher.
    const patch = (spec: unknown) => kube.store.patch("inferencepools.inference.networking.k8s.io", "default", "bad", "application/merge-patch+json", { spec });
    patch({ targetPorts: Array.from({ length: 9 }, (_, i) => ({ number: 9000 + i })) });
    await waitFor(() => w.stats.poolRejectedTooManyPorts === 1, 5_000, "nine ports refused");
    patch({ targetPorts: [{ number: 9000 }, { number: 9000 }] });
    await waitFor(() => w.stats.poolRejectedDuplicatePorts === 1, 5_000, "duplicate ports refused");
    patch({ targetPorts: [{ number: portA }], selector: { matchLabels: null } });
    await waitFor(() => w.stats.poolRejectedEmptySelector === 1, 5_000, "empty selector refused");
    expect(w.stats.poolInvalid).toBe(1);
    // Meanwhile the last valid spec stays in force.
    expect(every((g) => ready(g, "llama-8b").includes(`chat-1.default@127.0.0.3:${portA}`))).toBe(true);
    patch({ selector: { matchLabels: { app: "chat" } } });
    await waitFor(() => w.stats.poolInvalid === 0, 5_000, "valid again");
  });

  it("an HA pair on a Lease: only the leader publishes; when it stops, the standby takes over and the endpoints stay; another source's pods are untouched", async () => {
    await podApply("ha-0", { app: "ha", model: "llama-8b" });
    await setStatus("ha-0", true, "127.0.0.2");
    await pool("ha", { app: "ha" }, [portA]);
    await env.publishPod({ model: "llama-8b", pod: "static-0", address: "127.0.0.9:1", source: "someone-else" });
    // The other source is a live watcher: it beats, as a real one would. Without beats its pods
    // leave after the gateways' 2 s source timeout, which a loaded host's takeover can outlast.
    const otherSource = () => fire(env.nats.nc, env.subjects.podSource("someone-else"), { type: "pod-source", source: "someone-else", watcher: "static", pods: 1, intervalMs: 200, ts: Date.now() });
    otherSource();
    const beats = setInterval(otherSource, 200);
    const start = (id: string) => startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "default/ha", source: "pool-ha", watcherId: id, leaderElection: true, leaseMs: 1_500, heartbeatMs: 200, modelLabel: "model", objectivesApiVersion: "none", log: quietLog });
    const a = await start("ha-a");
    const b = await start("ha-b");
    try {
      await waitFor(() => [a, b].filter((w) => w.isLeader()).length === 1, 8_000, "one leader");
      await waitFor(() => every((g) => ready(g, "llama-8b").includes(`ha-0.default@127.0.0.2:${portA}`)), 5_000, "pool endpoint routable");
      expect(await kubectl("get", "lease", "-o", "name")).toContain("lease.coordination.k8s.io/jetroute-pod-watcher-pool-ha");
      const [leader, standby] = a.isLeader() ? [a, b] : [b, a];
      await leader.close();
      await waitFor(() => standby.isLeader(), 8_000, "standby took over");
      await kubectl("label", "pod", "ha-0", "app=gone", "--overwrite");
      await waitFor(() => every((g) => !ready(g, "llama-8b").some((p) => p.startsWith("ha-0."))), 5_000, "the new leader applies changes");
      expect(every((g) => ready(g, "llama-8b").includes("static-0@127.0.0.9:1"))).toBe(true);
    } finally {
      clearInterval(beats);
      await a.close().catch(() => undefined);
      await b.close().catch(() => undefined);
    }
  });

  it("an engine naming a model the pool does not serve (--inference-pool-models) is not published; its adapters outside the list are dropped", async () => {
    await podApply("guard-0", { app: "guarded" });
    await podApply("guard-1", { app: "guarded" });
    await setStatus("guard-0", true, "127.0.0.2");
    await setStatus("guard-1", true, "127.0.0.4");
    await pool("guarded", { app: "guarded" }, [portA]);
    const w = await startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "default/guarded", source: "pool-guarded", heartbeatMs: 200, objectivesApiVersion: "none", inferencePoolModels: ["llama-8b"], log: quietLog });
    watchers.push(w);
    await w.firstRound;
    await waitFor(() => every((g) => ready(g, "llama-8b").includes(`guard-0.default@127.0.0.2:${portA}`)), 8_000, "the listed model's endpoint routable");
    await waitFor(() => w.stats.modelsRefused === 1 && w.stats.adaptersDropped === 1, 5_000, () => `the other model's endpoint refused (${JSON.stringify(w.stats)})`);
    // guard-1's engine says mistral-7b, guard-0's lists sql-lora: neither is routable through this pool.
    expect(every((g) => g.views.pods.get("mistral-7b", "guard-1.default") === undefined)).toBe(true);
    expect(every((g) => !ready(g, "sql-lora").some((p) => p.startsWith("guard-0.")))).toBe(true);
    await w.close();
    await kubectl("delete", "infpool", "guarded");
    // Neither flag: a clear error at start, no engine asked.
    await expect(startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "default/guarded", source: "s", objectivesApiVersion: "none", log: quietLog })).rejects.toThrow(/needs --inference-pool-models/);
  });

  it("an unknown API version, and a cluster without the CRD, are clear errors at start", async () => {
    await expect(startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "default/x", poolApiVersion: "inference.networking.x-k8s.io/v1alpha2", log: quietLog })).rejects.toThrow(/unknown InferencePool API version .* implements inference.networking.k8s.io\/v1/);
    await expect(startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "Bad/x", log: quietLog })).rejects.toThrow(/--inference-pool must be <namespace>\/<name>/);
    // The command: one clear log line and exit status 2, nothing published.
    const cli = await run(process.execPath, [cliPath(), "pod-watcher", "--inference-pool", "default/x", "--inference-pool-api-version", "inference.networking.k8s.io/v2", "--kubeconfig", kubeconfig, "--nats", env.server.url]).then(
      () => ({ code: 0, stderr: "", stdout: "" }),
      (e: { code: number; stdout: string; stderr: string }) => e,
    );
    expect(cli.code).toBe(2);
    expect(`${cli.stdout}${cli.stderr}`).toMatch(/unknown InferencePool API version \\"inference.networking.k8s.io\/v2\\": this pod-watcher implements inference.networking.k8s.io\/v1 only/);
    const bare = await new KubeStandin({ resources: [] }).start();
    try {
      const kc = bare.writeKubeconfig(path.join(dir, "bare-kubeconfig"));
      await expect(startInferencePoolWatcher({ nats: env.server.url, kubeconfig: kc, inferencePool: "default/x", source: "s", modelLabel: "model", log: quietLog })).rejects.toThrow(/does not serve inferencepools.inference.networking.k8s.io\/v1: install the InferencePool CRD/);
    } finally {
      await bare.stop();
    }
  });
});
