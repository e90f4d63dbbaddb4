/**
 * Signed records, key sets kept apart (streams/record-keys.ts), on a real nats-server with
 * in-process gateways: a pod-watcher's key mints no API key, an operator's signs no pod, and a
 * gateway given a watcher's key among the operator's refuses to start.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import { apiKeyBucketKey, hashApiKey } from "../services/gateway/auth.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { acked } from "../services/shared/publish.js";
import { configBucketName } from "../streams/definitions.js";
import { configRecordSubject, generateSigningKeyPair, RecordSigner } from "../streams/signatures.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const chat = () => Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello" }] }));

describe("signed records: operator and pod-watcher keys verify their own records only", () => {
  let env: TestEnv;
  let gw: GatewayHandle;
  let client: ExtProcClient;
  let dir: string;
  const op = generateSigningKeyPair();
  const pods = generateSigningKeyPair();
  const opSigner = new RecordSigner(op.privateKeyPem);
  const podSigner = new RecordSigner(pods.privateKeyPem);
  const bucket = configBucketName("jr");
  const file = (name: string, text: string) => {
    const f = path.join(dir, name);
    writeFileSync(f, text);
    return f;
  };

  beforeAll(async () => {
    dir = mkdtempSync(path.join(tmpdir(), "jr-key-scope-"));
    env = await startTestEnv();
    // A pod the watcher's key signed: routable.
    const pod = { type: "pod" as const, action: "upsert" as const, model: MODEL, pod: "signed-0", address: "127.0.0.1:9300", ready: true, engine: "vllm" as const, ts: Date.now() };
    const subject = env.subjects.pod(MODEL, "signed-0");
    await acked(env.nats.js, subject, podSigner.sign(subject, pod, Date.now()));
    gw = await env.gateway({ id: "scope", auth: "required", configPublicKeyFile: file("operator.pub", op.publicKeyPem), podPublicKeyFile: file("pods.pub", pods.publicKeyPem) });
    client = new ExtProcClient(`127.0.0.1:${gw.port}`);
  });
  afterAll(async () => {
    client?.close();
    await env?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const send = async (key: string) => {
    const ex = client.open();
    const h = await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", authorization: `Bearer ${key}` });
    if (h.kind === "immediate") {
      ex.cancel();
      return h.status;
    }
    const b = await ex.requestBody(chat());
    ex.cancel();
    return b.kind === "immediate" ? b.status : 200;
  };

  it("an admin API key signed with the pod-watcher's key is no key; the operator-signed one routes", async () => {
    const kv = await new Kvm(env.nats.js).open(bucket);
    const planted = "jr-planted-by-a-compromised-watcher";
    const plantedKey = apiKeyBucketKey(hashApiKey(planted));
    await kv.put(plantedKey, JSON.stringify(podSigner.sign(configRecordSubject(bucket, plantedKey), { user: "mallory", createdAt: Date.now(), admin: true }, Date.now())));
    const good = "jr-issued-by-the-operator";
    const goodKey = apiKeyBucketKey(hashApiKey(good));
    await kv.put(goodKey, JSON.stringify(opSigner.sign(configRecordSubject(bucket, goodKey), { user: "alice", createdAt: Date.now() }, Date.now())));
    // Entries apply in revision order: once the operator's (later) one is in, the planted one was judged.
    await waitFor(() => gw.apiKeys.size > 0, 5_000, "the operator-signed key to apply");
    expect(await send(good)).toBe(200);
    expect(await send(planted)).toBe(401);
    expect(gw.state.signatureRefusals.config["unknown-key"]).toBeGreaterThanOrEqual(1);
  });

  it("an InferencePool policy signed with the pod-watcher's key applies (its key is not among the operator's); one signed with the operator's does not", async () => {
    const kv = await new Kvm(env.nats.js).open(bucket);
    const policy = (pool: string) => ({ pool, apiVersion: "llm-d.ai/v1alpha2", models: [MODEL], objectives: { batch: { priority: -2 } }, rewrites: [] });
    const byOp = "inferencepool.llm.by-operator";
    await kv.put(byOp, JSON.stringify(opSigner.sign(configRecordSubject(bucket, byOp), policy("llm/by-operator"), Date.now())));
    const byWatcher = "inferencepool.llm.by-watcher";
    await kv.put(byWatcher, JSON.stringify(podSigner.sign(configRecordSubject(bucket, byWatcher), policy("llm/by-watcher"), Date.now())));
    await waitFor(() => gw.state.poolPolicies.size > 0, 5_000, "the watcher-signed policy to apply");
    expect(gw.state.poolPolicies.size).toBe(1);
  });

  it("a pod signed with the operator's key is not routed to", async () => {
    const pod = { type: "pod" as const, action: "upsert" as const, model: "scope/other", pod: "op-signed", address: "127.0.0.1:9301", ready: true, engine: "vllm" as const, ts: Date.now() };
    const subject = env.subjects.pod(pod.model, pod.pod);
    await acked(env.nats.js, subject, opSigner.sign(subject, pod, Date.now()));
    await waitFor(() => gw.state.signatureRefusals.pods["unknown-key"] >= 1, 5_000, "the operator-signed pod to be refused");
    expect(gw.state.pods.knows("scope/other")).toBe(false);
  });

  it("a gateway whose --config-public-key lists the pod-watcher's key refuses to start, naming the flags", async () => {
    await expect(env.gateway({ id: "mixed", configPublicKeyFile: file("mixed.pub", op.publicKeyPem + pods.publicKeyPem), podPublicKeyFile: path.join(dir, "pods.pub") })).rejects.toThrow(/in both --config-public-key and --pod-public-key/);
  });
});
