import { describe, expect, it } from "vitest";
import type { PodEvent } from "../../schemas/events.js";
import { backoffDelayMs } from "./backoff.js";
import { mapPod, routable } from "./k8s-pods.js";
import { KubeConfig } from "@kubernetes/client-node";
import { clusterSourceName, leaseNameFor } from "./kubernetes.js";
import { planReconcile, podKey, type PodState } from "./reconcile.js";
import { checkWatcherName, staticSourceName } from "./pod-watcher.js";

const state = (pod: string, o: Partial<PodState> = {}): PodState => ({ model: "m", pod, address: `10.0.0.${pod.length}:8000`, ready: true, engine: "vllm", ...o });
const ev = (pod: string, source: string | undefined, o: Partial<PodState> = {}): PodEvent => ({ type: "pod", action: "upsert", ...state(pod, o), ...(source ? { source } : {}), ts: 1 });
const map = <T>(xs: Array<[string, T]>) => new Map(xs);

describe("reconcile: what a watcher publishes", () => {
  const base = { source: "a", now: 10_000, reassertMs: 60_000 };
  it("publishes new and changed pods, skips unchanged ones, tags every event with the source", () => {
    const plan = planReconcile({
      ...base, complete: true,
      desired: map([[podKey("m", "p1"), state("p1")], [podKey("m", "p2"), state("p2", { ready: false })], [podKey("m", "p3"), state("p3")]]),
      published: map([[podKey("m", "p1"), ev("p1", "a")], [podKey("m", "p2"), ev("p2", "a")]]),
      publishedAt: map([[podKey("m", "p1"), 9_000], [podKey("m", "p2"), 9_000]]),
    });
    expect(plan.upserts.map((u) => [u.pod, u.ready, u.source, u.ts])).toEqual([["p2", false, "a", 10_000], ["p3", true, "a", 10_000]]);
    expect(plan.removes).toEqual([]);
  });
  it("republishes a pod whose scheduling policy changed", () => {
    const plan = planReconcile({
      ...base, complete: true,
      desired: map([[podKey("m", "p1"), state("p1", { schedulingPolicy: "priority" })], [podKey("m", "p2"), state("p2")]]),
      published: map([[podKey("m", "p1"), ev("p1", "a")], [podKey("m", "p2"), ev("p2", "a", { schedulingPolicy: "priority" })]]),
      publishedAt: map([[podKey("m", "p1"), 9_000], [podKey("m", "p2"), 9_000]]),
    });
    expect(plan.upserts.map((u) => [u.pod, u.schedulingPolicy])).toEqual([["p1", "priority"], ["p2", undefined]]);
  });
  it("removes only its own source's pods, and only from a complete picture", () => {
    const input = {
      ...base,
      desired: map([[podKey("m", "keep"), state("keep")]]),
      published: map([[podKey("m", "keep"), ev("keep", "a")], [podKey("m", "mine"), ev("mine", "a")], [podKey("m", "theirs"), ev("theirs", "b")], [podKey("m", "legacy"), ev("legacy", undefined)]]),
      publishedAt: new Map<string, number>([[podKey("m", "keep"), 9_999]]),
    };
    expect(planReconcile({ ...input, complete: false }).removes).toEqual([]);
    const plan = planReconcile({ ...input, complete: true });
    expect(plan.removes.map((r) => [r.pod, r.action, r.source])).toEqual([["mine", "remove", "a"]]);
  });
  it("with adoptUnowned, pods published without a source count as its own (the upgrade migration)", () => {
    const input = {
      ...base, complete: true,
      desired: map([[podKey("m", "kept"), state("kept")]]),
      published: map([[podKey("m", "kept"), ev("kept", undefined)], [podKey("m", "legacy"), ev("legacy", undefined)], [podKey("m", "theirs"), ev("theirs", "b")]]),
      publishedAt: map([[podKey("m", "kept"), 9_999]]),
    };
    const plain = planReconcile(input);
    expect(plain.removes).toEqual([]);
    expect(plain.conflicts).toEqual([]);
    expect(plain.upserts.map((u) => [u.pod, u.source])).toEqual([["kept", "a"]]); // listed: taken over
    const adopt = planReconcile({ ...input, adoptUnowned: true });
    expect(adopt.removes.map((r) => r.pod)).toEqual(["legacy"]);
    expect(adopt.conflicts).toEqual([]);
    expect(adopt.upserts.map((u) => [u.pod, u.source])).toEqual([["kept", "a"]]);
  });
  it("re-asserts pods whose last event is older than the interval (retention never ages them out)", () => {
    const plan = planReconcile({
      ...base, complete: true,
      desired: map([[podKey("m", "old"), state("old")], [podKey("m", "new"), state("new")]]),
      published: map([[podKey("m", "old"), ev("old", "a")], [podKey("m", "new"), ev("new", "a")]]),
      publishedAt: map([[podKey("m", "old"), 10_000 - 60_000], [podKey("m", "new"), 9_000]]),
    });
    expect(plan.upserts.map((u) => u.pod)).toEqual(["old"]);
    expect(plan.reasserted).toBe(1);
  });
  it("claims a pod a silent source published, and reports the conflict", () => {
    const plan = planReconcile({ ...base, complete: true, desired: map([[podKey("m", "x"), state("x")]]), published: map([[podKey("m", "x"), ev("x", "b")]]), publishedAt: new Map() });
    expect(plan.upserts.map((u) => u.source)).toEqual(["a"]);
    expect(plan.conflicts).toEqual([podKey("m", "x")]);
  });
  it("leaves a pod of a live source alone (two followers would take it from each other forever), reporting the conflict", () => {
    const plan = planReconcile({
      ...base, complete: true, desired: map([[podKey("m", "x"), state("x")]]), published: map([[podKey("m", "x"), ev("x", "b")]]), publishedAt: new Map(), liveSources: new Set(["b"]),
    });
    expect(plan.upserts).toEqual([]);
    expect(plan.removes).toEqual([]);
    expect(plan.conflicts).toEqual([podKey("m", "x")]);
  });
  it("label order does not make a change; a label value does", () => {
    const desired = map([[podKey("m", "l"), state("l", { labels: { b: "2", a: "1" } })]]);
    const published = map([[podKey("m", "l"), ev("l", "a", { labels: { a: "1", b: "2" } })]]);
    const at = map([[podKey("m", "l"), 9_999]]);
    const base = { source: "a", now: 10_000, reassertMs: 60_000 };
    expect(planReconcile({ ...base, complete: true, desired, published, publishedAt: at }).upserts).toEqual([]);
    const changed = map([[podKey("m", "l"), state("l", { labels: { a: "1", b: "3" } })]]);
    expect(planReconcile({ ...base, complete: true, desired: changed, published, publishedAt: at }).upserts).toHaveLength(1);
  });
});

