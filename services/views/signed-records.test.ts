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
const KEY = "jr-test-key";
const HASH = hashApiKey(KEY);
const keyName = `apikey.${HASH}`;

let seq = 0;
function put(s: GatewayState, key: string, value: unknown, at = T) {
  return s.apply({ type: "config-entry", key, operation: "PUT", value }, { stream: "config", subject: key, seq: ++seq, serverTs: at });
}
const signed = (key: string, value: object, at = T) => signer.sign(configRecordSubject(BUCKET, key), value, at);
const checked = () => new GatewayState({ configSignatures: { verifier, bucket: BUCKET }, podSignatures: verifier });

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
    const good = signer.sign(subject, pod, T);
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
    expect(s.apply(signer.sign("jr.podsrc.src", hb, T), { ...meta(2), subject: "jr.podsrc.src" }).applied).toBe(true);
  });

  it("a copy of the fold keeps checking", () => {
    const c = checked().cloneAs("gw");
    expect(c.apply(pod, meta(1)).ignored).toBe("signature");
    expect(c.signatureRefusals.pods.unsigned).toBe(1);
  });
});
