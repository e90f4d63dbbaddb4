/**
 * The drain handshake end to end: a Deployment of simulated engines on the Kubernetes stand-in
 * (its ReplicaSet-like loop removes pods by pod-deletion-cost), `pod-watcher --kubernetes`, a
 * gateway behind the dev front, steady streaming traffic, and `jetroute autoscaler --apply`
 * scaling the Deployment down — with the handshake (the chosen pod drains, then leaves: no request
 * cut) and without it (Kubernetes picks a busy pod: requests cut), checked with the real kubectl.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { type KV, Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AUTOSCALE_KEY_PREFIX, type AutoscaleRecommendation } from "../schemas/autoscale.js";
import { kubeWorkloadClient } from "../services/autoscaler/kube-apply.js";
import { type AutoscalerHandle, startAutoscaler } from "../services/autoscaler/service.js";
import { startFront, type FrontServer } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { KubeStandin } from "../services/kube-standin/server.js";
import { loadKubeConfig, startKubernetesWatcher } from "../services/pod-watcher/kubernetes.js";
import type { PodWatcherHandle } from "../services/pod-watcher/pod-watcher.js";
import { StreamFollower } from "../services/shared/follower.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { configBucketName, streamName } from "../streams/definitions.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const run = promisify(execFile);
const MODEL = "drain-model";
const NS = "llm";

describe("autoscaler --apply: scale-down with and without the drain handshake (kubectl, stand-in, real NATS)", () => {
  let env: TestEnv;
  let kube: KubeStandin;
  let kubeconfig: string;
  let fleet: SimFleet;
  let gw: GatewayHandle;
  let front: FrontServer;
  let watcher: PodWatcherHandle;
  let kv: KV;
  const scalers: AutoscalerHandle[] = [];
  const records: AutoscaleRecommendation[] = [];
  let reader: StreamFollower<"autoscale">;
  const dir = mkdtempSync(path.join(os.tmpdir(), "jr-drain-"));
  /** Kubernetes pod -> the simulated engine serving it. */
  const engineOf = new Map<string, string>();
  const freeEngines: string[] = [];
  /** Pods the stand-in's kubelet stopped, with what the gateway's ledger held on them then. */
  const stopped: Array<{ pod: string; inFlight: number }> = [];
  const kubectl = async (...args: string[]) => (await run("kubectl", args, { env: { ...process.env, KUBECONFIG: kubeconfig }, timeout: 20_000 })).stdout.trim();
  const published = (name: string) => `${name}.${NS}`;

  beforeAll(async () => {
    env = await startTestEnv();
    kv = await new Kvm(env.nats.js).open(configBucketName("jr"));
    // 25 ms per decode step, 40 tokens: every request streams for about a second.
    fleet = await startSimFleet({ pods: 4, model: MODEL, decodeMsPerStep: 25, maxBatch: 16, kvEvents: false, logger: quietLog });
    freeEngines.push(...fleet.pods.map((p) => p.name));
    kube = await new KubeStandin({
      lifecycle: {
        // The kubelet: a new pod gets a free engine (its port as the discovery label) and turns Ready.
        started: async (p) => {
          const engine = freeEngines.shift();
          if (!engine) throw new Error("no free simulated engine");
          engineOf.set(p.metadata.name, engine);
          await fleet.start(engine).catch(() => undefined);
          const port = (fleet.pods.find((x) => x.name === engine) as { port: number }).port;
          kube.store.patch("pods", NS, p.metadata.name, "application/merge-patch+json", { metadata: { labels: { "model.aibrix.ai/port": String(port) } } });
          kube.setPodStatus(NS, p.metadata.name, { ready: true, podIP: "127.0.0.1", phase: "Running" });
        },
        // SIGTERM: the engine stops at once, cutting whatever it still streams (as an engine without a drain does).
        stopping: async (p) => {
          const engine = engineOf.get(p.metadata.name);
          stopped.push({ pod: published(p.metadata.name), inFlight: gw.views.ledger.outstanding(MODEL, published(p.metadata.name)).requests });
          if (engine) {
            await fleet.stop(engine);
            freeEngines.push(engine);
          }
        },
      },
    }).start();
    kubeconfig = kube.writeKubeconfig(path.join(dir, "kubeconfig"), NS);
    const manifest = path.join(dir, "deploy.yaml");
    writeFileSync(
      manifest,
      [
        "apiVersion: apps/v1", "kind: Deployment", "metadata:", "  name: engines", `  namespace: ${NS}`, "spec:", "  replicas: 3",
        "  selector:", "    matchLabels:", "      app: engines", "  template:", "    metadata:", "      labels:", "        app: engines",
        `        model.aibrix.ai/name: ${MODEL}`, "    spec:", "      terminationGracePeriodSeconds: 1", "      containers:", "      - name: engine", "        image: vllm/vllm-openai:latest", "",
      ].join("\n"),
    );
    await kubectl("apply", "--validate=false", "-f", manifest);
    watcher = await startKubernetesWatcher({ nats: env.server.url, kubeconfig, source: "drain", namespaces: [NS], heartbeatMs: 200, log: quietLog });
    gw = await env.gateway({ heartbeatIntervalMs: 200 });
    await waitFor(() => gw.views.pods.readyPods(MODEL).length === 3, 15_000, "3 pods routable");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${gw.port}`], logger: quietLog });
    reader = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "drain-autoscale-reader", family: "autoscale", types: ["autoscale"],
      stream: streamName("jr", "AUTOSCALE"), startAt: { kind: "all" }, onEvent: (ev) => void records.push(ev),
    });
    await reader.start();
  }, 60_000);
  afterAll(async () => {
    for (const s of scalers) await s.close().catch(() => undefined);
    await reader?.stop();
    await front?.close();
    await watcher?.close();
    await kube?.stop();
    await fleet?.close();
    await env?.stop();
  });

  /** Streams requests back to back on `lanes` concurrent lanes until `stop()`; counts completed and cut ones. */
  function traffic(lanes: number) {
    const res = { ok: 0, cut: 0, errors: [] as string[] };
    let on = true;
    const one = async () => {
      try {
        const r = await fetch(`http://127.0.0.1:${front.port}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello" }], max_tokens: 40, stream: true }),
        });
        const text = await r.text();
        if (r.status === 200 && text.includes("[DONE]")) res.ok++;
        else {
          res.cut++;
          res.errors.push(`${r.status} ${text.slice(-120)}`);
        }
      } catch (err) {
        res.cut++;
        res.errors.push((err as Error).message);
      }
    };
    const loops = Array.from({ length: lanes }, async () => {
      while (on) await one();
    });
    return { res, stop: async () => { on = false; await Promise.all(loops); } };
  }

  it("with the handshake: the autoscaler marks the cheapest pod, every gateway routes around it, and it leaves only once idle — no request cut", async () => {
    const t = traffic(6);
    await waitFor(() => t.res.ok >= 6, 20_000, "traffic flowing");
    const a = await startAutoscaler({ nats: env.server.url, prefix: "jr", tickMs: 100, log: quietLog, apply: kubeWorkloadClient(loadKubeConfig(kubeconfig)), drain: true });
    scalers.push(a);
    await kv.put(`${AUTOSCALE_KEY_PREFIX}engines`, JSON.stringify({
      model: MODEL, algorithm: "apa", metric: "ledger.inFlight", target: 1, minReplicas: 2, maxReplicas: 2,
      intervalMs: 100, scrapeIntervalMs: 100, stableWindowMs: 1000, panicWindowMs: 1000, scaleDownDelayMs: 0, drainGraceMs: 20_000,
      scaleTarget: { kind: "Deployment", namespace: NS, name: "engines" },
    }));
    await waitFor(() => records.some((r) => (r.removed ?? []).length > 0), 30_000, () => `a pod removed (last: ${JSON.stringify(records.at(-1))}; applier ${JSON.stringify([...a.appliers().values()].map((x) => ({ stats: x.stats, draining: x.tracker.list() })))})`);
    await waitFor(async () => (await kubectl("get", "deploy", "engines", "-o", "jsonpath={.spec.replicas} {.status.replicas}")) === "2 2", 15_000, "the Deployment at 2/2", 100);
    // Traffic keeps flowing on the two pods left for a while after the removal.
    const after = t.res.ok;
    await waitFor(() => t.res.ok >= after + 6, 20_000, "traffic on the remaining pods");
    await t.stop();
    const removal = records.find((r) => (r.removed ?? []).length > 0) as AutoscaleRecommendation;
    const victim = (removal.removed ?? [])[0] as { pod: string; reason: string; inFlight: number };
    expect(victim.reason).toBe("idle");
    // The pod the autoscaler chose is the one Kubernetes removed, and it held nothing when it stopped.
    expect(stopped).toEqual([{ pod: victim.pod, inFlight: 0 }]);
    expect(records.some((r) => (r.draining ?? []).some((d) => d.pod === victim.pod))).toBe(true);
    expect(t.res.cut, t.res.errors.slice(0, 3).join(" | ")).toBe(0);
    expect(t.res.ok).toBeGreaterThan(12);
    await a.close();
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}engines`);
  }, 90_000);

  it("without it (--no-drain): Kubernetes removes a busy pod and its streams are cut", async () => {
    const before = stopped.length;
    const t = traffic(6);
    await waitFor(() => t.res.ok >= 6, 20_000, "traffic flowing");
    const a = await startAutoscaler({ nats: env.server.url, prefix: "jr", tickMs: 100, log: quietLog, apply: kubeWorkloadClient(loadKubeConfig(kubeconfig)), drain: false });
    scalers.push(a);
    await kv.put(`${AUTOSCALE_KEY_PREFIX}engines`, JSON.stringify({
      model: MODEL, algorithm: "apa", metric: "ledger.inFlight", target: 1, minReplicas: 1, maxReplicas: 1,
      intervalMs: 100, scrapeIntervalMs: 100, stableWindowMs: 1000, panicWindowMs: 1000, scaleDownDelayMs: 0,
      scaleTarget: { kind: "Deployment", namespace: NS, name: "engines" },
    }));
    await waitFor(() => stopped.length > before, 30_000, "a pod stopped");
    await waitFor(async () => (await kubectl("get", "deploy", "engines", "-o", "jsonpath={.spec.replicas}")) === "1", 15_000, "the Deployment at 1", 100);
    await waitFor(() => t.res.cut > 0, 15_000, "a cut request");
    await t.stop();
    expect((stopped[before] as { inFlight: number }).inFlight).toBeGreaterThan(0);
    await a.close();
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}engines`);
  }, 90_000);

  it("two pods draining at once: each leaves only when idle, and Kubernetes removes exactly those two (no stream cut)", async () => {
    const policy = (n: number) => JSON.stringify({
      model: MODEL, algorithm: "apa", metric: "ledger.inFlight", target: 1, minReplicas: n, maxReplicas: n,
      intervalMs: 100, scrapeIntervalMs: 100, stableWindowMs: 1000, panicWindowMs: 1000, scaleDownDelayMs: 0, drainGraceMs: 20_000,
      scaleTarget: { kind: "Deployment", namespace: NS, name: "engines" },
    });
    const a = await startAutoscaler({ nats: env.server.url, prefix: "jr", tickMs: 100, log: quietLog, apply: kubeWorkloadClient(loadKubeConfig(kubeconfig)), drain: true });
    scalers.push(a);
    await kv.put(`${AUTOSCALE_KEY_PREFIX}engines`, policy(3));
    await waitFor(() => gw.views.pods.readyPods(MODEL).length === 3, 30_000, "3 pods routable again");
    const before = stopped.length;
    const from = records.length;
    const t = traffic(6);
    await waitFor(() => t.res.ok >= 12, 20_000, "traffic on 3 pods");
    await kv.put(`${AUTOSCALE_KEY_PREFIX}engines`, policy(1));
    await waitFor(() => stopped.length >= before + 2, 40_000, () => `two pods stopped (last: ${records.at(-1)?.reason})`);
    await waitFor(async () => (await kubectl("get", "deploy", "engines", "-o", "jsonpath={.spec.replicas} {.status.replicas}")) === "1 1", 15_000, "the Deployment at 1/1", 100);
    const after = t.res.ok;
    await waitFor(() => t.res.ok >= after + 4, 20_000, "traffic on the pod left");
    await t.stop();
    const removed = records.slice(from).flatMap((r) => r.removed ?? []);
    // Exactly the drained pods left, each idle when it stopped, and no stream was cut.
    expect(new Set(stopped.slice(before).map((x) => x.pod))).toEqual(new Set(removed.map((r) => r.pod)));
    expect(stopped.slice(before).map((x) => x.inFlight)).toEqual([0, 0]);
    expect(removed.map((r) => r.reason)).toEqual(["idle", "idle"]);
    expect(t.res.cut, t.res.errors.slice(0, 3).join(" | ")).toBe(0);
    await a.close();
  }, 120_000);
});
