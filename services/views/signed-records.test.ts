import { describe, expect, it } from "vitest";
import type { PodEvent } from "../../schemas/events.js";
import { configRecordSubject, generateSigningKeyPair, RecordSigner, RecordVerifier } from "../../streams/signatures.js";
import { hashApiKey } from "./api-keys.js";
import { GatewayState } from "./gateway-state.js";

const T = 1_700_000_000_000;
const BUCKET = "jr-config";
const pair = generateSigningKeyPair();
const signer = new RecordSigner(pair.privateKeyPem);
const verifier = new RecordVerifier(pair.publicKeyPem);
// The pod-watchers' key set, apart from the operator's (streams/record-keys.ts).
const podPair = generateSigningKeyPair();
const podSigner = new RecordSigner(podPair.privateKeyPem);
const podVerifier = new RecordVerifier(podPair.publicKeyPem);
const KEY = "jr-test-key";
const HASH = hashApiKey(KEY);
const keyName = `apikey.${HASH}`;

let seq = 0;
function put(s: GatewayState, key: string, value: unknown, at = T) {
  return s.apply({ type: "config-entry", key, operation: "PUT", value }, { stream: "config", subject: key, seq: ++seq, serverTs: at });
}
const signed = (key: string, value: object, at = T) => signer.sign(configRecordSubject(BUCKET, key), value, at);
const checked = () => new GatewayState({ configSignatures: { operator: verifier, podWatcher: podVerifier, bucket: BUCKET }, podSignatures: podVerifier });

describe("signed records - config bucket", () => {
  it("an unsigned API key record grants nothing; the signed one authenticates", () => {
    const s = checked();
    const r = put(s, keyName, { user: "mallory", createdAt: T, admin: true });
    expect(r).toMatchObject({ applied: false, ignored: "signature" });
    expect(s.apiKeys.authenticate(`Bearer ${KEY}`)).toEqual({ ok: false, reason: "unknown" });
    expect(s.signatureRefusals.config.unsigned).toBe(1);
    expect(put(s, keyName, signed(keyName, { user: "alice", createdAt: T })).applied).toBe(true);
    expect(s.apiKeys.authenticate(`Bearer ${KEY}`)).toMatchObject({ ok: true, user: "alice" });
  });

  it("a planted record over a signed key removes the key (fail closed), it never replaces its user", () => {
    const s = checked();
    put(s, keyName, signed(keyName, { user: "alice", createdAt: T }));
    const moved = signed(`apikey.${hashApiKey("other")}`, { user: "mallory", createdAt: T, admin: true });
    expect(put(s, keyName, moved).ignored).toBe("signature");
    expect(s.apiKeys.authenticate(`Bearer ${KEY}`).ok).toBe(false);
    expect(s.signatureRefusals.config["bad-signature"]).toBe(1);
  });

  it("limits, pools and model configs that do not verify are ignored; the signed previous ones stay", () => {
    const s = checked();
    put(s, "limits", signed("limits", { users: { default: { rpm: 2 } } }));
    put(s, "pool.chat", signed("pool.chat", { models: ["m1"] }));
    put(s, "model.m1", signed("model.m1", { lockedRoutingStrategy: "least-request" }));
    expect(put(s, "limits", { users: { default: { rpm: 1_000_000 } } }).ignored).toBe("signature");
    expect(put(s, "pool.chat", { models: ["m1", "m2"] }).ignored).toBe("signature");
    expect(put(s, "model.m1", { lockedRoutingStrategy: "random" }).ignored).toBe("signature");
    // A signed record replayed long after it was signed (an old copy put back).
    expect(put(s, "limits", signed("limits", { users: {} }, T), T + 3_600_000).ignored).toBe("signature");
    expect(s.configs.userLimits("anyone")).toEqual({ rpm: 2 });
    expect(s.pools.modelsOf("chat")).toEqual(["m1"]);
    expect(s.configs.get("m1")?.lockedRoutingStrategy).toBe("least-request");
    expect(s.signatureRefusals.config).toMatchObject({ unsigned: 3, "out-of-window": 1 });
    expect(s.configRejected).toBe(4);
  });

  it("without a verifier nothing changes: unsigned records apply, signed ones too", () => {
    const s = new GatewayState();
    expect(put(s, keyName, { user: "alice", createdAt: T }).applied).toBe(true);
    expect(put(s, "limits", signed("limits", { users: { default: { rpm: 2 } } })).applied).toBe(true);
    expect(s.apiKeys.authenticate(`Bearer ${KEY}`).ok).toBe(true);
    expect(s.configs.userLimits("x")).toEqual({ rpm: 2 });
  });
});

