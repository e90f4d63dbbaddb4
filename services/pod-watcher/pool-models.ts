/**
 * Gateway pools (streams/pools.ts): which models' pods a pod-watcher publishes. A pooled watcher
 * publishes the pods of its pool's models into the pool's namespace; an unpooled one publishes the
 * pods of models no pool lists. Both read every `pool.<name>` entry of the config bucket, at start
 * and then every few seconds (a read, not a watch: nothing to go silent, and assignments change
 * rarely), and decide with the gateways' rule (services/views/pool-map.ts): a model two pools list
 * belongs to the pool whose name sorts first. `--models` fixes a pooled watcher's list instead.
 *
 * What a failed read means is decided here, not by the publisher: before the first good read a
 * pooled watcher's models are unknown (it publishes and removes nothing), an unpooled one keeps
 * every pod (as before pools existed); an entry that stops validating keeps its previous models;
 * only a bucket or entry confirmed absent empties a pool (its watcher then removes its pods).
 */
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { POOL_KEY_PREFIX, readPoolConfig } from "../../schemas/config.js";
import { configBucketName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { poolNameError } from "../../streams/pools.js";
import type { Logger } from "../shared/log.js";
import { PoolMap } from "../views/pool-map.js";

/** What the publisher is told: publish pods whose model `accepts`, all pods (undefined), or nothing and remove nothing ("unknown"). */
export type ModelFilter = ((model: string) => boolean) | undefined | "unknown";

/**
 * The filter a watcher of `pool` (undefined: unpooled) applies, given the pools as last read
 * (undefined: never read) and the pools whose entry exists but never validated.
 */
export function modelFilterFor(pool: string | undefined, map: PoolMap | undefined, invalid: ReadonlySet<string> = new Set()): ModelFilter {
  if (map === undefined) return pool === undefined ? undefined : "unknown";
  if (pool !== undefined && invalid.has(pool) && map.modelsOf(pool) === undefined) return "unknown";
  return pool === undefined ? (m) => map.poolOf(m) === undefined : (m) => map.poolOf(m) === pool;
}

export interface PoolFollowOptions {
  nc: NatsConnection;
  configPrefix: string;
  log: Logger;
  /** Called after every read that changed the pools (and after the first good read); `invalid`: pools whose entry never validated. */
  onPools(map: PoolMap, invalid: ReadonlySet<string>): void;
  pollMs?: number;
}

export interface PoolFollowHandle {
  /** Resolves after the first read attempt: true if it succeeded. */
  ready: Promise<boolean>;
  /** Reads that succeeded (changed or not). */
  readonly reads: number;
  stop(): void;
}


export function followPools(o: PoolFollowOptions): PoolFollowHandle {
  let stopped = false;
  let reads = 0;
  let lastShape: string | undefined;
  /** Each pool's models as last validly read: an entry that stops validating keeps them. */
  const valid = new Map<string, readonly string[]>();
  /** Pools whose current entry does not validate, with the revision logged (once per revision). */
  const invalid = new Map<string, number>();
  const read = async (): Promise<void> => {
    const bucket = configBucketName(o.configPrefix);
    const seen = new Set<string>();
    try {
      const kv = await new Kvm(o.nc).open(bucket);
      for await (const key of await kv.keys(`${POOL_KEY_PREFIX}>`)) {
        const pool = key.slice(POOL_KEY_PREFIX.length);
        // As the gateways do (gateway-state.ts): an entry whose name is not a pool name is no pool.
        if (poolNameError(pool)) continue;
        const e = await kv.get(key);
        if (e?.operation !== "PUT") continue;
        seen.add(pool);
        const r = readPoolConfig(() => e.json());
        if (!r.ok) {
          if (invalid.get(pool) !== e.revision) o.log.error({ pool, revision: e.revision, err: r.error }, "invalid pool config ignored; the previous models stay (none: its pods are neither published nor removed)");
          invalid.set(pool, e.revision);
          continue;
        }
        invalid.delete(pool);
        valid.set(pool, r.value.models);
      }
    } catch (err) {
      // No bucket at all (streams never applied): there are no pools. Anything else is a failed read.
      if (!isStreamNotFound(err)) throw err;
      seen.clear();
    }
    for (const pool of [...valid.keys()]) if (!seen.has(pool)) valid.delete(pool);
    for (const pool of [...invalid.keys()]) if (!seen.has(pool)) invalid.delete(pool);
    if (stopped) return;
    reads++;
    const shape = JSON.stringify([[...valid].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)), [...invalid.keys()].sort()]);
    if (shape === lastShape) return;
    lastShape = shape;
    const map = new PoolMap();
    for (const [pool, models] of valid) map.set(pool, models);
    for (const c of map.conflicts()) o.log.warn(c, "a model listed by more than one pool belongs to the first by name");
    o.log.info({ pools: map.names() }, "gateway pools read from the config bucket");
    o.onPools(map, new Set(invalid.keys()));
  };
  const guarded = () =>
    read().then(
      () => true,
      (err: unknown) => {
        o.log.warn({ err: (err as Error).message }, "cannot read the gateway pools from the config bucket; keeping what was read before");
        return false;
      },
    );
  // One read at a time (chained, not an interval): two reads in flight could apply out of order.
  let timer: NodeJS.Timeout | undefined;
  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(() => void guarded().then(schedule), o.pollMs ?? 5_000);
    timer.unref();
  };
  const ready = guarded().then((ok) => {
    schedule();
    return ok;
  });
  return {
    ready,
    get reads() {
      return reads;
    },
    stop() {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
