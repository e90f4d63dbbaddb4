/**
 * Which key set verifies which signed record (docs/security.md, "Signed records"). Two key sets,
 * never mixed:
 * - the **operator's** keys (`--config-public-key`) alone verify what grants a tenant power or
 *   sizes the fleet: API keys (`apikey.*`), rate limits (`limits`), pool assignments (`pool.*`),
 *   model configs (`model.*`), autoscaling policies (`autoscale.*`) and LoRA adapter
 *   declarations (`adapter.*`: an adapter's artifact is code-like weights loaded onto engines);
 * - the **pod-watchers'** keys (`--pod-public-key`) alone verify what a watcher writes: pods and
 *   source heartbeats on PODS, and InferencePool policies (`inferencepool.*`).
 * A watcher's key that also verified config records would let a compromised watcher mint admin API
 * keys; an operator key that verified pods would let a config writer route to any address. Pure.
 */
import { ADAPTER_KEY_PREFIX } from "../schemas/adapters.js";
import { AUTOSCALE_KEY_PREFIX } from "../schemas/autoscale.js";
import { API_KEY_KEY_PREFIX, INFERENCE_POOL_KEY_PREFIX, MODEL_CONFIG_KEY_PREFIX, POOL_KEY_PREFIX, RATE_LIMITS_KEY } from "../schemas/config.js";
import type { RecordVerifier, SignatureRefusal } from "./signatures.js";

/** Who signs a record. */
export type SignerRole = "operator" | "pod-watcher";

/**
 * The role whose keys verify a config bucket entry: `inferencepool.*` is a pod-watcher's, the
 * config records (`apikey.*`, `limits`, `pool.*`, `model.*`, `autoscale.*`, `adapter.*`) the operator's;
 * anything else is not a record either role signs (undefined).
 */
export function configKeySigner(key: string): SignerRole | undefined {
  if (key.startsWith(INFERENCE_POOL_KEY_PREFIX)) return "pod-watcher";
  if (key === RATE_LIMITS_KEY || key.startsWith(API_KEY_KEY_PREFIX) || key.startsWith(POOL_KEY_PREFIX) || key.startsWith(MODEL_CONFIG_KEY_PREFIX) || key.startsWith(AUTOSCALE_KEY_PREFIX) || key.startsWith(ADAPTER_KEY_PREFIX)) return "operator";
  return undefined;
}

/** The two key sets a process was started with; an absent set is not checked. */
export interface RecordKeySets {
  operator?: RecordVerifier;
  podWatcher?: RecordVerifier;
}

/**
 * How a config bucket entry under `key` is checked:
 * - `{ verifier }`: only that role's keys verify it;
 * - `{ refuse }`: signatures are checked but the role's keys were not given (an InferencePool
 *   policy on a process started with `--config-public-key` alone: it used to verify under the
 *   config keys, and no key of the operator's may stand in for a watcher's);
 * - undefined: unchecked (no key set at all, or a key no role signs).
 */
export function configVerifierFor(key: string, sets: RecordKeySets): { verifier: RecordVerifier } | { refuse: SignatureRefusal } | undefined {
  const role = configKeySigner(key);
  if (role === "operator") return sets.operator ? { verifier: sets.operator } : undefined;
  if (role === "pod-watcher") {
    if (sets.podWatcher) return { verifier: sets.podWatcher };
    return sets.operator ? { refuse: "unknown-key" } : undefined;
  }
  return undefined;
}

/** Why `record` stored under `key` (subject `subject`) is not to be acted on, undefined when it may be. */
export function configRecordRefusal(key: string, subject: string, record: unknown, storedAt: number, sets: RecordKeySets): SignatureRefusal | undefined {
  const how = configVerifierFor(key, sets);
  if (!how) return undefined;
  return "refuse" in how ? how.refuse : how.verifier.refusal(subject, record, storedAt);
}

/**
 * Key ids present in both sets. A process refuses to start with any: a pod-watcher's key listed as
 * an operator key (as the docs once said to do for InferencePool policies) would verify API keys.
 */
export function sharedKeyIds(sets: RecordKeySets): string[] {
  if (!sets.operator || !sets.podWatcher) return [];
  const pods = new Set(sets.podWatcher.keyIds);
  return sets.operator.keyIds.filter((k) => pods.has(k));
}

/** The start-up error for shared keys, naming the flags (undefined when the sets are apart). */
export function sharedKeyError(sets: RecordKeySets, flags = { operator: "--config-public-key", podWatcher: "--pod-public-key" }): string | undefined {
  const shared = sharedKeyIds(sets);
  if (shared.length === 0) return undefined;
  return `key ${shared.join(", ")} is in both ${flags.operator} and ${flags.podWatcher}: a pod-watcher's key verifies pods, heartbeats and InferencePool policies only, and must not verify API keys, limits, pools, model configs or autoscaling policies; remove it from ${flags.operator}`;
}
