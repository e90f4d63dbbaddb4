/**
 * `node --expose-gc dist/loadtest/bench.js prefix-quality`: routing quality on a shared-prefix chat
 * workload (issue "One prefix index for every gateway"). The whole system as `jetroute demo`
 * assembles it, each piece its own process: nats-server, `jetroute sim` (8 pods), pod-watcher,
 * metrics-scraper, kv-bridge (when the engines publish KV events), 1 or 4 gateway replicas, the
 * dev front (which round-robins over the replicas). This process only plays the clients.
 *
 * Each case gets a fresh assembly (new nats-server, new engines with empty caches) and the same
 * seeded workload (loadtest/workloads/shared-prefix.ts): Poisson arrivals at one rate for every
 * case, so a strategy that makes more prefill work shows up as queueing, not as a lower rate.
 *
 * Measured, for requests scheduled after the warm-up:
 * - hit rate: the engines' own counters, delta of vllm:prefix_cache_hits_total over
 *   vllm:prefix_cache_queries_total (tokens) from the end of the warm-up to the end of the run;
 * - TTFT: client-observed, from sending the request to the front to the first SSE chunk carrying
 *   content (vLLM's opening chunk has an empty delta), in wall milliseconds;
 * - load: every 250 ms each pod's /debug/state; `busy` = share of samples whose running batch was
 *   non-empty (the engine was stepping), `batch_util` = mean running / maxBatch.
 *
 * Load calibration: the rate at which least-request keeps the engines busy ~80% of the time.
 * With prompts of ~3k tokens the engines are prefill-bound: a step's token budget
 * (maxNumBatchedTokens) fills long before maxBatch sequences do, so requests queue while the
 * running batch holds one or two; "80% utilised" is therefore the running batch being busy 80%
 * of the time, not 80% of its slots taken (that figure is reported too and stays low). A first
 * guess comes from the simulator's timing model (every prompt token prefilled, i.e. no cache hits;
 * see `modelRate`); short least-request runs on fresh engines then measure `busy` and correct the
 * rate (proportionally, then by interpolating between the closest measurements on either side),
 * because partial cache hits, preemptions and decode sharing make the model inexact.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { type ChatMessage, tokenizeChat } from "../../services/tokenizer/sim-tokenizer.js";
import { chunkContent, drainSseData } from "../streams-read.js";
import { ASSEMBLY_MODEL, type Assembly, type CaseSpec, getJson, PREFIX_QUALITY_ENGINE_DEFAULTS, type PrefixQualityEngineOptions, percentile, startAssembly } from "../assembly.js";
import { type HostCpu, hostCpu, processCpuUs } from "../proc-cpu.js";
import { buildSharedPrefixWorkload, SHARED_PREFIX_DEFAULTS, type SharedPrefixWorkload, type SharedPrefixWorkloadOptions } from "../workloads/shared-prefix.js";

const MODEL = ASSEMBLY_MODEL;

export type PrefixQualityCaseName = "random" | "least-request" | "prefix-approximate" | "prefix-precise" | "prefix-precise-4gw";

export const PREFIX_QUALITY_CASES: Record<PrefixQualityCaseName, CaseSpec> = {
  random: { strategy: "random", tokenizer: null, gateways: 1, kvEvents: true },
  "least-request": { strategy: "least-request", tokenizer: null, gateways: 1, kvEvents: true },
  // Routed-prefix history only, so the engines need not publish anything: run it without KV
  // events and without a kv-bridge, which is the deployment approximate mode is for.
  "prefix-approximate": { strategy: "prefix-cache", tokenizer: "approximate", gateways: 1, kvEvents: false },
  "prefix-precise": { strategy: "prefix-cache", tokenizer: "local", gateways: 1, kvEvents: true },
  "prefix-precise-4gw": { strategy: "prefix-cache", tokenizer: "local", gateways: 4, kvEvents: true },
};

export interface PrefixQualityBenchOptions {
  /** Cases to run, in order (default: all five). */
  cases?: PrefixQualityCaseName[];
  /** Arrivals per case, warm-up included (wall ms). */
  durationMs?: number;
  /** Requests scheduled before this are not measured (caches fill, conversations reach steady state). */
  warmupMs?: number;
  /** Request rate (per wall second); when absent it is calibrated with least-request. */
  rate?: number;
  /** Target mean running-batch utilisation for the calibration. */
  targetUtil?: number;
  /** Arrivals per calibration run (wall ms, warm-up included). */
  calibrationMs?: number;
  calibrationWarmupMs?: number;
  /** Calibration runs at most. */
  calibrationRuns?: number;
  /** How long, after the last arrival, requests still in flight may take before they count as errors. */
  drainTimeoutMs?: number;
  engine?: Partial<PrefixQualityEngineOptions>;
  workload?: Partial<Omit<SharedPrefixWorkloadOptions, "rate" | "durationMs">>;
  /** Keep the services' logs here instead of a temp dir removed at the end. */
  logDir?: string;
}

