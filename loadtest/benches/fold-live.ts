/**
 * `npm run bench -- fold-live`: what folding another replica's traffic costs a live gateway, per
 * request that other replica routed.
 *
 * One nats-server, 4 pods (published, never contacted: the load generator plays Envoy and the
 * engines), two gateway processes A and B. The generator (its own process) drives A only, at
 * `concurrency` ext_proc streams; B routes nothing and folds A's charges, releases and heartbeats.
 * CPU is read from /proc/<pid>/stat (user + system, every thread) for A, B and nats-server over
 * each loaded window and over an idle window of the same processes; the idle rate is subtracted,
 * and what is left is divided by the requests A completed in the window. Windows alternate
 * idle/loaded `rounds` times; medians are reported. Unlike `fold` (bulk, pre-published messages),
 * this includes messages arriving one by one: socket reads, event-loop turns, pull refills,
 * timers, GC.
 *
 * `releaseBatchMs` settings (the gateways' `--release-batch-ms`) are measured side by side: each
 * round runs one fresh pair of replicas per setting, settings alternating.
 *
 * `profileDir` runs B under `node --cpu-prof` in the first round (written when B exits).
 */
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { cliPath } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import { applyStreams } from "../../streams/apply.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { loadtestScript, runNode } from "../child.js";
import type { ExtProcLoadResult } from "../extproc-load.js";

export interface FoldLiveOptions {
  concurrency?: number;
  /** Length of each loaded and each idle window. */
  durationMs?: number;
  rounds?: number;
  heartbeatMs?: number;
  /** Gateways' `--release-batch-ms` settings to compare, side by side (default 0 and 5). */
  releaseBatchMs?: number[];
  /** Write a V8 CPU profile of replica B into this directory. */
  profileDir?: string;
}

export interface FoldLiveRound {
  requests: number;
  rps: number;
  a_us: number;
  b_us: number;
  nats_us: number;
  /** Of `b_us`, the kernel's share (system time: socket reads, epoll), idle subtracted. */
  b_sys_us: number;
  /** Of `b_us`, B's main thread (the event loop: the NATS client, the follower, the fold); the rest is V8's and libuv's helper threads. */
  b_main_us: number;
  /** B's read(2) calls per request, idle subtracted: how many event-loop wake-ups its socket costs (several messages share one read). */
  b_reads_per_request: number;
  idle_b_us_per_s: number;
  idle_nats_us_per_s: number;
  /** CHARGES stream messages per request routed (charges, releases or release batches, heartbeats). */
  charges_msgs_per_request: number;
}

export interface FoldLiveConfigResult {
  release_batch_ms: number;
  rps: number;
  /** B's CPU per request A routed, idle subtracted: the fold cost of one foreign request. */
  fold_cpu_us_per_foreign_request: number;
  /** nats-server's CPU per request A routed, idle subtracted. */
  nats_us_per_request: number;
  /** A's own CPU per request it routed (routing plus publishing), idle subtracted. */
  router_us_per_request: number;
  /** B / A: what folding a request costs relative to routing it. */
  fold_to_route_ratio: number;
  charges_msgs_per_request: number;
  /** Of the fold cost, B's main thread (medians, like the rest). */
  fold_main_thread_us: number;
  b_reads_per_request: number;
  rounds: FoldLiveRound[];
}

export interface FoldLiveResult {
  bench: "fold-live";
  concurrency: number;
  /** Of the last setting of `releaseBatchMs` (the default: 5 ms, the gateway's default). */
  fold_cpu_us_per_foreign_request: number;
  nats_us_per_request: number;
  /** Last setting's fold cost over the first's (batching vs none, by default), measured side by side. */
  fold_ratio_last_to_first?: number;
  results: FoldLiveConfigResult[];
}

const MODEL = "bench/fold-live";
const PODS = 4;
const progress = (line: string) => process.stderr.write(`[fold-live] ${line}\n`);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const round = (x: number, d = 2) => Number(x.toFixed(d));

/** Linux clock ticks per second for /proc/<pid>/stat (USER_HZ; 100 on every mainstream kernel). */
const TICK_US = 10_000;

/** CPU time (user + system, µs) a process has used so far. */
function cpuOf(pid: number): number {
  return userSys(pid).reduce((a, b) => a + b, 0);
}

