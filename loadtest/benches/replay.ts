/**
 * `npm run bench -- replay`: how fast `jetroute replay` re-decides a recorded window, and how much
 * of it it reproduces. The issue's target is >= 20,000 decisions/s with 4 counterfactual
 * strategies (an hour at 1,000 req/s analysed in 3 minutes) in bounded memory (streaming).
 *
 * Record: a fresh nats-server with the streams, `pods` pods of one model on PODS (never contacted),
 * R gateway processes (`--consistency eventual`), one closed-loop ext_proc load generator per
 * replica (loadtest/extproc-load.ts, all at once; it plays Envoy's response phases itself, so no
 * upstream is needed). The generator sends one static header set per process, so the recorded
 * strategy varies per generator (`routing-strategy`, round-robin over `recorded`), not per request.
 * The bench waits until every replica is idle and DECISIONS stops growing, then stops the replicas.
 *
 * Measure: the window is exported to a gzip file (`writeExport` over `natsSource`) so that the
 * headline times replay, not NATS delivery. Three replays follow: `runReplay` over the file
 * (untimed: a cross-check of the hand-built loop below, and the JIT warm-up), then timed
 * replays from NATS and from the file. The timed loop is `runReplay`'s own (a `ReplayEngine` fed
 * the source's messages, progress off) so it can sample `engine.buffered` and the process's RSS
 * and heap while it runs. decisions/s = decisions evaluated / wall seconds of the whole replay,
 * reading and gunzip included.
 *
 * Fixed and per-decision costs (so that a small window's figure can be read): the timed loop notes
 * (decisions evaluated, seconds) after every batch; `per_decision_us` is the slope over the second
 * half of the decisions (past the warm-up), `fixed_ms` what the replay took beyond its decisions
 * at that cost (file open, warm-up, the report). A window of N decisions then takes about
 * fixed_ms + N x per_decision_us. `first_replay_seconds` times the first replay of the process
 * (the untimed cross-check, JIT cold, modules already loaded) and `cold_fixed_ms` is its excess over
 * the same per-decision cost: what a fresh `jetroute replay` pays once on top of its decisions.
 *
 * Reading the figures: no engine publishes KV events here, so prefix hit rates are 0 by
 * construction (the decision records still carry their block hashes, so the prefix work is done).
 * The engine keeps the last `reorderMs` (60 s) of stream time buffered for gateways it has not
 * seen yet, so for a window shorter than that `max_buffered` is about every state message of it;
 * it is bounded by 60 s of traffic, not by the window.
 */
import { copyFileSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { runReplay } from "../../services/replay/command.js";
import { ReplayEngine } from "../../services/replay/engine.js";
import type { ReplayReport } from "../../services/replay/report-types.js";
import { EXPORT_FORMAT, EXPORT_VERSION, type ExportHeader, fileSource, type MessageSource, natsSource, writeExport } from "../../services/replay/sources.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../../services/shared/nats-server.js";
import { acked } from "../../services/shared/publish.js";
import { applyStreams } from "../../streams/apply.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { type Child, generatorScript, runNode } from "../child.js";
import type { ExtProcLoadResult } from "../extproc-load.js";
import { pollAll, processReplica, READY_TIMEOUT_MS, type Replica } from "../replicas.js";
import { settledMessageCount } from "../streams-read.js";

export const DEFAULT_REPLAY_STRATEGIES = ["least-request", "random", "power-of-two", "prefix-cache"] as const;
export const DEFAULT_RECORDED_STRATEGIES = ["least-request", "power-of-two", "random"] as const;

export interface ReplayBenchOptions {
  /** Recording length (default 10 s). */
  durationMs?: number;
  /** Streams in flight per generator (default 16). */
  concurrency?: number;
  /** Gateway replicas, one generator each (default 3). */
  replicas?: number;
  /** Counterfactual strategies of the replay (default the four of DEFAULT_REPLAY_STRATEGIES). */
  strategies?: readonly string[];
  /** Strategies the generators ask for (`routing-strategy`), one per generator, round-robin. */
  recorded?: readonly string[];
  /** Pods of the one model (default 8). */
  pods?: number;
  /** Heartbeat interval of the replicas (default 500 ms). */
  heartbeatMs?: number;
  /** Keep the export file here instead of deleting it (for profiling a replay of it). */
  keepExport?: string;
  /** How long the decision records may take to reach DECISIONS after the load (default 30 s). */
  drainTimeoutMs?: number;
}

export interface ReplayBenchResult {
  bench: "replay";
  decisions: number;
  decisions_per_s: number;
  strategies: number;
  fidelity: number;
  from_nats_decisions_per_s: number;
  messages: number;
  messages_per_s: number;
  peak_rss_mb: number;
  peak_heap_mb: number;
  max_buffered: number;
  residuals: Record<string, number>;
  record_seconds: number;
  file_bytes: number;
  replay_seconds: number;
  from_nats_seconds: number;
  export_seconds: number;
  rss_before_mb: number;
  heap_before_mb: number;
  max_waiting: number;
  /** The timed replay's cost beyond its decisions (ms): replay_seconds - decisions x per_decision_us. */
  fixed_ms: number;
  /** CPU-bound cost of one more decision (µs): the slope of the timed replay's second half. */
  per_decision_us: number;
  /** The first replay of the process (runReplay over the file: JIT still cold; module loading not included). */
  first_replay_seconds: number;
  /** That first replay's cost beyond its decisions at per_decision_us (ms): what a fresh `jetroute replay` pays once. */
  cold_fixed_ms: number;
  skipped: Record<string, number>;
  matches_run_replay: boolean;
  from_nats_matches: boolean;
  counterfactuals: Array<{ name: string; decisions: number; hitRate: number; meanSpread: number }>;
  streams: Record<string, number>;
  recorded: {
    replicas: number;
    concurrency: number;
    pods: number;
    strategies: string[];
    strategy_header: "per generator";
    x_request_id: false;
    decisions_in_stream: number;
    generator_completed: number;
    generator_immediate: number;
    generator_errors: number;
    rps: number;
  };
  export?: string;
}

const MODEL = "bench/replay-model";
const PREFIX = "jr";

const round = (x: number, digits = 0) => {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
};
const mb = (bytes: number) => round(bytes / 2 ** 20, 1);


interface Recording {
  fromMs: number;
  toMs: number;
  seconds: number;
  results: ExtProcLoadResult[];
  decisionsInStream: number;
}

async function record(h: NatsHandles, replicas: Replica[], o: Required<Omit<ReplayBenchOptions, "keepExport">>): Promise<Recording> {
  const script = generatorScript();
  const fromMs = Date.now();
  const t0 = performance.now();
  const gens: Child[] = replicas.map((r, i) => {
    const strategy = o.recorded[i % o.recorded.length];
    return runNode(script, [
      "--target", `127.0.0.1:${r.port}`, "--concurrency", String(o.concurrency), "--duration-ms", String(o.durationMs), "--warmup-ms", "0", "--model", MODEL,
      ...(strategy ? ["--header", `routing-strategy:${strategy}`] : []),
    ]);
  });
  let results: ExtProcLoadResult[];
  try {
    results = (await Promise.all(gens.map((g) => g.firstJson))) as unknown as ExtProcLoadResult[];
  } finally {
    await Promise.all(gens.map((g) => g.stop()));
  }
  const toMs = Date.now();
  const seconds = (performance.now() - t0) / 1000;
  const completed = results.reduce((a, r) => a + r.completed, 0);
  const bad = results.find((r) => r.completed === 0 || r.immediate > 0);
  if (bad) throw new Error(`a generator got ${bad.completed} completions, ${bad.immediate} immediate responses, ${bad.errors} errors (first: ${bad.firstError ?? "-"}): not a routing run`);
  console.error(`recorded ${completed} requests in ${seconds.toFixed(1)} s (${results.map((r) => `${r.rps.toFixed(0)} rps`).join(", ")}); waiting for the decision records`);

  // Every request has ended at every replica, then DECISIONS stops growing: every record is in.
  await pollAll(replicas, (s) => s.inFlight === 0, o.drainTimeoutMs, "replicas to finish every request");
  // Streams cancelled at the end of a generator's window were routed too: the stream holds at least `completed`.
  const { count: last, settled } = await settledMessageCount(h.jsm, streamName(PREFIX, "DECISIONS"), completed, o.drainTimeoutMs);
  if (!settled) throw new Error(`DECISIONS holds ${last} records after ${o.drainTimeoutMs} ms; the generators completed ${completed} requests`);
  console.error(`DECISIONS holds ${last} records (generators completed ${completed}; the rest were cancelled at the end of the window)`);
  return { fromMs, toMs, seconds, results, decisionsInStream: last };
}

interface TimedReplay {
  report: ReplayReport;
  seconds: number;
  messages: number;
  rssBefore: number;
  heapBefore: number;
  peakRss: number;
  peakHeap: number;
  maxBuffered: number;
  maxWaiting: number;
  /** Decisions evaluated and seconds elapsed after each batch. */
  marks: Array<[number, number]>;
}

/**
 * The per-decision cost as the slope over the second half of a replay's decisions (past warm-up),
 * and the fixed cost as what the whole replay took beyond that many decisions at that cost.
 */
export function splitCost(marks: ReadonlyArray<readonly [number, number]>, decisions: number, seconds: number): { perDecisionUs: number; fixedMs: number } {
  const half = marks.find(([n]) => n >= decisions / 2);
  const last = marks[marks.length - 1];
  if (!half || !last || last[0] <= half[0]) return { perDecisionUs: decisions > 0 ? (seconds * 1e6) / decisions : 0, fixedMs: 0 };
  const perDecisionUs = ((seconds - half[1]) * 1e6) / (decisions - half[0]);
  return { perDecisionUs, fixedMs: seconds * 1e3 - (decisions * perDecisionUs) / 1e3 };
}

/**
 * `runReplay` without the shell (same engine options, progress off), with memory and the engine's
 * buffers sampled: on a 20 ms timer and every 8192 messages (the loop may starve the timer).
 */
async function timedReplay(open: () => Promise<MessageSource>, fromMs: number, toMs: number, strategies: readonly string[]): Promise<TimedReplay> {
  (globalThis as { gc?: () => void }).gc?.();
  const before = process.memoryUsage();
  let peakRss = before.rss;
  let peakHeap = before.heapUsed;
  let maxBuffered = 0;
  let maxWaiting = 0;
  const sample = () => {
    const m = process.memoryUsage();
    if (m.rss > peakRss) peakRss = m.rss;
    if (m.heapUsed > peakHeap) peakHeap = m.heapUsed;
  };
  const timer = setInterval(sample, 20);
  const t0 = performance.now();
  try {
    const source = await open();
    const engine = new ReplayEngine({ fromMs, toMs, strategies, state: { prefixIndex: { maxEntries: 4_000_000 } }, source: source.describe, traceLimit: 0 });
    let n = 0;
    const marks: Array<[number, number]> = [];
    for await (const batch of source.batches) {
      for (const m of batch) engine.offer(m);
      marks.push([engine.evaluated, (performance.now() - t0) / 1000]);
      const before = n;
      n += batch.length;
      if (n >> 10 !== before >> 10) {
        const b = engine.buffered;
        if (b > maxBuffered) maxBuffered = b;
        const w = engine.waiting;
        if (w > maxWaiting) maxWaiting = w;
        if (n >> 13 !== before >> 13) sample();
      }
    }
    const report = engine.finish(new Date().toISOString());
    const seconds = (performance.now() - t0) / 1000;
    sample();
    return { report, seconds, messages: n, rssBefore: before.rss, heapBefore: before.heapUsed, peakRss, peakHeap, maxBuffered, maxWaiting, marks };
  } finally {
    clearInterval(timer);
  }
}

/** What two replays of the same window must agree on. */
const essence = (r: ReplayReport) => JSON.stringify({ decisions: r.decisions, fidelity: r.fidelity, strategies: r.strategies, agreement: r.agreement });

export async function runReplayBench(opts: ReplayBenchOptions = {}): Promise<ReplayBenchResult> {
  const o = {
    durationMs: opts.durationMs ?? 10_000,
    concurrency: opts.concurrency ?? 16,
    replicas: opts.replicas ?? 3,
    strategies: opts.strategies ?? DEFAULT_REPLAY_STRATEGIES,
    recorded: opts.recorded ?? DEFAULT_RECORDED_STRATEGIES,
    pods: opts.pods ?? 8,
    heartbeatMs: opts.heartbeatMs ?? 500,
    drainTimeoutMs: opts.drainTimeoutMs ?? 30_000,
  };
  let nats: NatsServerHandle | undefined;
  let h: NatsHandles | undefined;
  const replicas: Replica[] = [];
  const dir = mkdtempSync(path.join(tmpdir(), "jr-bench-replay-"));
  const file = path.join(dir, "window.jsonl.gz");
  try {
    nats = await startNatsServer();
    h = await connectNats(nats.url, "bench-replay");
    await applyStreams(h.nc, h.jsm);
    const s = new Subjects(PREFIX);
    for (let i = 0; i < o.pods; i++) {
      const pod = `pod-${i}`;
      await acked(h.js, s.pod(MODEL, pod), { type: "pod", action: "upsert", model: MODEL, pod, address: `127.0.0.1:${19000 + i}`, ready: true, engine: "vllm", ts: Date.now() });
    }
    const natsUrl = nats.url;
    const started = await Promise.allSettled(Array.from({ length: o.replicas }, (_, i) => processReplica(`rp-${i}`, natsUrl, "eventual", o.heartbeatMs)));
    for (const r of started) if (r.status === "fulfilled") replicas.push(r.value);
    const failed = started.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
    await pollAll(replicas, (st) => st.ready && st.pods === o.pods, READY_TIMEOUT_MS, "replicas ready with every pod");
    await pollAll(replicas, (st) => st.gateways === o.replicas, READY_TIMEOUT_MS, "replicas to see each other's heartbeats");
    console.error(`${o.replicas} replicas ready over ${o.pods} pods; recording ${o.durationMs} ms at ${o.concurrency} streams per generator (recorded strategies per generator: ${o.recorded.join(", ")})`);

    const rec = await record(h, replicas, o);
    // The replicas are done with the window; their heartbeats would only compete for the cores.
    await Promise.allSettled(replicas.splice(0).map((r) => r.stop()));

    const tailMs = Date.now() - rec.toMs + 1_000;
    const window = { fromMs: rec.fromMs, toMs: rec.toMs, tailMs };
    const header: ExportHeader = { format: EXPORT_FORMAT, version: EXPORT_VERSION, prefix: PREFIX, window: { fromMs: rec.fromMs, toMs: rec.toMs }, createdAt: new Date().toISOString() };
    const tx = performance.now();
    const counts = (await writeExport(file, header, (await natsSource(h, PREFIX, window)).batches)) ?? {};
    const exportSeconds = (performance.now() - tx) / 1000;
    const fileBytes = statSync(file).size;
    const streams = Object.fromEntries(Object.entries(counts).map(([k, v]) => [k, v?.count ?? 0]));
    console.error(`exported ${Object.values(streams).reduce((a, b) => a + b, 0)} messages (${JSON.stringify(streams)}) to ${(fileBytes / 2 ** 20).toFixed(1)} MiB in ${exportSeconds.toFixed(1)} s`);

    const handles = h;
    const tFirst = performance.now();
    const ref = await runReplay({ source: await fileSource(file), fromMs: rec.fromMs, toMs: rec.toMs, strategies: [...o.strategies], progress: false });
    const firstSeconds = (performance.now() - tFirst) / 1000;
    const fromNats = await timedReplay(() => natsSource(handles, PREFIX, window), rec.fromMs, rec.toMs, o.strategies);
    console.error(`replay from NATS: ${fromNats.report.decisions.evaluated} decisions in ${fromNats.seconds.toFixed(2)} s (${(fromNats.report.decisions.evaluated / fromNats.seconds).toFixed(0)}/s)`);
    const fromFile = await timedReplay(() => fileSource(file), rec.fromMs, rec.toMs, o.strategies);
    const r = fromFile.report;
    const dps = r.decisions.evaluated / fromFile.seconds;
    const split = splitCost(fromFile.marks, r.decisions.evaluated, fromFile.seconds);
    const coldFixedMs = firstSeconds * 1e3 - (ref.decisions.evaluated * split.perDecisionUs) / 1e3;
    console.error(
      `replay from the file: ${r.decisions.evaluated} decisions, ${fromFile.messages} messages in ${fromFile.seconds.toFixed(2)} s (${dps.toFixed(0)} decisions/s); fidelity ${r.fidelity.reproduced}/${r.fidelity.evaluated}; peak RSS ${mb(fromFile.peakRss)} MiB, at most ${fromFile.maxBuffered} messages buffered`,
    );
    let kept: string | undefined;
    if (opts.keepExport) {
      kept = path.resolve(opts.keepExport);
      copyFileSync(file, kept);
    }
    const completed = rec.results.reduce((a, x) => a + x.completed, 0);
    return {
      bench: "replay",
      decisions: r.decisions.evaluated,
      decisions_per_s: round(dps),
      strategies: o.strategies.length,
      fidelity: round(r.fidelity.ratio, 6),
      from_nats_decisions_per_s: round(fromNats.report.decisions.evaluated / fromNats.seconds),
      messages: fromFile.messages,
      messages_per_s: round(fromFile.messages / fromFile.seconds),
      peak_rss_mb: mb(fromFile.peakRss),
      peak_heap_mb: mb(fromFile.peakHeap),
      max_buffered: fromFile.maxBuffered,
      residuals: r.fidelity.residuals,
      record_seconds: round(rec.seconds, 2),
      file_bytes: fileBytes,
      replay_seconds: round(fromFile.seconds, 3),
      from_nats_seconds: round(fromNats.seconds, 3),
      export_seconds: round(exportSeconds, 3),
      rss_before_mb: mb(fromFile.rssBefore),
      heap_before_mb: mb(fromFile.heapBefore),
      max_waiting: fromFile.maxWaiting,
      fixed_ms: round(split.fixedMs, 1),
      per_decision_us: round(split.perDecisionUs, 2),
      first_replay_seconds: round(firstSeconds, 3),
      cold_fixed_ms: round(coldFixedMs, 1),
      skipped: r.decisions.skipped,
      matches_run_replay: essence(ref) === essence(r),
      from_nats_matches: essence(fromNats.report) === essence(r),
      counterfactuals: r.strategies.map((x) => ({ name: x.name, decisions: x.decisions, hitRate: round(x.hitRate, 4), meanSpread: round(x.meanSpread, 3) })),
      streams,
      recorded: {
        replicas: o.replicas,
        concurrency: o.concurrency,
        pods: o.pods,
        strategies: [...o.recorded],
        strategy_header: "per generator",
        x_request_id: false,
        decisions_in_stream: rec.decisionsInStream,
        generator_completed: completed,
        generator_immediate: rec.results.reduce((a, x) => a + x.immediate, 0),
        generator_errors: rec.results.reduce((a, x) => a + x.errors, 0),
        rps: round(rec.results.reduce((a, x) => a + x.rps, 0)),
      },
      ...(kept ? { export: kept } : {}),
    };
  } finally {
    await Promise.allSettled(replicas.map((r) => r.stop()));
    await h?.nc.close();
    await nats?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