export interface PrefixQualityRow {
  case: PrefixQualityCaseName;
  strategy: string;
  tokenizer: string | null;
  gateways: number;
  kv_events: boolean;
  hit_rate: number;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  requests: number;
  errors: number;
  ttft_mean_ms: number;
  /**
   * Fraction of samples (every 250 ms, every pod, measured window) in which the pod's running
   * batch was non-empty, i.e. the engine was stepping: the load figure calibrated to ~0.8.
   */
  busy: number;
  /** Mean running requests / maxBatch over the pods, measured window. */
  batch_util: number;
  /** Mean requests waiting per pod, measured window. */
  waiting_mean: number;
  /** Engine-side mean TTFT (simulated time converted to wall ms), measured window. */
  engine_ttft_mean_ms: number;
  preemptions: number;
  /** Turns sent late because the previous answer had not arrived when they were due. */
  late_turns: number;
  /** Turns not sent because an earlier turn of the conversation failed. */
  skipped_turns: number;
  /** Client send lag behind the schedule (p99, ms): large values mean the client, not the system, was slow. */
  send_lag_p99_ms: number;
  /** CPU used by every process of the run / (wall x cores), measured window. */
  cpu_util: number | null;
  /** The whole machine's CPU use over the same window: above cpu_util, other work shared the cores. */
  machine_cpu_util: number | null;
  first_error?: string;
}

export interface PrefixQualityResult {
  bench: "prefix-quality";
  results: PrefixQualityRow[];
  precise_vs_random_ttft_p50: number | null;
  hit_rate_4gw_over_1gw: number | null;
  targets: { precise_ttft_p50_5x_better_than_random: boolean | null; four_gw_hit_rate_at_least_095_of_one: boolean | null };
  rate_rps: number;
  time_scale: number;
  calibration: { method: string; target_util: number; model_guess_rps: number | null; points: Array<{ rate_rps: number; busy: number; batch_util: number; ttft_p50_ms: number }> };
  engine: PrefixQualityEngineOptions;
  workload: Omit<SharedPrefixWorkloadOptions, "rate" | "durationMs"> & { duration_ms: number; warmup_ms: number; requests_scheduled: number; conversations: number; mean_prompt_tokens: number };
  note: string;
}

const round = (x: number, digits = 2): number => Number(x.toFixed(digits));
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function progress(line: string): void {
  process.stderr.write(`[prefix-quality] ${line}\n`);
}

interface ChatOutcome {
  ok: boolean;
  /** ms from send to the first content chunk. */
  ttftMs?: number;
  text: string;
  error?: string;
}

/**
 * One streamed chat completion through the front. TTFT is taken at the first SSE event whose delta
 * carries text: vLLM opens a chat stream with an empty assistant delta, which is not a token.
 */
