/**
 * `npm run bench -- pd`: prefill/decode disaggregation against aggregated serving on equal pod
 * counts, one run, side by side: P/D (2 prefill + 2 decode pods, strategy `pd`) and aggregated
 * (4 combined pods, strategy `prefix-cache`), the same seeded long-prompt chat workload (shared
 * system prompts, >= 4k-token prompts) through the dev front and one gateway. Client-side TTFT
 * (send -> first content chunk), TPOT ((last - first chunk) / (tokens - 1)) and throughput.
 *
 * Then the gateway's own overhead on the prefill leg, on idle pods: an ext_proc exchange that
 * routes a P/D request (the gateway sends the prefill leg and answers once it returned) against a
 * direct POST of the same prefill body to a prefill pod, interleaved, p50 of each; overhead =
 * difference. The simulator runs as its own process so its timing does not share the driver's loop.
 *
 * Pinned (loadtest/pinning.ts; `--no-pinned` skips it): the overhead measured again against a
 * gateway started as its own process on the gateway CPU, the simulator and this driver on the
 * others (the gateway of the runs above shares this process), under `pinned` with the keys the
 * gateway benches use (`gateway_main_cpu_ms_per_request`, `gateway_cpu_ms_per_request` over the
 * measured exchanges, `max_own_loop_block_ms`) and `prefill_leg_overhead_p50_ms`.
 */
import { Agent } from "undici";
import { ExtProcClient } from "../../services/extproc/envoy-client.js";
import { startFront } from "../../services/front/front.js";
import { type GatewayHandle, startGateway } from "../../services/gateway/gateway.js";
import { vllmPrefillBody } from "../../services/routing/mod.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import { hostPinningPlan, pinningSummary, setAffinity, withPinning } from "../pinning.js";
import { mainThreadCpuUs, processCpuUs } from "../proc-cpu.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { quantile, randomWords } from "../assembly.js";
import { applyStreams } from "../../streams/apply.js";
import { Subjects } from "../../streams/subjects.js";

export interface PdBenchOptions {
  /** Request arrivals per second (Poisson) per run. */
  rate?: number;
  durationMs?: number;
  /** Words of each shared system prompt (about one token each) and of each user message. */
  systemWords?: number;
  userWords?: number;
  systemPrompts?: number;
  maxTokens?: number;
  /** Iterations of the prefill-leg overhead measurement (each: one gateway-issued, one direct). */
  overheadIterations?: number;
  seed?: number;
  /** Also measure the prefill-leg overhead with the gateway pinned to its own CPU (default true). */
  pinned?: boolean;
}

export interface PdRow {
  mode: "pd" | "aggregated";
  requests: number;
  errors: number;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  tpot_p50_ms: number;
  tpot_p99_ms: number;
  throughput_rps: number;
}

export interface PdBenchResult {
  bench: "pd";
  results: PdRow[];
  prefill_leg_overhead_p50_ms: number;
  prefill_leg_gateway_p50_ms: number;
  prefill_leg_direct_p50_ms: number;
  prompt_tokens_mean: number;
  /** The prefill-leg overhead against a gateway process alone on the gateway CPU. */
  pinned?: {
    gateway_main_cpu_ms_per_request: number;
    gateway_cpu_ms_per_request: number;
    max_own_loop_block_ms: number;
    prefill_leg_overhead_p50_ms: number;
    prefill_leg_gateway_p50_ms: number;
    prefill_leg_direct_p50_ms: number;
  };
  pinning: { gateway_cpus: string; other_cpus: string } | { note: string };
  options: Required<PdBenchOptions>;
}

const MODEL = "bench/pd-model";
const quiet = createLogger("bench-pd", "silent");
const progress = (line: string) => process.stderr.write(`[pd] ${line}\n`);
const round = (x: number, d = 2) => Number(x.toFixed(d));
const pct = quantile;

interface SimPodLine {
  pod: string;
  address: string;
  role: "prefill" | "decode" | "combined";
  roleset?: string;
}

