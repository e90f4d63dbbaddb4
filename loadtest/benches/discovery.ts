/**
 * `npm run bench -- discovery`: how long from a pod turning Ready in the Kubernetes API to a
 * gateway routing to it, with `pods` (1,000) pods and `rate` (10) changes per second; and what a
 * PODS event costs the gateway's fold.
 *
 * Setup, all real except the API server: a nats-server with jetroute's streams, the Kubernetes API
 * stand-in (services/kube-standin, the list/watch protocol over HTTP), `pod-watcher --kubernetes`
 * in process (client-node informers, source publisher, acked publishes), and one in-process
 * gateway following PODS. `pods` pods labelled for one model are created Ready before the clock
 * starts; the bench waits until the gateway routes to all of them.
 *
 * Changes: at `rate` per second one pod flips, through the pods/status subresource (the kubelet's
 * path): a routable pod turns not Ready, and a not-Ready pod turns Ready again (so the fleet stays
 * near `pods`). Only Ready transitions are measured. Both ends are read with `performance.now()`
 * in this process (one monotonic clock): the start right before the status write, the end when
 * the gateway's pod set (its `apply`, patched) first holds the pod as routable. No polling.
 * What it includes: the stand-in's watch event, the informer, the watcher's derive + reconcile
 * diff over all pods (coalesced per loop turn), the acked JetStream publish, the gateway's
 * ordered consumer, decoding, schema validation and the fold; and any wait for this shared event
 * loop.
 *
 * Apply cost: the same pod events folded by a fresh GatewayState in a tight loop (`applyEvents`
 * events over a `pods`-pod set): mean and p99 microseconds per event. The pod set rebuilds its
 * per-model ready lists on every change, so this grows with the fleet.
 */
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import type { PodEvent } from "../../schemas/events.js";
import { KubeStandin } from "../../services/kube-standin/server.js";
import { type GatewayHandle, startGateway } from "../../services/gateway/gateway.js";
import { startKubernetesWatcher } from "../../services/pod-watcher/kubernetes.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { GatewayState } from "../../services/views/gateway-state.js";
import { applyStreams } from "../../streams/apply.js";

export interface DiscoveryBenchOptions {
  pods?: number;
  /** Pod changes per second (half of them Ready transitions, which are measured). */
  rate?: number;
  durationMs?: number;
  /** Pod events folded in the apply-cost loop. */
  applyEvents?: number;
}

export interface DiscoveryBenchResult {
  bench: "discovery";
  pods: number;
  rate_per_s: number;
  changes: number;
  ready_to_routable_p50_ms: number;
  ready_to_routable_p99_ms: number;
  ready_to_routable_max_ms: number;
  samples: number;
  /** Ready transitions the gateway never saw within the grace period (must be 0). */
  missing: number;
  /** From creating the pods to the gateway routing to all of them (informer list + publishes). */
  initial_sync_ms: number;
  apply_us_mean: number;
  apply_us_p99: number;
}

const MODEL = "bench/discovery";
const NS = "bench";

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))] as number;
}
const round3 = (x: number) => Math.round(x * 1_000) / 1_000;
const ipOf = (i: number) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
const nameOf = (i: number) => `vllm-${i}`;

/** The pure fold's cost per pod event over a `pods`-pod set. */
export function measureApply(pods: number, events: number): { mean: number; p99: number } {
  const state = new GatewayState({ podSourceTimeoutMs: 30_000 });
  const ev = (i: number, ready: boolean): PodEvent => ({ type: "pod", action: "upsert", model: MODEL, pod: `${nameOf(i)}.${NS}`, address: `${ipOf(i)}:8000`, ready, engine: "vllm", source: "kubernetes", ts: 1 });
  let seq = 0;
  for (let i = 0; i < pods; i++) state.apply(ev(i, true), { stream: "pods", subject: "s", seq: ++seq, serverTs: 1_000 });
  const times = new Float64Array(events);
  for (let k = 0; k < events; k++) {
    const e = ev(k % pods, k % 2 === 1);
    const t0 = performance.now();
    state.apply(e, { stream: "pods", subject: "s", seq: ++seq, serverTs: 1_000 + k });
    times[k] = (performance.now() - t0) * 1_000;
  }
  const mean = times.reduce((a, b) => a + b, 0) / events;
  times.sort();
  return { mean: round3(mean), p99: round3(percentile(times, 0.99)) };
}