function streamChat(agent: http.Agent, port: number, body: string, timeoutMs: number): Promise<ChatOutcome> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    let ttftMs: number | undefined;
    let text = "";
    let done = false;
    let settled = false;
    const finish = (o: ChatOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(o);
    };
    const req = http.request(
      {
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/v1/chat/completions",
        agent,
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) },
      },
      (res) => {
        res.setEncoding("utf8");
        if (res.statusCode !== 200) {
          let errBody = "";
          res.on("data", (c: string) => {
            if (errBody.length < 500) errBody += c;
          });
          res.on("end", () => finish({ ok: false, text: "", error: `HTTP ${res.statusCode}: ${errBody.slice(0, 300)}` }));
          res.on("error", (err) => finish({ ok: false, text: "", error: `HTTP ${res.statusCode}: ${err.message}` }));
          return;
        }
        let buf = "";
        res.on("data", (c: string) => {
          buf = drainSseData(buf + c, (data) => {
            if (data === "[DONE]") {
              done = true;
              return;
            }
            const piece = chunkContent(data);
            if (piece === undefined) return;
            ttftMs ??= performance.now() - t0;
            text += piece;
          });
        });
        res.on("end", () => {
          if (done && ttftMs !== undefined) finish({ ok: true, ttftMs, text });
          else finish({ ok: false, ttftMs, text, error: done ? "stream carried no content" : "stream ended without [DONE]" });
        });
        res.on("error", (err) => finish({ ok: false, ttftMs, text, error: `response: ${err.message}` }));
      },
    );
    const timer = setTimeout(() => {
      req.destroy(new Error("client timeout"));
      finish({ ok: false, ttftMs, text, error: `no complete answer within ${timeoutMs} ms` });
    }, timeoutMs);
    req.on("error", (err) => finish({ ok: false, ttftMs, text, error: `request: ${err.message}` }));
    req.end(body);
  });
}

// ---------------------------------------------------------------------------------------------
// Engine metrics

interface PodCounters {
  queries: number;
  hits: number;
  ttftSum: number;
  ttftCount: number;
  preemptions: number;
}

function counter(text: string, name: string): number {
  // One series per pod (labels model_name, engine): the first matching sample is the one.
  const re = new RegExp(`^${name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}(?:\\{[^}]*\\})? (\\S+)`, "m");
  const m = re.exec(text);
  return m ? Number(m[1]) : 0;
}

async function scrapeCounters(agent: http.Agent, addresses: readonly string[]): Promise<PodCounters> {
  const total: PodCounters = { queries: 0, hits: 0, ttftSum: 0, ttftCount: 0, preemptions: 0 };
  await Promise.all(
    addresses.map(async (a) => {
      const { status, body } = await getJson<string>(agent, `http://${a}/metrics`);
      if (status !== 200 || typeof body !== "string") throw new Error(`GET http://${a}/metrics answered ${status}`);
      total.queries += counter(body, "vllm:prefix_cache_queries_total");
      total.hits += counter(body, "vllm:prefix_cache_hits_total");
      total.ttftSum += counter(body, "vllm:time_to_first_token_seconds_sum");
      total.ttftCount += counter(body, "vllm:time_to_first_token_seconds_count");
      total.preemptions += counter(body, "vllm:num_preemptions_total");
    }),
  );
  return total;
}

/** CPU seconds used so far by the assembly's processes (every thread) and this one. */
function cpuSeconds(pids: readonly (number | undefined)[]): number {
  const self = process.cpuUsage();
  let us = self.user + self.system;
  for (const p of pids) {
    if (p === undefined) continue;
    try {
      us += processCpuUs(p);
    } catch {
      return Number.NaN;
    }
  }
  return us / 1e6;
}

// ---------------------------------------------------------------------------------------------
// Driving the workload

interface RequestRecord {
  scheduledMs: number;
  lagMs: number;
  late: boolean;
  outcome: ChatOutcome;
}

interface DriveResult {
  records: RequestRecord[];
  skipped: number;
  counters: { warm: PodCounters; end: PodCounters };
  util: { running: number; waiting: number; busy: number; samples: number };
  cpuUtil: number | null;
  machineCpuUtil: number | null;
}