/** [user, system] CPU time (µs) of a process, every thread; or of one thread (`/proc/<pid>/task/<tid>/stat`). */
function userSys(pid: number, tid?: number): [number, number] {
  const stat = readFileSync(tid === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${tid}/stat`, "utf8");
  // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return [Number(fields[11]) * TICK_US, Number(fields[12]) * TICK_US];
}

/** read(2)-family calls a process has made so far (`syscr` of /proc/<pid>/io; 0 where the file is unreadable). */
function readsOf(pid: number): number {
  try {
    const m = /^syscr: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, "utf8"));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

function pidOf(p: { pid?: number }, what: string): number {
  if (p.pid === undefined) throw new Error(`${what} has no pid`);
  return p.pid;
}

interface GatewayProc {
  pid: number;
  port: number;
  adminPort: number;
  stop(): Promise<void>;
}

/**
 * A gateway child process. Spawned here rather than with `spawnJetroute` because a profile needs
 * node flags (`--cpu-prof` is refused in NODE_OPTIONS).
 */
async function gateway(id: string, natsUrl: string, heartbeatMs: number, releaseBatchMs: number, profileDir?: string): Promise<GatewayProc> {
  const args = ["gateway", "--release-batch-ms", String(releaseBatchMs), "--nats", natsUrl, "--id", id, "--port", "0", "--admin-port", "0", "--host", "127.0.0.1", "--heartbeat-ms", String(heartbeatMs), "--strategy", "least-request", "--consistency", "eventual", "--no-snapshots"];
  const proc = spawn(process.execPath, [...(profileDir ? ["--cpu-prof", `--cpu-prof-dir=${profileDir}`] : []), cliPath(), ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, JETROUTE_LOG_LEVEL: "warn" },
  });
  let stderr = "";
  proc.stderr?.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  const stop = async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill("SIGTERM");
    const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(t);
  };
  try {
    const line = await new Promise<{ port: number; adminPort: number }>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`${id}: no port line within 30 s; stderr: ${stderr}`)), 30_000);
      void exited.then(() => reject(new Error(`${id} exited early; stderr: ${stderr}`)));
      createInterface({ input: proc.stdout as NodeJS.ReadableStream }).on("line", (l) => {
        try {
          const v = JSON.parse(l) as { port?: unknown; adminPort?: unknown };
          if (typeof v.port === "number" && typeof v.adminPort === "number") {
            clearTimeout(t);
            resolve({ port: v.port, adminPort: v.adminPort });
          }
        } catch {
          /* not a JSON line */
        }
      });
    });
    return { pid: pidOf(proc, id), ...line, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

async function waitFor(what: string, ok: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await ok())) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

interface Cell {
  rounds: FoldLiveRound[];
}

/** One idle window and one loaded window on a fresh pair of replicas (A routes, B folds). */
async function measurePair(natsUrl: string, natsPid: number, h: NatsHandles, s: Subjects, o: Required<Omit<FoldLiveOptions, "profileDir">>, releaseBatchMs: number, profileDir: string | undefined): Promise<FoldLiveRound> {
  const procs: GatewayProc[] = [];
  try {
    const a = await gateway("fold-live-a", natsUrl, o.heartbeatMs, releaseBatchMs);
    procs.push(a);
    const b = await gateway("fold-live-b", natsUrl, o.heartbeatMs, releaseBatchMs, profileDir);
    procs.push(b);
    const state = async (port: number) => (await (await fetch(`http://127.0.0.1:${port}/debug/state`)).json()) as { ready: boolean; pods: unknown[]; ledger: { charges: number; liveGateways: Array<{ gateway: string }> } };
    await waitFor("both replicas ready and aware of each other", async () => {
      const [sa, sb] = await Promise.all([state(a.adminPort), state(b.adminPort)]);
      return sa.ready && sb.ready && sa.pods.length === PODS && sb.pods.length === PODS && sb.ledger.liveGateways.some((g) => g.gateway === "fold-live-a");
    });
    // The main thread's id is the process id.
    const sample = () => {
      const [mu, ms] = userSys(b.pid, b.pid);
      return { t: performance.now(), a: cpuOf(a.pid), b: cpuOf(b.pid), bSys: userSys(b.pid)[1], bMain: mu + ms, bReads: readsOf(b.pid), nats: cpuOf(natsPid) };
    };
    const drive = async (durationMs: number): Promise<ExtProcLoadResult> => {
      const gen = runNode(loadtestScript("extproc-load.js"), ["--target", `127.0.0.1:${a.port}`, "--concurrency", String(o.concurrency), "--duration-ms", String(durationMs), "--warmup-ms", "0", "--model", MODEL]);
      try {
        return (await gen.firstJson) as unknown as ExtProcLoadResult;
      } finally {
        await gen.stop();
      }
    };
    // Warm-up (JIT, connections), then the ledgers drain before the idle window.
    await drive(Math.min(2_000, o.durationMs));
    await waitFor("B's ledger to drain", async () => (await state(b.adminPort)).ledger.charges === 0, 10_000);
    // Idle: both replicas heartbeating and sweeping, nothing routed.
    const i0 = sample();
    await new Promise((res) => setTimeout(res, o.durationMs));
    const i1 = sample();
    const idleS = (i1.t - i0.t) / 1000;
    const idle = { a: (i1.a - i0.a) / idleS, b: (i1.b - i0.b) / idleS, bSys: (i1.bSys - i0.bSys) / idleS, bMain: (i1.bMain - i0.bMain) / idleS, bReads: (i1.bReads - i0.bReads) / idleS, nats: (i1.nats - i0.nats) / idleS };
    const chargesStream = streamName(s.prefix, "CHARGES");
    const m0 = (await h.jsm.streams.info(chargesStream)).state.messages;
    const l0 = sample();
    const res = await drive(o.durationMs);
    const l1 = sample();
    const m1 = (await h.jsm.streams.info(chargesStream)).state.messages;
    if (res.immediate > 0 || res.errors > 0) throw new Error(`A answered ${res.immediate} immediate responses and ${res.errors} errors (first: ${res.firstError ?? "-"}): not a routing run`);
    const loadS = (l1.t - l0.t) / 1000;
    const per = (k: "a" | "b" | "bSys" | "bMain" | "bReads" | "nats") => (l1[k] - l0[k] - idle[k] * loadS) / res.completed;
    return {
      requests: res.completed, rps: Math.round(res.rps), a_us: round(per("a")), b_us: round(per("b")), nats_us: round(per("nats")), b_sys_us: round(per("bSys")), b_main_us: round(per("bMain")),
      b_reads_per_request: round(per("bReads"), 3),
      idle_b_us_per_s: Math.round(idle.b), idle_nats_us_per_s: Math.round(idle.nats), charges_msgs_per_request: round((m1 - m0) / res.completed, 3),
    };
  } finally {
    // B exits on SIGTERM, which is when --cpu-prof writes its profile.
    await Promise.allSettled(procs.map((p) => p.stop()));
  }
}