describe("backoff", () => {
  it("doubles from the base, caps at the maximum, jitters within [50%, 100%]", () => {
    const o = { baseMs: 100, maxMs: 1_000 };
    expect([0, 1, 2, 3, 4, 10].map((a) => backoffDelayMs(a, 0.999999, o))).toEqual([100, 200, 400, 800, 1_000, 1_000]);
    expect(backoffDelayMs(0, 0, o)).toBe(50);
    expect(backoffDelayMs(3, 0.5, o)).toBe(600);
    expect(backoffDelayMs(1e9, 1, o)).toBe(1_000);
  });
});

describe("kubernetes pod -> published pod", () => {
  const pod = (o: { name?: string; labels?: Record<string, string>; annotations?: Record<string, string>; ip?: string; ready?: string; deleting?: boolean } = {}) => ({
    metadata: { name: o.name ?? "vllm-0", namespace: "ns1", labels: { "model.aibrix.ai/name": "llama", ...o.labels }, annotations: o.annotations, ...(o.deleting ? { deletionTimestamp: "2026-01-01T00:00:00Z" } : {}) },
    status: { ...(o.ip === "" ? {} : { podIP: o.ip ?? "10.1.2.3" }), conditions: [{ type: "Ready", status: o.ready ?? "True" }] },
  });
  it("maps the discovery labels and annotations", () => {
    const m = mapPod(pod({
      labels: { "model.aibrix.ai/port": "8100", "model.aibrix.ai/engine": "sglang", "model.aibrix.ai/metric-port": "9100", "model.aibrix.ai/kv-events-enabled": "true", "role-name": "prefill", "roleset-name": "rs1" },
      annotations: { "model.aibrix.ai/sglang-bootstrap-port": "9000", "model.aibrix.ai/lora-adapters": "b, a,a", "model.aibrix.ai/config": '{"profiles":{}}' },
    }));
    expect(m).toEqual({
      ok: true,
      state: {
        model: "llama", pod: "vllm-0.ns1", address: "10.1.2.3:8100", ready: true, engine: "sglang", role: "prefill", roleset: "rs1", metricsAddress: "10.1.2.3:9100",
        bootstrapPort: 9000, kvEvents: { endpoint: "tcp://10.1.2.3:5557", replayEndpoint: "tcp://10.1.2.3:5558" }, adapters: ["a", "b"], labels: { "model.aibrix.ai/config": '{"profiles":{}}' },
      },
    });
  });
  it("takes the pod class from jetroute.io/pod-class, else nvidia.com/gpu.product; a value that is no class name is left out", () => {
    const cls = (labels: Record<string, string>) => {
      const m = mapPod(pod({ labels }));
      return m.ok ? m.state.podClass : "skipped";
    };
    expect(cls({ "jetroute.io/pod-class": "a100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" })).toBe("a100");
    expect(cls({ "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" })).toBe("NVIDIA-H100-80GB-HBM3");
    expect(cls({ "jetroute.io/pod-class": "not a class", "nvidia.com/gpu.product": "L4" })).toBe("L4");
    expect(cls({ "jetroute.io/pod-class": "x".repeat(64) })).toBeUndefined();
    expect(cls({})).toBeUndefined();
  });
  it("takes priority scheduling from jetroute.io/scheduling-policy; fcfs or any other value means none, and the pod is kept", () => {
    const policy = (labels: Record<string, string>) => {
      const m = mapPod(pod({ labels }));
      return m.ok ? m.state.schedulingPolicy : "skipped";
    };
    expect(policy({ "jetroute.io/scheduling-policy": "priority" })).toBe("priority");
    expect(policy({ "model.aibrix.ai/engine": "sglang", "jetroute.io/scheduling-policy": "priority-low-values-first" })).toBe("priority-low-values-first");
    expect(policy({ "jetroute.io/scheduling-policy": "fcfs" })).toBeUndefined();
    expect(policy({ "jetroute.io/scheduling-policy": "Priority" })).toBeUndefined();
    expect(policy({})).toBeUndefined();
  });
  it("defaults: port 8000, vllm, combined; SGLang prefill pods get bootstrap port 8998", () => {
    expect(mapPod(pod())).toEqual({ ok: true, state: { model: "llama", pod: "vllm-0.ns1", address: "10.1.2.3:8000", ready: true, engine: "vllm" } });
    const sg = mapPod(pod({ labels: { "model.aibrix.ai/engine": "sglang", "role-name": "prefill" } }));
    expect(sg.ok && sg.state.bootstrapPort).toBe(8998);
  });
  it("routable = Ready, has an IP, not terminating", () => {
    expect(routable(pod())).toBe(true);
    expect(routable(pod({ ready: "False" }))).toBe(false);
    expect(routable(pod({ deleting: true }))).toBe(false);
    expect(routable(pod({ ip: "" }))).toBe(false);
    const terminating = mapPod(pod({ deleting: true }));
    expect(terminating.ok && terminating.state.ready).toBe(false);
    expect(mapPod(pod({ ip: "" }))).toEqual({ ok: false, skip: "no-ip" });
  });
  it("the autoscaler's drain annotation becomes the pod's draining state, and a change of it is a change to publish", () => {
    const m = mapPod(pod({ annotations: { "jetroute.io/drain-deadline": "1767225600000" } }));
    expect(m.ok && m.state.draining).toEqual({ deadline: 1767225600000 });
    const published = map([[podKey("llama", "vllm-0.ns1"), { type: "pod" as const, action: "upsert" as const, ...(mapPod(pod()) as { state: PodState }).state, source: "a", ts: 1 }]]);
    const desired = map([[podKey("llama", "vllm-0.ns1"), (m as { state: PodState }).state]]);
    const base = { source: "a", now: 10_000, reassertMs: 60_000 };
    expect(planReconcile({ ...base, complete: true, desired, published, publishedAt: map([[podKey("llama", "vllm-0.ns1"), 9_999]]) }).upserts).toHaveLength(1);
  });
  it.each([
    [{ annotations: { "jetroute.io/drain-deadline": "soon" } }, /drain-deadline must be epoch milliseconds/],
    [{ labels: { "model.aibrix.ai/port": "http" } }, /port/],
    [{ labels: { "model.aibrix.ai/engine": "trt" } }, /vllm or sglang/],
    [{ labels: { "role-name": "boss" } }, /prefill or decode/],
    [{ annotations: { "model.aibrix.ai/config": "x".repeat(17_000) } }, /larger than/],
    [{ ip: "fd00::1" }, /IPv6/],
    [{ name: "p".repeat(250) }, /longer than 253/],
  ])("refuses bad discovery input with a reason: %j", (o, reason) => {
    const m = mapPod(pod(o));
    expect(m.ok).toBe(false);
    expect(!m.ok && m.skip).toBe("invalid");
    expect(!m.ok && m.reason).toMatch(reason);
  });
  it("pods without the model label are not inference pods", () => {
    expect(mapPod({ metadata: { name: "x", labels: {} } })).toEqual({ ok: false, skip: "no-model" });
  });
});

