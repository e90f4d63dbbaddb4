/**
 * kv-bridge: follows PODS, opens a ZMQ SUB (+ replay DEALER) to every ready pod that advertises
 * `kvEvents` and that this replica's shard owns, and publishes each engine event batch to
 * `<prefix>.kv.<model>.<pod>` as one `KvBatch` (acked, `Nats-Msg-Id: <pod>:<epoch>:<seq>`).
 * See README.md for the sequence rules, epochs and sharding.
 */
import type { PodEvent } from "../../schemas/events.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { type DeadLetterOptions, DLQ_HEADER_ROOM } from "../shared/dead-letter.js";
import { StreamFollower } from "../shared/follower.js";
import type { Logger } from "../shared/log.js";
import { connectNats } from "../shared/nats.js";
import { KvDeadLetters } from "./dead-letters.js";
import { type KvBridgeStats, newStats, PodBridge, type PodTarget } from "./pod-bridge.js";
import { formatShard, ownsPod, parseShard, type Shard } from "./shard.js";

export type { KvBridgeStats } from "./pod-bridge.js";

export interface KvBridgeOptions {
  nats: string | string[];
  prefix?: string;
  /** `i/n` or parsed; default 0/1 (this replica owns every pod). */
  shard?: Shard | string;
  /** How long to wait for each replay reply before the replay counts as unavailable. */
  replayTimeoutMs?: number;
  /** Largest engine frame decoded; larger ones are dead-lettered (as a prefix). */
  maxFrameBytes?: number;
  /** Acks in flight per pod. */
  window?: number;
  /** Engine-hash -> router-hash entries kept per pod. */
  maxTrackedBlocks?: number;
  reconnectIntervalMs?: number;
  reconnectMaxIntervalMs?: number;
  /** Connection name and `Jr-Dlq-Consumer` header. */
  name?: string;
  /** What dead letters keep and where they are logged; default: the process's (`--dlq-payloads`). */
  deadLetters?: DeadLetterOptions;
  log: Logger;
}

export interface BridgedPod {
  model: string;
  pod: string;
  endpoint: string;
  replayEndpoint?: string;
  epoch?: string;
  lastSeq?: number;
  state: PodBridge["state"];
  /** The SUB socket's session with the engine is up (engine-link.ts `connected`). */
  connected: boolean;
  /** Connected, and the replay after joining is done: the engine's next events reach the bridge (pod-bridge.ts `settled`). */
  settled: boolean;
  /** Taken from the engine, not yet acknowledged by the KV stream (0: `lastSeq` is in the stream). */
  unacked: number;
}

export interface KvBridgeHandle {
  stats: KvBridgeStats;
  shard: Shard;
  /** Pods this replica bridges right now. */
  pods(): BridgedPod[];
  close(): Promise<void>;
}

export const DEFAULTS = {
  replayTimeoutMs: 1_000,
  maxFrameBytes: 4 * 1024 * 1024,
  window: 256,
  maxTrackedBlocks: 262_144,
  reconnectIntervalMs: 100,
  reconnectMaxIntervalMs: 5_000,
} as const;

const DEFAULT_MAX_PAYLOAD = 1024 * 1024;

const podKey = (model: string, pod: string) => `${model}\u0000${pod}`;

function sameTarget(a: PodTarget, b: PodTarget): boolean {
  return a.endpoint === b.endpoint && a.replayEndpoint === b.replayEndpoint && (a.topic ?? "") === (b.topic ?? "") && (a.engine ?? "vllm") === (b.engine ?? "vllm");
}

