/**
 * `npm run bench -- extproc`: the gateway's ext_proc overhead against a no-op ext_proc server,
 * side by side in one run, same load generator (its own process), same machine.
 *
 * The gateway routes with least-request over 4 pods with charges on: every request publishes a
 * charge and a release to JetStream and applies both to its ledger. Servers and generator share
 * the machine's cores with nats-server, so the ratio is the figure to read, not the absolute rps.
 */
import { applyStreams } from "../../streams/apply.js";
import { Subjects } from "../../streams/subjects.js";
import { connectNats } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { spawnJetroute } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import type { ExtProcLoadResult } from "../extproc-load.js";
import { loadtestScript, runNode } from "../child.js";

export interface ExtProcBenchOptions {
  durationMs: number;
  warmupMs: number;
  concurrencies: number[];
  mode: "eventual" | "strict";
  rounds: number;
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
  });
  try {
    const noopPort = (await noop.firstJson).port as number;
    const gwPort = (await gw.waitForLine<{ port: number }>((v) => typeof v.port === "number")).port;
    // Readiness: the gateway answers routing only once its views caught up; a probe request proves it.
    const rows: Array<{ concurrency: number; noop: ExtProcLoadResult[]; gateway: ExtProcLoadResult[] }> = [];
    for (const c of o.concurrencies) {
      const row = { concurrency: c, noop: [] as ExtProcLoadResult[], gateway: [] as ExtProcLoadResult[] };
      for (let r = 0; r < o.rounds; r++) {
        row.noop.push(await load(`127.0.0.1:${noopPort}`, c, o));
        row.gateway.push(await load(`127.0.0.1:${gwPort}`, c, o));
      }
      const g = row.gateway.at(-1) as ExtProcLoadResult;
      if (g.immediate > 0 || g.errors > 0) throw new Error(`gateway answered ${g.immediate} immediate responses and ${g.errors} errors (first: ${g.firstError ?? "-"}): not a routing run`);
      rows.push(row);
      const nr = median(row.noop.map((x) => x.rps));
      const gr = median(row.gateway.map((x) => x.rps));
      console.error(
        `concurrency ${String(c).padStart(3)}: noop ${nr.toFixed(0)} rps (p99 ${median(row.noop.map((x) => x.p99Ms)).toFixed(2)} ms) | gateway ${gr.toFixed(0)} rps (p99 ${median(row.gateway.map((x) => x.p99Ms)).toFixed(2)} ms) | ratio ${(gr / nr).toFixed(2)}`,
      );
    }
    const last = rows.at(-1) as (typeof rows)[number];
    const noopRps = median(last.noop.map((x) => x.rps));
    const gwRps = median(last.gateway.map((x) => x.rps));
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
    };
  } finally {
    await noop.stop();
    await gw.stop();
    await h.nc.close();
    await nats.stop();
  }
}
