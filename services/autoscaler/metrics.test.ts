/**
 * The autoscaler's metrics port over real HTTP: an autoscaler on a real nats-server evaluating a
 * policy with `--apply` (its Kubernetes calls go to an in-memory workload whose first read fails),
 * scraped while it runs; and the policy label bound on a fleet of many policies.
 */
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AUTOSCALE_KEY_PREFIX, type AutoscalePolicy } from "../../schemas/autoscale.js";
import type { LoadSample } from "../../schemas/events.js";
import { configBucketName } from "../../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { startMetricsServer } from "../shared/metrics-server.js";
import { acked } from "../shared/publish.js";
import type { ListedPod, WorkloadClient } from "./kube-apply.js";
import { autoscalerRegistry, MAX_POLICY_LABELS, type PolicyFigures } from "./metrics.js";
import { type AutoscalerHandle, startAutoscaler } from "./service.js";

const load = (pod: string, running: number): LoadSample => ({
  type: "load", model: MODEL, pod, ts: Date.now(), stale: false,
  load: { running, waiting: 0, kvCacheUsage: 0.1, prefixCacheQueries: null, prefixCacheHits: null, cacheHitRate: null, promptTokens: null, generationTokens: null, genThroughput: null, preemptions: null, blockSize: 16, numGpuBlocks: 1000, runningLoras: [], waitingLoras: [], maxLora: null, histograms: {} },
});

/** One Deployment's scale and pods, in memory; its first `failures` calls fail as an API error would. */
function memoryWorkload(replicas: number, failures: number): WorkloadClient & { replicas: number } {
  let fail = failures;
  const check = () => {
    if (fail-- > 0) throw Object.assign(new Error("the server is currently unable to handle the request"), { code: 503 });
  };
  const w = {
    replicas,
    async readScale() {
      check();
      return { replicas: w.replicas, selector: "app=chat" };
    },
    async writeScale(_t: unknown, n: number) {
      check();
      w.replicas = n;
    },
    async listPods(): Promise<ListedPod[]> {
      check();
      return Array.from({ length: w.replicas }, (_, i) => ({ name: `p${i + 1}`, pod: `p${i + 1}`, annotations: {}, ready: true, terminating: false }));
    },
    async annotate() {
      check();
    },
  };
  return w;
}

/** Sample value of one series in Prometheus text, or undefined. */
function sample(text: string, series: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

describe("autoscaler metrics port", () => {
  let env: TestEnv;
  let a: AutoscalerHandle;
  let srv: { port: number; close(): void };
  let loadTimer: NodeJS.Timeout;
  const workload = memoryWorkload(2, 1);

  beforeAll(async () => {
    env = await startTestEnv();
    for (const p of ["p1", "p2"]) await env.publishPod({ pod: p, address: `10.0.0.${p.slice(1)}:8000` });
    const publishLoad = () => Promise.all(["p1", "p2"].map((p) => acked(env.nats.js, env.subjects.load(MODEL, p), load(p, 30))));
    await publishLoad();
    loadTimer = setInterval(() => void publishLoad().catch(() => undefined), 200);
    const kv = await new Kvm(env.nats.js).open(configBucketName("jr"));
    const policy: AutoscalePolicy = {
      model: MODEL, algorithm: "kpa", metric: "load.running", target: 10, minReplicas: 1, maxReplicas: 5,
      intervalMs: 100, scrapeIntervalMs: 100, stableWindowMs: 2000, panicWindowMs: 1000, scaleDownDelayMs: 0,
      scaleTarget: { kind: "Deployment", namespace: "llm", name: "chat" },
    };
    await kv.put(`${AUTOSCALE_KEY_PREFIX}chat`, JSON.stringify(policy));
    a = await startAutoscaler({ nats: env.server.url, prefix: "jr", tickMs: 50, log: quietLog, apply: workload, leaderElection: true, leaseMs: 2_000 });
    await a.whenReady();
    srv = await startMetricsServer(0, "127.0.0.1", autoscalerRegistry(a), quietLog);
  }, 60_000);
  afterAll(async () => {
    clearInterval(loadTimer);
    srv?.close();
    await a?.close();
    await env?.stop();
  });

  it("serves evaluations, recommendations and the desired count per policy, applied scales, API errors, drains and the lease", async () => {
    const url = `http://127.0.0.1:${srv.port}`;
    const health = await fetch(`${url}/healthz`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: "ok" });
    let text = "";
    // 30 running on each of 2 pods at 10 a pod: 6 pods, bounded by the up rate to 2 x 2 = 4; the
    // first apply fails (a 503), the retry scales.
    await waitFor(async () => {
      const res = await fetch(`${url}/metrics`);
      text = await res.text();
      return res.status === 200 && sample(text, 'jetroute_autoscaler_scales_total{policy="chat"}') === 1;
    }, 15_000, "the scale to be applied after the API error");
    expect(workload.replicas).toBe(4);
    expect(sample(text, "jetroute_autoscaler_leader")).toBe(1);
    expect(sample(text, "jetroute_autoscaler_policies")).toBe(1);
    expect(sample(text, "jetroute_autoscaler_evaluations_total")).toBeGreaterThan(1);
    expect(sample(text, 'jetroute_autoscaler_recommendations_total{policy="chat"}')).toBeGreaterThan(0);
    expect(sample(text, 'jetroute_autoscaler_desired_replicas{policy="chat"}')).toBe(4);
    expect(sample(text, 'jetroute_autoscaler_ready_pods{policy="chat"}')).toBe(2);
    expect(sample(text, 'jetroute_autoscaler_api_errors_total{policy="chat"}')).toBe(1);
    expect(sample(text, 'jetroute_autoscaler_draining_pods{policy="chat"}')).toBe(0);
    expect(sample(text, 'jetroute_autoscaler_drained_pods_total{policy="chat",reason="idle"}')).toBe(0);
    expect(text).toMatch(/# TYPE jetroute_autoscaler_evaluations_total counter/);
    expect(text).toMatch(/jetroute_autoscaler_process_cpu_seconds_total/);
    const missing = await fetch(`${url}/nope`);
    expect(missing.status).toBe(404);
    expect(await missing.json()).toMatchObject({ error: { type: "invalid_request_error" } });
  }, 30_000);

  it("policy labels are bounded: past the bound the rest are summed under policy=\"_other\"", async () => {
    const figures = new Map<string, PolicyFigures>();
    for (let i = 0; i < MAX_POLICY_LABELS + 10; i++) figures.set(`p-${String(i).padStart(4, "0")}`, { evaluations: 1, published: 2, desired: 1, readyPods: 1 });
    const r = autoscalerRegistry({ isLeader: () => false, stats: { evaluations: 0, published: 0, publishErrors: 0, invalidPolicies: 0 }, policyFigures: () => figures, appliers: () => new Map() });
    const text = await r.metrics();
    const series = text.split("\n").filter((l) => l.startsWith("jetroute_autoscaler_recommendations_total{"));
    expect(series).toHaveLength(MAX_POLICY_LABELS + 1);
    expect(sample(text, 'jetroute_autoscaler_recommendations_total{policy="_other"}')).toBe(20);
    expect(sample(text, "jetroute_autoscaler_leader")).toBe(0);
  });
});
