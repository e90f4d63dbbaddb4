/**
 * The whole system as `jetroute demo` assembles it, each piece its own process, for the benchmarks
 * that drive it from outside (prefix-quality, predicted, flow, long-context): nats-server with the
 * streams, `jetroute sim` (N pods), pod-watcher, metrics-scraper, kv-bridge (when the engines
 * publish KV events), 1 or more gateway replicas and the dev front. Plus the small HTTP helpers
 * those benches share.
 */
import type { ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import http from "node:http";
import path from "node:path";
import { stringify as toYaml } from "yaml";
import { connectNats } from "../services/shared/nats.js";
import { freePort, type NatsServerHandle, startNatsServer } from "../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../services/shared/processes.js";
import { applyStreams } from "../streams/apply.js";

/** The model the assembly's pods serve unless a bench names another. */
export const ASSEMBLY_MODEL = "bench/llama-3.1-70b";
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export interface CaseSpec {
  strategy: string;
  /** Gateway tokenizer mode; null for strategies that never tokenize. */
  tokenizer: "approximate" | "local" | null;
  gateways: number;
  /** Engines publish KV events (and a kv-bridge carries them to the KV stream). */
  kvEvents: boolean;
}

export interface PrefixQualityEngineOptions {
  pods: number;
  timeScale: number;
  maxBatch: number;
  maxNumBatchedTokens: number;
  prefillMsPerToken: number;
  decodeMsPerStep: number;
  decodeBatchSlope: number;
  kvCacheBlocks: number;
  blockSize: number;
}

export const PREFIX_QUALITY_ENGINE_DEFAULTS: PrefixQualityEngineOptions = {
  pods: 8,
  // 1 wall second = 10 simulated seconds: conversations with realistic think times (15-30 s)
  // play out within a 40 s run.
  timeScale: 10,
  maxBatch: 8,
  maxNumBatchedTokens: 2048,
  // A 70B-class model on one GPU: ~1k prefill tokens/s, ~30 ms decode steps. A 2-3k-token system
  // prompt then costs 2-3 s of prefill against ~30 ms per decode step, so TTFT is prefill-bound.
  prefillMsPerToken: 1,
  decodeMsPerStep: 30,
  decodeBatchSlope: 0.05,
  // 16k tokens of KV per pod: 5-6 of the 16 system prompts with room for conversations, while the
  // fleet (8 pods) holds them all. Spreading every prompt over every pod cannot fit; keeping each
  // on a few pods can (the regime where prefix-aware routing matters).
  kvCacheBlocks: 1024,
  blockSize: 16,
};

export function percentile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] as number;
}

/** The `q` quantile of unsorted values (nearest rank; NaN when there are none). */
export function quantile(xs: readonly number[], q: number): number {
  return percentile([...xs].sort((a, b) => a - b), q);
}

/** `n` random lower-case words of 3-10 letters from `random` (a seeded PRNG): prompt text for a workload. */
export function randomWords(random: () => number, n: number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    const len = 3 + Math.floor(random() * 8);
    let w = "";
    for (let j = 0; j < len; j++) w += String.fromCharCode(97 + Math.floor(random() * 26));
    out.push(w);
  }
  return out.join(" ");
}


// HTTP helpers (this process's own agents: clients and probes never share sockets)

export function getJson<T>(agent: http.Agent, url: string, timeoutMs = 2_000): Promise<{ status: number; body: T | undefined }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent, timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let body: T | undefined;
        try {
          body = JSON.parse(text) as T;
        } catch {
          body = text as unknown as T;
        }
        resolve({ status: res.statusCode ?? 0, body });
      });
      res.on("error", reject);
    });
    req.on("timeout", () => req.destroy(new Error(`GET ${url} timed out`)));
    req.on("error", reject);
  });
}

export async function waitUntil(what: string, timeoutMs: number, fn: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      if (await fn()) return;
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(100);
  }
}

export interface SimPodLine {
  pod: string;
  address: string;
  podClass?: string;
  kvEvents?: { endpoint: string; replayEndpoint?: string; topic?: string };
  /** Set when the pod schedules by priority (`jetroute sim --scheduling-policy priority`). */
  schedulingPolicy?: string;
}

