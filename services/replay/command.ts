/**
 * `jetroute replay` (offline routing analysis) and `jetroute export` (a window of the streams to a
 * file, for replay elsewhere). The work is in engine.ts (pure) and whatif.ts (pure); this shell
 * reads the source, draws a progress bar on stderr, writes the HTML report and prints the final
 * JSON line on stdout.
 */
import { existsSync, readFileSync } from "node:fs";
import { type Command, InvalidArgumentError } from "commander";
import type { DecisionRecord } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { SingleBar } from "cli-progress";
import { streamName } from "../../streams/definitions.js";
import { DEFAULT_POD_SOURCE_TIMEOUT_MS } from "../views/pod-set.js";
import { addNamespaceOptions, intOption, namespaceFlags } from "../shared/cli-options.js";
import { connectNats, type NatsHandles } from "../shared/nats.js";
import { parseStrategy } from "../routing/mod.js";
import { ReplayEngine } from "./engine.js";
import { writeReportHtml } from "./report-html.js";
import type { ReplayReport } from "./report-types.js";
import { EXPORT_FORMAT, EXPORT_VERSION, fileSource, type MessageSource, natsSource, writeExport } from "./sources.js";
import { simulateWhatIf, type TraceRequest } from "./whatif.js";
import { calibratedClasses } from "./calibration.js";
import { parseWindowBound, type WindowBound } from "./window.js";
// `--rules` and `--autoscale` load their modules when used: the semantic rules' compiler alone
// costs ~0.75 s and ~50 MB of heap to import, paid by every replay (and benchmark) before.
import type { readRulesFile, RulesReplayReport } from "./semantic-rules.js";
import type { loadPolicy } from "./autoscale-command.js";

/** Strategy specs for --strategies / --simulate: comma separated, or `;`/space separated when a combination has commas of its own. */
export function strategiesOption(v: string): string[] {
  // Specs are separated by spaces or `;` (a combination has commas of its own: "prefix-cache:2,least-request:1").
  const specs = v.includes(";") || v.includes(" ") ? v.split(/[;\s]+/).filter(Boolean) : v.split(",").filter(Boolean);
  for (const s of specs) {
    try {
      parseStrategy(s);
    } catch (err) {
      throw new InvalidArgumentError((err as Error).message);
    }
  }
  return specs;
}

async function resolveBound(b: WindowBound, nats: NatsHandles | undefined, prefix: string): Promise<number> {
  if (b.kind === "time") return b.ms;
  if (!nats) throw new Error("seq:<n> bounds need a NATS source (an export file is bounded by time)");
  const name = streamName(prefix, "DECISIONS");
  try {
    const m = await nats.jsm.streams.getMessage(name, { seq: b.seq });
    if (!m) throw new Error("no such message");
    return m.time.getTime();
  } catch (err) {
    throw new Error(`DECISIONS sequence ${b.seq} cannot be read from ${name}: ${(err as Error).message} (purged by retention?)`);
  }
}

function progressBar(label: string, total: number | undefined): { tick(n?: number): void; stop(): void } {
  const bar = new SingleBar({
    format: `${label} [{bar}] {percentage}% | {value}/{total} messages | {eta_formatted} left`,
    stream: process.stderr,
    hideCursor: true,
    noTTYOutput: true,
    notTTYSchedule: 5_000,
    etaBuffer: 200,
  });
  bar.start(Math.max(1, total ?? 1), 0);
  let n = 0;
  return {
    tick(k = 1) {
      const before = n;
      n += k;
      if (n >> 10 !== before >> 10) bar.update(n, total === undefined ? { total: n } : {});
    },
    stop() {
      bar.update(n);
      bar.stop();
    },
  };
}

