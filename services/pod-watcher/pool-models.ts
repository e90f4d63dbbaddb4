/**
 * Gateway pools (streams/pools.ts): a pooled pod-watcher publishes only the pods of its pool's
 * models, into the pool's namespace. The models come from `--models`, or from the config bucket's
 * `pool.<name>` entry, read at start and then every few seconds (a read, not a watch: nothing to
 * go silent, and a pool's assignment changes rarely). Until the entry exists the watcher
 * publishes no pod, and says so; an entry that stops validating leaves the previous models in place.
 */
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { POOL_KEY_PREFIX, type PoolConfig, poolConfigError } from "../../schemas/config.js";
import { configBucketName } from "../../streams/definitions.js";
import type { Logger } from "../shared/log.js";

export interface PoolModelsOptions {
  nc: NatsConnection;
  configPrefix: string;
  pool: string;
  log: Logger;
  /** Called with the pool's models whenever they change (an empty set before the entry exists). */
  onModels(models: ReadonlySet<string>): void;
  pollMs?: number;
}

export interface PoolModelsHandle {
  /** Resolves after the first read (whatever it found). */
  ready: Promise<void>;
  stop(): void;
}

export function followPoolModels(o: PoolModelsOptions): PoolModelsHandle {
  const key = `${POOL_KEY_PREFIX}${o.pool}`;
  let revision = -1;
  let stopped = false;
  let warnedMissing = false;
  const read = async () => {
    const kv = await new Kvm(o.nc).open(configBucketName(o.configPrefix));
    const e = await kv.get(key);
    if (stopped) return;
    if (e?.operation !== "PUT") {
      if (revision !== 0) {
        revision = 0;
        o.onModels(new Set());
      }
      if (!warnedMissing) o.log.warn({ pool: o.pool, key }, "the pool has no models in the config bucket (jetroute config set-pool): publishing no pods");
      warnedMissing = true;
      return;
    }
    if (e.revision === revision) return;
    revision = e.revision;
    let value: unknown;
    try {
      value = e.json();
    } catch {
      value = undefined;
    }
    const err = value === undefined ? "not JSON" : poolConfigError(value);
    if (err) {
      o.log.error({ pool: o.pool, revision: e.revision, err }, "invalid pool config ignored; the previous models stay");
      return;
    }
    warnedMissing = false;
    const models = new Set((value as PoolConfig).models);
    o.log.info({ pool: o.pool, models: models.size, revision: e.revision }, "pool models applied");
    o.onModels(models);
  };
  const guarded = () => read().catch((err: unknown) => o.log.warn({ pool: o.pool, err: (err as Error).message }, "cannot read the pool's models; keeping the previous ones"));
  const ready = guarded();
  const timer = setInterval(guarded, o.pollMs ?? 5_000);
  return {
    ready,
    stop() {
      stopped = true;
      clearInterval(timer);
    },
  };
}