/**
 * Every child of a live assembly. A crash of this process (an exception outside the try blocks)
 * would otherwise leave nats-server and the services running: kill what is left on exit.
 */
const liveChildren = new Set<ChildProcess>();
let exitHookInstalled = false;
function track(proc: ChildProcess): void {
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.once("exit", () => {
      for (const p of liveChildren) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
    });
  }
  liveChildren.add(proc);
  proc.once("exit", () => liveChildren.delete(proc));
}

export interface GatewayLine {
  gateway: string;
  port: number;
  adminPort: number;
}

export interface Assembly {
  natsUrl: string;
  frontPort: number;
  pods: SimPodLine[];
  gateways: Array<GatewayLine & { pid: number | undefined }>;
  pids(): Array<number | undefined>;
  stop(): Promise<void>;
}

/** What other benches add to the assembly (the flow bench: its model config, longer front timeouts). */
export interface AssemblyExtras {
  /** Runs once the streams exist, before any gateway starts (e.g. to write the config bucket). */
  beforeGateways?: (natsUrl: string) => Promise<void>;
  gatewayArgs?: readonly string[];
  frontArgs?: readonly string[];
  /** Gateway ids are `<gatewayIdPrefix>-<i>` (default `pq-gw`). */
  gatewayIdPrefix?: string;
  model?: string;
  /** More `jetroute sim` flags (a real tokenizer; the predicted bench's `--pod-classes`). */
  simArgs?: readonly string[];
  /** The engine the pod list declares (default vllm); pass the same `--engine` in simArgs. */
  podEngine?: "vllm" | "sglang";
  /** Node flags of the gateway processes (e.g. `--cpu-prof`). */
  gatewayNodeArgs?: readonly string[];
  /** More environment of the gateway processes (e.g. `JETROUTE_LOOP_CPU_PROBE`). */
  gatewayEnv?: Readonly<Record<string, string>>;
  /** Called with each gateway's pid as soon as it is spawned (loadtest/pinning.ts moves it to its CPU). */
  onGatewayPid?: (pid: number) => void;
}

