/**
 * `npm run bench -- predicted`: routing on a heterogeneous fleet by the latency model learned from
 * the fleet's own outcomes (docs/latency-model.md). The whole system as `jetroute demo` assembles
 * it (prefix-quality.ts `startAssembly`): nats-server, `jetroute sim` with 2 fast and 2 slow pods
 * (`--pod-classes`: the slow ones `slowFactor` times slower to prefill and to decode), pod-watcher
 * with the pods' classes in its pod list, metrics-scraper, kv-bridge, one gateway, the dev front.
 *
 * Each case gets a fresh assembly and the same seeded arrivals: single-turn chats over 16 shared
 * system prompts (loadtest/workloads/shared-prefix.ts), Poisson, at `targetUtil` of the fleet's
 * capacity by the simulator's timing model with every prompt prefilled (cache hits make the real
 * load lower; the measured `busy` share is printed). Measured after the warm-up: client TTFT
 * (first content chunk), and the engines' prefix-cache hit rate (counter deltas).
 *
 * Then, per case, `jetroute replay` over the measured window from the run's own streams, with
 * `--simulate` of the recorded strategy: its fidelity, the prediction error of the records'
 * predictions (TTFT MAPE), and the calibrated what-if's TTFT p50 over the recorded one.
 *
 * Headlines: `ttft_mape` = the predicted-latency run's; `whatif_ttft_p50_ratio` = the least-request
 * run's calibrated what-if (the recorded strategy, simulated on engine parameters fitted per pod
 * class to the recorded outcomes) over its recorded TTFT p50. Details go to stderr.
 */
import http from "node:http";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { connectNats } from "../../services/shared/nats.js";
import { runReplay } from "../../services/replay/command.js";
import { natsSource } from "../../services/replay/sources.js";
import type { ReplayReport } from "../../services/replay/report-types.js";
import { LatencyModel } from "../../services/views/latency-model.js";
import { tokenizeChat } from "../../services/tokenizer/sim-tokenizer.js";
import { streamName } from "../../streams/definitions.js";
import { DEFAULT_PREFIX } from "../../streams/subjects.js";
import { chunkContent, drainSseData, settledMessageCount } from "../streams-read.js";
import { buildSharedPrefixWorkload, SHARED_PREFIX_DEFAULTS, type SharedPrefixWorkload } from "../workloads/shared-prefix.js";
import { type Assembly, type CaseSpec, getJson, percentile, type PrefixQualityEngineOptions, startAssembly } from "../assembly.js";

const MODEL = "bench/llama-3.1-8b";

export const PREDICTED_CASES: ReadonlyArray<{ name: string; spec: CaseSpec }> = [
  // least-request tokenizes too (after routing, off its path): its records keep the prompt blocks replay calibrates with.
  { name: "least-request", spec: { strategy: "least-request", tokenizer: "local", gateways: 1, kvEvents: true } },
  { name: "prefix-cache", spec: { strategy: "prefix-cache", tokenizer: "local", gateways: 1, kvEvents: true } },
  { name: "predicted-latency", spec: { strategy: "predicted-latency", tokenizer: "local", gateways: 1, kvEvents: true } },
  { name: "predicted-latency+prefix-cache", spec: { strategy: "predicted-latency:1,prefix-cache:1", tokenizer: "local", gateways: 1, kvEvents: true } },
];

export interface PredictedBenchOptions {
  durationMs?: number;
  warmupMs?: number;
  /** Arrivals per wall second; default: `targetUtil` of the timing model's capacity. */
  rate?: number;
  targetUtil?: number;
  /** How much slower the slow pods prefill and decode. */
  slowFactor?: number;
  cases?: readonly string[];
  logDir?: string;
}

export interface PredictedResult {
  bench: "predicted";
  results: Array<{ strategy: string; ttft_p50_ms: number; ttft_p99_ms: number; hit_rate: number }>;
  ttft_mape: number | null;
  whatif_ttft_p50_ratio: number | null;
}

