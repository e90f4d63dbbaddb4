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
import { xxh64 } from "@node-rs/xxhash";
import type { PodInfo } from "../../views/pod-set.js";
import { scorerStrategy } from "./combine.js";
import type { RoutingContext, Scorer, SessionHint } from "./types.js";

export const SESSION_ID_HEADER = "x-session-id";
export const SESSION_KEY_HEADER = "x-aibrix-session-key";
const MAX_SESSION_KEY = 256;
// An encoded ip:port (IPv6 included) is far shorter; longer values are not ours.
const MAX_SESSION_ID = 128;

export const encodeSessionId = (address: string): string => Buffer.from(address, "utf8").toString("base64url");

/** The address in a session id, or undefined when it is not one. Node decodes both base64 alphabets. */
export function decodeSessionId(id: string): string | undefined {
  if (!id || id.length > MAX_SESSION_ID || !/^[A-Za-z0-9+/_-]+={0,2}$/.test(id)) return undefined;
  return Buffer.from(id, "base64").toString("utf8");
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
