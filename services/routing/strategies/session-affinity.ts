/**
 * `session-affinity`: keep a client's session on one pod without gateway-side session state.
 *
 * 1. `x-session-id` (as this strategy hands out) names a candidate: that pod.
 * 2. Else `x-aibrix-session-key` (1..256 characters): rendezvous (highest random weight) hashing
 *    of the key's hash over the candidates (the hash is what decision records keep, so replay maps
 *    a session exactly as the gateway did), so every replica maps a key to the same pod, and adding or
 *    removing a pod moves only the keys that land on / lived on it (~1/n of them).
 * 3. Else (no header, unknown or no-longer-ready pod): least-request.
 *
 * The pod finally chosen is always returned as `x-session-id` for the response, also when this
 * strategy is one part of a combination, so the next request of the session sticks to it.
 * As a scorer: 1 for the session's pod, 0 for the others (higher is better); without a usable
 * header it has no opinion (no value for any pod).
 *
 * Session ids come in two kinds (sessionIdOf / sessionAddressOf):
 * - with a fleet secret (`configureSessionSigning`): an opaque id, the base64url of an HMAC-SHA256
 *   of the pod's address truncated to 96 bits. Nothing in it decodes to the address; a replica
 *   resolves it by computing the MAC of each of the model's ready pods (cached per address) and
 *   matching, so every replica with the secret resolves it alike, an id for a pod that left names
 *   nothing, and an id the fleet did not make names no pod. Ids of the previous signed form
 *   (`<base64url address>.<MAC>`) are still accepted, verified, so sessions survive the upgrade;
 *   responses carry the opaque form.
 * - without one: AIBrix's base64 of `ip:port` (emitted base64url; standard base64 accepted too).
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
// An id (an encoded ip:port, IPv6 included, or a MAC) is far shorter; longer values are not ours.
const MAX_SESSION_ID = 128;

/** Bytes of HMAC-SHA256 kept in a signed session id (96 bits: forging one is out of reach). */
const MAC_BYTES = 12;
/** Length of an opaque session id: MAC_BYTES in base64url. */
const OPAQUE_ID_LENGTH = Math.ceil((MAC_BYTES * 4) / 3);
/**
 * Domain of the opaque ids' MAC: it differs from the previous form's MAC of the bare address, so
 * an opaque id is never the signature half of an old id for the same pod.
 */
const OPAQUE_DOMAIN = "jetroute x-session-id v2\0";
/** Pod addresses whose opaque id a replica keeps (a fleet's pods; the cache starts over when full). */
export const SESSION_ID_CACHE_ADDRESSES = 4096;

/** A fleet secret and the opaque ids of the addresses it has seen (pod addresses only, never client input). */
export class SessionSigner {
  private readonly key: Buffer;
  private readonly ids = new Map<string, Buffer>();

  constructor(
    secret: string,
    private readonly maxCached = SESSION_ID_CACHE_ADDRESSES,
  ) {
    if (!secret) throw new Error("session secret must not be empty");
    if (!Number.isSafeInteger(maxCached) || maxCached < 1) throw new Error(`session id cache size must be a positive integer, got ${maxCached}`);
    this.key = Buffer.from(secret, "utf8");
  }

  /** The opaque id of `address` as text bytes (cached). */
  opaque(address: string): Buffer {
    let id = this.ids.get(address);
    if (id === undefined) {
      id = Buffer.from(createHmac("sha256", this.key).update(OPAQUE_DOMAIN + address, "utf8").digest().subarray(0, MAC_BYTES).toString("base64url"), "utf8");
      if (this.ids.size >= this.maxCached) this.ids.clear();
      this.ids.set(address, id);
    }
    return id;
  }

  /** The MAC of the previous signed form, `<base64url address>.<this>` (not cached: the address is the client's). */
  legacyMac(address: string): string {
    return createHmac("sha256", this.key).update(address, "utf8").digest().subarray(0, MAC_BYTES).toString("base64url");
  }
}

let signer: SessionSigner | undefined;

/**
 * Sets the secret every replica shares (or none): with it, session ids are opaque and an id the
 * fleet did not make names no pod, so a client can neither read a pod's address from its id nor
 * pin an arbitrary pod by forging one. Without it (the default) ids are AIBrix's plain base64 of
 * `ip:port`, accepted as they are.
 */
export function configureSessionSigning(secret: string | undefined): void {
  signer = secret ? new SessionSigner(secret) : undefined;
}

/** The session id for `address`: opaque with a signer, else base64url of the address. */
export function sessionIdOf(address: string, by: SessionSigner | undefined): string {
  return by ? by.opaque(address).toString("utf8") : Buffer.from(address, "utf8").toString("base64url");
}

/** Constant-time equality of two strings' bytes. */
const sameText = (a: Buffer, b: Buffer): boolean => a.length === b.length && timingSafeEqual(a, b);

/**
 * The address a session id names, or undefined when it names none. With a signer: the candidate
 * whose opaque id it is (`candidates` is called only then), or the verified address of a
 * previous-form signed id; anything else, plain base64 included, names nothing. Without one: the
 * decoded base64 (either alphabet). `candidates` are the addresses the id may name.
 */
export function sessionAddressOf(id: string, by: SessionSigner | undefined, candidates: () => Iterable<string>): string | undefined {
  if (!id || id.length > MAX_SESSION_ID) return undefined;
  if (by && id.length === OPAQUE_ID_LENGTH && /^[A-Za-z0-9_-]+$/.test(id)) {
    const given = Buffer.from(id, "utf8");
    for (const address of candidates()) if (sameText(given, by.opaque(address))) return address;
    return undefined;
  }
  const dot = id.indexOf(".");
  const body = dot < 0 ? id : id.slice(0, dot);
  if (!/^[A-Za-z0-9+/_-]+={0,2}$/.test(body)) return undefined;
  // Node decodes both base64 alphabets.
  const address = Buffer.from(body, "base64").toString("utf8");
  if (!by) return dot < 0 ? address : undefined;
  if (dot < 0) return undefined;
  // Compared as text: base64 decoding ignores trailing characters, so a padded copy must not pass.
  return sameText(Buffer.from(id.slice(dot + 1), "utf8"), Buffer.from(by.legacyMac(address), "utf8")) ? address : undefined;
}

/** The session id this gateway hands out for `address`. */
export const encodeSessionId = (address: string): string => sessionIdOf(address, signer);

/** The address a session id names under the configured secret (sessionAddressOf); `candidates` are the ready pod addresses. */
export function decodeSessionId(id: string, candidates: () => Iterable<string>): string | undefined {
  return sessionAddressOf(id, signer, candidates);
}

/**
 * The session hint of a request's headers (invalid or oversized values are ignored). `candidates`
 * are the addresses an opaque `x-session-id` may name: the model's ready pods.
 */
export function sessionHintOf(headers: Readonly<Record<string, string>>, candidates: () => Iterable<string>): SessionHint | undefined {
  const id = headers[SESSION_ID_HEADER];
  const address = id ? decodeSessionId(id, candidates) : undefined;
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
