import { describe, expect, it } from "vitest";
import { configKeySigner, configVerifierFor, sharedKeyError, sharedKeyIds } from "./record-keys.js";
import { generateSigningKeyPair, RecordVerifier } from "./signatures.js";

const op = generateSigningKeyPair();
const pods = generateSigningKeyPair();
const operator = new RecordVerifier(op.publicKeyPem);
const podWatcher = new RecordVerifier(pods.publicKeyPem);

describe("which key set verifies which record", () => {
  it("config records are the operator's; InferencePool policies a pod-watcher's", () => {
    for (const k of ["apikey.ab12", "limits", "pool.chat", "model.org~Llama", "autoscale.chat", "adapter.sql-lora"]) expect(configKeySigner(k), k).toBe("operator");
    expect(configKeySigner("inferencepool.llm.p")).toBe("pod-watcher");
    expect(configKeySigner("something.else")).toBeUndefined();
    // "limits" exactly: a key merely starting with it is no rate-limits record.
    expect(configKeySigner("limitsx")).toBeUndefined();
  });

  it("each role's records go to that role's keys only; a missing watcher set refuses its records once the operator's is given", () => {
    const both = { operator, podWatcher };
    expect(configVerifierFor("apikey.x", both)).toEqual({ verifier: operator });
    expect(configVerifierFor("inferencepool.a.b", both)).toEqual({ verifier: podWatcher });
    expect(configVerifierFor("apikey.x", { podWatcher })).toBeUndefined();
    expect(configVerifierFor("inferencepool.a.b", { operator })).toEqual({ refuse: "unknown-key" });
    expect(configVerifierFor("inferencepool.a.b", {})).toBeUndefined();
  });

  it("a key in both sets is named, and the start-up error says which flag to fix", () => {
    expect(sharedKeyIds({ operator, podWatcher })).toEqual([]);
    const mixed = new RecordVerifier(op.publicKeyPem + pods.publicKeyPem);
    expect(sharedKeyIds({ operator: mixed, podWatcher })).toEqual(podWatcher.keyIds);
    expect(sharedKeyError({ operator: mixed, podWatcher })).toMatch(/in both --config-public-key and --pod-public-key.*remove it from --config-public-key/);
    expect(sharedKeyError({ operator })).toBeUndefined();
  });
});