async function drive(
  asm: Assembly,
  workload: SharedPrefixWorkload,
  o: { durationMs: number; warmupMs: number; drainTimeoutMs: number; label: string },
): Promise<DriveResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY });
  const probe = new http.Agent({ keepAlive: true, maxSockets: 16 });
  const addresses = asm.pods.map((p) => p.address);
  // Per conversation, turns run one after another: `tail` is the previous turn's completion.
  const conversations = workload.conversations.map(() => ({ history: [] as ChatMessage[], tail: Promise.resolve(), busy: 0, broken: false }));
  const records: RequestRecord[] = [];
  const outstanding = new Set<Promise<void>>();
  let skipped = 0;
  let sent = 0;
  let completed = 0;
  let failed = 0;
  let firstError: string | undefined;

  const send = (turn: SharedPrefixWorkload["schedule"][number], t0: number): Promise<void> => {
    const conv = conversations[turn.conversation] as (typeof conversations)[number];
    // The previous answer is not back yet: a chat client cannot send before it has it.
    const late = conv.busy > 0;
    conv.busy++;
    const run = conv.tail.then(async () => {
      if (conv.broken) {
        skipped++;
        return;
      }
      const c = workload.conversations[turn.conversation] as SharedPrefixWorkload["conversations"][number];
      if (conv.history.length === 0) conv.history.push({ role: "system", content: workload.systemPrompts[c.systemPrompt] as string });
      conv.history.push({ role: "user", content: turn.userText });
      const body = JSON.stringify({
        model: MODEL,
        messages: conv.history,
        max_tokens: turn.maxTokens,
        stream: true,
        stream_options: { include_usage: true },
      });
      const lagMs = performance.now() - t0 - turn.atMs;
      sent++;
      const outcome = await streamChat(agent, asm.frontPort, body, o.drainTimeoutMs + 30_000);
      if (outcome.ok) {
        conv.history.push({ role: "assistant", content: outcome.text });
        completed++;
      } else {
        conv.broken = true;
        failed++;
        firstError ??= outcome.error;
      }
      records.push({ scheduledMs: turn.atMs, lagMs, late, outcome });
    });
    conv.tail = run.finally(() => {
      conv.busy--;
    });
    return conv.tail;
  };

  const t0 = performance.now();
  let warm: PodCounters | undefined;
  let cpuWarm: number | undefined;
  let machineWarm: HostCpu | undefined;
  const runningSamples: number[] = [];
  const waitingSamples: number[] = [];
  const warmTimer = setTimeout(() => {
    cpuWarm = cpuSeconds(asm.pids());
    machineWarm = hostCpu();
    scrapeCounters(probe, addresses).then(
      (c) => {
        warm = c;
      },
      (err: unknown) => progress(`${o.label}: warm-up metrics scrape failed: ${(err as Error).message}`),
    );
  }, o.warmupMs);
  let sampling = false;
  const sampler = setInterval(() => {
    const now = performance.now() - t0;
    if (now < o.warmupMs || now > o.durationMs || sampling) return;
    sampling = true;
    Promise.all(addresses.map((a) => getJson<{ running: number; waiting: number }>(probe, `http://${a}/debug/state`)))
      .then((states) => {
        for (const s of states) {
          runningSamples.push(s.body?.running ?? 0);
          waitingSamples.push(s.body?.waiting ?? 0);
        }
      })
      .catch(() => {})
      .finally(() => {
        sampling = false;
      });
  }, 250);
  const ticker = setInterval(() => {
    const s = Math.round((performance.now() - t0) / 1000);
    progress(`${o.label}: t=${s}s sent=${sent} done=${completed} in-flight=${sent - completed - failed} errors=${failed}`);
  }, 5_000);

  let cpuEnd: number | undefined;
  try {
    for (const turn of workload.schedule) {
      const wait = t0 + turn.atMs - performance.now();
      if (wait > 0) await sleep(wait);
      const p = send(turn, t0);
      outstanding.add(p);
      void p.finally(() => outstanding.delete(p));
    }
    const rest = t0 + o.durationMs - performance.now();
    if (rest > 0) await sleep(rest);
    cpuEnd = cpuSeconds(asm.pids());
    const machineEnd = hostCpu();
    const cpuWall = (performance.now() - t0 - o.warmupMs) / 1000;
    // Late turns of conversations may still be queued behind earlier ones; each resolves (the
    // client's own timeout bounds every request).
    const drained = Promise.all([...outstanding]);
    const timedOut = await Promise.race([drained.then(() => false), sleep(o.drainTimeoutMs + 35_000).then(() => true)]);
    if (timedOut) progress(`${o.label}: requests still in flight after the drain timeout`);
    clearInterval(sampler);
    // Counters after the last request finished: every measured admission is in them.
    const end = await scrapeCounters(probe, addresses);
    if (!warm) warm = { queries: 0, hits: 0, ttftSum: 0, ttftCount: 0, preemptions: 0 };
    if (firstError) progress(`${o.label}: first error: ${firstError}`);
    const mean = (xs: number[]) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);
    const cores = os.availableParallelism();
    const cpuUtil = cpuWarm !== undefined && Number.isFinite(cpuEnd) && Number.isFinite(cpuWarm) ? (cpuEnd - cpuWarm) / (cpuWall * cores) : null;
    return {
      records,
      skipped,
      counters: { warm, end },
      util: { running: mean(runningSamples), waiting: mean(waitingSamples), busy: mean(runningSamples.map((r) => (r > 0 ? 1 : 0))), samples: runningSamples.length },
      cpuUtil,
      machineCpuUtil: machineWarm && machineEnd && machineEnd.total > machineWarm.total ? (machineEnd.busy - machineWarm.busy) / (machineEnd.total - machineWarm.total) : null,
    };
  } finally {
    clearTimeout(warmTimer);
    clearInterval(sampler);
    clearInterval(ticker);
    agent.destroy();
    probe.destroy();
  }
}

