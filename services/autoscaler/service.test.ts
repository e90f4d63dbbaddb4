/**
 * `jetroute autoscaler` on a real nats-server: pods and load published on their streams, policies
 * in the config bucket, recommendations read back from the AUTOSCALE stream; HA with the lease;
 * `config set-autoscale` refusing bad policies through the built CLI.
 */
import { type KV, Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AUTOSCALE_KEY_PREFIX, type AutoscalePolicy, type AutoscaleRecommendation } from "../../schemas/autoscale.js";
import type { LoadSample } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { runJetroute as jetroute } from "../../test/harness/cli.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { StreamFollower } from "../shared/follower.js";
import { acked } from "../shared/publish.js";
import { type AutoscalerHandle, startAutoscaler } from "./service.js";

const load = (pod: string, running: number): LoadSample => ({
  type: "load", model: MODEL, pod, ts: Date.now(), stale: false,
  load: { running, waiting: 0, kvCacheUsage: 0.1, prefixCacheQueries: null, prefixCacheHits: null, cacheHitRate: null, promptTokens: null, generationTokens: null, genThroughput: null, preemptions: null, blockSize: 16, numGpuBlocks: 1000, runningLoras: [], waitingLoras: [], maxLora: null, histograms: {} },
});

const FAST = { intervalMs: 100, scrapeIntervalMs: 100, stableWindowMs: 2000, panicWindowMs: 1000, scaleDownDelayMs: 0 } as const;

describe("autoscaler on a real nats-server", () => {
  let env: TestEnv;
  let kv: KV;
  const records: AutoscaleRecommendation[] = [];
  let reader: StreamFollower<"autoscale">;
  const scalers: AutoscalerHandle[] = [];
  const start = async (o: Partial<Parameters<typeof startAutoscaler>[0]> = {}) => {
    const a = await startAutoscaler({ nats: env.server.url, prefix: "jr", tickMs: 50, log: quietLog, ...o });
    scalers.push(a);
    await a.whenReady();
    return a;
  };
  const setPolicy = (name: string, p: AutoscalePolicy) => kv.put(`${AUTOSCALE_KEY_PREFIX}${name}`, JSON.stringify(p));
  /** Keeps the load samples fresh (they go stale after 2 s) while a test waits. */
  const running = 30;
  let loadTimer: NodeJS.Timeout;

  beforeAll(async () => {
    env = await startTestEnv();
    kv = await new Kvm(env.nats.js).open(configBucketName("jr"));
    await env.publishPod({ pod: "p1", address: "10.0.0.1:8000" });
    await env.publishPod({ pod: "p2", address: "10.0.0.2:8000" });
    const publishLoad = () => Promise.all(["p1", "p2"].map((p) => acked(env.nats.js, env.subjects.load(MODEL, p), load(p, running))));
    await publishLoad();
    loadTimer = setInterval(() => void publishLoad().catch(() => undefined), 200);
    reader = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "test-autoscale-reader", family: "autoscale", types: ["autoscale"],
      stream: streamName("jr", "AUTOSCALE"), startAt: { kind: "all" }, onEvent: (ev) => void records.push(ev),
    });
    await reader.start();
  });
  afterAll(async () => {
    clearInterval(loadTimer);
    await Promise.all(scalers.map((s) => s.close()));
    await reader?.stop();
    await env?.stop();
  });

  it("publishes every evaluation with its inputs and arithmetic (KPA: 2 pods x 30 running against 10/pod -> 4, the 2x rate cap)", async () => {
    await setPolicy("kpa-running", { model: MODEL, algorithm: "kpa", metric: "load.running", target: 10, minReplicas: 0, maxReplicas: 10, ...FAST });
    const a = await start();
    await waitFor(() => records.some((r) => r.policy === "kpa-running" && r.kpa?.stableTotal === 60), 10_000, "a kpa record over 60 running");
    const r = records.filter((x) => x.policy === "kpa-running" && x.kpa?.stableTotal === 60).at(-1) as AutoscaleRecommendation;
    expect(r).toMatchObject({ model: MODEL, algorithm: "kpa", readyPods: 2, metric: "load.running", value: 60, desired: 4, autoscaler: a.id });
    // ceil(60/10) = 6, capped at ceil(2 x 2) = 4
    expect(r.kpa).toMatchObject({ stablePods: 4, maxScaleUp: 4, maxScaleDown: 1 });
    expect(checkEvent("autoscale", r).ok).toBe(true);
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}kpa-running`);
    await waitFor(() => !a.policies().has("kpa-running"), 5_000, "the deleted policy to stop");
  });

  it("applies a policy change live, and keeps the previous policy when the bucket holds an invalid one", async () => {
    const a = scalers[0] as AutoscalerHandle;
    await setPolicy("apa", { model: MODEL, algorithm: "apa", metric: "load.running", target: 10, minReplicas: 1, maxReplicas: 10, ...FAST });
    // per pod 30 / 10 = 3 -> ceil(2 x 3) = 6, capped at ceil(2 x 2) = 4
    await waitFor(() => records.some((r) => r.policy === "apa" && r.desired === 4 && r.apa?.band === "up"), 10_000, "apa scaling up to 4");
    await setPolicy("apa", { model: MODEL, algorithm: "apa", metric: "load.running", target: 30, minReplicas: 1, maxReplicas: 10, ...FAST });
    await waitFor(() => records.some((r) => r.policy === "apa" && r.desired === 2 && r.apa?.band === "hold"), 10_000, "apa holding at 2 after the change");
    const before = a.stats.invalidPolicies;
    await kv.put(`${AUTOSCALE_KEY_PREFIX}apa`, JSON.stringify({ model: MODEL, algorithm: "apa", metric: "load.bogus", target: 1, minReplicas: 0, maxReplicas: 1 }));
    await waitFor(() => a.stats.invalidPolicies > before, 5_000, "the invalid policy to be counted");
    expect(a.policies().get("apa")?.policy.target).toBe(30);
  });

  it("sizes only its own namespace's models: a policy for a gateway pool's model is left to that pool's autoscaler", async () => {
    await kv.put("pool.chat", JSON.stringify({ models: ["pooled/model"] }));
    await setPolicy("pooled", { model: "pooled/model", algorithm: "kpa", metric: "load.running", target: 1, minReplicas: 1, maxReplicas: 3, ...FAST });
    const a = scalers[0] as AutoscalerHandle;
    await waitFor(() => a.policies().has("pooled"), 5_000, "the pooled policy to load");
    const from = records.length;
    // Proof of absence by order: several rounds of the in-scope policy pass, none for the pooled one.
    await waitFor(() => records.slice(from).filter((r) => r.policy === "apa").length >= 5, 10_000, "five more apa rounds");
    expect(records.slice(from).some((r) => r.policy === "pooled")).toBe(false);
    await kv.delete("pool.chat");
    await waitFor(() => records.slice(from).some((r) => r.policy === "pooled"), 10_000, "the policy to run once its model is in no pool");
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}pooled`);
  });

  it("HA: only the lease holder publishes; the standby takes over when it leaves", async () => {
    await Promise.all(scalers.splice(0).map((s) => s.close()));
    // The bucket's newest `apa` entry is the invalid one of the test before: a fresh process has no policy from it.
    await setPolicy("apa", { model: MODEL, algorithm: "apa", metric: "load.running", target: 30, minReplicas: 1, maxReplicas: 10, ...FAST });
    const a = await start({ id: "as-a", leaderElection: true, leaseMs: 1500 });
    const b = await start({ id: "as-b", leaderElection: true, leaseMs: 1500 });
    await waitFor(() => a.isLeader() || b.isLeader(), 10_000, "a leader");
    const [leader, standby] = a.isLeader() ? [a, b] : [b, a];
    const from = records.length;
    await waitFor(() => records.slice(from).filter((r) => r.policy === "apa").length >= 5, 10_000, "the leader's records");
    expect(new Set(records.slice(from).map((r) => r.autoscaler))).toEqual(new Set([leader.id]));
    expect(standby.stats.evaluations).toBeGreaterThan(0); // evaluating, warm, silent
    expect(standby.stats.published).toBe(0);
    await leader.close();
    const mark = records.length;
    await waitFor(() => records.slice(mark).some((r) => r.autoscaler === standby.id), 10_000, "the standby to publish");
    const firstB = records.findIndex((r, i) => i >= mark && r.autoscaler === standby.id);
    expect(records.slice(firstB).every((r) => r.autoscaler === standby.id)).toBe(true);
  });
});


