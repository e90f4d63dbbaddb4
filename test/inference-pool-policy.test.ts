/**
 * InferenceObjective and InferenceModelRewrite end to end: objects applied with the real
 * `kubectl` to the API stand-in, `pod-watcher --inference-pool` deriving the pool's policy and
 * writing it to the config bucket on a real nats-server, and a gateway that merges the objectives
 * into flow control's bands and rewrites request models by weight, per request id, on the
 * ext_proc wire.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MODEL_CONFIG_KEY_PREFIX } from "../schemas/config.js";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { KubeStandin } from "../services/kube-standin/server.js";
import { startInferencePoolWatcher } from "../services/pod-watcher/k8s-inference-pool.js";
import type { PodWatcherHandle } from "../services/pod-watcher/pod-watcher.js";
import { configBucketName } from "../streams/definitions.js";
import { encodeToken } from "../streams/tokens.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const run = promisify(execFile);

describe("InferenceObjective / InferenceModelRewrite -> config bucket -> gateway flow bands and model rewrites", () => {
  let env: TestEnv;
  let kube: KubeStandin;
  let kubeconfig: string;
  let gw: GatewayHandle;
  let watcher: PodWatcherHandle;
  let client: ExtProcClient;
  const dir = mkdtempSync(path.join(os.tmpdir(), "jr-infpol-"));
  const kubectl = async (...args: string[]) => (await run("kubectl", args, { env: { ...process.env, KUBECONFIG: kubeconfig }, timeout: 20_000 })).stdout.trim();
  const apply = async (name: string, yaml: string[]) => {
    const file = path.join(dir, `${name}.yaml`);
    writeFileSync(file, `${yaml.join("\n")}\n`);
    return kubectl("apply", "--validate=false", "-f", file);
  };
  const objective = (name: string, priority: number, pool = "mixed") =>
    apply(`obj-${name}`, ["apiVersion: llm-d.ai/v1alpha2", "kind: InferenceObjective", "metadata:", `  name: ${name}`, "spec:", `  priority: ${priority}`, "  poolRef:", `    name: ${pool}`]);

  beforeAll(async () => {
    env = await startTestEnv();
    kube = await new KubeStandin({ bookmarkIntervalMs: 200 }).start();
    kubeconfig = kube.writeKubeconfig(path.join(dir, "kubeconfig"));
    gw = await env.gateway({ id: "gw-policy" });
    client = new ExtProcClient(`127.0.0.1:${gw.port}`);
    for (const [pod, model, ip] of [["llama-0", "llama-8b", "127.0.0.6"], ["mistral-0", "mistral-7b", "127.0.0.7"]] as const) {
      await apply(`pod-${pod}`, ["apiVersion: v1", "kind: Pod", "metadata:", `  name: ${pod}`, "  labels:", "    app: mixed", `    model: ${model}`, "spec:", "  containers:", "  - name: e", "    image: e"]);
      await kubectl("patch", "pod", pod, "--subresource=status", "--type=merge", "-p", JSON.stringify({ status: { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: "True" }] } }));
    }
    await apply("pool", ["apiVersion: inference.networking.k8s.io/v1", "kind: InferencePool", "metadata:", "  name: mixed", "spec:", "  selector:", "    matchLabels:", "      app: mixed", "  targetPorts:", "  - number: 8000"]);
  });
  afterAll(async () => {
    client?.close();
    await watcher?.close();
    await kube?.stop();
    await env?.stop();
  });

  it("objectives (priorities clamped to the bands) reach the gateway and merge into the flow-control objectives of the pool's models; the model's own win", async () => {
    await objective("interactive", 10);
    await objective("scavenger", -100);
    await objective("batch", 5);
    await objective("elsewhere", 3, "another-pool");
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken("llama-8b")}`, JSON.stringify({ flowControl: { objectives: { batch: { priority: 0 } } } }));
    watcher = await startInferencePoolWatcher({ nats: env.server.url, kubeconfig, inferencePool: "default/mixed", source: "pool-mixed", heartbeatMs: 200, modelLabel: "model", log: quietLog });
    await watcher.firstRound;
    await waitFor(() => gw.state.pods.readyPods("llama-8b").length === 1 && gw.state.pods.readyPods("mistral-7b").length === 1, 5_000, "pool endpoints routable");
    await waitFor(() => gw.state.poolPolicies.size === 1 && Object.keys(gw.state.poolPolicies.objectivesFor("llama-8b") ?? {}).length === 3, 5_000, "policy in the gateway");
    expect(gw.state.configs.get("llama-8b")?.flowControl?.objectives).toEqual({ interactive: { priority: 10 }, scavenger: { priority: -16 }, batch: { priority: 0 } });
    // A model without flow control keeps its config as it is (no bands to feed).
    expect(gw.state.configs.get("mistral-7b")).toBeUndefined();
    expect(watcher.stats.prioritiesClamped).toBe(1);
    // Changes apply live: the objective deleted leaves the bands.
    await kubectl("delete", "inferenceobjectives.llm-d.ai", "interactive");
    await waitFor(() => gw.state.configs.get("llama-8b")?.flowControl?.objectives?.interactive === undefined, 5_000, "objective removed");
  });

  it("an InferenceModelRewrite splits a model name by weight, the same target for the same request id, and the engine gets the rewritten body", async () => {
    await apply("rewrite", [
      "apiVersion: llm-d.ai/v1alpha2", "kind: InferenceModelRewrite", "metadata:", "  name: canary", "spec:", "  poolRef:", "    name: mixed", "  rules:",
      "  - matches:", "    - model:", "        type: Exact", "        value: food", "    targets:", "    - modelRewrite: llama-8b", "      weight: 3", "    - modelRewrite: mistral-7b", "      weight: 1",
      // Not implemented match type: the rule is skipped and reported.
      "  - matches:", "    - model:", "        type: Prefix", "        value: x", "    targets:", "    - modelRewrite: llama-8b",
    ]);
    await waitFor(() => gw.state.poolPolicies.hasRewrites, 5_000, "rewrite rules in the gateway");
    expect(watcher.stats.policyProblems).toBe(1);
    const send = async (id: string) => {
      const ex = client.open();
      await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", "x-request-id": id });
      const b = await ex.requestBody(Buffer.from(JSON.stringify({ model: "food", messages: [{ role: "user", content: "hi" }] })));
      ex.cancel();
      if (b.kind !== "continue") throw new Error(`expected continue, got ${b.kind}`);
      const model = (JSON.parse((b.bodyMutation as Buffer).toString()) as { model: string }).model;
      return { model, endpoint: b.headerMutation.set["x-gateway-destination-endpoint"], length: Number(b.headerMutation.set["content-length"]), bodyLength: (b.bodyMutation as Buffer).length };
    };
    const seen = new Map<string, number>();
    for (let i = 0; i < 80; i++) {
      const r = await send(`req-${i}`);
      seen.set(r.model, (seen.get(r.model) ?? 0) + 1);
      expect(r.endpoint).toBe(r.model === "llama-8b" ? "127.0.0.6:8000" : "127.0.0.7:8000");
      expect(r.length).toBe(r.bodyLength);
    }
    expect([...seen.keys()].sort()).toEqual(["llama-8b", "mistral-7b"]);
    // 3:1 by weight, within what 80 hashed ids give.
    expect(seen.get("llama-8b")).toBeGreaterThan(45);
    expect(seen.get("mistral-7b")).toBeGreaterThan(8);
    const again = await send("req-7");
    expect(again.model).toBe((await send("req-7")).model);
    await waitFor(() => gw.state.ledger.size === 0, 2_000, "cancelled requests released");
  });
});