async function runCase(
  name: PrefixQualityCaseName,
  spec: CaseSpec,
  workload: SharedPrefixWorkload,
  engine: PrefixQualityEngineOptions,
  o: { durationMs: number; warmupMs: number; drainTimeoutMs: number; logDir: string; label: string },
): Promise<{ row: PrefixQualityRow }> {
  const asm = await startAssembly(spec, engine, o.logDir, o.label.replace(/[^a-z0-9-]+/gi, "_"));
  let d: DriveResult;
  try {
    d = await drive(asm, workload, o);
  } finally {
    await asm.stop();
  }
  const measured = d.records.filter((r) => r.scheduledMs >= o.warmupMs);
  const ttfts = measured.filter((r) => r.outcome.ok).map((r) => r.outcome.ttftMs as number).sort((a, b) => a - b);
  const errors = measured.filter((r) => !r.outcome.ok);
  // A late turn waited for its previous answer on purpose: only on-time sends say whether the client kept up.
  const lags = measured.filter((r) => !r.late).map((r) => r.lagMs).sort((a, b) => a - b);
  const { warm, end } = d.counters;
  const queries = end.queries - warm.queries;
  const hits = end.hits - warm.hits;
  const engineTtftMs = end.ttftCount > warm.ttftCount ? ((end.ttftSum - warm.ttftSum) / (end.ttftCount - warm.ttftCount) / engine.timeScale) * 1000 : Number.NaN;
  const row: PrefixQualityRow = {
    case: name,
    strategy: spec.strategy,
    tokenizer: spec.tokenizer,
    gateways: spec.gateways,
    kv_events: spec.kvEvents,
    hit_rate: round(queries > 0 ? hits / queries : 0, 4),
    ttft_p50_ms: round(percentile(ttfts, 0.5), 1),
    ttft_p99_ms: round(percentile(ttfts, 0.99), 1),
    requests: measured.length,
    errors: errors.length,
    ttft_mean_ms: round(ttfts.reduce((a, b) => a + b, 0) / Math.max(1, ttfts.length), 1),
    busy: round(d.util.busy, 3),
    batch_util: round(d.util.running / engine.maxBatch, 3),
    waiting_mean: round(d.util.waiting, 2),
    engine_ttft_mean_ms: round(engineTtftMs, 1),
    preemptions: end.preemptions - warm.preemptions,
    late_turns: measured.filter((r) => r.late).length,
    skipped_turns: d.skipped,
    send_lag_p99_ms: round(percentile(lags, 0.99), 1),
    cpu_util: d.cpuUtil === null ? null : round(d.cpuUtil, 3),
    machine_cpu_util: d.machineCpuUtil === null ? null : round(d.machineCpuUtil, 3),
    ...(errors[0]?.outcome.error ? { first_error: errors[0].outcome.error } : {}),
  };
  progress(
    `${o.label}: hit rate ${row.hit_rate}, TTFT p50 ${row.ttft_p50_ms} ms p99 ${row.ttft_p99_ms} ms, ${row.requests} requests, ${row.errors} errors, busy ${row.busy}, batch util ${row.batch_util}, waiting ${row.waiting_mean}, late ${row.late_turns}, cpu ${row.cpu_util} (machine ${row.machine_cpu_util})`,
  );
  return { row };
}