export async function runPdBench(opts: PdBenchOptions = {}): Promise<PdBenchResult> {
  const o: Required<PdBenchOptions> = {
    rate: opts.rate ?? 1.5,
    durationMs: opts.durationMs ?? 30_000,
    systemWords: opts.systemWords ?? 3_600,
    userWords: opts.userWords ?? 600,
    systemPrompts: opts.systemPrompts ?? 4,
    maxTokens: opts.maxTokens ?? 64,
    overheadIterations: opts.overheadIterations ?? 200,
    seed: opts.seed ?? 7,
    pinned: opts.pinned ?? true,
  };
  const plan = hostPinningPlan();
  let pinned: PdBenchResult["pinned"];
  const random = mulberry32(o.seed);
  const systems = Array.from({ length: o.systemPrompts }, () => randomWords(random, o.systemWords));
  // The schedule: arrival times and prompts, identical for both modes.
  const schedule: Array<{ at: number; system: number; user: string }> = [];
  for (let t = 0; ; ) {
    t += -Math.log(1 - random()) * (1000 / o.rate);
    if (t >= o.durationMs) break;
    schedule.push({ at: t, system: Math.floor(random() * o.systemPrompts), user: randomWords(random, o.userWords) });
  }
  const server = await startNatsServer();
  const nc = await connectNats(server.url, "jetroute-bench-pd");
  await applyStreams(nc.nc, nc.jsm);
  const subjects = new Subjects();
  const children: ServiceProcess[] = [];
  try {
    const results: PdRow[] = [];
    let overhead = { gateway: Number.NaN, direct: Number.NaN };
    let promptTokens = 0;
    for (const mode of ["pd", "aggregated"] as const) {
      const roles = mode === "pd" ? "prefill,prefill,decode,decode" : "combined";
      const sim = spawnJetroute(`sim-${mode}`, ["sim", "--pods", "4", "--base-port", "0", "--model", MODEL, "--role", roles, "--roleset", "bench", "--kv-abort-timeout-ms", "5000"], { env: { JETROUTE_LOG_LEVEL: "warn" } });
      children.push(sim);
      const pods = await Promise.all([0, 1, 2, 3].map((i) => sim.waitForLine<SimPodLine>((v) => v.pod === `sim-${i}` && typeof v.address === "string", 30_000)));
      // Each mode's pods under their own names, the other mode's removed from the pod set.
      for (const p of pods) {
        await acked(nc.js, subjects.pod(MODEL, `${mode}-${p.pod}`), { type: "pod", action: "upsert", model: MODEL, pod: `${mode}-${p.pod}`, address: p.address, ready: true, engine: "vllm", role: p.role, roleset: "bench", ts: Date.now() });
      }
      const gw: GatewayHandle = await startGateway({ nats: server.url, port: 0, host: "127.0.0.1", adminPort: -1, id: `pd-bench-${mode}`, log: quiet, defaultStrategy: mode === "pd" ? "pd" : "prefix-cache", tokenizerMode: "local", snapshots: false, shutdownGraceMs: 500 });
      await gw.whenReady();
      const deadline = Date.now() + 10_000;
      while (gw.views.pods.readyPods(MODEL).filter((p) => p.pod.startsWith(`${mode}-`)).length < 4 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      const front = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${gw.port}`], logger: quiet });
      const base = `http://127.0.0.1:${front.port}`;
      const agent = new Agent({ connections: 256 });
      progress(`${mode}: ${schedule.length} requests at ${o.rate}/s over ${o.durationMs / 1000} s`);
      const ttfts: number[] = [];
      const tpots: number[] = [];
      let errors = 0;
      let lastEnd = 0;
      const t0 = performance.now();
      const runOne = async (s: (typeof schedule)[number]) => {
        const wait = s.at - (performance.now() - t0);
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        const sent = performance.now();
        const body = JSON.stringify({ model: MODEL, messages: [{ role: "system", content: systems[s.system] }, { role: "user", content: s.user }], max_tokens: o.maxTokens, stream: true, stream_options: { include_usage: true } });
        try {
          const res = await agent.request({ origin: base, path: "/v1/chat/completions", method: "POST", headers: { "content-type": "application/json" }, body });
          if (res.statusCode !== 200) {
            errors++;
            await res.body.text();
            return;
          }
          let first = 0;
          let last = 0;
          let tokens = 0;
          let buf = "";
          for await (const chunk of res.body) {
            buf += (chunk as Buffer).toString("utf8");
            let i = buf.indexOf("\n\n");
            while (i >= 0) {
              const ev = buf.slice(0, i);
              buf = buf.slice(i + 2);
              i = buf.indexOf("\n\n");
              if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
              const j = JSON.parse(ev.slice(6)) as { choices?: Array<{ delta?: { content?: string } }>; usage?: { prompt_tokens: number } };
              if (j.usage) promptTokens += j.usage.prompt_tokens / schedule.length / 2;
              if (j.choices?.[0]?.delta?.content) {
                const now = performance.now();
                if (!first) first = now;
                last = now;
                tokens++;
              }
            }
          }
          if (!first) {
            errors++;
            return;
          }
          ttfts.push(first - sent);
          if (tokens > 1) tpots.push((last - first) / (tokens - 1));
          lastEnd = Math.max(lastEnd, performance.now() - t0);
        } catch {
          errors++;
        }
      };
      await Promise.all(schedule.map(runOne));
      results.push({
        mode,
        requests: schedule.length,
        errors,
        ttft_p50_ms: round(pct(ttfts, 0.5), 1),
        ttft_p99_ms: round(pct(ttfts, 0.99), 1),
        tpot_p50_ms: round(pct(tpots, 0.5), 2),
        tpot_p99_ms: round(pct(tpots, 0.99), 2),
        throughput_rps: round(ttfts.length / (lastEnd / 1000), 3),
      });
      progress(`${mode}: ${JSON.stringify(results.at(-1))}`);
      if (mode === "pd") overhead = await prefillLegOverhead(gw.port, pods.find((p) => p.role === "prefill") as SimPodLine, o.overheadIterations, agent);
      if (mode === "pd" && o.pinned && plan.available) {
        progress(`pinned: a gateway process on CPU ${plan.gatewayCpus}, the simulator and this driver on CPU ${plan.otherCpus}`);
        if (sim.proc.pid !== undefined) setAffinity(sim.proc.pid, plan.otherCpus);
        pinned = await withPinning(plan, (pin) => pinnedOverhead(server.url, pin, pods.find((p) => p.role === "prefill") as SimPodLine, o.overheadIterations, agent, mode));
        progress(`pinned: ${JSON.stringify(pinned)}`);
      } else if (mode === "pd" && o.pinned) progress(`not pinned: ${plan.note}`);
      await agent.close();
      await front.close();
      await gw.close();
      for (const p of pods) await acked(nc.js, subjects.pod(MODEL, `${mode}-${p.pod}`), { type: "pod", action: "remove", model: MODEL, pod: `${mode}-${p.pod}`, address: p.address, ready: false, engine: "vllm", ts: Date.now() });
      await sim.stop();
    }
    return {
      bench: "pd",
      results,
      prefill_leg_overhead_p50_ms: round(overhead.gateway - overhead.direct, 3),
      prefill_leg_gateway_p50_ms: round(overhead.gateway, 3),
      prefill_leg_direct_p50_ms: round(overhead.direct, 3),
      prompt_tokens_mean: Math.round(promptTokens),
      ...(pinned ? { pinned } : {}),
      pinning: o.pinned ? pinningSummary(plan) : { note: "pinned run not asked (--no-pinned)" },
      options: o,
    };
  } finally {
    for (const c of children) await c.stop().catch(() => undefined);
    await nc.nc.close();
    await server.stop();
  }
}

/**
 * p50 of (a) an ext_proc exchange whose body reply waits for the gateway's prefill leg and (b) a
 * direct POST of the same prefill body, interleaved on idle pods with a short prompt (the same
 * one each time: cached after the first, so both sides measure transport and scheduling, not compute).
 */
async function prefillLegOverhead(port: number, prefill: SimPodLine, n: number, agent: Agent): Promise<{ gateway: number; direct: number }> {
  const client = new ExtProcClient(`127.0.0.1:${port}`);
  const body = { model: MODEL, messages: [{ role: "user", content: "a short prompt for the overhead measurement" }], max_tokens: 8 };
  const raw = Buffer.from(JSON.stringify(body));
  const direct = vllmPrefillBody(body);
  const viaGateway: number[] = [];
  const plain: number[] = [];
  for (let i = 0; i < n + 20; i++) {
    const id = `ovh-${i}`;
    const ex = client.open();
    await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "bench", "content-type": "application/json", "x-request-id": id, "routing-strategy": "pd" });
    const t1 = performance.now();
    await ex.requestBody(raw);
    const g = performance.now() - t1;
    ex.cancel();
    const t2 = performance.now();
    const res = await agent.request({ origin: `http://${prefill.address}`, path: "/v1/chat/completions", method: "POST", headers: { "content-type": "application/json", "x-request-id": `${id}-direct` }, body: direct });
    await res.body.text();
    const d = performance.now() - t2;
    if (i >= 20) {
      viaGateway.push(g);
      plain.push(d);
    }
  }
  client.close();
  return { gateway: pct(viaGateway, 0.5), direct: pct(plain, 0.5) };
}

