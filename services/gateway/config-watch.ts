/**
 * Keeps a ModelConfigView (and the API keys) in step with the config bucket: current values at
 * start, then every change, live. A config that fails validation is logged and ignored (the
 * previous one stays), so a bad `put` from outside `jetroute config set` can never break routing.
 * API key records are the exception: an invalid one removes the key (fail closed), so a botched
 * hand-made revocation never leaves a key working.
 */
import { Kvm, type KvEntry } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import {
  API_KEY_KEY_PREFIX,
  type ApiKeyRecord,
  apiKeyRecordError,
  MODEL_CONFIG_KEY_PREFIX,
  type ModelConfig,
  modelConfigError,
  RATE_LIMITS_KEY,
  type RateLimits,
  rateLimitsError,
} from "../../schemas/config.js";
import { decodeToken } from "../../streams/tokens.js";
import type { Logger } from "../shared/log.js";
import type { ModelConfigView } from "../views/model-config.js";
import { type ApiKeyView, hashOfBucketKey, SHOWN_HASH_PREFIX } from "./auth.js";

export interface ConfigWatch {
  rejected: number;
  stop(): Promise<void>;
}

function entryJson(e: KvEntry): unknown {
  try {
    return e.json();
  } catch {
    return undefined;
  }
}

export async function watchModelConfigs(nc: NatsConnection, bucket: string, view: ModelConfigView, log: Logger, keys?: ApiKeyView): Promise<ConfigWatch> {
  const kv = await new Kvm(nc).open(bucket);
  const revisions = new Map<string, number>();
  const state: ConfigWatch = { rejected: 0, stop: async () => undefined };
  const apply = (e: KvEntry) => {
    const isKey = e.key.startsWith(API_KEY_KEY_PREFIX);
    if (e.key !== RATE_LIMITS_KEY && !e.key.startsWith(MODEL_CONFIG_KEY_PREFIX) && !isKey) return;
    if ((revisions.get(e.key) ?? 0) >= e.revision) return;
    revisions.set(e.key, e.revision);
    if (isKey) {
      if (!keys) return;
      const hash = hashOfBucketKey(e.key);
      if (!hash) {
        state.rejected++;
        return log.warn({ key: e.key.slice(0, API_KEY_KEY_PREFIX.length + SHOWN_HASH_PREFIX) }, "API key entry not named by a SHA-256 hex hash; ignored");
      }
      const key = hash.slice(0, SHOWN_HASH_PREFIX);
      if (e.operation !== "PUT") {
        keys.set(hash, undefined);
        return log.info({ key, revision: e.revision }, "API key removed");
      }
      const value = entryJson(e);
      const err = value === undefined ? "not JSON" : apiKeyRecordError(value);
      if (err) {
        state.rejected++;
        keys.set(hash, undefined);
        return log.error({ key, revision: e.revision, err }, "invalid API key record; the key is refused until a valid record is stored");
      }
      const rec = value as ApiKeyRecord;
      keys.set(hash, rec);
      return log.info({ key, user: rec.user, revoked: rec.disabled === true, revision: e.revision }, "API key applied");
    }
    if (e.key === RATE_LIMITS_KEY) {
      if (e.operation !== "PUT") return view.setLimits(undefined);
      const value = entryJson(e);
      const err = value === undefined ? "not JSON" : rateLimitsError(value);
      if (err) {
        state.rejected++;
        return log.error({ revision: e.revision, err }, "invalid rate limits ignored; the previous ones stay");
      }
      view.setLimits(value as RateLimits);
      return log.info({ revision: e.revision }, "rate limits applied");
    }
    let model: string;
    try {
      model = decodeToken(e.key.slice(MODEL_CONFIG_KEY_PREFIX.length));
    } catch {
      state.rejected++;
      return log.warn({ key: e.key }, "config key is not an escaped model name; ignored");
    }
    if (e.operation !== "PUT") return view.set(model, undefined);
    const value = entryJson(e);
    const err = value === undefined ? "not JSON" : modelConfigError(value);
    if (err) {
      state.rejected++;
      return log.error({ model, revision: e.revision, err }, "invalid model config ignored; the previous one stays");
    }
    view.set(model, value as ModelConfig);
    log.info({ model, revision: e.revision }, "model config applied");
  };
  // Watch first, then read the current values: nothing can fall between the two.
  const watch = await kv.watch({ include: "updates" });
  void (async () => {
    for await (const e of watch) apply(e);
  })().catch((err: unknown) => log.error({ err }, "config watch ended"));
  for await (const key of await kv.keys()) {
    const e = await kv.get(key);
    if (e) apply(e);
  }
  state.stop = async () => {
    watch.stop();
  };
  return state;
}
