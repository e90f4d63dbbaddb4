/**
 * Idempotent creation/update of jetroute's streams and config bucket.
 * Returns one line per stream saying what happened, for the CLI and the demo to print.
 */
import { type JetStreamManager, JetStreamApiCodes, JetStreamApiError, type StreamConfig } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { configBucketName, type StreamOptions, streamDefinitions } from "./definitions.js";

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
      if (!(err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamNotFound)) throw err;
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
  const bucket = configBucketName(opts.prefix ?? "jr");
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
  return changes;
}