// ---------------------------------------------------------------------------------------------
// Calibration

/** Mean prompt tokens per request of the schedule, answers counted at their max_tokens. */
function meanPromptTokens(w: SharedPrefixWorkload): number {
  const sysTokens = w.systemPrompts.map((s) => tokenizeChat([{ role: "system", content: s }], { addGenerationPrompt: false }).length);
  const userTokens = new Map<string, number>();
  const history = new Map<number, number>();
  let total = 0;
  for (const t of w.schedule) {
    const c = w.conversations[t.conversation] as SharedPrefixWorkload["conversations"][number];
    const before = history.get(c.id) ?? (sysTokens[c.systemPrompt] as number);
    const u = userTokens.get(t.userText) ?? tokenizeChat([{ role: "user", content: t.userText }], { addGenerationPrompt: true }).length;
    total += before + u;
    // Template headers around the answer: a handful of tokens.
    history.set(c.id, before + u + t.maxTokens + 5);
  }
  return total / Math.max(1, w.schedule.length);
}

/**
 * The simulator's timing model, with no cache hits: a request costs the engine its prompt in
 * prefill steps (P x prefillMsPerToken) and its answer in decode steps (M x decodeMsPerStep; in a
 * prefill-bound engine the batch is small, so decode steps are hardly shared). An engine busy a
 * fraction `target` of the time then takes target / (engine ms per request) requests per simulated
 * ms; times pods, times timeScale for wall time.
 */
function modelRate(w: SharedPrefixWorkload, e: PrefixQualityEngineOptions, target: number): number {
  const p = meanPromptTokens(w);
  const m = (w.options.maxTokens[0] + w.options.maxTokens[1]) / 2;
  const engineMsPerRequest = p * e.prefillMsPerToken + m * e.decodeMsPerStep;
  return (target * e.pods * 1000 * e.timeScale) / engineMsPerRequest;
}

// ---------------------------------------------------------------------------------------------

