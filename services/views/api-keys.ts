/**
 * The API keys a gateway knows, folded from the config bucket (`apikey.<sha256 hex>` entries), and
 * the pure checks around them. Pure: hashing only, no I/O.
 *
 * Keys live in the config bucket as `apikey.<sha256 hex>` -> ApiKeyRecord; the plaintext key is
 * shown once by `jetroute config add-key` and stored nowhere. Per request the bearer token is
 * hashed once and the hash looked up. Comparing hashes through a Map leaks nothing useful through
 * timing: an attacker learns at most something about the SHA-256 of the guess.
 */
import { createHash } from "node:crypto";
import { API_KEY_KEY_PREFIX, type ApiKeyRecord } from "../../schemas/config.js";

/** Every generated key starts with this (recognisable in logs and by secret scanners). */
export const API_KEY_PREFIX = "jr-";
/** Bearer tokens longer than this are refused unhashed (a generated key has 46 characters). */
export const MAX_BEARER_TOKEN_LENGTH = 512;
/** Shortest hash prefix `config revoke-key` accepts. */
export const MIN_HASH_PREFIX = 6;
/** How many hex digits `config list-keys` shows. */
export const SHOWN_HASH_PREFIX = 12;

export type AuthMode = "off" | "required";
export type AuthFailureReason = "missing" | "malformed" | "unknown" | "revoked";

export type AuthResult = { ok: true; user: string; hash: string; objective?: string; cacheSalt?: string; keyClass?: string; models?: readonly string[]; delegate?: boolean } | { ok: false; reason: AuthFailureReason };
export type AuthOk = Extract<AuthResult, { ok: true }>;

/**
 * The header a delegate key (`config add-key --delegate`, the batch-worker's) sends to run a
 * request under another key's settings: the other key's SHA-256 (64 lower-case hex digits), never
 * the key itself.
 */
export const ON_BEHALF_OF_HEADER = "x-jetroute-on-behalf-of";

/**
 * What a request's `x-jetroute-on-behalf-of` header decides, given the key that authenticated it:
 * - `self`: no header; the request runs under its own key;
 * - `owner`: the authenticated key may delegate and the named key is known and not revoked: the
 *   request runs under that key's settings (user, models, objective, cache salt, class);
 * - `refused`: `malformed` (not a 64-hex hash), `not-permitted` (the authenticated key has no
 *   `delegate` permission: checked first, so a plain key learns nothing about other keys), or
 *   `owner-invalid` (unknown, revoked, or a record the gateway refused, e.g. unsigned).
 * Pure: `lookup` is the folded key view (records that failed validation or signature are absent).
 */
export type Delegation = { kind: "self" } | { kind: "owner"; owner: AuthOk } | { kind: "refused"; reason: "malformed" | "not-permitted" | "owner-invalid" };

export function delegationOf(caller: AuthOk, header: string | undefined, lookup: (hash: string) => ApiKeyRecord | undefined): Delegation {
  if (header === undefined) return { kind: "self" };
  if (caller.delegate !== true) return { kind: "refused", reason: "not-permitted" };
  const hash = header.trim();
  if (!isKeyHash(hash)) return { kind: "refused", reason: "malformed" };
  const rec = lookup(hash);
  if (!rec || rec.disabled) return { kind: "refused", reason: "owner-invalid" };
  // The owner's settings, never its delegate permission: a delegated request cannot delegate again.
  const { delegate: _ignored, ...owner } = authOkOf(hash, rec);
  return { kind: "owner", owner };
}

/** The settings of a valid, active key record, as a successful authentication carries them. */
function authOkOf(hash: string, rec: ApiKeyRecord): AuthOk {
  return { ok: true, user: rec.user, hash, ...(rec.objective ? { objective: rec.objective } : {}), ...(rec.cacheSalt !== undefined ? { cacheSalt: rec.cacheSalt } : {}), ...(rec.class !== undefined ? { keyClass: rec.class } : {}), ...(rec.models ? { models: rec.models } : {}), ...(rec.delegate === true ? { delegate: true } : {}) };
}

/** SHA-256 of the key's UTF-8 bytes, lower-case hex: what the config bucket stores. */
export function hashApiKey(key: string): string {
  return createHash("sha256").update(key, "utf8").digest("hex");
}

const HASH = /^[0-9a-f]{64}$/;

export function isKeyHash(s: string): boolean {
  return HASH.test(s);
}

/** Config bucket key of a hash. */
export function apiKeyBucketKey(hash: string): string {
  return `${API_KEY_KEY_PREFIX}${hash}`;
}

/** The hash named by a config bucket key, or undefined if the key is not a well-formed API key entry. */
export function hashOfBucketKey(key: string): string | undefined {
  if (!key.startsWith(API_KEY_KEY_PREFIX)) return undefined;
  const h = key.slice(API_KEY_KEY_PREFIX.length);
  return isKeyHash(h) ? h : undefined;
}

/**
 * The token of an `authorization: Bearer <token>` header value (scheme case-insensitive, RFC 7235).
 * `undefined`: no header; `null`: a header that is not a usable bearer token.
 */
export function bearerToken(header: string | undefined): string | undefined | null {
  if (header === undefined || header === "") return undefined;
  const m = /^\s*bearer\s+(\S+)\s*$/i.exec(header);
  const token = m?.[1];
  if (!token || token.length > MAX_BEARER_TOKEN_LENGTH) return null;
  return token;
}

/** The API keys a gateway knows, by hash. Revoked keys stay (to tell `revoked` from `unknown`). */
export class ApiKeyView {
  private readonly keys = new Map<string, ApiKeyRecord>();

  set(hash: string, record: ApiKeyRecord | undefined): void {
    if (record) this.keys.set(hash, record);
    else this.keys.delete(hash);
  }

  get(hash: string): ApiKeyRecord | undefined {
    return this.keys.get(hash);
  }

  get size(): number {
    return this.keys.size;
  }

  /** Every record by hash, in a canonical order (state comparison). */
  dump(): Array<[string, ApiKeyRecord]> {
    return [...this.keys.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1));
  }

  /** Keys that authenticate (not revoked). */
  get active(): number {
    let n = 0;
    for (const r of this.keys.values()) if (!r.disabled) n++;
    return n;
  }

  /** Checks an `authorization` header value: one SHA-256 and one Map lookup. */
  authenticate(authorization: string | undefined): AuthResult {
    const token = bearerToken(authorization);
    if (token === undefined) return { ok: false, reason: "missing" };
    if (token === null) return { ok: false, reason: "malformed" };
    const hash = hashApiKey(token);
    const rec = this.keys.get(hash);
    if (!rec) return { ok: false, reason: "unknown" };
    if (rec.disabled) return { ok: false, reason: "revoked" };
    return authOkOf(hash, rec);
  }

  /** The request's delegation decision (delegationOf) against this view. */
  delegation(caller: AuthOk, header: string | undefined): Delegation {
    return delegationOf(caller, header, (h) => this.keys.get(h));
  }
}


/**
 * What `GET /v1/models` lists to a key: every model and adapter served, or only those the key's
 * `models` names (a key restricted to some models learns nothing of the others, not even their
 * names). Absent `keyModels` (no restriction, or `--auth off`): everything.
 */
export function modelsVisibleTo(served: readonly string[], keyModels: readonly string[] | undefined): string[] {
  if (!keyModels) return [...served];
  const allowed = new Set(keyModels);
  return served.filter((m) => allowed.has(m));
}