/**
 * The prefill-leg overhead against a gateway started as its own process (`jetroute gateway`, the
 * pd strategy, its loop probe on) and moved to the gateway CPU by `pin`; its CPU per exchange from
 * /proc over the measurement (after 20 unmeasured exchanges; the measurement's own 20 warm-up
 * exchanges are counted with it).
 */
async function pinnedOverhead(natsUrl: string, pin: (pid: number) => void, prefill: SimPodLine, n: number, agent: Agent, mode: string): Promise<NonNullable<PdBenchResult["pinned"]>> {
  const gw = spawnJetroute("gateway-pinned", ["gateway", "--nats", natsUrl, "--port", "0", "--admin-port", "0", "--host", "127.0.0.1", "--id", "pd-bench-pinned", "--strategy", "pd", "--tokenizer", "local", "--no-snapshots", "--shutdown-grace-ms", "500"], {
    env: { JETROUTE_LOG_LEVEL: "warn", JETROUTE_LOOP_CPU_PROBE: "1" },
  });
  try {
    const pid = gw.proc.pid;
    if (pid === undefined) throw new Error("the pinned gateway has no pid");
    pin(pid);
    const line = await gw.waitForLine<{ port: number; adminPort: number }>((v) => typeof v.port === "number" && typeof v.adminPort === "number", 60_000);
    const admin = `http://127.0.0.1:${line.adminPort}`;
    const deadline = Date.now() + 30_000;
    for (;;) {
      const s = (await (await fetch(`${admin}/debug/state`)).json()) as { ready?: boolean; pods?: Array<{ pod: string; ready?: boolean }> };
      if (s.ready && (s.pods ?? []).filter((p) => p.pod.startsWith(`${mode}-`)).length >= 4) break;
      if (Date.now() > deadline) throw new Error("the pinned gateway did not see the pods");
      await new Promise((r) => setTimeout(r, 50));
    }
    // A fresh process: its first exchanges compile the path (JIT). Warmed up first, not counted.
    await prefillLegOverhead(line.port, prefill, 0, agent);
    // A scrape resets the loop probe's maximum: the measurement's is read at its end.
    await (await fetch(`${admin}/metrics`)).text();
    const cpu0 = processCpuUs(pid);
    const main0 = mainThreadCpuUs(pid);
    const r = await prefillLegOverhead(line.port, prefill, n, agent);
    const exchanges = n + 20;
    const cpu = processCpuUs(pid) - cpu0;
    const main = mainThreadCpuUs(pid) - main0;
    const metrics = await (await fetch(`${admin}/metrics`)).text();
    const block = Number(/^jetroute_gateway_loop_block_cpu_max_seconds(?:\{[^}]*\})? (\S+)$/m.exec(metrics)?.[1] ?? Number.NaN) * 1000;
    return {
      gateway_main_cpu_ms_per_request: round(main / 1000 / exchanges, 4),
      gateway_cpu_ms_per_request: round(cpu / 1000 / exchanges, 4),
      max_own_loop_block_ms: round(block, 3),
      prefill_leg_overhead_p50_ms: round(r.gateway - r.direct, 3),
      prefill_leg_gateway_p50_ms: round(r.gateway, 3),
      prefill_leg_direct_p50_ms: round(r.direct, 3),
    };
  } finally {
    await gw.stop();
  }
}