/** The final JSON line: everything but the per-bucket timeline. */
export function summaryLine(r: ReplayReport, reportPath: string | undefined): Record<string, unknown> {
  return {
    replay: "done",
    window: { from: new Date(r.window.fromMs).toISOString(), to: new Date(r.window.toMs).toISOString() },
    decisions: r.decisions,
    events: r.events,
    fidelity: r.fidelity,
    strategies: r.strategies.map((s) => ({ name: s.name, decisions: s.decisions, hitRate: Number(s.hitRate.toFixed(4)), meanSpread: Number(s.meanSpread.toFixed(3)), maxSpread: Number(s.maxSpread.toFixed(3)), meanRegretBlocks: Number(s.meanRegretBlocks.toFixed(3)) })),
    agreement: r.agreement,
    topRegrets: r.topRegrets.slice(0, 5),
    ...(r.simulation ? { simulation: r.simulation.map((s) => ({ strategy: s.strategy, requests: s.requests, completed: s.completed, ttftP50Ms: s.ttft.p50Ms, ttftP99Ms: s.ttft.p99Ms, hitRate: Number(s.hitRate.toFixed(4)) })) } : {}),
    ...(r.prediction ? { prediction: { decisions: r.prediction.decisions, fromPrior: r.prediction.fromPrior, ttftMape: r.prediction.ttftMape, tpotMape: r.prediction.tpotMape } } : {}),
    ...(r.calibration ? { calibration: r.calibration } : {}),
    ...(r.flow ? { flow: r.flow.map((f) => ({ band: f.band, requests: f.requests, held: f.held, waitP50Ms: f.wait.p50Ms, waitP99Ms: f.wait.p99Ms })) } : {}),
    warnings: r.warnings,
    ...(reportPath ? { report: reportPath } : {}),
  };
}

export interface ReplayRunOptions {
  source: MessageSource;
  fromMs: number;
  toMs: number;
  strategies: string[];
  simulate?: string[];
  reorderMs?: number;
  prefixMaxEntries?: number;
  /** As the gateways ran (`--pod-source-timeout-ms`): pods of a source silent this long stop being candidates. Default 30 s; 0 = never. */
  podSourceTimeoutMs?: number;
  /** As the gateways ran (`--heartbeat-timeout-ms`): a peer silent this long loses its charges. Default: 3 x each gateway's heartbeat interval. */
  heartbeatTimeoutMs?: number;
  simulateMax?: number;
  progress?: boolean;
}

/** The simulated engines use one block size per model: keep each model's most common one. */
function oneBlockSizePerModel(trace: readonly TraceRequest[]): { trace: TraceRequest[]; dropped: number } {
  const counts = new Map<string, Map<number, number>>();
  for (const t of trace) {
    const m = counts.get(t.model) ?? new Map<number, number>();
    m.set(t.blockSize, (m.get(t.blockSize) ?? 0) + 1);
    counts.set(t.model, m);
  }
  const size = new Map([...counts].map(([model, m]) => [model, [...m].sort((a, b) => b[1] - a[1])[0]?.[0]]));
  const kept = trace.filter((t) => t.blockSize === size.get(t.model) && t.blockSize >= 5);
  return { trace: kept, dropped: trace.length - kept.length };
}

/** `replay --rules`: the window's decision records re-decided under other rules (semantic-rules.ts). */
export async function runRulesReplay(source: MessageSource, rules: ReturnType<typeof readRulesFile>, fromMs: number, toMs: number): Promise<RulesReplayReport> {
  const { RulesReplay } = await import("./semantic-rules.js");
  const replay = new RulesReplay(rules);
  for await (const batch of source.batches) {
    for (const m of batch) {
      if (m.stream !== "decisions" || m.invalid || !checkEvent("decision", m.data).ok) continue;
      const rec = m.data as DecisionRecord;
      if (rec.ts >= fromMs && rec.ts <= toMs) replay.offer(rec);
    }
  }
  return replay.finish();
}

/** Runs a replay over a source; returns the report. */
export async function runReplay(o: ReplayRunOptions): Promise<ReplayReport> {
  const engine = new ReplayEngine({
    fromMs: o.fromMs,
    toMs: o.toMs,
    strategies: o.strategies,
    ...(o.reorderMs !== undefined ? { reorderMs: o.reorderMs } : {}),
    state: { prefixIndex: { maxEntries: o.prefixMaxEntries ?? 4_000_000 }, podSourceTimeoutMs: o.podSourceTimeoutMs ?? DEFAULT_POD_SOURCE_TIMEOUT_MS, ...(o.heartbeatTimeoutMs !== undefined ? { heartbeatTimeoutMs: o.heartbeatTimeoutMs } : {}) },
    source: o.source.describe,
    traceLimit: o.simulate?.length ? (o.simulateMax ?? 200_000) : 0,
  });
  const bar = o.progress ? progressBar("replay", o.source.total) : undefined;
  for await (const batch of o.source.batches) {
    for (const m of batch) engine.offer(m);
    bar?.tick(batch.length);
  }
  bar?.stop();
  const report = engine.finish(new Date().toISOString());
  if (o.simulate?.length) simulateInto(report, engine, o.simulate);
  return report;
}