describe("names", () => {
  it("source and watcher names must fit the PODS schema", () => {
    expect(checkWatcherName("--source", "cluster-a")).toBe("cluster-a");
    expect(() => checkWatcherName("--source", "")).toThrow(/1-253/);
    expect(() => checkWatcherName("--source", "a b")).toThrow(/without whitespace/);
    expect(() => checkWatcherName("--source", "x".repeat(254))).toThrow(RangeError);
  });
  it("sources and lease names derived from files and sources", () => {
    expect(staticSourceName("/etc/jr/pods-east.yaml")).toBe("static-pods-east");
    expect(leaseNameFor("static-Pods_East")).toBe("jetroute-pod-watcher-static-pods-east");
    expect(leaseNameFor("x".repeat(100)).length).toBeLessThanOrEqual(63);
  });
  it("a Kubernetes source name comes from the kubeconfig's context (sanitized, bounded); in-cluster there is none (--source required)", () => {
    const kc = (context: string, server: string) => {
      const k = new KubeConfig();
      k.loadFromOptions({ clusters: [{ name: "c", server }], users: [{ name: "u" }], contexts: [{ name: context, cluster: "c", user: "u" }], currentContext: context });
      return k;
    };
    expect(clusterSourceName(kc("prod-east", "https://10.0.0.1:6443"), false)).toBe("kubernetes-prod-east");
    expect(clusterSourceName(kc("arn:aws:eks:us-east-1:1234:cluster/prod west", "https://x"), false)).toBe("kubernetes-arn-aws-eks-us-east-1-1234-cluster-prod-west");
    expect(clusterSourceName(kc("c".repeat(400), "https://x"), false)?.length).toBeLessThanOrEqual(111);
    // Two clusters' watchers no longer share the fixed name "kubernetes".
    expect(clusterSourceName(kc("a", "https://a"), false)).not.toBe(clusterSourceName(kc("b", "https://b"), false));
    expect(clusterSourceName(kc("prod-east", "https://10.96.0.1:443"), true)).toBeUndefined();
  });
});