describe("jetroute config set-autoscale (built CLI, real nats-server)", () => {
  let env: TestEnv;
  beforeAll(async () => {
    env = await startTestEnv();
  });
  afterAll(async () => env?.stop());

  it.each([
    [{ model: "m", algorithm: "kpa", metric: "load.nonsense", target: 1, minReplicas: 0, maxReplicas: 2 }, "/metric: unknown metric"],
    [{ model: "m", algorithm: "kpa", metric: "load.running", target: 1, minReplicas: 0, maxReplicas: 2, stableWindowMs: 500 }, "/stableWindowMs: 500 ms is shorter than the scrape interval"],
    [{ model: "m", algorithm: "apa", metric: "load.running", target: 1, minReplicas: 3, maxReplicas: 2 }, "/minReplicas: 3 is above /maxReplicas 2"],
    [{ model: "m", algorithm: "apa", metric: "load.running", target: 0, minReplicas: 0, maxReplicas: 2 }, "/target: must be > 0"],
  ])("refuses %j naming the field, storing nothing", async (policy, msg) => {
    const r = await jetroute(["config", "set-autoscale", "bad", "--json", JSON.stringify(policy), "--nats", env.server.url]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(msg);
    const kv = await new Kvm(env.nats.js).open(configBucketName("jr"));
    expect(await kv.get(`${AUTOSCALE_KEY_PREFIX}bad`)).toBeNull();
  });

  it("stores a valid policy, lists and prints it", async () => {
    const p = { model: "m", algorithm: "kpa", metric: "ledger.inFlight", target: 8, minReplicas: 0, maxReplicas: 4 };
    expect((await jetroute(["config", "set-autoscale", "chat", "--json", JSON.stringify(p), "--nats", env.server.url])).code).toBe(0);
    expect((await jetroute(["config", "list-autoscale", "--nats", env.server.url])).stdout.trim()).toBe("chat");
    expect(JSON.parse((await jetroute(["config", "get-autoscale", "chat", "--nats", env.server.url])).stdout)).toEqual(p);
  });
});
