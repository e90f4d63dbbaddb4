import { generateKeyPairSync } from "node:crypto";
import { describe, expect, it } from "vitest";
import { canonicalJson, configRecordSubject, generateSigningKeyPair, RecordSigner, RecordVerifier, SIGNATURE_MAX_SKEW_MS, SigningKeyError, signedBytes } from "./signatures.js";

const T = 1_700_000_000_000;
const subject = configRecordSubject("jr-config", "apikey.aa");
const pair = generateSigningKeyPair();
const signer = new RecordSigner(pair.privateKeyPem);
const verifier = new RecordVerifier(pair.publicKeyPem);

describe("signatures - canonical form", () => {
  it("sorts keys at every depth, keeps array order, drops undefined members", () => {
    expect(canonicalJson({ b: 1, a: { d: [3, { y: 1, x: 2 }], c: "s" }, u: undefined })).toBe('{"a":{"c":"s","d":[3,{"x":2,"y":1}]},"b":1}');
    expect(canonicalJson([undefined, null, "é"])).toBe('[null,null,"é"]');
  });

  it("is the same for a record and its parsed JSON copy, whatever the key order", () => {
    const r = { user: "alice", createdAt: T, admin: true, name: "ci \u2028 x" };
    const reordered = { name: r.name, admin: true, createdAt: T, user: "alice" };
    expect(signedBytes(subject, "k", T, JSON.parse(JSON.stringify(r)))).toEqual(signedBytes(subject, "k", T, reordered));
  });
});

describe("signatures - sign and verify", () => {
  it("a signed record verifies, under its subject, within the window", () => {
    const rec = signer.sign(subject, { user: "alice", createdAt: T }, T);
    expect(rec.sig).toMatchObject({ key: pair.keyId, at: T });
    expect(verifier.refusal(subject, JSON.parse(JSON.stringify(rec)), T + 1_000)).toBeUndefined();
    expect(verifier.refusal(subject, rec, T - SIGNATURE_MAX_SKEW_MS)).toBeUndefined();
  });

  it("signing again replaces the signature, and the signature field itself is not signed", () => {
    const once = signer.sign(subject, { user: "alice", createdAt: T }, T);
    const twice = signer.sign(subject, once, T + 5);
    expect(twice.sig.at).toBe(T + 5);
    expect(verifier.refusal(subject, twice, T)).toBeUndefined();
  });

  it("refuses, by reason: unsigned, malformed, unknown key, bad signature, out of window", () => {
    const rec = signer.sign(subject, { user: "alice", createdAt: T }, T);
    expect(verifier.refusal(subject, { user: "alice", createdAt: T }, T)).toBe("unsigned");
    expect(verifier.refusal(subject, "not an object", T)).toBe("unsigned");
    expect(verifier.refusal(subject, undefined, T)).toBe("unsigned");
    expect(verifier.refusal(subject, { ...rec, sig: { ...rec.sig, extra: 1 } }, T)).toBe("malformed");
    expect(verifier.refusal(subject, { ...rec, sig: "ed25519:abc" }, T)).toBe("malformed");
    const other = new RecordSigner(generateSigningKeyPair().privateKeyPem);
    expect(verifier.refusal(subject, other.sign(subject, { user: "alice", createdAt: T }, T), T)).toBe("unknown-key");
    // A field changed, the record moved to another key, the time changed: the signature no longer covers it.
    expect(verifier.refusal(subject, { ...rec, admin: true }, T)).toBe("bad-signature");
    expect(verifier.refusal(configRecordSubject("jr-config", "apikey.bb"), rec, T)).toBe("bad-signature");
    expect(verifier.refusal(subject, { ...rec, sig: { ...rec.sig, at: T + 1 } }, T)).toBe("bad-signature");
    // Another key id's signature bytes under this key's id.
    const forged = other.sign(subject, { user: "alice", createdAt: T }, T);
    expect(verifier.refusal(subject, { ...forged, sig: { ...forged.sig, key: pair.keyId } }, T)).toBe("bad-signature");
    // Stored long after (or before) it was signed: a copy replayed later.
    expect(verifier.refusal(subject, rec, T + SIGNATURE_MAX_SKEW_MS + 1)).toBe("out-of-window");
    expect(verifier.refusal(subject, rec, T - SIGNATURE_MAX_SKEW_MS - 1)).toBe("out-of-window");
  });

  it("a verifier takes several public keys (one PEM after another) and accepts any of them", () => {
    const second = generateSigningKeyPair();
    const both = new RecordVerifier(`${pair.publicKeyPem}\n${second.publicKeyPem}`);
    expect(both.keyIds.sort()).toEqual([pair.keyId, second.keyId].sort());
    expect(both.refusal(subject, new RecordSigner(second.privateKeyPem).sign(subject, { a: 1 }, T), T)).toBeUndefined();
    expect(both.refusal(subject, signer.sign(subject, { a: 1 }, T), T)).toBeUndefined();
  });

  it("keys that are not Ed25519, or not keys, are refused with a SigningKeyError", () => {
    const rsa = generateKeyPairSync("rsa", { modulusLength: 1024 });
    expect(() => new RecordSigner(rsa.privateKey.export({ type: "pkcs8", format: "pem" }).toString())).toThrow(SigningKeyError);
    expect(() => new RecordSigner("nonsense")).toThrow(SigningKeyError);
    expect(() => new RecordVerifier(rsa.publicKey.export({ type: "spki", format: "pem" }).toString())).toThrow(/Ed25519/);
    expect(() => new RecordVerifier(pair.privateKeyPem)).toThrow(/no PEM public key/);
  });
});