export async function startAssembly(spec: CaseSpec, engine: PrefixQualityEngineOptions, logDir: string, tag: string, extras: AssemblyExtras = {}): Promise<Assembly> {
  const model = extras.model ?? ASSEMBLY_MODEL;
  const children: ServiceProcess[] = [];
  let nats: NatsServerHandle | undefined;
  const probe = new http.Agent({ keepAlive: true, maxSockets: 16 });
  const stop = async () => {
    // Front first (no new requests), then gateways, then what feeds them, engines and NATS last.
    const order = (c: ServiceProcess) => (c.name === "front" ? 0 : c.name.startsWith("gateway-") ? 1 : 2);
    for (const c of [...children].reverse().sort((a, b) => order(a) - order(b))) await c.stop(3_000);
    await nats?.stop();
    probe.destroy();
  };
  try {
    nats = await startNatsServer();
    track(nats.proc);
    const natsUrl = nats.url;
    const h = await connectNats(natsUrl, "jetroute-bench-prefix-quality");
    await applyStreams(h.nc, h.jsm);
    await h.nc.close();
    await extras.beforeGateways?.(natsUrl);

    const env = { JETROUTE_LOG_LEVEL: "warn" };
    const spawn = (name: string, args: string[]) => {
      const gateway = name.startsWith("gateway-");
      const nodeArgs = gateway ? extras.gatewayNodeArgs : undefined;
      const c = spawnJetroute(name, args, { logFile: path.join(logDir, `${tag}-${name}.log`), env: gateway ? { ...env, ...extras.gatewayEnv } : env, ...(nodeArgs ? { nodeArgs } : {}) });
      children.push(c);
      track(c.proc);
      if (gateway && c.proc.pid !== undefined) extras.onGatewayPid?.(c.proc.pid);
      return c;
    };
    const e = engine;
    const sim = spawn("sim", [
      "sim", "--pods", String(e.pods), "--base-port", "0", "--model", model, "--time-scale", String(e.timeScale),
      "--max-batch", String(e.maxBatch), "--max-num-batched-tokens", String(e.maxNumBatchedTokens),
      "--prefill-ms-per-token", String(e.prefillMsPerToken), "--decode-ms-per-step", String(e.decodeMsPerStep),
      "--decode-batch-slope", String(e.decodeBatchSlope), "--kv-cache-blocks", String(e.kvCacheBlocks), "--block-size", String(e.blockSize),
      ...(spec.kvEvents ? [] : ["--no-kv-events"]), ...(extras.simArgs ?? []),
    ]);
    // Gateways start while the engines do (they watch PODS for the pods to appear): process
    // start-up is most of an assembly's time on a busy host.
    const starting = Promise.all(
      Array.from({ length: spec.gateways }, async (_, i) => {
        const gw = spawn(`gateway-${i + 1}`, [
          "gateway", "--nats", natsUrl, "--port", "0", "--admin-port", "0", "--host", "127.0.0.1", "--id", `${extras.gatewayIdPrefix ?? "pq-gw"}-${i + 1}`,
          "--strategy", spec.strategy, ...(spec.tokenizer ? ["--tokenizer", spec.tokenizer] : []), "--shutdown-grace-ms", "1000", ...(extras.gatewayArgs ?? []),
        ]);
        // 60 s: on a 2-core box shared with other work a gateway has been seen to need more than 30.
        const line = await gw.waitForLine<GatewayLine>((v) => typeof v.port === "number", 60_000);
        return { ...line, pid: gw.proc.pid };
      }),
    );
    // Awaited below; a failure meanwhile must not count as unhandled.
    starting.catch(() => {});
    const pods = await Promise.all(
      Array.from({ length: e.pods }, (_, i) => sim.waitForLine<SimPodLine>((v) => v.pod === `sim-${i}` && typeof v.address === "string", 60_000)),
    );
    const podFile = path.join(logDir, `${tag}-pods.yaml`);
    writeFileSync(podFile, toYaml({ pods: pods.map((p) => ({ name: p.pod, model, address: p.address, engine: extras.podEngine ?? "vllm", ...(p.podClass ? { podClass: p.podClass } : {}), ...(p.schedulingPolicy ? { schedulingPolicy: p.schedulingPolicy } : {}), ...(p.kvEvents ? { kvEvents: p.kvEvents } : {}) })) }));
    spawn("pod-watcher", ["pod-watcher", "--static", podFile, "--nats", natsUrl]);
    spawn("metrics-scraper", ["metrics-scraper", "--nats", natsUrl]);
    if (spec.kvEvents) spawn("kv-bridge", ["kv-bridge", "--nats", natsUrl]);

    const gateways = await starting;
    const frontPort = await freePort();
    spawn("front", ["front", "--port", String(frontPort), "--gateway", gateways.map((g) => `127.0.0.1:${g.port}`).join(","), ...(extras.frontArgs ?? [])]);
    // Ready, and every pod known and ready in every replica's view.
    for (const g of gateways) {
      // Generous: on a loaded 2-core box (a test suite beside) spawning a dozen processes is slow.
      await waitUntil(`gateway ${g.gateway} to see ${e.pods} ready pods`, 60_000, async () => {
        const r = await getJson<{ ready: boolean; pods: Array<{ ready: boolean }> }>(probe, `http://127.0.0.1:${g.adminPort}/debug/state`);
        return r.status === 200 && r.body?.ready === true && (r.body.pods ?? []).filter((p) => p.ready).length === e.pods;
      });
    }
    await waitUntil("the front to list the model", 60_000, async () => {
      const r = await getJson<{ data?: Array<{ id: string }> }>(probe, `http://127.0.0.1:${frontPort}/v1/models`);
      return r.status === 200 && (r.body?.data ?? []).some((m) => m.id === model);
    });
    // The kv-bridge replays each engine from seq 0 when it connects, so engine events produced
    // before its sockets are up are not lost; a short pause lets the sockets settle all the same.
    if (spec.kvEvents) await sleep(500);
    const natsProc = nats.proc;
    return { natsUrl, frontPort, pods, gateways, pids: () => [natsProc.pid, ...children.map((c) => c.proc.pid)], stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