function summary(releaseBatchMs: number, rounds: FoldLiveRound[]): FoldLiveConfigResult {
  const a_us = median(rounds.map((x) => x.a_us));
  const b_us = median(rounds.map((x) => x.b_us));
  return {
    release_batch_ms: releaseBatchMs,
    rps: median(rounds.map((x) => x.rps)),
    fold_cpu_us_per_foreign_request: b_us,
    nats_us_per_request: median(rounds.map((x) => x.nats_us)),
    router_us_per_request: a_us,
    fold_to_route_ratio: round(b_us / a_us, 3),
    charges_msgs_per_request: median(rounds.map((x) => x.charges_msgs_per_request)),
    fold_main_thread_us: median(rounds.map((x) => x.b_main_us)),
    b_reads_per_request: median(rounds.map((x) => x.b_reads_per_request)),
    rounds,
  };
}

export async function runFoldLiveBench(opts: FoldLiveOptions = {}): Promise<FoldLiveResult> {
  const o = { concurrency: opts.concurrency ?? 32, durationMs: opts.durationMs ?? 5_000, rounds: opts.rounds ?? 3, heartbeatMs: opts.heartbeatMs ?? 1_000, releaseBatchMs: opts.releaseBatchMs ?? [0, 5] };
  const nats = await startNatsServer();
  const h = await connectNats(nats.url, "jetroute-bench-fold-live");
  try {
    await applyStreams(h.nc, h.jsm);
    const s = new Subjects();
    for (let i = 0; i < PODS; i++) {
      await acked(h.js, s.pod(MODEL, `pod-${i}`), { type: "pod", action: "upsert", model: MODEL, pod: `pod-${i}`, address: `127.0.0.1:${19000 + i}`, ready: true, engine: "vllm", ts: Date.now() });
    }
    const cells = new Map<number, Cell>(o.releaseBatchMs.map((ms) => [ms, { rounds: [] }]));
    // Settings alternate within each round, so a busy spell of the machine hits them alike.
    for (let r = 0; r < o.rounds; r++) {
      for (const ms of o.releaseBatchMs) {
        const row = await measurePair(nats.url, pidOf(nats.proc, "nats-server"), h, s, o, ms, r === 0 ? opts.profileDir : undefined);
        (cells.get(ms) as Cell).rounds.push(row);
        progress(`round ${r + 1}, release batch ${ms} ms: ${JSON.stringify(row)}`);
      }
    }
    const results = o.releaseBatchMs.map((ms) => summary(ms, (cells.get(ms) as Cell).rounds));
    const last = results.at(-1) as FoldLiveConfigResult;
    const first = results[0] as FoldLiveConfigResult;
    return {
      bench: "fold-live",
      concurrency: o.concurrency,
      fold_cpu_us_per_foreign_request: last.fold_cpu_us_per_foreign_request,
      nats_us_per_request: last.nats_us_per_request,
      ...(results.length > 1 ? { fold_ratio_last_to_first: round(last.fold_cpu_us_per_foreign_request / first.fold_cpu_us_per_foreign_request, 3) } : {}),
      results,
    };
  } finally {
    await h.nc.close();
    await nats.stop();
  }
}
