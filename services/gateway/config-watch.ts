/**
 * Keeps a gateway's state in step with the config bucket: current values at start, then every
 * change, live. Each entry is folded by GatewayState (services/views/gateway-state.ts), which
 * decides what it means and whether it validates; this shell only reads the bucket and logs what
 * the fold reports.
 *
 * A watch is an ordered push consumer on the bucket's stream, and one hosted on a NATS node that
 * dies can go silent for good (as stream followers do, see services/shared/follower.ts): API key
 * revocations would then silently stop applying. So the bucket's last revision is probed every few
 * seconds; a watch that ended, or stayed behind it for two probes, is replaced by one resuming
 * after the last revision applied.
 */
import { Kvm, type KV, type KvEntry, type KvWatchEntry } from "@nats-io/kv";
import type { QueuedIterator } from "@nats-io/nats-core";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "../shared/log.js";
import type { ConfigEntry, GatewayState } from "../views/gateway-state.js";
import { RefusedRecordLog } from "./refused-records.js";

export interface ConfigWatch {
  readonly rejected: number;
  /** Times the watch was replaced (ended, or stalled behind the bucket). */
  readonly reopens: number;
  stop(): Promise<void>;
}

/** A bucket entry as the fold takes it. */
export function configEntryOf(e: KvEntry): ConfigEntry {
  const entry: ConfigEntry = { type: "config-entry", key: e.key, operation: e.operation };
  if (e.operation === "PUT") {
    try {
      entry.value = e.json();
    } catch {
      entry.notJson = true;
    }
  }
  return entry;
}

export interface ConfigWatchOptions {
  /** How often the bucket's last revision is compared with the last one applied (default 3 s). */
  probeEveryMs?: number;
}

export async function watchModelConfigs(nc: NatsConnection, bucket: string, state: GatewayState, log: Logger, o: ConfigWatchOptions = {}): Promise<ConfigWatch> {
  const kv: KV = await new Kvm(nc).open(bucket);
  const notes = new RefusedRecordLog(log);
  const apply = (e: KvEntry) => notes.note(state.apply(configEntryOf(e), { stream: "config", subject: e.key, seq: e.revision, serverTs: e.created.getTime() }));
  let stopped = false;
  let reopens = 0;
  let watch: QueuedIterator<KvWatchEntry> | undefined;
  const run = (w: QueuedIterator<KvWatchEntry>) => {
    void (async () => {
      for await (const e of w) apply(e);
    })()
      .catch((err: unknown) => log.warn({ err }, "config watch failed"))
      .finally(() => {
        if (!stopped && watch === w) void reopen("ended");
      });
  };
  const reopen = async (why: string) => {
    if (stopped) return;
    const old = watch;
    watch = undefined;
    old?.stop();
    reopens++;
    for (let delay = 250; !stopped; delay = Math.min(delay * 2, 4_000)) {
      try {
        const w = await kv.watch({ resumeFromRevision: state.cursors.config + 1 });
        if (stopped) {
          w.stop();
          return;
        }
        watch = w;
        run(w);
        log.warn({ bucket, why, resumeFrom: state.cursors.config + 1 }, "config watch reopened");
        return;
      } catch (err) {
        log.warn({ bucket, err: (err as Error).message }, "config watch reopen failed; retrying");
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  };
  // Watch first, then read the current values: nothing can fall between the two.
  watch = await kv.watch({ include: "updates" });
  run(watch);
  for await (const key of await kv.keys()) {
    const e = await kv.get(key);
    if (e) apply(e);
  }
  let behind = 0;
  const probe = setInterval(() => {
    if (stopped || !watch) return;
    kv.status().then(
      (st) => {
        const last = st.streamInfo.state.last_seq;
        behind = last > state.cursors.config ? behind + 1 : 0;
        if (behind >= 2) {
          behind = 0;
          void reopen(`behind the bucket (last revision ${last}, applied ${state.cursors.config})`);
        }
      },
      () => undefined,
    );
  }, o.probeEveryMs ?? 3_000);
  probe.unref?.();
  return {
    get rejected() {
      return state.configRejected;
    },
    get reopens() {
      return reopens;
    },
    stop: async () => {
      stopped = true;
      clearInterval(probe);
      notes.stop();
      watch?.stop();
    },
  };
}