export const PREDICTED_ENGINE: PrefixQualityEngineOptions = {
  pods: 4,
  timeScale: 10,
  maxBatch: 8,
  maxNumBatchedTokens: 2048,
  // The fast class: an 8B-class model on a big GPU (~2.5k prefill tokens/s, 20 ms decode steps).
  prefillMsPerToken: 0.4,
  decodeMsPerStep: 20,
  decodeBatchSlope: 0.05,
  // 64k tokens of KV per pod: every system prompt fits on every pod, so the prefix index is what
  // the engines hold (evictions would make "cached" a coin toss no feature can predict).
  kvCacheBlocks: 4096,
  blockSize: 16,
};

const round = (x: number, d = 2) => (Number.isFinite(x) ? Number(x.toFixed(d)) : Number.NaN);
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const progress = (line: string) => process.stderr.write(`[predicted] ${line}\n`);

/** One streamed chat through the front: client TTFT at the first content chunk. */
function streamChat(agent: http.Agent, port: number, body: string, timeoutMs: number): Promise<{ ok: boolean; ttftMs?: number; error?: string }> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    let ttftMs: number | undefined;
    let done = false;
    let settled = false;
    const finish = (o: { ok: boolean; ttftMs?: number; error?: string }) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(o);
    };
    const req = http.request({ host: "127.0.0.1", port, method: "POST", path: "/v1/chat/completions", agent, headers: { "content-type": "application/json" } }, (res) => {
      res.setEncoding("utf8");
      let buf = "";
      res.on("data", (c: string) => {
        if (res.statusCode !== 200) return;
        buf = drainSseData(buf + c, (data) => {
          if (data === "[DONE]") done = true;
          else if (chunkContent(data) !== undefined) ttftMs ??= performance.now() - t0;
        });
      });
      res.on("end", () => finish(res.statusCode === 200 && done && ttftMs !== undefined ? { ok: true, ttftMs } : { ok: false, error: `HTTP ${res.statusCode}` }));
      res.on("error", (err) => finish({ ok: false, error: err.message }));
    });
    const timer = setTimeout(() => {
      req.destroy();
      finish({ ok: false, error: "timeout" });
    }, timeoutMs);
    req.on("error", (err) => finish({ ok: false, error: err.message }));
    req.end(body);
  });
}

async function prefixCounters(agent: http.Agent, addresses: readonly string[]): Promise<{ queries: number; hits: number }> {
  const read = (text: string, name: string) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)`, "m").exec(text)?.[1] ?? 0);
  let queries = 0;
  let hits = 0;
  for (const a of addresses) {
    const { body } = await getJson<string>(agent, `http://${a}/metrics`);
    const text = typeof body === "string" ? body : "";
    queries += read(text, "vllm:prefix_cache_queries_total");
    hits += read(text, "vllm:prefix_cache_hits_total");
  }
  return { queries, hits };
}

/** Requests per wall second the fleet serves at `util` by the timing model (no cache hits; answers decoded alone). */
function modelRate(w: SharedPrefixWorkload, e: PrefixQualityEngineOptions, slow: number, util: number): number {
  const prompt = w.schedule.reduce((s, t) => {
    const c = w.conversations[t.conversation] as SharedPrefixWorkload["conversations"][number];
    return s + tokenizeChat([{ role: "system", content: w.systemPrompts[c.systemPrompt] as string }, { role: "user", content: t.userText }], { addGenerationPrompt: true }).length;
  }, 0) / Math.max(1, w.schedule.length);
  const answer = (w.options.maxTokens[0] + w.options.maxTokens[1]) / 2;
  const fastMs = prompt * e.prefillMsPerToken + answer * e.decodeMsPerStep;
  const perSimMs = (e.pods / 2) * (1 / fastMs + 1 / (fastMs * slow));
  return util * perSimMs * 1000 * e.timeScale;
}

interface CaseRow {
  strategy: string;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  hit_rate: number;
  requests: number;
  errors: number;
  busy: number;
  replay: { fidelity: number; evaluated: number; ttft_mape: number | null; tpot_mape: number | null; from_prior: number; whatif: ReplayReport["calibration"] | null };
}

