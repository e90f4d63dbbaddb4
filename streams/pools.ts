/**
 * Gateway pools: a pool is a set of models whose routing state lives in its own namespace.
 *
 * A pool's subjects are jetroute's usual subjects under the prefix `<base>.pool.<name>`, captured by
 * its own streams (`JR_POOL_<NAME>_PODS`, `_LOAD`, `_KV`, `_CHARGES`, `_DECISIONS`, `_DLQ`) and its
 * own snapshot and lease buckets. A process started with `--pool <name>` (gateway, pod-watcher,
 * metrics-scraper, kv-bridge, replay) reads and writes only that namespace, so a pool's replicas
 * fold only their pool's events: one stream each, no subject filter needed, which fits nats-server
 * 2.9.10's one filter per consumer (and its one source per origin stream, which rules out pools as
 * filtered views of shared streams). What stays shared lives under the base prefix: the config
 * bucket (model configs, rate limits, API keys, pool assignments) and the usage summaries that
 * carry per-user rate-limit counts across pools (docs/scaling.md, "Gateway pools").
 */

/** Lower-case letters, digits and inner dashes, at most 32: a subject token and, upper-cased, part of a stream name. */
const POOL_NAME = /^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$/;

export function poolNameError(name: string): string | undefined {
  if (POOL_NAME.test(name)) return undefined;
  return `a pool name is 1-32 lower-case letters, digits and inner dashes, got ${JSON.stringify(name.slice(0, 64))}`;
}

/** The subject prefix of a pool's namespace. */
export function poolPrefix(base: string, pool: string): string {
  const err = poolNameError(pool);
  if (err) throw new Error(err);
  return `${base}.pool.${pool}`;
}

/** Where a process reads and writes: its namespace's prefix, and the base prefix of the shared config. */
export interface Namespace {
  /** Subjects, streams, snapshots and leases. */
  prefix: string;
  /** The config bucket and the usage summaries, shared by every pool. */
  configPrefix: string;
  /** Undefined for the unpooled namespace (the base prefix itself). */
  pool?: string;
}

export function namespaceOf(base: string, pool?: string): Namespace {
  return pool === undefined ? { prefix: base, configPrefix: base } : { prefix: poolPrefix(base, pool), configPrefix: base, pool };
}
