/**
 * The stand-in's Deployments driven by the real `kubectl`: apply, the `scale` subresource
 * (`kubectl scale`, `kubectl get --subresource=scale`), `kubectl get deploy -w`, and a scale-down
 * removing the pod with the lowest `controller.kubernetes.io/pod-deletion-cost`.
 */
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitFor } from "../../test/harness/wait.js";
import { removalOrder } from "./deployments.js";
import { KubeStandin } from "./server.js";
import type { KubeObject } from "./store.js";

const run = promisify(execFile);

describe("stand-in Deployments with kubectl", () => {
  let kube: KubeStandin;
  let kubeconfig: string;
  const dir = mkdtempSync(path.join(os.tmpdir(), "jr-deploy-"));
  const started: string[] = [];
  const stopping: string[] = [];
  let ip = 10;
  const kubectl = async (...args: string[]) => (await run("kubectl", args, { env: { ...process.env, KUBECONFIG: kubeconfig }, timeout: 20_000 })).stdout.trim();
  /** The Deployment's pods that are not terminating. */
  const podNames = async () =>
    (await kubectl("get", "pods", "-l", "app=sim", "-o", 'jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\\n"}{end}'))
      .split("\n")
      .map((l) => l.trim().split(" "))
      .filter((f) => f[0] && f.length === 1)
      .map((f) => f[0] as string);

  beforeAll(async () => {
    kube = await new KubeStandin({
      lifecycle: {
        // The kubelet: a started pod gets an IP and turns Ready.
        started: (p) => {
          started.push(p.metadata.name);
          kube.setPodStatus(p.metadata.namespace ?? "", p.metadata.name, { ready: true, podIP: `10.0.0.${ip++}`, phase: "Running" });
        },
        stopping: (p) => void stopping.push(p.metadata.name),
      },
    }).start();
    kubeconfig = kube.writeKubeconfig(path.join(dir, "kubeconfig"));
    const manifest = path.join(dir, "deploy.yaml");
    writeFileSync(
      manifest,
      [
        "apiVersion: apps/v1", "kind: Deployment", "metadata:", "  name: sim", "  namespace: default", "spec:", "  replicas: 3",
        "  selector:", "    matchLabels:", "      app: sim", "  template:", "    metadata:", "      labels:", "        app: sim",
        "        model.aibrix.ai/name: m", "    spec:", "      terminationGracePeriodSeconds: 1", "      containers:", "      - name: engine", "        image: vllm/vllm-openai:latest", "",
      ].join("\n"),
    );
    expect(await kubectl("apply", "--validate=false", "-f", manifest)).toBe("deployment.apps/sim created");
  });
  afterAll(async () => kube?.stop());

  it("creates the template's pods, owned by the Deployment, and reports them ready in its status", async () => {
    await waitFor(async () => (await kubectl("get", "deploy", "sim", "-o", "jsonpath={.status.readyReplicas}")) === "3", 10_000, "3 ready replicas", 50);
    const pods = await podNames();
    expect(pods).toHaveLength(3);
    expect(new Set(pods)).toEqual(new Set(started));
    expect(await kubectl("get", "pod", pods[0] as string, "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.metadata.labels.model\\.aibrix\\.ai/name}")).toBe("Deployment/sim m");
    expect(await kubectl("get", "deploy", "sim", "--subresource=scale", "-o", "jsonpath={.spec.replicas} {.status.replicas} {.status.selector}")).toBe("3 3 app=sim");
  });

  it("kubectl scale down removes the pod with the lowest deletion cost; kubectl get deploy -w sees every step", async () => {
    const seen: string[] = [];
    const watch = spawn("kubectl", ["get", "deploy", "sim", "-w", "--output-watch-events", "-o", 'jsonpath={.type} {.object.spec.replicas} {.object.status.replicas}{"\\n"}'], { env: { ...process.env, KUBECONFIG: kubeconfig } });
    createInterface({ input: watch.stdout }).on("line", (l) => seen.push(l.trim()));
    try {
      await waitFor(() => seen.length > 0, 10_000, "kubectl watching");
      const pods = await podNames();
      // The middle pod, neither newest nor oldest: only its deletion cost can make it the one removed.
      const victim = [...pods].sort()[1] as string;
      await kubectl("annotate", "pod", victim, "controller.kubernetes.io/pod-deletion-cost=-1000000");
      expect(await kubectl("scale", "deploy/sim", "--replicas=2")).toBe("deployment.apps/sim scaled");
      await waitFor(() => stopping.includes(victim), 10_000, "the annotated pod to be stopped");
      expect(stopping).toEqual([victim]);
      await waitFor(async () => (await podNames()).length === 2 && !(await podNames()).includes(victim), 10_000, "two pods left");
      await waitFor(() => seen.some((l) => l === "MODIFIED 2 2"), 10_000, () => `the watch to show 2/2 (saw ${seen.join(" | ")})`);
      // Back up: a new pod from the template.
      await kubectl("scale", "deploy/sim", "--replicas=3");
      await waitFor(async () => (await kubectl("get", "deploy", "sim", "-o", "jsonpath={.status.readyReplicas}")) === "3", 10_000, "3 ready again", 50);
      expect(started).toHaveLength(4);
    } finally {
      watch.kill();
    }
  });

  it("refuses a negative replica count on the scale subresource", async () => {
    await expect(kubectl("scale", "deploy/sim", "--replicas=-1")).rejects.toThrow();
    expect(await kubectl("get", "deploy", "sim", "-o", "jsonpath={.spec.replicas}")).toBe("3");
  });
});

describe("removalOrder (the ReplicaSet's ranking, simplified)", () => {
  const pod = (name: string, o: { ready?: boolean; cost?: number; created?: string } = {}): KubeObject => ({
    metadata: { name, creationTimestamp: o.created ?? "2026-01-01T00:00:00Z", ...(o.cost !== undefined ? { annotations: { "controller.kubernetes.io/pod-deletion-cost": String(o.cost) } } : {}) },
    status: { conditions: [{ type: "Ready", status: o.ready === false ? "False" : "True" }] },
  });
  it("not ready first, then lower deletion cost, then newer", () => {
    const order = removalOrder([pod("old"), pod("new", { created: "2026-01-02T00:00:00Z" }), pod("cheap", { cost: -5 }), pod("starting", { ready: false, cost: 100 })]);
    expect(order.map((p) => p.metadata.name)).toEqual(["starting", "cheap", "new", "old"]);
  });
});