export async function runPrefixQualityBench(opts: PrefixQualityBenchOptions = {}): Promise<PrefixQualityResult> {
  const engine: PrefixQualityEngineOptions = { ...PREFIX_QUALITY_ENGINE_DEFAULTS, ...opts.engine };
  const wl = { ...SHARED_PREFIX_DEFAULTS, ...opts.workload };
  const cases = opts.cases ?? (Object.keys(PREFIX_QUALITY_CASES) as PrefixQualityCaseName[]);
  const durationMs = opts.durationMs ?? 36_000;
  const warmupMs = opts.warmupMs ?? 10_000;
  const drainTimeoutMs = opts.drainTimeoutMs ?? 20_000;
  const targetUtil = opts.targetUtil ?? 0.8;
  const calibrationMs = opts.calibrationMs ?? 18_000;
  const calibrationWarmupMs = opts.calibrationWarmupMs ?? 8_000;
  const calibrationRuns = opts.calibrationRuns ?? 3;
  const logDir = opts.logDir ?? mkdtempSync(path.join(os.tmpdir(), "jetroute-prefix-quality-"));
  mkdirSync(logDir, { recursive: true });
  const workloadFor = (rate: number, ms: number) => buildSharedPrefixWorkload({ ...wl, rate, durationMs: ms });
  progress(`engine: ${JSON.stringify(engine)}; logs in ${logDir}`);

  try {
    const points: PrefixQualityResult["calibration"]["points"] = [];
    let rate = opts.rate;
    let guess: number | null = null;
    if (rate === undefined) {
      guess = modelRate(workloadFor(10, calibrationMs), engine, targetUtil);
      progress(`calibration: timing-model guess ${guess.toFixed(2)} req/s for engines busy ${targetUtil} of the time (no cache hits assumed)`);
      let r = guess;
      for (let i = 0; i < calibrationRuns; i++) {
        const m = await runCase("least-request", PREFIX_QUALITY_CASES["least-request"], workloadFor(r, calibrationMs), engine, {
          durationMs: calibrationMs,
          warmupMs: calibrationWarmupMs,
          drainTimeoutMs,
          logDir,
          label: `calibration ${i + 1} @ ${r.toFixed(2)} req/s`,
        });
        points.push({ rate_rps: round(r, 3), busy: m.row.busy, batch_util: m.row.batch_util, ttft_p50_ms: m.row.ttft_p50_ms });
        if (Math.abs(m.row.busy - targetUtil) <= 0.03) break;
        // Interpolate between the closest measurements on either side once there are some; else
        // scale proportionally (utilisation ~ rate x time in the batch), at most 2x per step.
        const below = points.filter((p) => p.busy < targetUtil).sort((a, b) => b.busy - a.busy)[0];
        const above = points.filter((p) => p.busy > targetUtil).sort((a, b) => a.busy - b.busy)[0];
        if (below && above && above.busy > below.busy) {
          r = below.rate_rps + ((targetUtil - below.busy) / (above.busy - below.busy)) * (above.rate_rps - below.rate_rps);
        } else {
          r *= Math.min(2, Math.max(0.5, targetUtil / Math.max(0.01, m.row.busy)));
        }
      }
      const last = points.at(-1);
      rate = last && Math.abs(last.busy - targetUtil) <= 0.03 ? last.rate_rps : r;
      progress(`calibration: ${rate.toFixed(2)} req/s`);
    }

    const workload = workloadFor(rate, durationMs);
    progress(
      `workload: ${workload.schedule.length} requests over ${durationMs} ms (${warmupMs} ms warm-up), ${workload.conversations.length} conversations, ` +
        `${workload.systemPrompts.length} system prompts, mean prompt ~${Math.round(meanPromptTokens(workload))} tokens`,
    );
    const rows: PrefixQualityRow[] = [];
    for (const name of cases) {
      const m = await runCase(name, PREFIX_QUALITY_CASES[name], workload, engine, { durationMs, warmupMs, drainTimeoutMs, logDir, label: name });
      rows.push(m.row);
    }

    const byCase = (n: PrefixQualityCaseName) => rows.find((r) => r.case === n);
    const random = byCase("random");
    const precise = byCase("prefix-precise");
    const precise4 = byCase("prefix-precise-4gw");
    const ttftRatio = random && precise && precise.ttft_p50_ms > 0 ? round(random.ttft_p50_ms / precise.ttft_p50_ms, 2) : null;
    const hitRatio = precise && precise4 && precise.hit_rate > 0 ? round(precise4.hit_rate / precise.hit_rate, 4) : null;
    return {
      bench: "prefix-quality",
      results: rows,
      precise_vs_random_ttft_p50: ttftRatio,
      hit_rate_4gw_over_1gw: hitRatio,
      targets: {
        precise_ttft_p50_5x_better_than_random: ttftRatio === null ? null : ttftRatio >= 5,
        four_gw_hit_rate_at_least_095_of_one: hitRatio === null ? null : hitRatio >= 0.95,
      },
      rate_rps: round(rate, 3),
      time_scale: engine.timeScale,
      calibration: {
        method:
          opts.rate !== undefined
            ? "rate given"
            : `least-request runs of ${calibrationMs} ms (${calibrationWarmupMs} ms warm-up) on fresh engines, starting at the timing-model guess, corrected until the engines are busy (running batch non-empty) ${targetUtil} of the time within 0.03 (at most ${calibrationRuns} runs, then interpolated)`,
        target_util: targetUtil,
        model_guess_rps: guess === null ? null : round(guess, 3),
        points,
      },
      engine,
      workload: {
        ...wl,
        duration_ms: durationMs,
        warmup_ms: warmupMs,
        requests_scheduled: workload.schedule.length,
        conversations: workload.conversations.length,
        mean_prompt_tokens: Math.round(meanPromptTokens(workload)),
      },
      note: `TTFT is wall time at the client through the front; simulated engines run ${engine.timeScale}x faster than wall time, so 1 wall ms = ${engine.timeScale} simulated ms.`,
    };
  } finally {
    if (!opts.logDir) rmSync(logDir, { recursive: true, force: true });
  }
}
