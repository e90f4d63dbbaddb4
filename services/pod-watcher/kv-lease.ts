/**
 * Static mode's lease: one key per source in the `<prefix>-leases` KV bucket (the bucket the
 * gateways' snapshot lease uses), written with compare-and-set on the key's revision.
 */
import { Kvm, type KV } from "@nats-io/kv";
import { StorageType } from "@nats-io/jetstream";
import { leaseBucketName } from "../../streams/definitions.js";
import { isWrongLastSequence } from "../../streams/errors.js";
import { encodeToken } from "../../streams/tokens.js";
import type { NatsHandles } from "../shared/nats.js";
import type { LeaseRecord } from "./lease.js";
import type { LeaseStore } from "./leader.js";

interface KvLeaseValue {
  holder: string;
  durationMs: number;
  transitions: number;
  acquiredAt: number;
  renewedAt: number;
}

export async function natsKvLeaseStore(nats: NatsHandles, prefix: string, source: string): Promise<LeaseStore> {
  const kvm = new Kvm(nats.js);
  const bucket = leaseBucketName(prefix);
  const kv: KV = await kvm.create(bucket, { history: 1, storage: StorageType.File }).catch((err: unknown) => kvm.open(bucket).catch(() => Promise.reject(err)));
  const key = `pod-watcher.${encodeToken(source)}`;
  let acquiredAt = 0;
  const parse = (v: unknown): KvLeaseValue | undefined => {
    const x = v as Partial<KvLeaseValue> | null;
    return x && typeof x.holder === "string" && Number.isFinite(x.durationMs) ? (x as KvLeaseValue) : undefined;
  };
  return {
    describe: `nats kv ${bucket}/${key}`,
    async read(): Promise<LeaseRecord | undefined> {
      const e = await kv.get(key);
      if (e?.operation !== "PUT") return undefined;
      let v: KvLeaseValue | undefined;
      try {
        v = parse(e.json());
      } catch {
        v = undefined;
      }
      // An unreadable value is a lease nobody holds: replace it (against its revision).
      return { holder: v?.holder ?? "", durationMs: v?.durationMs ?? 0, version: String(e.revision), transitions: v?.transitions ?? 0 };
    },
    async write(me, durationMs, transitions, acquire, expected): Promise<boolean> {
      const now = Date.now();
      if (acquire) acquiredAt = now;
      const value = JSON.stringify({ holder: me, durationMs, transitions, acquiredAt, renewedAt: now } satisfies KvLeaseValue);
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
      const value = JSON.stringify({ holder: "", durationMs: expected.durationMs, transitions: expected.transitions, acquiredAt, renewedAt: Date.now() });
      if (expected.holder !== me) return;
      await kv.update(key, value, Number(expected.version)).catch((err: unknown) => {
        if (!isWrongLastSequence(err)) throw err;
      });
    },
  };
}