export async function startKvBridge(o: KvBridgeOptions): Promise<KvBridgeHandle> {
  const prefix = o.prefix ?? "jr";
  const subjects = new Subjects(prefix);
  const shard = typeof o.shard === "string" ? parseShard(o.shard) : (o.shard ?? { index: 0, count: 1 });
  const name = o.name ?? `kv-bridge-${formatShard(shard).replace("/", "of")}`;
  const log = o.log;
  const maxFrameBytes = o.maxFrameBytes ?? DEFAULTS.maxFrameBytes;
  const nats = await connectNats(o.nats, `jetroute-${name}`);
  const maxPayload = () => nats.nc.info?.max_payload ?? DEFAULT_MAX_PAYLOAD;
  const stats = newStats();
  const deadLetters = new KvDeadLetters(stats, nats.js, subjects, name, log, () => maxPayload() - DLQ_HEADER_ROOM, o.deadLetters);
  const podOptions = {
    js: nats.js,
    jsm: nats.jsm,
    subjects,
    stream: streamName(prefix, "KV"),
    deadLetters,
    stats,
    log,
    replayTimeoutMs: o.replayTimeoutMs ?? DEFAULTS.replayTimeoutMs,
    maxFrameBytes,
    // libzmq's own limit sits well above ours, so an oversized frame still arrives and can be
    // dead-lettered; only a frame beyond this costs the connection (see engine-link.ts).
    maxMessageBytes: maxFrameBytes * 4,
    window: o.window ?? DEFAULTS.window,
    maxTrackedBlocks: o.maxTrackedBlocks ?? DEFAULTS.maxTrackedBlocks,
    reconnectIntervalMs: o.reconnectIntervalMs ?? DEFAULTS.reconnectIntervalMs,
    reconnectMaxIntervalMs: o.reconnectMaxIntervalMs ?? DEFAULTS.reconnectMaxIntervalMs,
    maxPayload,
  };

  const bridges = new Map<string, PodBridge>();
  // Per pod, changes run one after another: a replaced bridge finishes (and flushes) before its
  // successor reads the stream's last word and starts publishing.
  const transitions = new Map<string, Promise<void>>();
  let closing = false;

  const wanted = (ev: PodEvent): PodTarget | undefined => {
    if (ev.action !== "upsert" || !ev.ready || !ev.kvEvents) return undefined;
    if (!ownsPod(shard, ev.pod)) return undefined;
    const k = ev.kvEvents;
    return { model: ev.model, pod: ev.pod, engine: ev.engine === "sglang" ? "sglang" : "vllm", endpoint: k.endpoint, replayEndpoint: k.replayEndpoint, topic: k.topic };
  };

  const reconcile = (key: string, target: PodTarget | undefined) => {
    const prevStep = transitions.get(key) ?? Promise.resolve();
    const step = prevStep.then(async () => {
      if (closing) return;
      const current = bridges.get(key);
      if (current && target && sameTarget(current.target, target)) return;
      if (current) {
        bridges.delete(key);
        log.info({ pod: current.target.pod, endpoint: current.target.endpoint }, "closing pod bridge");
        await current.close();
      }
      if (target && !closing) {
        const b = new PodBridge(target, podOptions);
        bridges.set(key, b);
        log.info({ pod: target.pod, endpoint: target.endpoint, replay: target.replayEndpoint }, "bridging pod");
        b.start();
      }
    });
    const tracked = step.catch((err: unknown) => log.error({ err }, "pod bridge transition failed"));
    transitions.set(key, tracked);
    void tracked.then(() => {
      if (transitions.get(key) === tracked) transitions.delete(key);
    });
  };

  const follower = new StreamFollower({
    nats,
    subjects,
    log,
    name,
    family: "pods",
    types: ["pod"] as const,
    stream: streamName(prefix, "PODS"),
    filter: subjects.all("pods"),
    startAt: { kind: "last-per-subject" },
    ...(o.deadLetters ? { deadLetters: o.deadLetters } : {}),
    onEvent: (ev) => reconcile(podKey(ev.model, ev.pod), wanted(ev)),
  });
  await follower.start();

  return {
    stats,
    shard,
    pods: () =>
      [...bridges.values()].map((b) => ({
        model: b.target.model,
        pod: b.target.pod,
        endpoint: b.target.endpoint,
        replayEndpoint: b.target.replayEndpoint,
        epoch: b.epoch,
        lastSeq: b.lastSeq,
        state: b.state,
        connected: b.connected,
        settled: b.settled,
        unacked: b.unacked,
      })),
    async close() {
      if (closing) return;
      closing = true;
      await follower.stop();
      await Promise.all([...transitions.values()]);
      await Promise.all([...bridges.values()].map((b) => b.close()));
      bridges.clear();
      await nats.nc.drain();
    },
  };
}
