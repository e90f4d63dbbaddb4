/**
 * `npm run bench -- extproc`: the gateway's ext_proc overhead against a no-op ext_proc server,
 * side by side in one run, same load generator (its own process), same machine.
 *
 * The gateway routes with least-request over 4 pods with charges on: every request publishes a
 * charge and a release to JetStream and applies both to its ledger. Servers and generator share
 * the machine's cores with nats-server, so the ratio is the figure to read, not the absolute rps.
 *
 * Then, with `pacedRate`, each server at a fixed moderate rate (paced streams, not saturation): its
 * CPU per request and main-thread wake-ups per request, an idle window of the same length before and
 * after subtracted (/proc, loadtest/proc-cpu.ts). At saturation one wake-up serves many requests;
 * at moderate rates every timer, flush and deferred step a request schedules can cost one.
 */
import { applyStreams } from "../../streams/apply.js";
import { Subjects } from "../../streams/subjects.js";
import { connectNats } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { spawnJetroute } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import type { ExtProcLoadResult } from "../extproc-load.js";
import { loadtestScript, runNode } from "../child.js";
import { mainThreadWakeups, processCpuUs } from "../proc-cpu.js";
import { hostPinningPlan, type PinningPlan, pinningSummary, setAffinity } from "../pinning.js";

export interface ExtProcBenchOptions {
  durationMs: number;
  warmupMs: number;
  concurrencies: number[];
  mode: "eventual" | "strict";
  rounds: number;
  /** Requests per second of the paced CPU measurement (0: skipped). */
  pacedRate?: number;
  /** Write a V8 CPU profile of the gateway (node --cpu-prof) into this directory. */
  profileDir?: string;
  /** Also run each round with the server under test alone on one CPU (default true; loadtest/pinning.ts). */
  pinned?: boolean;
}

export interface PacedRow {
  rate: number;
  requests: number;
  cpu_us_per_request: number;
  wakeups_per_request: number;
  idle_cpu_us_per_s: number;
}

const MODEL = "bench/model";

async function load(target: string, concurrency: number, o: ExtProcBenchOptions): Promise<ExtProcLoadResult> {
  const gen = runNode(loadtestScript("extproc-load.js"), [
    "--target", target, "--concurrency", String(concurrency), "--duration-ms", String(o.durationMs), "--warmup-ms", String(o.warmupMs), "--model", MODEL,
  ]);
  const r = (await gen.firstJson) as unknown as ExtProcLoadResult;
  await gen.stop();
  return r;
}

/**
 * One paced window against `target` (pid `pid`): CPU and wake-ups per request, the mean of an
 * idle window before (while the generator starts) and one after subtracted.
 */
