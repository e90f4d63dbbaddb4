/**
 * Kubernetes discovery end to end: the API stand-in (services/kube-standin) driven with the real
 * `kubectl`, `jetroute pod-watcher --kubernetes` (client-node informers) publishing to a real
 * nats-server, and two gateways whose pod sets must mirror the cluster.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { spawn } from "node:child_process";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { KubeStandin } from "../services/kube-standin/server.js";
import { startKubernetesWatcher } from "../services/pod-watcher/kubernetes.js";
import type { PodWatcherHandle } from "../services/pod-watcher/pod-watcher.js";
import { StreamFollower } from "../services/shared/follower.js";
import { spawnJetroute } from "../services/shared/processes.js";
import { streamName } from "../streams/definitions.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const run = promisify(execFile);
const MODEL = "k8s-model";

describe("Kubernetes discovery: kubectl -> API stand-in -> pod-watcher --kubernetes -> PODS -> gateways", () => {
  let env: TestEnv;
  let kube: KubeStandin;
  let kubeconfig: string;
  const dir = mkdtempSync(path.join(os.tmpdir(), "jr-k8s-"));
  const gws: GatewayHandle[] = [];
  const watchers: PodWatcherHandle[] = [];
  const kubectl = async (...args: string[]) => (await run("kubectl", args, { env: { ...process.env, KUBECONFIG: kubeconfig }, timeout: 20_000 })).stdout.trim();
  const podYaml = (name: string, labels: Record<string, string> = {}, ns = "default") => {
    const file = path.join(dir, `${ns}-${name}.yaml`);
    const all = { "model.aibrix.ai/name": MODEL, ...labels };
    writeFileSync(file, [
      "apiVersion: v1", "kind: Pod", "metadata:", `  name: ${name}`, `  namespace: ${ns}`, "  labels:",
      ...Object.entries(all).map(([k, v]) => `    ${k}: ${JSON.stringify(v)}`),
      "spec:", "  containers:", "  - name: vllm", "    image: vllm/vllm-openai:latest", "",
    ].join("\n"));
    return file;
  };
  /** The kubelet's part, done with kubectl: Ready condition and IP through the status subresource; prints the new resourceVersion. */
  const setStatus = (name: string, ready: boolean, ip = "10.0.0.7", ns = "default") =>
    kubectl("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-o", "jsonpath={.metadata.resourceVersion}",
      "-p", JSON.stringify({ status: { phase: "Running", podIP: ip, podIPs: [{ ip }], conditions: [{ type: "Ready", status: ready ? "True" : "False" }] } }));
  const inEvery = (pred: (g: GatewayHandle) => boolean) => gws.every(pred);
  const pod = (g: GatewayHandle, name: string, ns = "default") => g.views.pods.get(MODEL, `${name}.${ns}`);
  const routable = (g: GatewayHandle, name: string, ns = "default") => g.views.pods.readyPods(MODEL).some((p) => p.pod === `${name}.${ns}`);

  beforeAll(async () => {
    env = await startTestEnv();
    kube = await new KubeStandin({ bookmarkIntervalMs: 200 }).start();
    kubeconfig = kube.writeKubeconfig(path.join(dir, "kubeconfig"));
    for (const id of ["gw-k8s-1", "gw-k8s-2"]) gws.push(await env.gateway({ id, podSourceTimeoutMs: 2_000 }));
  });
  afterAll(async () => {
    for (const w of watchers) await w.close().catch(() => undefined);
    await kube?.stop();
    await env?.stop();
  });

  it("kubectl works against the stand-in: discovery, apply, get", async () => {
    expect(await kubectl("apply", "--validate=false", "-f", podYaml("probe-0"))).toBe("pod/probe-0 created");
    expect(await kubectl("get", "pods", "-o", "name")).toBe("pod/probe-0");
    expect(await kubectl("apply", "--validate=false", "-f", podYaml("probe-0"))).toBe("pod/probe-0 unchanged");
    expect(await kubectl("delete", "pod", "probe-0")).toBe('pod "probe-0" deleted');
    expect(await kubectl("get", "pods", "-o", "name")).toBe("");
  });

  it("pod lifecycle (created, not ready, ready, relabelled, terminating, deleted) mirrored in every gateway, and kubectl get -w saw the same changes", async () => {
    const seen: string[] = [];
    const watch = spawn("kubectl", ["get", "pods", "-w", "--output-watch-events", "-o", 'jsonpath={.type} {.object.metadata.name} {.object.metadata.resourceVersion}{"\\n"}'], { env: { ...process.env, KUBECONFIG: kubeconfig } });
    createInterface({ input: watch.stdout }).on("line", (l) => seen.push(l.trim()));
    try {
      const w = await startKubernetesWatcher({ nats: env.server.url, kubeconfig, source: "cluster-a", heartbeatMs: 200, log: quietLog });
      watchers.push(w);
      await w.firstRound;
      await waitFor(() => kube.stats.watches >= 2, 5_000, "kubectl and the informer watching");
      const rvs: string[] = [];
      await kubectl("apply", "--validate=false", "-f", podYaml("vllm-0"));
      rvs.push(await kubectl("get", "pod", "vllm-0", "-o", "jsonpath={.metadata.resourceVersion}"));
      // Created, no IP yet: seen by the watcher, not published (it cannot be addressed).
      await waitFor(() => w.stats.skippedNoIp === 1, 5_000, "watcher saw the pod without an IP");
      expect(inEvery((g) => pod(g, "vllm-0") === undefined)).toBe(true);

      rvs.push(await setStatus("vllm-0", false));
      await waitFor(() => inEvery((g) => pod(g, "vllm-0")?.ready === false), 5_000, "published not ready");
      expect(pod(gws[0] as GatewayHandle, "vllm-0")).toMatchObject({ address: "10.0.0.7:8000", source: "cluster-a", engine: "vllm" });

      rvs.push(await setStatus("vllm-0", true));
      await waitFor(() => inEvery((g) => routable(g, "vllm-0")), 5_000, "ready in every gateway");

      await kubectl("label", "pod", "vllm-0", "model.aibrix.ai/port=8100", "model.aibrix.ai/engine=sglang");
      rvs.push(await kubectl("get", "pod", "vllm-0", "-o", "jsonpath={.metadata.resourceVersion}"));
      await waitFor(() => inEvery((g) => pod(g, "vllm-0")?.address === "10.0.0.7:8100" && pod(g, "vllm-0")?.engine === "sglang"), 5_000, "relabel mirrored");

      await kubectl("annotate", "pod", "vllm-0", "model.aibrix.ai/lora-adapters=sql-lora,chat-lora");
      rvs.push(await kubectl("get", "pod", "vllm-0", "-o", "jsonpath={.metadata.resourceVersion}"));
      await waitFor(() => inEvery((g) => g.views.pods.readyPods("sql-lora").some((p) => p.pod === "vllm-0.default")), 5_000, "adapter from the annotation");

      await kubectl("delete", "pod", "vllm-0", "--grace-period=2", "--wait=false");
      await waitFor(() => inEvery((g) => pod(g, "vllm-0")?.ready === false), 5_000, "terminating = not routable");
      await waitFor(() => inEvery((g) => pod(g, "vllm-0") === undefined), 8_000, "deleted everywhere");
      await waitFor(() => seen.some((l) => l.startsWith("DELETED vllm-0")), 5_000, "kubectl saw the delete");
      const kubectlRvs = seen.filter((l) => l.includes(" vllm-0 ")).map((l) => l.split(" ")[2]);
      for (const rv of rvs) expect(kubectlRvs).toContain(rv);
      expect(seen.filter((l) => l.includes(" vllm-0 ")).map((l) => l.split(" ")[0])).toEqual(["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]);
    } finally {
      watch.kill();
    }
  });

  it("a watch cut and a 410 Gone: the informer resumes, relists, and misses nothing", async () => {
    for (const n of ["cut-0", "cut-1", "cut-2"]) {
      await kubectl("apply", "--validate=false", "-f", podYaml(n));
      await setStatus(n, true, `10.0.1.${n.slice(-1)}`);
    }
    await waitFor(() => inEvery((g) => ["cut-0", "cut-1", "cut-2"].every((n) => routable(g, n))), 5_000, "three pods routable");
    // A cut alone: the change made while the watch is down arrives once it resumes from its resourceVersion.
    const listsBefore = kube.stats.lists;
    kube.cutWatches();
    kube.setPodStatus("default", "cut-0", { ready: false });
    await waitFor(() => inEvery((g) => pod(g, "cut-0")?.ready === false), 5_000, "change during the cut");
    // A cut and the history compacted meanwhile: the resumed watch gets 410 and the informer relists.
    const expiredBefore = kube.stats.expired;
    kube.cutWatches();
    kube.store.delete("pods", "default", "cut-1", Date.now());
    kube.store.create("pods", "default", { apiVersion: "v1", kind: "Pod", metadata: { name: "cut-3", labels: { "model.aibrix.ai/name": MODEL } } }, Date.now());
    kube.setPodStatus("default", "cut-3", { ready: true, podIP: "10.0.1.3" });
    kube.setPodStatus("default", "cut-2", { ready: false });
    kube.store.compact();
    await waitFor(() => inEvery((g) => pod(g, "cut-1") === undefined && routable(g, "cut-3") && pod(g, "cut-2")?.ready === false), 8_000, "relist mirrored");
    expect(kube.stats.expired).toBeGreaterThan(expiredBefore);
    expect(kube.stats.lists).toBeGreaterThan(listsBefore);
    // Bookmarks keep the informer's resourceVersion current: after a quiet spell, history
    // compacted and the watch cut, it resumes from the bookmark instead of relisting.
    // The resourceVersion moves on with a write the informer's selector never shows it.
    kube.store.create("pods", "default", { apiVersion: "v1", kind: "Pod", metadata: { name: "unrelated-0", labels: { app: "web" } } }, Date.now());
    const bookmarks = kube.stats.bookmarks;
    await waitFor(() => kube.stats.bookmarks >= bookmarks + 3, 5_000, "bookmarks sent");
    const [lists, expired] = [kube.stats.lists, kube.stats.expired];
    kube.store.compact();
    kube.cutWatches();
    kube.setPodStatus("default", "cut-2", { ready: true });
    await waitFor(() => inEvery((g) => routable(g, "cut-2")), 8_000, "change after the cut");
    expect([kube.stats.lists, kube.stats.expired]).toEqual([lists, expired]);
  });

  it("watcher down while pods were deleted and added: reconciled on restart; another source's pods untouched; its pods unroutable while it is down", async () => {
    for (const w of watchers.splice(0)) await w.close();
    await env.publishPod({ model: MODEL, pod: "static-0", address: "127.0.0.1:9", source: "static-elsewhere" });
    const args = ["pod-watcher", "--kubernetes", "--kubeconfig", kubeconfig, "--source", "cluster-a", "--heartbeat-ms", "200", "--nats", env.server.url];
    let proc = spawnJetroute("pod-watcher", args, { logFile: path.join(dir, "pod-watcher-1.log") });
    try {
      await waitFor(() => inEvery((g) => routable(g, "cut-3") && routable(g, "cut-0") === false), 10_000, "watcher process publishing");
      await proc.kill();
      await kubectl("delete", "pod", "cut-3");
      await kubectl("apply", "--validate=false", "-f", podYaml("late-0"));
      await setStatus("late-0", true, "10.0.2.1");
      // Nobody vouches for cluster-a now: its pods stop being routable after the 2 s timeout.
      await waitFor(() => inEvery((g) => !routable(g, "cut-3")), 6_000, "silent source unroutable");
      expect(inEvery((g) => pod(g, "cut-3")?.ready === true)).toBe(true);
      proc = spawnJetroute("pod-watcher", args, { logFile: path.join(dir, "pod-watcher-2.log") });
      await waitFor(() => inEvery((g) => pod(g, "cut-3") === undefined && routable(g, "late-0")), 10_000, "reconciled after the restart");
      expect(inEvery((g) => g.views.pods.get(MODEL, "static-0")?.source === "static-elsewhere")).toBe(true);
    } finally {
      await proc.stop();
    }
  });

  it("HA pair on a coordination.k8s.io Lease: kill the leader, the other publishes within the lease; kubectl sees the holder", async () => {
    const leaseMs = 2_000;
    const mk = (id: string) => startKubernetesWatcher({ nats: env.server.url, kubeconfig, source: "cluster-ha", namespaces: ["ha"], heartbeatMs: 100, leaderElection: true, leaseMs, leaseNamespace: "default", watcherId: id, log: quietLog });
    await kubectl("apply", "--validate=false", "-f", podYaml("ha-0", {}, "ha"));
    await setStatus("ha-0", true, "10.0.3.1", "ha");
    const one = await mk("ha-one");
    watchers.push(one);
    await waitFor(() => one.isLeader(), 5_000, "first leader");
    const two = await mk("ha-two");
    watchers.push(two);
    await waitFor(() => inEvery((g) => routable(g, "ha-0", "ha")), 5_000, "ha pod routable");
    expect(await kubectl("get", "lease", "jetroute-pod-watcher-cluster-ha", "-n", "default", "-o", "jsonpath={.spec.holderIdentity}")).toBe("ha-one");
    expect(two.isLeader()).toBe(false);
    // Every heartbeat of the source, in stream order: never two publishers.
    const beats: string[] = [];
    const f = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "test-k8s-ha", family: "podsrc", types: ["pod-source"] as const,
      stream: streamName("jr", "PODS"), filter: env.subjects.all("podsrc"), startAt: { kind: "all" },
      onEvent: (ev) => {
        if (ev.source === "cluster-ha") beats.push(ev.watcher);
      },
    });
    await f.start();
    const killedAt = performance.now();
    await one.close({ release: false });
    // The waitFor bound (3 leases) is the correctness bound: lease + two renewal rounds, with room for a loaded machine.
    await waitFor(() => two.isLeader(), 3 * leaseMs, "standby takes over");
    // Not before the lease ran out on the standby's clock (it never saw a release).
    expect(performance.now() - killedAt).toBeGreaterThan(leaseMs / 2);
    await waitFor(() => beats.includes("ha-two"), 3_000, "the new leader's heartbeat");
    await f.stop();
    const firstTwo = beats.indexOf("ha-two");
    expect(beats.slice(firstTwo).every((w) => w === "ha-two")).toBe(true);
    const sourceOf = (g: GatewayHandle) => g.views.pods.sourceInfo().find((s) => s.source === "cluster-ha");
    await waitFor(() => inEvery((g) => sourceOf(g)?.watcher === "ha-two"), 3_000, "gateways hear the new leader");
    expect(await kubectl("get", "lease", "jetroute-pod-watcher-cluster-ha", "-n", "default", "-o", "jsonpath={.spec.holderIdentity}")).toBe("ha-two");
    expect(inEvery((g) => routable(g, "ha-0", "ha"))).toBe(true);
  });

  it("a half-open watch (connection up, nothing ever arrives, never closed) is aborted by the watchdog and the change is seen", async () => {
    const w = await startKubernetesWatcher({
      nats: env.server.url, kubeconfig, source: "cluster-stall", namespaces: ["stall"], heartbeatMs: 200, watchTimeoutSeconds: [1, 2], watchdogMarginMs: 500, log: quietLog,
    });
    watchers.push(w);
    await kubectl("apply", "--validate=false", "-f", podYaml("stall-0", {}, "stall"));
    await setStatus("stall-0", true, "10.0.4.1", "stall");
    await waitFor(() => inEvery((g) => routable(g, "stall-0", "stall")), 8_000, "first pod routable");
    expect(kube.muteWatches()).toBeGreaterThan(0);
    await kubectl("apply", "--validate=false", "-f", podYaml("stall-1", {}, "stall"));
    await setStatus("stall-1", true, "10.0.4.2", "stall");
    // The muted watch will never deliver this: only the watchdog's restart can.
    await waitFor(() => inEvery((g) => routable(g, "stall-1", "stall")), 10_000, "pod seen after the watchdog restarted the watch");
    expect(w.stats.watchStalls).toBeGreaterThan(0);
  });

  it("an informer refused (403) for longer than blindAfterMs stops the heartbeats: the source goes silent, and routable again once it sees", async () => {
    const w = await startKubernetesWatcher({ nats: env.server.url, kubeconfig, source: "cluster-blind", namespaces: ["blind"], heartbeatMs: 200, blindAfterMs: 1_000, log: quietLog });
    watchers.push(w);
    await kubectl("apply", "--validate=false", "-f", podYaml("blind-0", {}, "blind"));
    await setStatus("blind-0", true, "10.0.5.1", "blind");
    await waitFor(() => inEvery((g) => routable(g, "blind-0", "blind")), 8_000, "routable while the informer sees");
    kube.forbid("pods");
    try {
      // What kubectl makes of it: the API's Forbidden Status.
      await expect(kubectl("get", "pods", "-n", "blind")).rejects.toThrow(/forbidden/i);
      kube.cutWatches();
      await waitFor(() => inEvery((g) => !routable(g, "blind-0", "blind")), 10_000, "unroutable: nobody can see the pod");
      expect(inEvery((g) => pod(g, "blind-0", "blind")?.ready === true)).toBe(true); // still published, just unvouched
      expect(w.stats.blind).toBe(1);
    } finally {
      kube.forbid("pods", false);
    }
    await waitFor(() => inEvery((g) => routable(g, "blind-0", "blind")), 15_000, "routable again once the informer sees");
  });

  it("a watch that fails right after connecting keeps backing off (the backoff restarts only after a watch delivered)", async () => {
    const w = await startKubernetesWatcher({ nats: env.server.url, kubeconfig, source: "cluster-flaky", namespaces: ["flaky"], heartbeatMs: 200, log: quietLog });
    watchers.push(w);
    await kubectl("apply", "--validate=false", "-f", podYaml("flaky-0", {}, "flaky"));
    await setStatus("flaky-0", true, "10.0.6.1", "flaky");
    await waitFor(() => inEvery((g) => routable(g, "flaky-0", "flaky")), 8_000, "routable");
    const errors = w.stats.informerErrors ?? 0;
    kube.cutWatchesOnConnect = true;
    try {
      kube.cutWatches();
      await waitFor(() => (w.stats.informerErrors ?? 0) >= errors + 4, 15_000, "four failed watches");
      // Each restart connected, then failed before delivering anything: the attempt count grows.
      expect(w.stats.backoffAttempt).toBeGreaterThanOrEqual(4);
    } finally {
      kube.cutWatchesOnConnect = false;
    }
    await setStatus("flaky-0", false, "10.0.6.1", "flaky");
    await waitFor(() => inEvery((g) => pod(g, "flaky-0", "flaky")?.ready === false), 15_000, "watching again");
  });
});