/**
 * `--simulate`: each strategy on a simulated fleet of the recorded size; calibrated (per pod class,
 * from the window's recorded outcomes, calibration.ts) when releases carried latency samples,
 * and then the most recorded strategy too, beside the recorded actuals.
 */
function simulateInto(report: ReplayReport, engine: ReplayEngine, strategies: readonly string[]): void {
  // The simulated pods get the recorded pods' KV cache size (their load samples report it), else the simulator's default.
  const kv = Math.max(0, ...Object.values(engine.kvCapacityTokens));
  const { trace, dropped } = oneBlockSizePerModel(engine.trace);
  if (dropped > 0) report.warnings.push(`what-if: ${dropped} requests hashed with another block size than the rest of their model's were left out`);
  const fits = engine.calibration.coefficients(report.window.toMs);
  const calibrated = fits.some((f) => f.samples > 0) ? calibratedClasses(fits, engine.fleetClasses) : undefined;
  const run = (strategy: string) =>
    simulateWhatIf(trace, { strategy, podsPerModel: engine.fleet, ...(kv > 0 ? { engine: { kvCapacityTokens: kv } } : {}), ...(calibrated ? { classes: calibrated.classes } : {}) });
  report.simulation = [];
  for (const strategy of strategies) {
    try {
      report.simulation.push(run(strategy));
    } catch (err) {
      report.warnings.push(`what-if under ${strategy} failed: ${(err as Error).message}`);
    }
  }
  if (!calibrated) {
    report.warnings.push("what-if: no release in the window carried a latency sample; the simulated engines use the simulator's defaults (uncalibrated)");
    return;
  }
  const recorded = [...engine.recordedStrategies].sort((a, b) => b[1] - a[1])[0]?.[0];
  if (recorded === undefined) return;
  try {
    const sim = report.simulation.find((x) => x.strategy === recorded) ?? run(recorded);
    const rec = report.recordedTtft.p50Ms;
    const simP50 = sim.ttft.p50Ms;
    report.calibration = { strategy: recorded, recordedTtftP50Ms: rec, simulatedTtftP50Ms: simP50, ttftP50Ratio: rec && simP50 !== null ? simP50 / rec : null, classes: calibrated.summary };
  } catch (err) {
    report.warnings.push(`calibrated what-if under the recorded ${recorded} failed: ${(err as Error).message}`);
  }
}

/** loadPolicy, or the refusal on stderr and exit 2 (as `config set-autoscale` refuses). */
async function policyOrExit(arg: string, bucket: Parameters<typeof loadPolicy>[1]): Promise<Awaited<ReturnType<typeof loadPolicy>>> {
  const { loadPolicy, PolicyInputError } = await import("./autoscale-command.js");
  try {
    return await loadPolicy(arg, bucket);
  } catch (err) {
    if (!(err instanceof PolicyInputError)) throw err;
    console.error(err.message);
    process.exit(2);
  }
}

/** `replay --autoscale`: the what-if as a table (or one JSON line with --json). */
async function autoscaleReplay(o: Record<string, unknown>, p: Awaited<ReturnType<typeof loadPolicy>>, source: MessageSource, fromMs: number, toMs: number): Promise<void> {
  const [{ PolicyInputError, runAutoscaleReplay }, { autoscaleTable }] = await Promise.all([import("./autoscale-command.js"), import("./autoscale-whatif.js")]);
  try {
    const report = await runAutoscaleReplay({
      source, fromMs, toMs, name: p.name, policy: p.policy,
      ...(o.autoscaleStrategy !== undefined ? { strategy: String(o.autoscaleStrategy) } : {}),
      ...(o.staticPods !== undefined ? { staticPods: Number(o.staticPods) } : {}),
      ...(o.initialPods !== undefined ? { initialPods: Number(o.initialPods) } : {}),
      startupMs: Number(o.startupMs), drain: o.drain !== false, ttftTargetMs: Number(o.ttftTargetMs),
      reorderMs: Number(o.reorderMs), podSourceTimeoutMs: Number(o.podSourceTimeoutMs), maxRequests: Number(o.simulateMax),
      ...(o.progress !== false ? { progress: progressBar } : {}),
    });
    const window = { from: new Date(fromMs).toISOString(), to: new Date(toMs).toISOString() };
    if (o.json) console.log(JSON.stringify({ autoscale: p.name, policyFrom: p.from, window, ...report }));
    else console.log(`window ${window.from} .. ${window.to}, policy from ${p.from}\n${autoscaleTable(report)}`);
  } catch (err) {
    if (!(err instanceof PolicyInputError || err instanceof RangeError)) throw err;
    console.error(err.message);
    process.exit(2);
  }
}

