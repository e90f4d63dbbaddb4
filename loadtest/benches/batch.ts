/**
 * `npm run bench -- batch`: the Batch API on the simulated fleet beside interactive traffic
 * (issue 37). The system as the demo assembles it, every piece its own process: nats-server,
 * `jetroute sim`, pod-watcher, metrics-scraper, one gateway, the dev front forwarding /v1/files
 * and /v1/batches to `jetroute batch-api`, and `--workers` batch-worker processes. The model's
 * flow control is the demo's (interactive priority 10, batch -1, sheddable) with a pod full at one
 * waiting request, or at its slots + 1 in flight (benchFlowControl).
 *
 * Phases, on one assembly:
 *   capacity      a batch alone (`--probe-items`): the fleet's throughput for batch items, C;
 *   interactive   streamed interactive chats alone, Poisson at `--interactive-load` x C for
 *                 `--interactive-ms`: TTFT p99 without the batch;
 *   mixed         the same interactive load while a `--items` batch runs; one worker is killed
 *                 with SIGKILL once half the items are done; the interactive load keeps going
 *                 until the batch is completed.
 * Figures: items, completed, lost (input custom_ids without an output line), duplicated (output
 * lines beyond one per custom_id), batch_items_per_s (the steady rate: items done between 10 % and
 * 90 % of the batch over that time; `batch_seconds_end_to_end` adds queueing and assembly), C the
 * same steady rate of the probe (after a 100-item warm-up batch),
 * idle_capacity_items_per_s = C x (1 - interactive load), interactive TTFT p99 with and without
 * the batch (client wall ms at the first content chunk). Targets (issue 37): 0 lost, 0
 * duplicated, TTFT p99 within 1.2x, batch throughput >= 0.8x the idle capacity.
 */
import http from "node:http";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { Kvm } from "@nats-io/kv";
import { MODEL_CONFIG_KEY_PREFIX } from "../../schemas/config.js";
import { DEMO_FLOW_CONTROL } from "../../services/demo/demo.js";
import { connectNats } from "../../services/shared/nats.js";
import { freePort } from "../../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../../services/shared/processes.js";
import { configBucketName } from "../../streams/definitions.js";
import { encodeToken } from "../../streams/tokens.js";
import { type Assembly, PREFIX_QUALITY_ENGINE_DEFAULTS, percentile, startAssembly } from "../assembly.js";
import { type ClientOutcome, sendChat } from "./flow-client.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";

const MODEL = "bench/batch-8b";

/**
 * The demo's bands, with a pod full at one waiting request: batch items then never stand in an
 * engine queue ahead of an interactive request by more than one, and the rest wait in the gateway's
 * batch band, behind every interactive request. The ledger limit (a pod's slots + 1) decides alone
 * when the scraper's samples go stale on a loaded host, instead of one request per pod.
 */
export const benchFlowControl = (maxBatch: number) => ({ flowControl: { ...DEMO_FLOW_CONTROL.flowControl, saturation: { queueDepth: 1, maxInFlightPerPod: maxBatch + 1 } } });

export interface BatchBenchOptions {
  items: number;
  probeItems: number;
  workers: number;
  workerConcurrency: number;
  interactiveLoad: number;
  interactiveMs: number;
  pods: number;
  timeScale: number;
  maxTokens: number;
  maxBatch: number;
  seed: number;
  /**
   * The pods' engine and scheduler: `sglang-priority` (SGLang scheduling by priority, preempting a
   * running batch item for a waiting interactive request more urgent by more than its threshold)
   * or `vllm-fcfs` (first come, first served: an interactive request waits for a free slot).
   */
  engine: "sglang-priority" | "vllm-fcfs";
  logDir?: string;
}

/**
 * Engine-bound on purpose: 4 pods of 4 slots, 30 ms decode steps in real time, 24 output tokens
 * (~20 items/s for the fleet), so the fleet's capacity, not the CPU of the processes around it,
 * is what the batch fills and what interactive traffic competes for.
 */
export const BATCH_BENCH_DEFAULTS: BatchBenchOptions = { items: 5_000, probeItems: 400, workers: 3, workerConcurrency: 16, interactiveLoad: 0.6, interactiveMs: 20_000, pods: 4, timeScale: 1, maxTokens: 24, maxBatch: 4, seed: 37, engine: "sglang-priority" };

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

const inputFile = (n: number, tag: string, maxTokens: number) =>
  `${Array.from({ length: n }, (_, i) => JSON.stringify({ custom_id: `${tag}-${i}`, method: "POST", url: "/v1/chat/completions", body: { model: MODEL, messages: [{ role: "user", content: `${tag} item ${i}: summarise the quarterly report` }], max_tokens: maxTokens } })).join("\n")}\n`;