async function runCase(name: string, spec: CaseSpec, w: SharedPrefixWorkload, engine: PrefixQualityEngineOptions, slowFactor: number, o: { durationMs: number; warmupMs: number; logDir: string }): Promise<CaseRow> {
  const slow = `slow:prefill=${engine.prefillMsPerToken * slowFactor}:decode=${engine.decodeMsPerStep * slowFactor}`;
  const asm: Assembly = await startAssembly(spec, engine, o.logDir, name.replace(/[^a-z0-9-]+/gi, "_"), { model: MODEL, simArgs: ["--pod-classes", `fast,${slow}`] });
  const agent = new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY });
  const probe = new http.Agent({ keepAlive: true, maxSockets: 8 });
  const addresses = asm.pods.map((p) => p.address);
  try {
    const t0 = performance.now();
    const wall0 = Date.now();
    const outcomes: Array<{ at: number; ok: boolean; ttftMs?: number; error?: string }> = [];
    const pending: Array<Promise<void>> = [];
    let warm: { queries: number; hits: number } | undefined;
    const warmTimer = setTimeout(() => void prefixCounters(probe, addresses).then((c) => (warm = c), () => undefined), o.warmupMs);
    const busy: number[] = [];
    const sampler = setInterval(() => {
      const at = performance.now() - t0;
      if (at < o.warmupMs || at > o.durationMs) return;
      void Promise.all(addresses.map((a) => getJson<{ running: number }>(probe, `http://${a}/debug/state`))).then((xs) => {
        for (const x of xs) busy.push((x.body?.running ?? 0) > 0 ? 1 : 0);
      }, () => undefined);
    }, 250);
    for (const turn of w.schedule) {
      const wait = t0 + turn.atMs - performance.now();
      if (wait > 0) await sleep(wait);
      const c = w.conversations[turn.conversation] as SharedPrefixWorkload["conversations"][number];
      const body = JSON.stringify({ model: MODEL, messages: [{ role: "system", content: w.systemPrompts[c.systemPrompt] }, { role: "user", content: turn.userText }], max_tokens: turn.maxTokens, stream: true, stream_options: { include_usage: true } });
      pending.push(streamChat(agent, asm.frontPort, body, 60_000).then((r) => void outcomes.push({ at: turn.atMs, ...r })));
    }
    await Promise.all(pending);
    clearInterval(sampler);
    clearTimeout(warmTimer);
    const end = await prefixCounters(probe, addresses);
    const measured = outcomes.filter((x) => x.at >= o.warmupMs);
    const ttfts = measured.filter((x) => x.ok).map((x) => x.ttftMs as number).sort((a, b) => a - b);
    const queries = end.queries - (warm?.queries ?? 0);
    const hits = end.hits - (warm?.hits ?? 0);
    // Every request's decision record is on the stream before the window is replayed.
    const h = await connectNats(asm.natsUrl, "jetroute-bench-predicted");
    let report: ReplayReport;
    try {
      await settledMessageCount(h.jsm, streamName(DEFAULT_PREFIX, "DECISIONS"), outcomes.length, 10_000);
      const fromMs = wall0 + o.warmupMs;
      const toMs = Date.now();
      report = await runReplay({ source: await natsSource(h, DEFAULT_PREFIX, { fromMs, toMs, tailMs: 5_000 }), fromMs, toMs, strategies: [], simulate: [spec.strategy], progress: false });
    } finally {
      await h.nc.close();
    }
    const row: CaseRow = {
      strategy: spec.strategy,
      ttft_p50_ms: round(percentile(ttfts, 0.5), 1),
      ttft_p99_ms: round(percentile(ttfts, 0.99), 1),
      hit_rate: round(queries > 0 ? hits / queries : 0, 4),
      requests: measured.length,
      errors: measured.filter((x) => !x.ok).length,
      busy: round(busy.reduce((a, b) => a + b, 0) / Math.max(1, busy.length), 3),
      replay: {
        fidelity: round(report.fidelity.ratio, 4),
        evaluated: report.fidelity.evaluated,
        ttft_mape: report.prediction?.ttftMape == null ? null : round(report.prediction.ttftMape, 4),
        tpot_mape: report.prediction?.tpotMape == null ? null : round(report.prediction.tpotMape, 4),
        from_prior: report.prediction?.fromPrior ?? 0,
        whatif: report.calibration ?? null,
      },
    };
    progress(`${name}: ${JSON.stringify(row)}`);
    if (report.warnings.length > 0) progress(`${name}: replay warnings: ${report.warnings.join("; ")}`);
    return row;
  } finally {
    agent.destroy();
    probe.destroy();
    await asm.stop();
  }
}

