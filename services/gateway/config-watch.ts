/**
 * Keeps a gateway's state in step with the config bucket: current values at start, then every
 * change, live. Each entry is folded by GatewayState (services/views/gateway-state.ts), which
 * decides what it means and whether it validates; this shell only reads the bucket and logs what
 * the fold reports.
 */
import { Kvm, type KvEntry } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "../shared/log.js";
import type { ConfigEntry, GatewayState } from "../views/gateway-state.js";

export interface ConfigWatch {
  readonly rejected: number;
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

export async function watchModelConfigs(nc: NatsConnection, bucket: string, state: GatewayState, log: Logger): Promise<ConfigWatch> {
  const kv = await new Kvm(nc).open(bucket);
  const apply = (e: KvEntry) => {
    const r = state.apply(configEntryOf(e), { stream: "config", subject: e.key, seq: e.revision, serverTs: e.created.getTime() });
    if (r.note) log[r.note.level](r.note.fields, r.note.message);
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
  return {
    get rejected() {
      return state.configRejected;
    },
    stop: async () => {
      watch.stop();
    },
  };
}
