/**
 * Bearer API-key authentication (`gateway --auth required`): key generation, the client-facing
 * messages and the `config revoke-key` helpers. Pure: no NATS, no gRPC. The folded view of the
 * keys (ApiKeyView) and the per-request check live in services/views/api-keys.ts.
 */
import { randomBytes } from "node:crypto";
import { API_KEY_PREFIX, type AuthFailureReason, hashApiKey, MIN_HASH_PREFIX } from "../views/api-keys.js";

export {
  API_KEY_PREFIX,
  type AuthFailureReason,
  type AuthMode,
  type AuthResult,
  ApiKeyView,
  apiKeyBucketKey,
  bearerToken,
  hashApiKey,
  hashOfBucketKey,
  isKeyHash,
  MAX_BEARER_TOKEN_LENGTH,
  MIN_HASH_PREFIX,
  SHOWN_HASH_PREFIX,
} from "../views/api-keys.js";

/** A new random key: `jr-` + base64url of 32 random bytes (256 bits). */
export function generateApiKey(random: (n: number) => Buffer = randomBytes): string {
  return API_KEY_PREFIX + random(32).toString("base64url");
}

/** The client-facing message of a failure. Unknown and revoked read the same: a probe learns nothing. */
export function authFailureMessage(reason: AuthFailureReason): string {
  switch (reason) {
    case "missing":
      return "No API key provided. Send it in the Authorization header as `Authorization: Bearer <key>`.";
    case "malformed":
      return "The Authorization header is not a bearer token. Send `Authorization: Bearer <key>`.";
    default:
      return "Incorrect API key provided.";
  }
}

/**
 * What `config revoke-key <arg>` names: a full key (hashed here) or a hash prefix of at least
 * MIN_HASH_PREFIX hex digits. Returns the lower-case prefix, or an error message.
 */
export function revokeTarget(arg: string): { prefix: string } | { error: string } {
  const a = arg.trim();
  if (a.startsWith(API_KEY_PREFIX)) return { prefix: hashApiKey(a) };
  const lower = a.toLowerCase();
  if (!/^[0-9a-f]+$/.test(lower) || lower.length < MIN_HASH_PREFIX || lower.length > 64) {
    return { error: `expected a key hash prefix of ${MIN_HASH_PREFIX} to 64 hex digits (as \`config list-keys\` shows) or the key itself, got ${JSON.stringify(arg)}` };
  }
  return { prefix: lower };
}

/** The one hash starting with `prefix`, or why there is none. */
export function resolveHashPrefix(hashes: Iterable<string>, prefix: string): { hash: string } | { error: "unknown" | "ambiguous"; matches: string[] } {
  const matches: string[] = [];
  for (const h of hashes) if (h.startsWith(prefix)) matches.push(h);
  if (matches.length === 1) return { hash: matches[0] as string };
  return { error: matches.length === 0 ? "unknown" : "ambiguous", matches: matches.sort() };
}