/** Heap bytes per (model, class) entry of a full window (every bucket holding samples), `node --expose-gc`. */
export function latencyModelBytesPerEntry(entries = 1_000): number | null {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) return null;
  gc();
  const before = process.memoryUsage().heapUsed;
  const m = new LatencyModel();
  for (let b = 0; b < 12; b++) {
    // 10 models x 100 classes each (the pooled entries included in the count below).
    for (let e = 0; e < entries; e++) m.learn(`m${e % 10}`, b * 10_000, { x: [100, 0, 0, 0, 0, 0], cls: `c${Math.floor(e / 10) % 64}`, ttftMs: 20, tpotMs: 10 });
  }
  gc();
  const bytes = process.memoryUsage().heapUsed - before;
  return m.size > 0 ? Math.round(bytes / m.size) : null;
}

export async function runPredictedBench(opts: PredictedBenchOptions = {}): Promise<PredictedResult> {
  const durationMs = opts.durationMs ?? 40_000;
  const warmupMs = opts.warmupMs ?? 12_000;
  const slowFactor = opts.slowFactor ?? 2.5;
  const targetUtil = opts.targetUtil ?? 0.7;
  const engine = PREDICTED_ENGINE;
  const logDir = opts.logDir ?? mkdtempSync(path.join(os.tmpdir(), "jetroute-predicted-"));
  mkdirSync(logDir, { recursive: true });
  const wl = { ...SHARED_PREFIX_DEFAULTS, maxTokens: [32, 96] as const };
  const rate = opts.rate ?? modelRate(buildSharedPrefixWorkload({ ...wl, rate: 10, durationMs: 20_000 }), engine, slowFactor, targetUtil);
  const w = buildSharedPrefixWorkload({ ...wl, rate, durationMs });
  progress(`rate ${rate.toFixed(2)} req/s (${targetUtil} of the timing model's capacity), ${w.schedule.length} requests over ${durationMs} ms (${warmupMs} ms warm-up); logs in ${logDir}`);
  const rows: CaseRow[] = [];
  try {
    for (const c of PREDICTED_CASES.filter((x) => !opts.cases || opts.cases.includes(x.name))) rows.push(await runCase(c.name, c.spec, w, engine, slowFactor, { durationMs, warmupMs, logDir }));
  } finally {
    if (!opts.logDir) rmSync(logDir, { recursive: true, force: true });
  }
  const by = (s: string) => rows.find((r) => r.strategy === s);
  const baseline = Math.min(by("least-request")?.ttft_p99_ms ?? Number.POSITIVE_INFINITY, by("prefix-cache")?.ttft_p99_ms ?? Number.POSITIVE_INFINITY);
  const predicted = Math.min(...rows.filter((r) => r.strategy.startsWith("predicted-latency")).map((r) => r.ttft_p99_ms));
  const mape = by("predicted-latency")?.replay.ttft_mape ?? null;
  const ratio = by("least-request")?.replay.whatif?.ttftP50Ratio ?? null;
  progress(
    `targets: best predicted TTFT p99 ${predicted} ms vs ${round(0.7 * baseline, 1)} (0.7 x best of least-request, prefix-cache) -> ${predicted <= 0.7 * baseline ? "met" : "NOT MET"}; ` +
      `TTFT MAPE ${mape} (<= 0.25 ${mape !== null && mape <= 0.25 ? "met" : "NOT MET"}); what-if p50 ratio ${ratio} (0.75-1.25 ${ratio !== null && ratio >= 0.75 && ratio <= 1.25 ? "met" : "NOT MET"}); ` +
      `predicted-latency replay fidelity ${by("predicted-latency")?.replay.fidelity}; latency model ${latencyModelBytesPerEntry()} bytes per (model, class) entry`,
  );
  return {
    bench: "predicted",
    results: rows.map((r) => ({ strategy: r.strategy, ttft_p50_ms: r.ttft_p50_ms, ttft_p99_ms: r.ttft_p99_ms, hit_rate: r.hit_rate })),
    ttft_mape: mape,
    whatif_ttft_p50_ratio: ratio === null ? null : round(ratio, 3),
  };
}
