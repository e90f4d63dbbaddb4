/**
 * pod-watcher (static mode): publishes each listed pod's readiness to PODS, probing the engine's
 * `/health`, and a removal for every pod that left the list (including pods published by an
 * earlier run, found by reading PODS back at start). Publishes only changes; each publish is
 * acknowledged by the stream, because a lost readiness event would hide a pod until the next change.
 */
import { unwatchFile, watchFile } from "node:fs";
import type { PodEvent } from "../../schemas/events.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { StreamFollower } from "../shared/follower.js";
import type { Logger } from "../shared/log.js";
import { connectNats } from "../shared/nats.js";
import { acked } from "../shared/publish.js";
import { PodSet } from "../views/pod-set.js";
import { readPodList, type StaticPod } from "./static-pods.js";

export interface PodWatcherOptions {
  nats: string | string[];
  prefix?: string;
  file: string;
  probeIntervalMs?: number;
  probeTimeoutMs?: number;
  /** Skip /health probes: every listed pod is ready. */
  noProbe?: boolean;
  log: Logger;
}

export interface PodWatcherHandle {
  stats: { pods: number; ready: number; published: number; removed: number; probeRounds: number; reloadsRejected: number };
  /** Resolves after the first full round of probes was published. */
  firstRound: Promise<void>;
  close(): Promise<void>;
}

async function probe(address: string, timeoutMs: number): Promise<boolean> {
  try {
    const res = await fetch(`http://${address}/health`, { signal: AbortSignal.timeout(timeoutMs) });
    await res.arrayBuffer();
    return res.ok;
  } catch {
    return false;
  }
}

export async function startPodWatcher(o: PodWatcherOptions): Promise<PodWatcherHandle> {
  const log = o.log;
  const prefix = o.prefix ?? "jr";
  const subjects = new Subjects(prefix);
  let pods = readPodList(o.file);
  const nats = await connectNats(o.nats, "jetroute-pod-watcher");

  // What the stream says now: our last word on each pod (from this or an earlier run).
  const published = new PodSet();
  const follower = new StreamFollower({
    nats, subjects, log, name: "pod-watcher", family: "pods", types: ["pod"] as const,
    stream: streamName(prefix, "PODS"), filter: subjects.all("pods"), startAt: { kind: "last-per-subject" },
    onEvent: (ev, m) => published.apply(ev, m.seq),
  });
  await follower.start();
  await follower.whenCaughtUp();
  await follower.stop();

  const lastReady = new Map<string, boolean>();
  const stats = { pods: 0, ready: 0, published: 0, removed: 0, probeRounds: 0, reloadsRejected: 0 };
  const keyOf = (p: { model: string; name?: string; pod?: string }) => `${p.model}\u0000${p.name ?? p.pod}`;
  for (const p of published.all()) lastReady.set(keyOf(p), p.ready);

  const event = (p: StaticPod, action: PodEvent["action"], ready: boolean): PodEvent => ({
    type: "pod",
    action,
    model: p.model,
    pod: p.name,
    address: p.address,
    ready,
    engine: p.engine ?? "vllm",
    ...(p.role ? { role: p.role } : {}),
    ...(p.roleset ? { roleset: p.roleset } : {}),
    ...(p.bootstrapPort ? { bootstrapPort: p.bootstrapPort } : {}),
    ...(p.metricsAddress ? { metricsAddress: p.metricsAddress } : {}),
    ...(p.kvEvents ? { kvEvents: p.kvEvents } : {}),
    ...(p.adapters ? { adapters: p.adapters } : {}),
    ...(p.labels ? { labels: p.labels } : {}),
    ts: Date.now(),
  });

  const publishRemovals = async () => {
    const listed = new Set(pods.map(keyOf));
    for (const p of published.all()) {
      const k = keyOf(p);
      if (listed.has(k) || !lastReady.has(k)) continue;
      await acked(nats.js, subjects.pod(p.model, p.pod), {
        type: "pod", action: "remove", model: p.model, pod: p.pod, address: p.address, ready: false, engine: p.engine, ts: Date.now(),
      } satisfies PodEvent);
      lastReady.delete(k);
      stats.removed++;
      log.info({ model: p.model, pod: p.pod }, "pod removed");
    }
  };

  let stopped = false;
  let round: Promise<void> = Promise.resolve();
  const probeRound = async () => {
    const results = await Promise.all(pods.map(async (p) => [p, o.noProbe ? true : await probe(p.address, o.probeTimeoutMs ?? 1_000)] as const));
    stats.probeRounds++;
    stats.pods = results.length;
    stats.ready = results.filter(([, r]) => r).length;
    for (const [p, ready] of results) {
      if (stopped) return;
      const k = keyOf(p);
      if (lastReady.get(k) === ready && published.get(p.model, p.name)?.address === p.address) continue;
      const ev = event(p, "upsert", ready);
      await acked(nats.js, subjects.pod(p.model, p.name), ev);
      published.apply(ev);
      lastReady.set(k, ready);
      stats.published++;
      log.info({ model: p.model, pod: p.name, address: p.address, ready }, "pod readiness published");
    }
  };

  await publishRemovals();
  const firstRound = probeRound();
  round = firstRound;
  const timer = setInterval(() => {
    round = round.then(probeRound).catch((err: unknown) => log.error({ err }, "probe round failed"));
  }, o.probeIntervalMs ?? 1_000);

  watchFile(o.file, { interval: 1_000 }, () => {
    try {
      pods = readPodList(o.file);
      log.info({ pods: pods.length }, "pod list reloaded");
      round = round.then(publishRemovals).then(probeRound).catch((err: unknown) => log.error({ err }, "reload failed"));
    } catch (err) {
      stats.reloadsRejected++;
      log.error({ err: (err as Error).message }, "pod list rejected; keeping the previous one");
    }
  });

  return {
    stats,
    firstRound,
    async close() {
      stopped = true;
      clearInterval(timer);
      unwatchFile(o.file);
      await round.catch(() => undefined);
      await nats.nc.drain();
    },
  };
}