describe("signed records - PODS", () => {
  const subject = "jr.pods.m1.p0";
  const pod: PodEvent = { type: "pod", action: "upsert", model: "m1", pod: "p0", address: "10.0.0.1:8000", ready: true, engine: "vllm", ts: T };
  const meta = (n: number, at = T) => ({ stream: "pods" as const, subject, seq: n, serverTs: at });

  it("an unsigned or re-addressed pod event is ignored; a signed one is routed to", () => {
    const s = checked();
    expect(s.apply(pod, meta(1))).toMatchObject({ applied: false, ignored: "signature", note: { level: "warn" } });
    expect(s.pods.knows("m1")).toBe(false);
    const good = podSigner.sign(subject, pod, T);
    expect(s.apply(good, meta(2)).applied).toBe(true);
    expect(s.pods.knows("m1")).toBe(true);
    // The signed event with another address, or under another pod's subject: refused, the pod stays as signed.
    expect(s.apply({ ...good, address: "169.254.169.254:80" }, meta(3)).ignored).toBe("signature");
    expect(s.apply({ ...good, action: "remove" }, meta(4)).ignored).toBe("signature");
    expect(s.apply(good, { ...meta(5), subject: "jr.pods.m1.p1" }).ignored).toBe("signature");
    expect(s.pods.all().map((p) => p.address)).toEqual(["10.0.0.1:8000"]);
    expect(s.signatureRefusals.pods).toMatchObject({ unsigned: 1, "bad-signature": 3 });
  });

  it("watcher heartbeats are checked too", () => {
    const s = checked();
    const hb = { type: "pod-source" as const, source: "src", watcher: "w", pods: 1, intervalMs: 1_000, ts: T };
    expect(s.apply(hb, { ...meta(1), subject: "jr.podsrc.src" }).ignored).toBe("signature");
    expect(s.apply(podSigner.sign("jr.podsrc.src", hb, T), { ...meta(2), subject: "jr.podsrc.src" }).applied).toBe(true);
  });

  it("a copy of the fold keeps checking", () => {
    const c = checked().cloneAs("gw");
    expect(c.apply(pod, meta(1)).ignored).toBe("signature");
    expect(c.signatureRefusals.pods.unsigned).toBe(1);
  });
});

describe("signed records - each record type verifies under its own signer's keys only", () => {
  const poolKey = "inferencepool.llm.pool-a";
  const policy = { pool: "llm/pool-a", apiVersion: "llm-d.ai/v1alpha2", models: ["m1"], objectives: { batch: { priority: -1 } }, rewrites: [] };
  const bySigner = (sg: RecordSigner, key: string, value: object, at = T) => sg.sign(configRecordSubject(BUCKET, key), value, at);

  it("a pod-watcher's key mints no API key, limits, pool, model config or autoscaling policy", () => {
    const s = checked();
    expect(put(s, keyName, bySigner(podSigner, keyName, { user: "mallory", createdAt: T, admin: true }))).toMatchObject({ applied: false, ignored: "signature" });
    expect(s.apiKeys.authenticate(`Bearer ${KEY}`).ok).toBe(false);
    expect(put(s, "limits", bySigner(podSigner, "limits", { users: { default: { rpm: 1 } } })).ignored).toBe("signature");
    expect(put(s, "pool.chat", bySigner(podSigner, "pool.chat", { models: ["m1"] })).ignored).toBe("signature");
    expect(put(s, "model.m1", bySigner(podSigner, "model.m1", { lockedRoutingStrategy: "random" })).ignored).toBe("signature");
    expect(s.configs.userLimits("anyone")).toBeUndefined();
    expect(s.pools.modelsOf("chat") ?? []).toEqual([]);
    expect(s.configs.get("m1")).toBeUndefined();
    expect(s.signatureRefusals.config["unknown-key"]).toBe(4);
  });

  it("InferencePool policies verify under the pod-watchers' keys, not the operator's", () => {
    const s = checked();
    expect(put(s, poolKey, bySigner(signer, poolKey, policy)).ignored).toBe("signature");
    expect(s.poolPolicies.size).toBe(0);
    expect(put(s, poolKey, bySigner(podSigner, poolKey, policy)).applied).toBe(true);
    expect(s.poolPolicies.size).toBe(1);
  });

  it("with the operator's keys alone, an InferencePool policy is refused (no watcher key to verify it with); with the watchers' alone, config records are unchecked", () => {
    const op = new GatewayState({ configSignatures: { operator: verifier, bucket: BUCKET } });
    expect(put(op, poolKey, bySigner(podSigner, poolKey, policy)).ignored).toBe("signature");
    expect(put(op, poolKey, bySigner(signer, poolKey, policy)).ignored).toBe("signature");
    const pods = new GatewayState({ configSignatures: { podWatcher: podVerifier, bucket: BUCKET }, podSignatures: podVerifier });
    expect(put(pods, "limits", { users: { default: { rpm: 2 } } }).applied).toBe(true);
    expect(put(pods, poolKey, policy).ignored).toBe("signature");
    expect(put(pods, poolKey, bySigner(podSigner, poolKey, policy)).applied).toBe(true);
  });

  it("an operator key signs no pod", () => {
    const s = checked();
    const pod: PodEvent = { type: "pod", action: "upsert", model: "m1", pod: "p0", address: "10.0.0.1:8000", ready: true, engine: "vllm", ts: T };
    expect(s.apply(signer.sign("jr.pods.m1.p0", pod, T), { stream: "pods", subject: "jr.pods.m1.p0", seq: 1, serverTs: T }).ignored).toBe("signature");
    expect(s.pods.knows("m1")).toBe(false);
  });
});