interface Api {
  upload(text: string): Promise<string>;
  create(fileId: string): Promise<string>;
  get(id: string): Promise<{ status: string; request_counts: { total: number; completed: number; failed: number }; output_file_id: string | null; error_file_id: string | null }>;
  content(fileId: string): Promise<string>;
}

function api(base: string): Api {
  const ok = async (r: Response) => {
    if (!r.ok) throw new Error(`${r.url}: HTTP ${r.status} ${(await r.text()).slice(0, 300)}`);
    return r;
  };
  return {
    async upload(text) {
      const form = new FormData();
      form.set("purpose", "batch");
      form.set("file", new Blob([text]), "bench.jsonl");
      return ((await (await ok(await fetch(`${base}/v1/files`, { method: "POST", body: form }))).json()) as { id: string }).id;
    },
    async create(fileId) {
      const body = JSON.stringify({ input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h" });
      return ((await (await ok(await fetch(`${base}/v1/batches`, { method: "POST", body, headers: { "content-type": "application/json" } }))).json()) as { id: string }).id;
    },
    async get(id) {
      return (await (await ok(await fetch(`${base}/v1/batches/${id}`))).json()) as never;
    },
    async content(fileId) {
      return await (await ok(await fetch(`${base}/v1/files/${fileId}/content`))).text();
    },
  };
}

/** Streams interactive chats, Poisson at `rate`/s, until `stop()`; returns their TTFTs (ms). */
function interactiveLoad(port: number, rate: number, rand: () => number, maxTokens: number): { stop(): Promise<{ ttfts: number[]; failed: number; sent: number }> } {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1024 });
  const t0 = performance.now();
  const now = () => performance.now() - t0;
  const live: Array<Promise<ClientOutcome>> = [];
  let stopped = false;
  let i = 0;
  const loop = (async () => {
    let next = 0;
    while (!stopped) {
      next += -Math.log(1 - rand()) * (1000 / rate);
      const wait = next - now();
      if (wait > 0) await sleep(wait);
      if (stopped) break;
      const r = { index: i, atMs: next, objective: "interactive" as const, user: `u${i % 16}`, prompt: `interactive ${i}: what is the capital of France?`, maxTokens };
      live.push(sendChat(agent, port, MODEL, r, `int-${i++}`, now, 60_000).done);
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      const outs = await Promise.all(live);
      agent.destroy();
      const ttfts = outs.filter((o) => o.kind === "ok" && o.firstTokenAt !== undefined).map((o) => (o.firstTokenAt as number) - o.sentAt);
      return { ttfts, failed: outs.filter((o) => o.kind !== "ok").length, sent: outs.length };
    },
  };
}

const p99 = (xs: number[]) => (xs.length ? Math.round(percentile([...xs].sort((a, b) => a - b), 0.99) * 10) / 10 : null);

export async function runBatchBench(opts: Partial<BatchBenchOptions> = {}): Promise<Record<string, unknown>> {
  const o = { ...BATCH_BENCH_DEFAULTS, ...opts };
  const logDir = o.logDir ?? mkdtempSync(path.join(os.tmpdir(), "jetroute-bench-batch-"));
  mkdirSync(logDir, { recursive: true });
  const apiPort = await freePort();
  const extra: ServiceProcess[] = [];
  let assembly: Assembly | undefined;
  const log = (msg: string) => process.stderr.write(`[batch] ${msg}\n`);
  try {
    assembly = await startAssembly(
      { strategy: "least-request", tokenizer: null, gateways: 1, kvEvents: false },
      { ...PREFIX_QUALITY_ENGINE_DEFAULTS, pods: o.pods, timeScale: o.timeScale, prefillMsPerToken: 0.2, decodeMsPerStep: 30, maxBatch: o.maxBatch },
      logDir,
      "batch",
      {
        model: MODEL,
        ...(o.engine === "sglang-priority" ? { simArgs: ["--engine", "sglang", "--scheduling-policy", "priority"], podEngine: "sglang" as const } : {}),
        frontArgs: ["--batch-api", `127.0.0.1:${apiPort}`],
        beforeGateways: async (natsUrl) => {
          const h = await connectNats(natsUrl, "jetroute-bench-batch");
          const kv = await new Kvm(h.nc).open(configBucketName("jr"));
          await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(MODEL)}`, JSON.stringify(benchFlowControl(o.maxBatch)));
          await h.nc.close();
          const a = spawnJetroute("batch-api", ["batch-api", "--nats", natsUrl, "--port", String(apiPort)], { logFile: path.join(logDir, "batch-api.log"), env: { JETROUTE_LOG_LEVEL: "warn" } });
          extra.push(a);
          await a.waitForLine((v: { service?: string }) => v.service === "batch-api", 30_000);
        },
      },
    );
    const a = assembly;
    const base = `http://127.0.0.1:${a.frontPort}`;
    const client = api(base);
    const workers: ServiceProcess[] = [];
    for (let i = 0; i < o.workers; i++) {
      const w = spawnJetroute(`batch-worker-${i + 1}`, ["batch-worker", "--nats", a.natsUrl, "--target", base, "--concurrency", String(o.workerConcurrency), "--ack-wait-ms", "5000", "--id", `bench-worker-${i + 1}`], { logFile: path.join(logDir, `batch-worker-${i + 1}.log`), env: { JETROUTE_LOG_LEVEL: "warn" } });
      extra.push(w);
      workers.push(w);
    }
    await Promise.all(workers.map((w) => w.waitForLine((v: { service?: string }) => v.service === "batch-worker", 30_000)));

    // Steady rate: items done between 10 % and 90 % of the batch over the time between, so start-up
    // (queueing) and the end (the last stragglers, the output assembly) do not count.
    const runBatch = async (n: number, tag: string, onProgress?: (done: number) => void) => {
      const fileId = await client.upload(inputFile(n, tag, o.maxTokens));
      const t0 = performance.now();
      const id = await client.create(fileId);
      let lo: { t: number; done: number } | undefined;
      let hi: { t: number; done: number } | undefined;
      for (;;) {
        const b = await client.get(id);
        const done = b.request_counts.completed + b.request_counts.failed;
        const t = performance.now();
        if (!lo && done >= n * 0.1) lo = { t, done };
        if (!hi && done >= n * 0.9) hi = { t, done };
        onProgress?.(done);
        if (["completed", "failed", "expired", "cancelled"].includes(b.status)) {
          const steady = lo && hi && hi.t > lo.t ? ((hi.done - lo.done) * 1000) / (hi.t - lo.t) : n / ((t - t0) / 1000);
          return { b, seconds: (t - t0) / 1000, steady };
        }
        await sleep(200);
      }
    };
    log("warm-up: 100 items");
    await runBatch(100, "warmup");

    // 1. Capacity: a batch alone.
    log(`capacity probe: ${o.probeItems} items alone`);
    const probe = await runBatch(o.probeItems, "probe");
    const capacity = probe.steady;
    log(`capacity ${capacity.toFixed(1)} items/s`);
    const rate = capacity * o.interactiveLoad;

    // 2. Interactive alone.
    log(`interactive alone: ${rate.toFixed(1)}/s for ${o.interactiveMs} ms`);
    const alone = interactiveLoad(a.frontPort, rate, mulberry32(o.seed), o.maxTokens);
    await sleep(o.interactiveMs);
    const without = await alone.stop();

    // 3. Interactive + the batch, one worker killed half-way.
    log(`mixed: ${o.items} items beside ${rate.toFixed(1)} interactive/s`);
    const mixed = interactiveLoad(a.frontPort, rate, mulberry32(o.seed + 1), o.maxTokens);
    let killed = false;
    const run = await runBatch(o.items, "bench", (done) => {
      if (!killed && done >= o.items / 2) {
        killed = true;
        log(`killing batch-worker-1 (SIGKILL) at ${done} items done`);
        void workers[0]?.kill();
      }
    });
    const withBatch = await mixed.stop();
    const out = run.b.output_file_id ? await client.content(run.b.output_file_id) : "";
    const errs = run.b.error_file_id ? await client.content(run.b.error_file_id) : "";
    const ids = [...out.split("\n"), ...errs.split("\n")].filter(Boolean).map((l) => (JSON.parse(l) as { custom_id: string }).custom_id);
    const unique = new Set(ids);
    const lost = Array.from({ length: o.items }, (_, i) => `bench-${i}`).filter((c) => !unique.has(c)).length;
    const idle = capacity * (1 - o.interactiveLoad);
    const result = {
      bench: "batch",
      items: o.items,
      completed: run.b.request_counts.completed,
      failed: run.b.request_counts.failed,
      status: run.b.status,
      lost,
      duplicated: ids.length - unique.size,
      batch_items_per_s: Math.round(run.steady * 10) / 10,
      batch_seconds_end_to_end: Math.round(run.seconds * 10) / 10,
      idle_capacity_items_per_s: Math.round(idle * 10) / 10,
      capacity_items_per_s: Math.round(capacity * 10) / 10,
      interactive_rate_per_s: Math.round(rate * 10) / 10,
      interactive_ttft_p99_ms: p99(withBatch.ttfts),
      interactive_ttft_p99_ms_without_batch: p99(without.ttfts),
      interactive_failed: withBatch.failed,
      interactive_failed_without_batch: without.failed,
      worker_killed: killed,
      pods: o.pods,
      max_batch: o.maxBatch,
      engine: o.engine,
      saturation: benchFlowControl(o.maxBatch).flowControl.saturation,
      max_tokens: o.maxTokens,
      workers: o.workers,
    };
    if (!o.logDir) rmSync(logDir, { recursive: true, force: true });
    return result;
  } finally {
    for (const p of extra.reverse()) await p.stop(3_000).catch(() => undefined);
    await assembly?.stop();
  }
}
