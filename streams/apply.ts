/**
 * Idempotent creation/update of jetroute's streams and config bucket.
 * Returns one line per stream saying what happened, for the CLI and the demo to print.
 */
import { type JetStreamManager, StorageType, type StreamConfig } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { isStreamNotFound } from "./errors.js";
import { configBucketName, filesBucketName, leaseBucketName, snapshotBucketName, type StreamOptions, streamDefinitions } from "./definitions.js";

export interface ApplyChange {
  name: string;
  action: "created" | "updated" | "unchanged";
  /** Field-level differences that an update changed: `max_age: 0 -> 3600000000000`. */
  diff: string[];
}

function sameValue(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

export async function applyStreams(nc: NatsConnection, jsm: JetStreamManager, opts: StreamOptions = {}): Promise<ApplyChange[]> {
  const changes: ApplyChange[] = [];
  for (const def of streamDefinitions(opts)) {
    const want = def.config;
    let current: StreamConfig | undefined;
    try {
      current = (await jsm.streams.info(want.name)).config;
    } catch (err) {
      if (!isStreamNotFound(err)) throw err;
    }
    if (!current) {
      await jsm.streams.add(want);
      changes.push({ name: want.name, action: "created", diff: [] });
      continue;
    }
    const diff: string[] = [];
    for (const [k, v] of Object.entries(want)) {
      const have = (current as unknown as Record<string, unknown>)[k];
      if (!sameValue(have, v)) diff.push(`${k}: ${JSON.stringify(have)} -> ${JSON.stringify(v)}`);
    }
    if (diff.length === 0) {
      changes.push({ name: want.name, action: "unchanged", diff });
      continue;
    }
    await jsm.streams.update(want.name, { ...current, ...want });
    changes.push({ name: want.name, action: "updated", diff });
  }
  // A pool's namespace shares the base prefix's config bucket (streams/pools.ts).
  const bucket = configBucketName(opts.configPrefix ?? opts.prefix ?? "jr");
  const kvm = new Kvm(nc);
  let existed = true;
  try {
    await kvm.open(bucket);
    await jsm.streams.info(`KV_${bucket}`);
  } catch {
    existed = false;
  }
  if (!existed) {
    await kvm.create(bucket, { history: 10, replicas: opts.replicas ?? 1 });
  }
  changes.push({ name: `KV_${bucket}`, action: existed ? "unchanged" : "created", diff: [] });
  // Snapshot lease and store: created here so they get the cluster's replica count (gateways would
  // otherwise create them with one replica on first use).
  const leases = leaseBucketName(opts.prefix ?? "jr");
  const hadLeases = await jsm.streams.info(`KV_${leases}`).then(() => true, () => false);
  if (!hadLeases) await kvm.create(leases, { history: 1, storage: StorageType.File, replicas: opts.replicas ?? 1 });
  changes.push({ name: `KV_${leases}`, action: hadLeases ? "unchanged" : "created", diff: [] });
  const snaps = snapshotBucketName(opts.prefix ?? "jr");
  const hadSnaps = await jsm.streams.info(`OBJ_${snaps}`).then(() => true, () => false);
  if (!hadSnaps) await new Objm(nc).create(snaps, { storage: StorageType.File, replicas: opts.replicas ?? 1 });
  changes.push({ name: `OBJ_${snaps}`, action: hadSnaps ? "unchanged" : "created", diff: [] });
  // The Batch API's files (docs/batch.md), base prefix only (a pool's namespace shares its base's).
  if (opts.configPrefix === undefined || opts.configPrefix === (opts.prefix ?? "jr")) {
    const files = filesBucketName(opts.prefix ?? "jr");
    const hadFiles = await jsm.streams.info(`OBJ_${files}`).then(() => true, () => false);
    if (!hadFiles) await new Objm(nc).create(files, { storage: StorageType.File, replicas: opts.replicas ?? 1, description: "jetroute Batch API files" });
    changes.push({ name: `OBJ_${files}`, action: hadFiles ? "unchanged" : "created", diff: [] });
  }
  return changes;
}