export async function runDiscoveryBench(o: DiscoveryBenchOptions = {}): Promise<DiscoveryBenchResult> {
  const pods = o.pods ?? 1_000;
  const rate = o.rate ?? 10;
  const durationMs = o.durationMs ?? 20_000;
  const log = createLogger("bench-discovery", process.env.JETROUTE_BENCH_LOG ?? "silent");
  const dir = mkdtempSync(path.join(os.tmpdir(), "jr-bench-discovery-"));
  const server = await startNatsServer();
  const kube = await new KubeStandin({ historySize: 100_000 }).start();
  let gw: GatewayHandle | undefined;
  let watcher: Awaited<ReturnType<typeof startKubernetesWatcher>> | undefined;
  try {
    const admin = await connectNats(server.url);
    await applyStreams(admin.nc, admin.jsm);
    await admin.nc.close();
    const kubeconfig = kube.writeKubeconfig(path.join(dir, "kubeconfig"));
    gw = await startGateway({ nats: server.url, port: 0, host: "127.0.0.1", adminPort: -1, log, heartbeatIntervalMs: 500, podSourceTimeoutMs: 30_000 });
    await gw.whenReady();
    const podSet = gw.state.pods;
    // The end of each measurement: the first fold that leaves the pod routable.
    const pending = new Map<string, number>();
    const latencies: number[] = [];
    const original = podSet.apply.bind(podSet);
    podSet.apply = (ev, seq, at) => {
      original(ev, seq, at);
      if (ev.action !== "upsert" || !ev.ready) return;
      const t0 = pending.get(ev.pod);
      if (t0 === undefined) return;
      const p = podSet.get(ev.model, ev.pod);
      if (!p || !podSet.vouched(p)) return;
      pending.delete(ev.pod);
      latencies.push(performance.now() - t0);
    };
    const routable = () => podSet.readyPods(MODEL).length;

    const t0 = performance.now();
    for (let i = 0; i < pods; i++) {
      kube.store.create("pods", NS, { apiVersion: "v1", kind: "Pod", metadata: { name: nameOf(i), labels: { "model.aibrix.ai/name": MODEL } } }, Date.now());
      kube.setPodStatus(NS, nameOf(i), { ready: true, podIP: ipOf(i) });
    }
    watcher = await startKubernetesWatcher({ nats: server.url, kubeconfig, namespaces: [NS], source: "kubernetes", heartbeatMs: 1_000, log });
    await watcher.firstRound;
    while (routable() < pods) await new Promise((r) => setTimeout(r, 5));
    const initialSync = performance.now() - t0;
    process.stderr.write(`discovery: ${pods} pods routable after ${Math.round(initialSync)} ms; ${rate} changes/s for ${durationMs} ms\n`);

    // Alternate: take a routable pod down, then bring the previous one back up.
    const down: number[] = [];
    let next = 0;
    let changes = 0;
    const started = performance.now();
    while (performance.now() - started < durationMs) {
      const due = started + (changes * 1_000) / rate;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      if (changes % 2 === 0 || down.length === 0) {
        const i = next++ % pods;
        down.push(i);
        kube.setPodStatus(NS, nameOf(i), { ready: false });
      } else {
        const i = down.shift() as number;
        pending.set(`${nameOf(i)}.${NS}`, performance.now());
        kube.setPodStatus(NS, nameOf(i), { ready: true });
      }
      changes++;
    }
    const graceEnd = performance.now() + 5_000;
    while (pending.size > 0 && performance.now() < graceEnd) await new Promise((r) => setTimeout(r, 10));
    const sorted = Float64Array.from(latencies).sort();
    const apply = measureApply(pods, o.applyEvents ?? 20_000);
    return {
      bench: "discovery",
      pods,
      rate_per_s: rate,
      changes,
      ready_to_routable_p50_ms: round3(percentile(sorted, 0.5)),
      ready_to_routable_p99_ms: round3(percentile(sorted, 0.99)),
      ready_to_routable_max_ms: round3(sorted[sorted.length - 1] ?? Number.NaN),
      samples: latencies.length,
      missing: pending.size,
      initial_sync_ms: Math.round(initialSync),
      apply_us_mean: apply.mean,
      apply_us_p99: apply.p99,
    };
  } finally {
    await watcher?.close().catch(() => undefined);
    await gw?.close().catch(() => undefined);
    await kube.stop();
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
