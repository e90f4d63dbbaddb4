import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { generateSigningKeyPair, SigningKeyError } from "../../streams/signatures.js";
import { readSigner, readVerifier, SIGNING_KEY_ENV } from "./signing-keys.js";

const dir = mkdtempSync(path.join(os.tmpdir(), "jetroute-signing-keys-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const pair = generateSigningKeyPair();
const keyFile = path.join(dir, "op.key");
const pubFile = path.join(dir, "op.pub");
writeFileSync(keyFile, pair.privateKeyPem);
writeFileSync(pubFile, pair.publicKeyPem);

describe("signing keys - files and environment", () => {
  it("the flag wins; else the environment holds a PEM or a path; else no signer", () => {
    expect(readSigner(keyFile, {})?.keyId).toBe(pair.keyId);
    expect(readSigner(undefined, { [SIGNING_KEY_ENV]: pair.privateKeyPem })?.keyId).toBe(pair.keyId);
    expect(readSigner(undefined, { [SIGNING_KEY_ENV]: keyFile })?.keyId).toBe(pair.keyId);
    expect(readSigner(undefined, {})).toBeUndefined();
    expect(readVerifier(pubFile).keyIds).toEqual([pair.keyId]);
  });

  it("a missing file or a file without the right key fails, naming it", () => {
    const missing = path.join(dir, "nope.key");
    expect(() => readSigner(missing, {})).toThrow(SigningKeyError);
    expect(() => readSigner(missing, {})).toThrow(missing);
    expect(() => readSigner(undefined, { [SIGNING_KEY_ENV]: missing })).toThrow(new RegExp(`${SIGNING_KEY_ENV}.*nope\\.key`));
    expect(() => readSigner(pubFile, {})).toThrow(pubFile);
    expect(() => readVerifier(keyFile, "--config-public-key")).toThrow(/--config-public-key .*op\.key: no PEM public key/);
  });
});
