import { describe, expect, it } from "vitest";
import { API_KEY_KEY_PREFIX, type ApiKeyRecord, apiKeyRecordError } from "../../schemas/config.js";
import {
  ApiKeyView,
  apiKeyBucketKey,
  authFailureMessage,
  bearerToken,
  generateApiKey,
  hashApiKey,
  hashOfBucketKey,
  MAX_BEARER_TOKEN_LENGTH,
  resolveHashPrefix,
  revokeTarget,
} from "./auth.js";

const rec = (over: Partial<ApiKeyRecord> = {}): ApiKeyRecord => ({ user: "alice", createdAt: 1_700_000_000_000, ...over });

describe("auth - keys and hashes", () => {
  it("generates jr- + base64url of 32 random bytes, different every time", () => {
    const k = generateApiKey();
    expect(k).toMatch(/^jr-[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(k.slice(3), "base64url")).toHaveLength(32);
    const many = new Set(Array.from({ length: 200 }, () => generateApiKey()));
    expect(many.size).toBe(200);
    // The bytes come from the random source, unaltered.
    expect(generateApiKey((n) => Buffer.alloc(n, 0xff))).toBe(`jr-${"_".repeat(42)}8`);
  });

  it("hashes with SHA-256 to lower-case hex (known vectors)", () => {
    expect(hashApiKey("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect(hashApiKey("")).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    // UTF-8 bytes, not UTF-16 code units.
    expect(hashApiKey("é")).toBe("4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c");
  });

  it("maps hashes to config bucket keys and back, refusing anything that is not 64 lower-case hex digits", () => {
    const h = hashApiKey("jr-x");
    expect(apiKeyBucketKey(h)).toBe(`${API_KEY_KEY_PREFIX}${h}`);
    expect(hashOfBucketKey(apiKeyBucketKey(h))).toBe(h);
    expect(hashOfBucketKey(`${API_KEY_KEY_PREFIX}${h.toUpperCase()}`)).toBeUndefined();
    expect(hashOfBucketKey(`${API_KEY_KEY_PREFIX}${h.slice(1)}`)).toBeUndefined();
    expect(hashOfBucketKey(`${API_KEY_KEY_PREFIX}jr-plaintext`)).toBeUndefined();
    expect(hashOfBucketKey(`limits`)).toBeUndefined();
  });
});

describe("auth - bearer header parsing", () => {
  it.each([
    ["Bearer jr-abc", "jr-abc"],
    ["bearer jr-abc", "jr-abc"],
    ["BEARER   jr-abc  ", "jr-abc"],
    [" Bearer\tjr-abc", "jr-abc"],
  ])("%j -> the token", (header, token) => {
    expect(bearerToken(header)).toBe(token);
  });

  it.each([
    ["Basic YWxpY2U6cHc="],
    ["Bearer"],
    ["Bearer "],
    ["Bearer a b"],
    ["jr-abc"],
    ["Token jr-abc"],
    [`Bearer ${"a".repeat(MAX_BEARER_TOKEN_LENGTH + 1)}`],
  ])("%j -> malformed (null)", (header) => {
    expect(bearerToken(header)).toBeNull();
  });

  it("no header or an empty one -> missing (undefined)", () => {
    expect(bearerToken(undefined)).toBeUndefined();
    expect(bearerToken("")).toBeUndefined();
  });
});

describe("auth - ApiKeyView", () => {
  const key = "jr-alice-key";
  const other = "jr-bob-key";

  it("authenticates a known key to its user and refuses the rest with a reason", () => {
    const v = new ApiKeyView();
    v.set(hashApiKey(key), rec());
    v.set(hashApiKey(other), rec({ user: "bob", disabled: true, revokedAt: 1 }));
    expect(v.authenticate(`Bearer ${key}`)).toEqual({ ok: true, user: "alice", hash: hashApiKey(key) });
    expect(v.authenticate(undefined)).toEqual({ ok: false, reason: "missing" });
    expect(v.authenticate("Basic abc")).toEqual({ ok: false, reason: "malformed" });
    expect(v.authenticate("Bearer jr-guess")).toEqual({ ok: false, reason: "unknown" });
    expect(v.authenticate(`Bearer ${other}`)).toEqual({ ok: false, reason: "revoked" });
    // The hash is not a key: presenting it fails.
    expect(v.authenticate(`Bearer ${hashApiKey(key)}`)).toEqual({ ok: false, reason: "unknown" });
    expect([v.size, v.active]).toEqual([2, 1]);
  });

  it("follows changes: revoke, re-enable, delete", () => {
    const v = new ApiKeyView();
    const h = hashApiKey(key);
    v.set(h, rec());
    expect(v.authenticate(`Bearer ${key}`).ok).toBe(true);
    v.set(h, rec({ disabled: true }));
    expect(v.authenticate(`Bearer ${key}`)).toEqual({ ok: false, reason: "revoked" });
    v.set(h, rec({ user: "alice2" }));
    expect(v.authenticate(`Bearer ${key}`)).toMatchObject({ ok: true, user: "alice2" });
    v.set(h, undefined);
    expect(v.authenticate(`Bearer ${key}`)).toEqual({ ok: false, reason: "unknown" });
    expect(v.size).toBe(0);
  });

  it("tells the client the same thing for an unknown and a revoked key", () => {
    expect(authFailureMessage("unknown")).toBe(authFailureMessage("revoked"));
    expect(authFailureMessage("missing")).toMatch(/Authorization: Bearer/);
    expect(authFailureMessage("malformed")).not.toBe(authFailureMessage("missing"));
  });
});

describe("auth - API key record validation", () => {
  it("accepts a minimal and a full record", () => {
    expect(apiKeyRecordError(rec())).toBeUndefined();
    expect(apiKeyRecordError(rec({ name: "ci", disabled: true, revokedAt: 5 }))).toBeUndefined();
  });

  it.each([
    ["no user", { createdAt: 1 }, /user/],
    ["an empty user", rec({ user: "" }), /user/],
    ["a user with a control character (it becomes a header)", rec({ user: "al\nice" }), /user/],
    ["a user over 256 characters (charge events cap it)", rec({ user: "u".repeat(257) }), /user/],
    ["no createdAt", { user: "alice" }, /createdAt/],
    ["a fractional createdAt", rec({ createdAt: 1.5 }), /createdAt/],
    ["disabled as a string", { ...rec(), disabled: "yes" }, /disabled/],
    ["the plaintext key stored alongside", { ...rec(), key: "jr-abc" }, /key|additional/i],
    ["not an object", "alice", /./],
  ])("rejects %s", (_what, value, reason) => {
    const err = apiKeyRecordError(value);
    expect(err).toBeDefined();
    expect(err).toMatch(reason);
  });
});

describe("auth - naming a key to revoke", () => {
  const hashes = ["abcdef0011", "abcdef0022", "0123456789"].map((p) => p.padEnd(64, "0"));

  it("resolves a unique prefix, and reports unknown and ambiguous ones with their matches", () => {
    expect(resolveHashPrefix(hashes, "0123456")).toEqual({ hash: hashes[2] });
    expect(resolveHashPrefix(hashes, "abcdef001")).toEqual({ hash: hashes[0] });
    expect(resolveHashPrefix(hashes, "abcdef00")).toEqual({ error: "ambiguous", matches: [hashes[0], hashes[1]] });
    expect(resolveHashPrefix(hashes, "ffffff")).toEqual({ error: "unknown", matches: [] });
    expect(resolveHashPrefix(hashes, hashes[1] as string)).toEqual({ hash: hashes[1] });
  });

  it("accepts a hex prefix (case-insensitive) of 6 to 64 digits, or the key itself", () => {
    expect(revokeTarget("ABCDEF00")).toEqual({ prefix: "abcdef00" });
    expect(revokeTarget(" abcdef ")).toEqual({ prefix: "abcdef" });
    expect(revokeTarget("jr-secret")).toEqual({ prefix: hashApiKey("jr-secret") });
    for (const bad of ["abc", "xyzxyzxyz", "", "a".repeat(65), "abcdef*"]) expect(revokeTarget(bad)).toHaveProperty("error");
  });
});