async function paced(target: string, pid: number, rate: number, o: ExtProcBenchOptions): Promise<PacedRow> {
  const sample = () => ({ t: performance.now(), cpu: processCpuUs(pid), wake: mainThreadWakeups(pid) });
  const until = (epochMs: number) => new Promise((r) => setTimeout(r, Math.max(0, epochMs - Date.now())));
  const i0 = sample();
  const startAt = Date.now() + o.durationMs;
  const gen = runNode(loadtestScript("extproc-load.js"), [
    "--target", target, "--rate", String(rate), "--concurrency", "32", "--duration-ms", String(o.durationMs), "--warmup-ms", "0", "--start-at", String(startAt), "--model", MODEL,
  ]);
  await until(startAt);
  const l0 = sample();
  await until(startAt + o.durationMs);
  const l1 = sample();
  const r = (await gen.firstJson) as unknown as ExtProcLoadResult;
  await gen.stop();
  const j0 = sample();
  await new Promise((res) => setTimeout(res, o.durationMs));
  const j1 = sample();
  const idleMs = l0.t - i0.t + (j1.t - j0.t);
  const idleCpu = (l0.cpu - i0.cpu + (j1.cpu - j0.cpu)) / idleMs;
  const idleWake = (l0.wake - i0.wake + (j1.wake - j0.wake)) / idleMs;
  const ms = l1.t - l0.t;
  const n = Math.max(1, r.completed);
  return {
    rate,
    requests: r.completed,
    cpu_us_per_request: Math.round((l1.cpu - l0.cpu - idleCpu * ms) / n),
    wakeups_per_request: Math.round(((l1.wake - l0.wake - idleWake * ms) / n) * 1000) / 1000,
    idle_cpu_us_per_s: Math.round(idleCpu * 1000),
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

export async function runExtProcBench(o: ExtProcBenchOptions): Promise<Record<string, unknown>> {
  const nats = await startNatsServer();
  const h = await connectNats(nats.url);
  await applyStreams(h.nc, h.jsm);
  const s = new Subjects();
  for (let i = 0; i < 4; i++) {
    await acked(h.js, s.pod(MODEL, `pod-${i}`), { type: "pod", action: "upsert", model: MODEL, pod: `pod-${i}`, address: `127.0.0.1:${18000 + i}`, ready: true, engine: "vllm", ts: Date.now() });
  }
  const noop = runNode(loadtestScript("noop-main.js"));
  const gw = spawnJetroute("gateway", ["gateway", "--nats", nats.url, "--port", "0", "--admin-port", "-1", "--host", "127.0.0.1", "--id", "bench-gw", "--strategy", "least-request", "--consistency", o.mode], {
    env: { JETROUTE_LOG_LEVEL: "warn" },
    ...(o.profileDir ? { nodeArgs: ["--cpu-prof", "--cpu-prof-dir", o.profileDir] } : {}),
  });
  try {
    const noopPort = (await noop.firstJson).port as number;
    const gwPort = (await gw.waitForLine<{ port: number }>((v) => typeof v.port === "number")).port;
    // Readiness: the gateway answers routing only once its views caught up; a probe request proves it.
    const plan: PinningPlan = hostPinningPlan();
    const pin = o.pinned !== false && plan.available;
    // Pinned: the two servers on the gateway CPU, this driver (so each generator it spawns) and
    // nats-server on the others; shared: every process on every CPU.
    const place = (pinned: boolean) => {
      if (!plan.available) return;
      for (const pid of [process.pid, nats.proc.pid]) if (pid !== undefined) setAffinity(pid, pinned ? plan.otherCpus : plan.allCpus);
      for (const pid of [noop.proc.pid, gw.proc.pid]) if (pid !== undefined) setAffinity(pid, pinned ? plan.gatewayCpus : plan.allCpus);
    };
    const rows: Array<{ concurrency: number; noop: ExtProcLoadResult[]; gateway: ExtProcLoadResult[]; pinnedNoop: ExtProcLoadResult[]; pinnedGateway: ExtProcLoadResult[] }> = [];
    for (const c of o.concurrencies) {
      const row = { concurrency: c, noop: [] as ExtProcLoadResult[], gateway: [] as ExtProcLoadResult[], pinnedNoop: [] as ExtProcLoadResult[], pinnedGateway: [] as ExtProcLoadResult[] };
      for (let r = 0; r < o.rounds; r++) {
        row.noop.push(await load(`127.0.0.1:${noopPort}`, c, o));
        row.gateway.push(await load(`127.0.0.1:${gwPort}`, c, o));
        if (pin) {
          place(true);
          try {
            row.pinnedNoop.push(await load(`127.0.0.1:${noopPort}`, c, o));
            row.pinnedGateway.push(await load(`127.0.0.1:${gwPort}`, c, o));
          } finally {
            place(false);
          }
        }
      }
      const g = row.gateway.at(-1) as ExtProcLoadResult;
      if (g.immediate > 0 || g.errors > 0) throw new Error(`gateway answered ${g.immediate} immediate responses and ${g.errors} errors (first: ${g.firstError ?? "-"}): not a routing run`);
      rows.push(row);
      const nr = median(row.noop.map((x) => x.rps));
      const gr = median(row.gateway.map((x) => x.rps));
      console.error(
        `concurrency ${String(c).padStart(3)}: noop ${nr.toFixed(0)} rps (p99 ${median(row.noop.map((x) => x.p99Ms)).toFixed(2)} ms) | gateway ${gr.toFixed(0)} rps (p99 ${median(row.gateway.map((x) => x.p99Ms)).toFixed(2)} ms) | ratio ${(gr / nr).toFixed(2)}`,
      );
      if (pin) {
        const pn = median(row.pinnedNoop.map((x) => x.rps));
        const pg = median(row.pinnedGateway.map((x) => x.rps));
        console.error(`   pinned (server on CPU ${plan.gatewayCpus}): noop ${pn.toFixed(0)} rps | gateway ${pg.toFixed(0)} rps | ratio ${(pg / pn).toFixed(2)}`);
      }
    }
    const last = rows.at(-1) as (typeof rows)[number];
    let pacedRows: { noop: PacedRow; gateway: PacedRow } | undefined;
    if (o.pacedRate && o.pacedRate > 0) {
      const noopPid = noop.proc.pid;
      const gwPid = gw.proc.pid;
      if (noopPid === undefined || gwPid === undefined) throw new Error("a server has no pid");
      pacedRows = { noop: await paced(`127.0.0.1:${noopPort}`, noopPid, o.pacedRate, o), gateway: await paced(`127.0.0.1:${gwPort}`, gwPid, o.pacedRate, o) };
      console.error(`paced ${o.pacedRate}/s: noop ${pacedRows.noop.cpu_us_per_request} µs, ${pacedRows.noop.wakeups_per_request} wake-ups per request | gateway ${pacedRows.gateway.cpu_us_per_request} µs, ${pacedRows.gateway.wakeups_per_request} wake-ups per request`);
    }
    const noopRps = median(last.noop.map((x) => x.rps));
    const gwRps = median(last.gateway.map((x) => x.rps));
    const pinnedFigures = pin
      ? (() => {
          const pn = median(last.pinnedNoop.map((x) => x.rps));
          const pg = median(last.pinnedGateway.map((x) => x.rps));
          return {
            noop_rps: Math.round(pn),
            gateway_rps: Math.round(pg),
            ratio: Math.round((pg / pn) * 1000) / 1000,
            gateway_p99_ms: Math.round(median(last.pinnedGateway.map((x) => x.p99Ms)) * 100) / 100,
            noop_p99_ms: Math.round(median(last.pinnedNoop.map((x) => x.p99Ms)) * 100) / 100,
            by_concurrency: rows.map((r) => ({ concurrency: r.concurrency, noop_rps: Math.round(median(r.pinnedNoop.map((x) => x.rps))), gateway_rps: Math.round(median(r.pinnedGateway.map((x) => x.rps))) })),
          };
        })()
      : undefined;
    return {
      bench: "extproc",
      ...(o.mode === "eventual" ? {} : { mode: o.mode }),
      concurrency: last.concurrency,
      noop_rps: Math.round(noopRps),
      gateway_rps: Math.round(gwRps),
      ratio: Math.round((gwRps / noopRps) * 1000) / 1000,
      gateway_p99_ms: Math.round(median(last.gateway.map((x) => x.p99Ms)) * 100) / 100,
      noop_p99_ms: Math.round(median(last.noop.map((x) => x.p99Ms)) * 100) / 100,
      by_concurrency: rows.map((r) => ({
        concurrency: r.concurrency,
        noop_rps: Math.round(median(r.noop.map((x) => x.rps))),
        gateway_rps: Math.round(median(r.gateway.map((x) => x.rps))),
        gateway_p50_ms: Math.round(median(r.gateway.map((x) => x.p50Ms)) * 100) / 100,
        gateway_p99_ms: Math.round(median(r.gateway.map((x) => x.p99Ms)) * 100) / 100,
      })),
      ...(pinnedFigures ? { pinned: pinnedFigures } : {}),
      pinning: o.pinned === false ? { note: "pinned runs not asked (--no-pinned)" } : pinningSummary(plan),
      ...(pacedRows
        ? {
            paced_rate: pacedRows.gateway.rate,
            paced_gateway_cpu_us_per_request: pacedRows.gateway.cpu_us_per_request,
            paced_gateway_wakeups_per_request: pacedRows.gateway.wakeups_per_request,
            paced_noop_cpu_us_per_request: pacedRows.noop.cpu_us_per_request,
            paced_noop_wakeups_per_request: pacedRows.noop.wakeups_per_request,
            paced: pacedRows,
          }
        : {}),
    };
  } finally {
    await noop.stop();
    await gw.stop();
    await h.nc.close();
    await nats.stop();
  }
}
