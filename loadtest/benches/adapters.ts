/**
 * `npm run bench -- adapters`: many LoRA adapters (Zipf demand) over a few simulated vLLM pods with
 * a small `max_loras`, placed by `jetroute adapter-controller` (minReplicas 0: every adapter starts
 * cold and is loaded on demand, the coldest evicted first when pods are full), routed by a gateway
 * behind the dev front, with one pod killed half way through (docs/adapters.md).
 *
 * Figures: `requests_404` (answers 404: an engine asked for an adapter it does not hold, or a
 * gateway that did not know the adapter), `hit_rate_loaded` (requests whose adapter had a loaded,
 * routable replica when they were sent: they waited for no load), the cold starts' time to first
 * token (requests sent while their adapter had no replica: they wait in the waiting room while the
 * controller loads it; the simulated load takes `--load-ms`), and the controller's engine calls
 * (`placement_moves`: loads + unloads that succeeded).
 *
 * Everything runs in this process (engines, gateway, controller), so times carry the box's load.
 */
import { Kvm } from "@nats-io/kv";
import { ADAPTER_KEY_PREFIX } from "../../schemas/adapters.js";
import { MODEL_CONFIG_KEY_PREFIX } from "../../schemas/config.js";
import type { PodEvent } from "../../schemas/events.js";
import { applyStreams } from "../../streams/apply.js";
import { configBucketName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { encodeToken } from "../../streams/tokens.js";
import { startAdapterController } from "../../services/adapters/controller.js";
import { startFront } from "../../services/front/front.js";
import { startGateway } from "../../services/gateway/gateway.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { startSimFleet } from "../../services/sim/fleet.js";

export interface AdaptersBenchOptions {
  adapters: number;
  pods: number;
  maxLoras: number;
  /** Requests per second (open loop). */
  rps: number;
  durationMs: number;
  /** Zipf exponent of the adapters' popularity. */
  zipfS: number;
  /** How long one simulated load takes. */
  loadMs: number;
  seed: number;
}

const MODEL = "bench/llama-8b";
const pct = (xs: number[], p: number) => {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return Math.round((s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number) * 10) / 10;
};

export async function runAdaptersBench(o: AdaptersBenchOptions): Promise<object> {
  const quiet = createLogger("bench", "silent");
  const server = await startNatsServer();
  const nats = await connectNats(server.url);
  await applyStreams(nats.nc, nats.jsm);
  const subjects = new Subjects();
  const fleet = await startSimFleet({ pods: o.pods, model: MODEL, lora: { maxLoras: o.maxLoras, loadMs: o.loadMs }, logger: quiet });
  const publishPod = (name: string, address: string, action: PodEvent["action"] = "upsert") =>
    nats.js.publish(subjects.pod(MODEL, name), JSON.stringify({ type: "pod", action, model: MODEL, pod: name, address, ready: true, engine: "vllm", ts: Date.now() } satisfies PodEvent));
  for (const p of fleet.pods) await publishPod(p.name, p.address);
  const kv = await new Kvm(nats.js).open(configBucketName("jr"));
  await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(MODEL)}`, JSON.stringify({ flowControl: { waitingRoomTtlMs: 30_000 } }));
  const names = Array.from({ length: o.adapters }, (_, i) => `tenant-${i}`);
  for (const n of names) await kv.put(`${ADAPTER_KEY_PREFIX}${n}`, JSON.stringify({ baseModel: MODEL, artifactURL: `/adapters/${n}`, minReplicas: 0, maxReplicas: 2, targetRps: 4 }));
  const gw = await startGateway({ nats: server.url, port: 0, host: "127.0.0.1", adminPort: -1, log: quiet, heartbeatIntervalMs: 200, shutdownGraceMs: 300 });
  await gw.whenReady();
  const front = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${gw.port}`], logger: quiet });
  const ctl = await startAdapterController({ nats: server.url, prefix: "jr", id: "bench-ctl", tickMs: 100, maxLoras: o.maxLoras, unloadGraceMs: 100, retryDelayMs: 50, log: quiet });
  await ctl.whenReady();
  // Every declaration known to the gateway before traffic starts (each is a model it knows).
  const t0wait = Date.now();
  while (!names.every((n) => gw.views.pods.knows(n)) && Date.now() - t0wait < 30_000) await new Promise((r) => setTimeout(r, 100));

  // Zipf popularity.
  const weights = names.map((_, i) => 1 / (i + 1) ** o.zipfS);
  const total = weights.reduce((a, b) => a + b, 0);
  const cdf: number[] = [];
  let acc = 0;
  for (const w of weights) cdf.push((acc += w / total));
  const rnd = mulberry32(o.seed);
  const pick = () => {
    const u = rnd();
    let lo = 0;
    let hi = cdf.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((cdf[mid] as number) < u) lo = mid + 1;
      else hi = mid;
    }
    return names[lo] as string;
  };

  const base = `http://127.0.0.1:${front.port}`;
  let requests = 0;
  let hits = 0;
  let notFound = 0;
  let errors = 0;
  const cold: number[] = [];
  const warm: number[] = [];
  const pending: Array<Promise<void>> = [];
  const send = async (adapter: string) => {
    requests++;
    const loaded = gw.views.pods.readyPods(adapter).length > 0;
    if (loaded) hits++;
    const t0 = performance.now();
    try {
      const res = await fetch(`${base}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: adapter, prompt: `request for ${adapter}`, max_tokens: 4, stream: true }) });
      if (res.status === 404) notFound++;
      if (!res.ok || !res.body) {
        errors++;
        await res.text().catch(() => undefined);
        return;
      }
      const reader = res.body.getReader();
      const first = await reader.read();
      const ms = performance.now() - t0;
      if (!first.done) (loaded ? warm : cold).push(ms);
      while (!(await reader.read()).done) {
        // drain
      }
    } catch {
      errors++;
    }
  };
  const start = Date.now();
  let killed: string | undefined;
  const interval = 1000 / o.rps;
  let next = start;
  while (Date.now() - start < o.durationMs) {
    if (!killed && Date.now() - start >= o.durationMs / 2) {
      // The busiest pod dies: its watcher removes it, its engine stops answering.
      const victim = fleet.pods[0] as (typeof fleet.pods)[number];
      killed = victim.name;
      await publishPod(victim.name, victim.address, "remove");
      await fleet.stop(victim.name);
    }
    pending.push(send(pick()));
    next += interval;
    const wait = next - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }
  await Promise.all(pending);
  await ctl.idle();
  const result = {
    bench: "adapters",
    adapters: o.adapters,
    pods: o.pods,
    max_loras: o.maxLoras,
    zipf_s: o.zipfS,
    rps: o.rps,
    duration_ms: o.durationMs,
    load_ms: o.loadMs,
    requests,
    errors,
    killed_pod: killed ?? null,
    cold_starts: cold.length,
    cold_start_first_token_p50_ms: pct(cold, 50),
    cold_start_first_token_p99_ms: pct(cold, 99),
    warm_first_token_p50_ms: pct(warm, 50),
    requests_404: notFound,
    placement_moves: ctl.stats.loads + ctl.stats.unloads,
    failed_engine_calls: ctl.stats.failedCalls,
    hit_rate_loaded: requests > 0 ? Math.round((hits / requests) * 10_000) / 10_000 : null,
    targets: { requests_404: "0", hit_rate_loaded: ">= 0.95" },
  };
  await ctl.close();
  await front.close();
  await gw.close();
  await fleet.close();
  await nats.nc.close();
  await server.stop();
  return result;
}
