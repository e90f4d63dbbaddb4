/**
 * `session-affinity`: keep a client's session on one pod without gateway-side session state.
 *
 * 1. `x-session-id` (base64 of the pod's `ip:port`, as this strategy hands out) names a candidate:
 *    that pod.
 * 2. Else `x-aibrix-session-key` (1..256 characters): rendezvous (highest random weight) hashing
 *    of the key's hash over the candidates (the hash is what decision records keep, so replay maps
 *    a session exactly as the gateway did), so every replica maps a key to the same pod, and adding or
 *    removing a pod moves only the keys that land on / lived on it (~1/n of them).
 * 3. Else (no header, unknown or no-longer-ready pod): least-request.
 *
 * The pod finally chosen is always returned as `x-session-id` for the response, also when this
 * strategy is one part of a combination, so the next request of the session sticks to it.
 * Emitted base64url (header- and cookie-safe); decoding accepts standard base64 too, which is
 * what AIBrix hands out. As a scorer: 1 for the session's pod, 0 for the others (higher is better);
 * without a usable header it has no opinion (no value for any pod).
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import { xxh64 } from "@node-rs/xxhash";
import type { PodInfo } from "../../views/pod-set.js";
import { scorerStrategy } from "./combine.js";
import type { RoutingContext, Scorer, SessionHint } from "./types.js";
import { fixedPlugin, type StrategyPlugin } from "./plugin.js";

export const SESSION_ID_HEADER = "x-session-id";
export const SESSION_KEY_HEADER = "x-aibrix-session-key";
const MAX_SESSION_KEY = 256;
// An encoded ip:port (IPv6 included) is far shorter; longer values are not ours.
const MAX_SESSION_ID = 128;

/** Bytes of HMAC-SHA256 kept in a signed session id (96 bits: forging one is out of reach). */
const MAC_BYTES = 12;
let signingKey: Buffer | undefined;

/**
 * Signs the session ids this gateway hands out (`<base64url address>.<base64url HMAC>`), with a
 * secret every replica shares: with it set, an id without a valid signature names no pod, so a
 * client cannot pin an arbitrary pod by forging `x-session-id`. Without it (the default) ids are
 * AIBrix's plain base64 of `ip:port`, accepted as they are.
 */
export function configureSessionSigning(secret: string | undefined): void {
  signingKey = secret ? Buffer.from(secret, "utf8") : undefined;
}

const macOf = (key: Buffer, address: string): Buffer => createHmac("sha256", key).update(address, "utf8").digest().subarray(0, MAC_BYTES);

export const encodeSessionId = (address: string): string => {
  const id = Buffer.from(address, "utf8").toString("base64url");
  return signingKey ? `${id}.${macOf(signingKey, address).toString("base64url")}` : id;
};

/** The address in a session id, or undefined when it is not one (or, when signing, not signed by us). Node decodes both base64 alphabets. */
export function decodeSessionId(id: string): string | undefined {
  if (!id || id.length > MAX_SESSION_ID) return undefined;
  const dot = id.indexOf(".");
  const body = dot < 0 ? id : id.slice(0, dot);
  if (!/^[A-Za-z0-9+/_-]+={0,2}$/.test(body)) return undefined;
  const address = Buffer.from(body, "base64").toString("utf8");
  if (!signingKey) return dot < 0 ? address : undefined;
  if (dot < 0) return undefined;
  // Compared as text: base64 decoding ignores trailing characters, so a padded copy must not pass.
  const mac = Buffer.from(id.slice(dot + 1), "utf8");
  const want = Buffer.from(macOf(signingKey, address).toString("base64url"), "utf8");
  return mac.length === want.length && timingSafeEqual(mac, want) ? address : undefined;
}

/** The session hint of a request's headers (invalid or oversized values are ignored). */
export function sessionHintOf(headers: Readonly<Record<string, string>>): SessionHint | undefined {
  const id = headers[SESSION_ID_HEADER];
  const address = id ? decodeSessionId(id) : undefined;
  const key = headers[SESSION_KEY_HEADER];
  const keyHash = key && key.length <= MAX_SESSION_KEY ? xxh64(key).toString(16) : undefined;
  if (address === undefined && keyHash === undefined) return undefined;
  return { ...(address !== undefined ? { address } : {}), ...(keyHash !== undefined ? { keyHash } : {}) };
}

/** Rendezvous hashing: the candidate with the highest hash of (key, address). */
export function rendezvous(key: string, pods: readonly PodInfo[]): number {
  let best = -1;
  let bestHash = -1n;
  pods.forEach((pod, i) => {
    // NUL separates the two parts so ("ab", "c") and ("a", "bc") hash differently.
    const h = xxh64(`${key}\0${pod.address}`);
    if (h > bestHash || (h === bestHash && pod.address < (pods[best] as PodInfo).address)) {
      best = i;
      bestHash = h;
    }
  });
  return best;
}

/** Index of the session's pod among the candidates, or -1. */
export function sessionTarget(ctx: RoutingContext): number {
  const s = ctx.request.session;
  if (s?.address !== undefined) {
    const i = ctx.pods.findIndex((p) => p.address === s.address);
    if (i >= 0) return i;
  }
  if (s?.keyHash !== undefined) return rendezvous(s.keyHash, ctx.pods);
  return -1;
}

export const sessionAffinityScorer: Scorer = {
  name: "session-affinity",
  better: "higher",
  score: (ctx) => {
    const target = sessionTarget(ctx);
    return ctx.pods.map((_, i) => (target < 0 ? undefined : i === target ? 1 : 0));
  },
  responseHeaders: (_ctx, picked) => ({ [SESSION_ID_HEADER]: encodeSessionId(picked.address) }),
};

export const sessionAffinityStrategy = scorerStrategy(sessionAffinityScorer);

export const sessionAffinityPlugin: StrategyPlugin = fixedPlugin(sessionAffinityStrategy);
