/**
 * The autoscaler's trust boundary on a real nats-server and the Kubernetes stand-in (real HTTP,
 * the real client-node calls of `--apply`): only operator-signed policies and pool assignments
 * are acted on, only watcher-signed pods count, and `--apply` scales only the policy model's
 * workload unless `--allow-workload` names another.
 */
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { type KV, Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AUTOSCALE_KEY_PREFIX, type AutoscalePolicy, type AutoscaleRecommendation } from "../../schemas/autoscale.js";
import type { PodEvent } from "../../schemas/events.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { configRecordSubject, generateSigningKeyPair, RecordSigner, RecordVerifier } from "../../streams/signatures.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { KubeStandin } from "../kube-standin/server.js";
import { loadKubeConfig } from "../pod-watcher/kubernetes.js";
import { StreamFollower } from "../shared/follower.js";
import { acked } from "../shared/publish.js";
import { kubeWorkloadClient } from "./kube-apply.js";
import { type AutoscalerHandle, startAutoscaler } from "./service.js";

const NS = "llm";
const OTHER = "org/Qwen-other";
const FAST = { intervalMs: 100, scrapeIntervalMs: 100, stableWindowMs: 2000, panicWindowMs: 1000, scaleDownDelayMs: 0 } as const;

describe("autoscaler: signed policies and pods, and --apply only on the policy model's workload", () => {
  let env: TestEnv;
  let kv: KV;
  let kube: KubeStandin;
  let dir: string;
  const records: AutoscaleRecommendation[] = [];
  let reader: StreamFollower<"autoscale">;
  const scalers: AutoscalerHandle[] = [];
  const op = generateSigningKeyPair();
  const pods = generateSigningKeyPair();
  const opSigner = new RecordSigner(op.privateKeyPem);
  const podSigner = new RecordSigner(pods.privateKeyPem);
  const signatures = { operator: new RecordVerifier(op.publicKeyPem), podWatcher: new RecordVerifier(pods.publicKeyPem) };
  const bucket = configBucketName("jr");

  const setPolicy = (name: string, p: AutoscalePolicy, signer?: RecordSigner) => {
    const key = `${AUTOSCALE_KEY_PREFIX}${name}`;
    return kv.put(key, JSON.stringify(signer ? signer.sign(configRecordSubject(bucket, key), p, Date.now()) : p));
  };
  const publishPod = async (model: string, pod: string, signer?: RecordSigner) => {
    const ev: PodEvent = { type: "pod", action: "upsert", model, pod, address: `127.0.0.1:${9400 + records.length}`, ready: true, engine: "vllm", ts: Date.now() };
    const subject = env.subjects.pod(model, pod);
    await acked(env.nats.js, subject, signer ? signer.sign(subject, ev, Date.now()) : ev);
  };
  const deployment = (name: string, app: string, replicas: number) => ({
    apiVersion: "apps/v1", kind: "Deployment", metadata: { name, namespace: NS },
    spec: { replicas, selector: { matchLabels: { app } }, template: { metadata: { labels: { app } }, spec: { containers: [{ name: "engine", image: "vllm" }] } } },
  });
  const replicasOf = (name: string) => (kube.store.get("deployments.apps", NS, name).spec as { replicas: number }).replicas;
  const podsOf = (app: string) => kube.store.list("pods", NS, `app=${app}`).items.map((p) => `${p.metadata.name}.${NS}`);
  const start = async (o: Partial<Parameters<typeof startAutoscaler>[0]> = {}) => {
    const a = await startAutoscaler({ nats: env.server.url, prefix: "jr", tickMs: 50, log: quietLog, signatures, ...o });
    scalers.push(a);
    await a.whenReady();
    return a;
  };

  beforeAll(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), "jr-autoscaler-trust-"));
    env = await startTestEnv();
    kv = await new Kvm(env.nats.js).open(bucket);
    kube = await new KubeStandin().start();
    kube.writeKubeconfig(path.join(dir, "kubeconfig"), NS);
    kube.store.create("deployments.apps", NS, deployment("llama-servers", "llama", 2), Date.now());
    kube.store.create("deployments.apps", NS, deployment("qwen-servers", "qwen", 2), Date.now());
    await waitFor(() => podsOf("llama").length === 2 && podsOf("qwen").length === 2, 10_000, "the stand-in's Deployments to create their pods");
    // The pod-watcher's signed pods: the llama Deployment's under MODEL, the qwen one's under OTHER.
    for (const p of podsOf("llama")) await publishPod(MODEL, p, podSigner);
    for (const p of podsOf("qwen")) await publishPod(OTHER, p, podSigner);
    reader = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "trust-autoscale-reader", family: "autoscale", types: ["autoscale"],
      stream: streamName("jr", "AUTOSCALE"), startAt: { kind: "all" }, onEvent: (ev) => void records.push(ev),
    });
    await reader.start();
  }, 30_000);
  afterAll(async () => {
    await Promise.all(scalers.map((s) => s.close().catch(() => undefined)));
    await reader?.stop();
    await kube?.stop();
    await env?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("acts only on policies the operator's key signed, and counts only pods a watcher's key signed", async () => {
    // An unsigned pod of MODEL (planted on PODS): not one of the fleet's.
    await publishPod(MODEL, "planted-0.llm");
    const a = await start();
    const policy: AutoscalePolicy = { model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", target: 10, minReplicas: 1, maxReplicas: 4, ...FAST };
    await setPolicy("unsigned", policy);
    await setPolicy("by-watcher", policy, podSigner);
    await setPolicy("by-operator", policy, opSigner);
    await waitFor(() => a.policies().has("by-operator"), 5_000, "the operator-signed policy to load");
    expect(a.policies().has("unsigned")).toBe(false);
    expect(a.policies().has("by-watcher")).toBe(false);
    expect(a.stats.refusedSignature).toBeGreaterThanOrEqual(2);
    await waitFor(() => records.some((r) => r.policy === "by-operator"), 5_000, "an evaluation of the signed policy");
    // Two signed pods of MODEL; the planted one is not among them.
    expect(records.find((r) => r.policy === "by-operator")?.readyPods).toBe(2);
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}by-operator`);
    await waitFor(() => !a.policies().has("by-operator"), 5_000, "the policy to go");
    await a.close();
  });

  it("--apply refuses a scaleTarget whose pods are another model's, and scales the model's own workload", async () => {
    const a = await start({ apply: kubeWorkloadClient(loadKubeConfig(path.join(dir, "kubeconfig"))), drain: false });
    // A policy of MODEL aimed at the qwen servers: must not touch them.
    await setPolicy("hijack", { model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", target: 10, minReplicas: 3, maxReplicas: 3, ...FAST, scaleTarget: { kind: "Deployment", namespace: NS, name: "qwen-servers" } }, opSigner);
    await waitFor(() => records.some((r) => r.policy === "hijack" && /not org\/Llama-3\.1-8B's workload/.test(r.reason)), 10_000, () => `a refused round (last: ${records.filter((r) => r.policy === "hijack").at(-1)?.reason})`);
    expect(replicasOf("qwen-servers")).toBe(2);
    expect(a.appliers().get("hijack")?.stats.scaled).toBe(0);
    // The same policy aimed at the model's own workload scales it.
    await setPolicy("own", { model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", target: 10, minReplicas: 3, maxReplicas: 3, ...FAST, scaleTarget: { kind: "Deployment", namespace: NS, name: "llama-servers" } }, opSigner);
    await waitFor(() => replicasOf("llama-servers") === 3, 10_000, "the model's own workload scaled to 3");
    expect(replicasOf("qwen-servers")).toBe(2);
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}hijack`);
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}own`);
    await a.close();
  });

  it("--allow-workload admits a workload the operator names", async () => {
    const a = await start({ apply: kubeWorkloadClient(loadKubeConfig(path.join(dir, "kubeconfig"))), drain: false, allowWorkloads: ["Deployment/llm/qwen-servers"] });
    await setPolicy("allowed", { model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", target: 10, minReplicas: 3, maxReplicas: 3, ...FAST, scaleTarget: { kind: "Deployment", namespace: NS, name: "qwen-servers" } }, opSigner);
    await waitFor(() => replicasOf("qwen-servers") === 3, 10_000, "the allow-listed workload scaled to 3");
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}allowed`);
    await a.close();
  });

  it("flow.waitMs from a gateway whose clock is 60 s behind reads as its real wait, not 60 s (one clock: reported age + time since receipt)", async () => {
    // The autoscaler's clock runs 60 s ahead of the gateway's (Date.now() here).
    const a = await start({ clock: () => Date.now() + 60_000 });
    await setPolicy("waits", { model: MODEL, algorithm: "kpa", metric: "flow.waitMs", target: 1_000, minReplicas: 1, maxReplicas: 50, ...FAST }, opSigner);
    await waitFor(() => a.policies().has("waits"), 5_000, "the policy to load");
    const summary = () => {
      const ts = Date.now();
      return JSON.stringify({ gateway: "gw-behind", ts, models: { [MODEL]: [{ band: 0, count: 3, oldest: ts - 500 }] } });
    };
    const timer = setInterval(() => env.nats.nc.publish(env.subjects.flow("gw-behind"), summary()), 50);
    try {
      await waitFor(() => records.some((r) => r.policy === "waits" && (r.value ?? 0) > 0), 10_000, "an evaluation that sees the held requests");
      const seen = records.filter((r) => r.policy === "waits" && (r.value ?? 0) > 0);
      // 500 ms reported, plus at most a few hundred ms since receipt on a loaded box; never the 60 s skew.
      for (const r of seen) expect(r.value).toBeLessThan(5_000);
      expect(seen.at(-1)?.desired).toBeLessThan(50);
    } finally {
      clearInterval(timer);
      await kv.delete(`${AUTOSCALE_KEY_PREFIX}waits`);
      await a.close();
    }
  });

  it("refuses to start with a pod-watcher's key among the operator's", async () => {
    const mixed = { operator: new RecordVerifier(op.publicKeyPem + pods.publicKeyPem), podWatcher: signatures.podWatcher };
    await expect(startAutoscaler({ nats: env.server.url, prefix: "jr", log: quietLog, signatures: mixed })).rejects.toThrow(/in both --config-public-key and --pod-public-key/);
  });
});
