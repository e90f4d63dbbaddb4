/**
 * A lease on one key of the `<prefix>-leases` KV bucket (history 1): the pod-watchers' static-mode
 * lease (`pod-watcher.<source>`) and the gateways' snapshot lease (`snapshotter.prefix-index`).
 * Written with compare-and-set on the key's revision only; the rule that reads it is lease.ts.
 *
 * The bucket, not the config bucket: leases are renewed every third of their duration, which
 * would fill the config bucket's operator history with churn and wake every config watcher.
 * nats-server 2.9 has no per-key TTL: expiry is the readers' judgement (lease.ts).
 */
import { StorageType } from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import { leaseBucketName } from "../../streams/definitions.js";
import { isWrongLastSequence } from "../../streams/errors.js";
import type { LeaseStore } from "./leader.js";
import type { LeaseRecord } from "./lease.js";
import type { NatsHandles } from "./nats.js";

interface KvLeaseValue {
  holder: string;
  durationMs: number;
  transitions: number;
  /** Holder's wall clock: for people reading the bucket, never for deciding expiry. */
  acquiredAt: number;
  renewedAt: number;
  /**
   * What gateways from before the shared lease read (they judged expiry by `expiresAt` on their
   * own clock): written so a rolling upgrade does not see every new holder's lease as unreadable.
   */
  leaseMs: number;
  expiresAt: number;
}

export interface KvLeaseOptions {
  /** Replicas of the bucket when this call creates it (3 on a 3-node cluster). */
  replicas?: number;
}

/** Opens (creating if needed) the prefix's lease bucket and returns a store for `key`. */
export async function kvLeaseStore(nats: NatsHandles, prefix: string, key: string, o: KvLeaseOptions = {}): Promise<LeaseStore> {
  const kvm = new Kvm(nats.js);
  const bucket = leaseBucketName(prefix);
  // Two processes creating the bucket at once can make one creation fail on 2.9; it exists either way.
  const kv: KV = await kvm
    .create(bucket, { history: 1, storage: StorageType.File, replicas: o.replicas ?? 1 })
    .catch((err: unknown) => kvm.open(bucket).catch(() => Promise.reject(err)));
  let acquiredAt = 0;
  const encode = (holder: string, durationMs: number, transitions: number) => {
    const now = Date.now();
    return JSON.stringify({ holder, durationMs, transitions, acquiredAt, renewedAt: now, leaseMs: durationMs, expiresAt: holder ? now + durationMs : now } satisfies KvLeaseValue);
  };
  const parse = (v: unknown): LeaseRecord | undefined => {
    const x = v as Partial<KvLeaseValue> | null;
    const durationMs = x?.durationMs ?? x?.leaseMs;
    return x && typeof x.holder === "string" && Number.isFinite(durationMs) ? { holder: x.holder, durationMs: durationMs as number, version: "", transitions: Number.isFinite(x.transitions) ? (x.transitions as number) : 0 } : undefined;
  };
  return {
    describe: `nats kv ${bucket}/${key}`,
    async read(): Promise<LeaseRecord | undefined> {
      const e = await kv.get(key);
      if (e?.operation !== "PUT") return undefined;
      let v: LeaseRecord | undefined;
      try {
        v = parse(e.json());
      } catch {
        v = undefined;
      }
      // An unreadable value is a lease nobody holds: replace it (against its revision).
      return { holder: v?.holder ?? "", durationMs: v?.durationMs ?? 0, version: String(e.revision), transitions: v?.transitions ?? 0 };
    },
    async write(me, durationMs, transitions, acquire, expected): Promise<boolean> {
      if (acquire) acquiredAt = Date.now();
      const value = encode(me, durationMs, transitions);
      try {
        if (expected === undefined) await kv.create(key, value);
        else await kv.update(key, value, Number(expected.version));
        return true;
      } catch (err) {
        if (isWrongLastSequence(err)) return false;
        throw err;
      }
    },
    async release(me, expected): Promise<void> {
      if (expected.holder !== me) return;
      await kv.update(key, encode("", expected.durationMs, expected.transitions), Number(expected.version)).catch((err: unknown) => {
        if (!isWrongLastSequence(err)) throw err;
      });
    },
  };
}