const POOL_HELP = "gateway pool: read this pool's namespace (<prefix>.pool.<name>); the config bucket stays the base prefix's";

export function registerReplayCommands(program: Command): void {
  addNamespaceOptions(
    program
      .command("replay")
      .description("re-decide a window of recorded requests on the views their gateways had: fidelity, counterfactual strategies, what-if simulation, HTML report"),
    { pool: POOL_HELP },
  )
    .option("--file <path>", "read an export written by `jetroute export` instead of NATS")
    .option("--from <when>", "window start: ISO time, epoch ms, now, -15m, or seq:<DECISIONS sequence>", "-15m")
    .option("--to <when>", "window end (same forms)", "now")
    .option("--strategies <specs>", "counterfactual strategies (comma separated; separate combinations with ';')", strategiesOption, ["least-request", "prefix-cache", "random"])
    .option("--simulate [specs]", "also re-send the recorded arrivals to a simulated fleet of the recorded size under these strategies (default: --strategies)")
    .option("--simulate-max <n>", "most requests kept for the simulation (each keeps its block hashes in memory)", intOption(1), 50_000)
    .option("--reorder-ms <ms>", "how long a decision may wait for an earlier one of its gateway (stream time)", intOption(0), 60_000)
    .option("--prefix-max-entries <n>", "prefix index bound, as the gateways ran", intOption(1), 4_000_000)
    .option("--pod-source-timeout-ms <ms>", "pods of a pod-watcher source silent this long stop being candidates, as the gateways ran (0 = never)", intOption(0), DEFAULT_POD_SOURCE_TIMEOUT_MS)
    .option("--heartbeat-timeout-ms <ms>", "a peer silent this long lost its charges, as the gateways ran (default: 3 x each gateway's heartbeat interval, their default)", intOption(10))
    .option("--report <path>", "where to write the HTML report", "replay-report.html")
    .option("--rules <file>", "instead: re-decide the window's virtual-model requests under this rule set (JSON: virtual model -> config with `semantic`) from their recorded signals, and count the requests that move")
    .option("--autoscale <policy>", "instead: re-run this autoscaling policy (a JSON file, else a policy name in the config bucket) over the window in virtual time, beside a static fleet of the recorded size")
    .option("--startup-ms <ms>", "with --autoscale: a new pod's creation to Ready (its model loading)", intOption(0), 30_000)
    .option("--ttft-target-ms <ms>", "with --autoscale: the TTFT target whose attainment is reported", intOption(1), 1_000)
    .option("--static-pods <n>", "with --autoscale: the static fleet's size (default: the recorded fleet's largest)", intOption(1))
    .option("--initial-pods <n>", "with --autoscale: the autoscaled fleet's size at the window start (default: the static size within the policy's bounds)", intOption(0))
    .option("--autoscale-strategy <spec>", "with --autoscale: routing strategy of the simulated fleets (default: the window's most recorded one)")
    .option("--no-drain", "with --autoscale: scale down as the plain scale subresource does (the newest pods leave at once, cutting their requests), not through the drain handshake")
    .option("--json", "with --autoscale: print the result as one JSON line instead of a table")
    .option("--no-progress", "no progress bar on stderr")
    .action(async (o) => {
      // Read (and checked) before anything is connected: a bad file fails at once, naming the field.
      const rules = o.rules ? (await import("./semantic-rules.js")).readRulesFile(JSON.parse(readFileSync(o.rules, "utf8"))) : undefined;
      if (o.autoscale !== undefined && o.autoscaleStrategy !== undefined) strategiesOption(o.autoscaleStrategy);
      let policy = o.autoscale !== undefined && existsSync(o.autoscale) ? await policyOrExit(o.autoscale, async () => undefined) : undefined;
      const { nats: urls, namespace: ns } = namespaceFlags(o);
      const now = Date.now();
      const from = parseWindowBound(o.from, now);
      const to = parseWindowBound(o.to, now);
      let nats: NatsHandles | undefined;
      try {
        let source: MessageSource;
        let fromMs: number;
        let toMs: number;
        if (o.file) {
          const f = await fileSource(o.file);
          // An export is bounded by its own window unless told otherwise.
          fromMs = o.from === "-15m" ? f.header.window.fromMs : await resolveBound(from, undefined, ns.prefix);
          toMs = o.to === "now" ? f.header.window.toMs : await resolveBound(to, undefined, ns.prefix);
          source = f;
        } else {
          nats = await connectNats(urls, "jetroute-replay");
          fromMs = await resolveBound(from, nats, ns.prefix);
          toMs = await resolveBound(to, nats, ns.prefix);
          if (toMs < fromMs) throw new Error(`--to (${new Date(toMs).toISOString()}) is before --from (${new Date(fromMs).toISOString()})`);
          source = await natsSource(nats, ns.prefix, { fromMs, toMs, tailMs: Math.max(o.reorderMs, 5_000), configPrefix: ns.configPrefix });
        }
        if (o.autoscale !== undefined) {
          if (!policy) {
            nats ??= await connectNats(urls, "jetroute-replay");
            policy = await policyOrExit(o.autoscale, (await import("./autoscale-command.js")).bucketOf(nats, ns.configPrefix));
          }
          await autoscaleReplay(o, policy, source, fromMs, toMs);
          return;
        }
        if (rules) {
          console.log(JSON.stringify({ rules: o.rules, window: { from: new Date(fromMs).toISOString(), to: new Date(toMs).toISOString() }, ...(await runRulesReplay(source, rules, fromMs, toMs)) }));
          return;
        }
        const simulate = o.simulate === undefined ? undefined : o.simulate === true ? o.strategies : strategiesOption(String(o.simulate));
        const report = await runReplay({ source, fromMs, toMs, strategies: o.strategies, simulate, reorderMs: o.reorderMs, prefixMaxEntries: o.prefixMaxEntries, podSourceTimeoutMs: o.podSourceTimeoutMs, ...(o.heartbeatTimeoutMs !== undefined ? { heartbeatTimeoutMs: o.heartbeatTimeoutMs } : {}), simulateMax: o.simulateMax, progress: o.progress !== false });
        writeReportHtml(o.report, report);
        console.log(JSON.stringify(summaryLine(report, o.report)));
      } finally {
        await nats?.nc.close();
      }
    });

  addNamespaceOptions(program.command("export").description("write a window of every stream replay reads (merged, gzip JSON lines) to a file"), { pool: POOL_HELP })
    .option("--from <when>", "window start (as for replay)", "-15m")
    .option("--to <when>", "window end (as for replay)", "now")
    .option("--tail-ms <ms>", "also export this long after --to (decisions arrive when requests end)", intOption(0), 60_000)
    .requiredOption("--out <path>", "output file (gzip; .jsonl.gz)")
    .option("--no-progress", "no progress bar on stderr")
    .action(async (o) => {
      const { nats: urls, namespace: ns } = namespaceFlags(o);
      const now = Date.now();
      const nats = await connectNats(urls, "jetroute-export");
      try {
        const fromMs = await resolveBound(parseWindowBound(o.from, now), nats, ns.prefix);
        const toMs = await resolveBound(parseWindowBound(o.to, now), nats, ns.prefix);
        if (toMs < fromMs) throw new Error(`--to is before --from`);
        const source = await natsSource(nats, ns.prefix, { fromMs, toMs, tailMs: o.tailMs, configPrefix: ns.configPrefix });
        const bar = o.progress !== false ? progressBar("export", source.total) : undefined;
        const streams = await writeExport(o.out, { format: EXPORT_FORMAT, version: EXPORT_VERSION, prefix: ns.prefix, window: { fromMs, toMs }, createdAt: new Date().toISOString() }, source.batches, () => bar?.tick());
        bar?.stop();
        console.log(JSON.stringify({ export: o.out, window: { from: new Date(fromMs).toISOString(), to: new Date(toMs).toISOString() }, streams }));
      } finally {
        await nats.nc.close();
      }
    });
}

