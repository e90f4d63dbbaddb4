/**
 * `npm run bench -- scale`: what a gateway replica pays as its pool grows, and what another pool
 * costs it (issue 13, "scale past one fold").
 *
 * One nats-server, two pools (streams/pools.ts): pool `a` with 4 pods of one model, pool `b` with
 * 4 pods of another (published, never contacted: the load generators play Envoy and the engines).
 * For each R in `replicas` (default 1, 2, 4): R replicas of pool a, each driven by its own ext_proc
 * load generator (its own process) paced at the same `rate` req/s, so the fleet's load grows with R
 * and every replica's own load stays fixed; one replica of pool a that routes nothing (the
 * observer: it folds the R replicas' requests and nothing else, as fold-live's B does); one
 * replica of pool b that routes nothing. CPU of every gateway and of nats-server is read from
 * /proc (loadtest/proc-cpu.ts) over a loaded window and an idle window of the same processes; the
 * idle rate (heartbeats, sweeps, timers) is subtracted. Fresh processes per cell; the R settings
 * alternate within each round (rotated from round to round) so that a busy spell of the machine
 * hits them alike; medians over rounds.
 *
 * Per R:
 * - `cpu_us_per_own_request`: a loaded replica's CPU (idle subtracted) per request it routed;
 * - `fold_cpu_us_per_foreign_request`: (a replica's CPU − the same round's R = 1 replica's CPU over
 *   the same length of window, both idle subtracted) / the requests the other R − 1 replicas
 *   completed; null at R = 1 (no foreign request). The R = 1 CPU is taken per second of window, not
 *   per request: at these paced rates a replica's CPU is dominated by per-wake-up costs and barely
 *   follows its own rate, so when a busy host leaves a generator short of its rate, per-second is
 *   the nearer "same own load" (`own_rps_per_replica` shows whether the rate was met);
 * - `observer_fold_us_per_request`: the observer's CPU per request of the pool (the fold measured
 *   directly, no subtraction, on a replica whose loop wakes only for foreign messages: R × rate of
 *   them, where a loaded replica folds (R − 1) × rate between its own);
 * - `observer_wakeups_per_request`, `observer_us_per_wakeup` (and `wakeups_per_own_request`,
 *   `us_per_wakeup` of the loaded replicas): main-thread wake-ups (voluntary context switches, idle
 *   subtracted) per request, and CPU per wake-up — at paced rates the live cost goes by wake-ups;
 * - `other_pool_us_per_request`: pool b's replica's CPU per pool-a request;
 * - `nats_us_per_request`: nats-server's CPU per pool-a request.
 *
 * The fit: least squares of y = c + f·x over the R settings (medians per R), y = a loaded
 * replica's CPU per second (idle subtracted), x = the foreign requests per second it folded
 * ((R − 1) × its peers' rate): the slope f is the capacity model's fold constant at this per-replica
 * rate, c / rate its routing cost r (docs/scaling.md, "Gateway pools"). The headline
 * `other_pool_us_per_request` pools every cell (b's CPU over all of them / all pool-a requests),
 * the most a-requests per unit of noise: b's own idle CPU wanders by a few ms per window.
 */
import os from "node:os";
import { Kvm } from "@nats-io/kv";
import { POOL_KEY_PREFIX } from "../../schemas/config.js";
import { StreamFollower } from "../../services/shared/follower.js";
import { createLogger } from "../../services/shared/log.js";
import { DEFAULT_FOLD_PACE_MS } from "../../services/gateway/config.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import { applyStreams } from "../../streams/apply.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { STREAM_EVENT_TYPES } from "../../streams/event-types.js";
import { GatewayState } from "../../services/views/gateway-state.js";
import { namespaceOf } from "../../streams/pools.js";
import { DEFAULT_PREFIX, Subjects } from "../../streams/subjects.js";
import { generatorScript, runNode } from "../child.js";
import type { ExtProcLoadResult } from "../extproc-load.js";
import { busyFraction, hostCpu, loadAverage1m, mainThreadCpuUs, mainThreadWakeups, processCpuUs } from "../proc-cpu.js";
import { hostPinningPlan, pinningSummary, setAffinity, withPinning } from "../pinning.js";

export interface ScaleOptions {
  /** Replica counts of pool a (default 1, 2, 4). */
  replicas?: number[];
  /** Requests per second offered to each replica of pool a (paced). */
  rate?: number;
  /** Streams in flight per generator, at most. */
  concurrency?: number;
  /** Length of each loaded and each idle window. */
  durationMs?: number;
  rounds?: number;
  heartbeatMs?: number;
  /** The gateways' `--release-batch-ms` (default 0, the gateway's default). */
  releaseBatchMs?: number;
  /** The gateways' `--fold-pace-ms` (absent: the gateway's default). */
  foldPaceMs?: number;
  /** Write V8 CPU profiles of the observer (node --cpu-prof, first round) into this directory. */
  profileDir?: string;
  /** After the rounds, one R = 1 cell with the gateways pinned to their own CPU (default true; loadtest/pinning.ts). */
  pinned?: boolean;
}

/** What a round and a result row (its rounds' medians) both report. */
interface ScaleFigures {
  replicas: number;
  fold_cpu_us_per_foreign_request: number | null;
  cpu_us_per_own_request: number;
  /** A loaded replica's CPU per second of window (mean over the loaded replicas), idle subtracted: the fit's y. */
  cpu_us_per_s: number;
  observer_fold_us_per_request: number;
  /**
   * The bulk fold of the same loaded window: the CHARGES messages the observer folded live, read
   * afterwards in one catch-up by this process (the same follower and fold, every message already
   * stored), CPU per pool request; and the observer's live figure over it.
   */
  bulk_fold_us_per_request: number;
  observer_live_over_bulk: number;
  /** The observer's main-thread wake-ups (voluntary context switches, idle subtracted) per pool request, and its CPU per wake-up. */
  observer_wakeups_per_request: number;
  observer_us_per_wakeup: number;
  /** The same for the loaded replicas, per request they routed. */
  wakeups_per_own_request: number;
  us_per_wakeup: number;
  other_pool_us_per_request: number;
  nats_us_per_request: number;
  host_busy_fraction: number;
}

export interface ScaleRound extends ScaleFigures {
  /** Per loaded replica: requests it completed in the window. */
  own: number[];
  /** Per loaded replica: CPU µs over the window, idle subtracted. */
  cpu_us: number[];
  /** Per loaded replica: CPU in the loaded window, idle included, in cores. */
  cores: number[];
  /** Per loaded replica (mean): requests per second it routed, and its peers' it folded. */
  own_rps: number;
  foreign_rps: number;
  /** Excess CPU µs (idle subtracted) of pool b's replica and nats-server, for the pooled figures. */
  b_excess_us: number;
  requests: number;
  /** The latest a generator began its window after the common start (start-up on a busy host). */
  start_late_ms: number;
  generator_cpu_pct: number;
  /** The loaded replicas' main thread (the event loop) alone, per own request, idle subtracted. */
  main_cpu_us_per_own_request: number;
  /** The loaded replicas' longest CPU run of the main thread between two 1 ms ticks (pinned cell only: JETROUTE_LOOP_CPU_PROBE). */
  max_own_loop_block_ms?: number;
}

/** `fold_cpu_us_per_foreign_request` is null at R = 1: a lone replica folds no foreign request. */
export interface ScaleResultRow extends ScaleFigures {
  /** A loaded replica's CPU in cores, idle included (median of the replicas' mean). */
  cores_per_replica: number;
  /** Requests per second a loaded replica routed. */
  own_rps_per_replica: number;
  /** Requests per second of the other replicas a loaded replica folded. */
  foreign_rps_per_replica: number;
  rounds: ScaleRound[];
}

export interface ScaleFit {
  /** The intercept (CPU per second at no foreign load) over the replicas' own rate: r. */
  router_us_per_request: number;
  /** The slope: a replica's CPU per request another replica of its pool routed (f). */
  fold_cpu_us_per_foreign_request: number;
  /** The points fitted (medians per R): x = foreign requests per second, y = CPU µs per second. */
  points: Array<{ replicas: number; x: number; y: number }>;
}

export interface ScaleResult {
  bench: "scale";
  results: ScaleResultRow[];
  /** Pool b's replica: CPU per pool-a request, all cells pooled (idle subtracted). Target ≤ 1 µs. */
  other_pool_us_per_request: number;
  fit: ScaleFit;
  /** The observer's fold per pool request, median over the R settings: the fold measured directly. */
  observer_fold_us_per_request: number;
  /**
   * One R = 1 cell with every gateway process (the loaded replica, the observer, pool b's) on the
   * gateway CPU and the generators and nats-server on the others: the replica's own cost per request.
   */
  pinned?: {
    gateway_main_cpu_ms_per_request: number;
    gateway_cpu_ms_per_request: number;
    max_own_loop_block_ms: number;
    observer_fold_us_per_request: number;
    other_pool_us_per_request: number;
    own_rps: number;
    host_busy_fraction: number;
  };
  pinning: { gateway_cpus: string; other_cpus: string } | { note: string };
  /**
   * `saturated`: some loaded window had the host's cores more than 90 % busy (every process
   * counted, other tenants too); `min_rate_fraction`: the lowest own rate a loaded replica reached,
   * over the offered `rate` (below ~0.9 the generators, not the offered load, set the pace).
   */
  host: { cores: number; load_average_start: number; load_average_end: number; max_busy_fraction: number; saturated: boolean; min_rate_fraction: number };
  options: Opts;
}

type Opts = Required<Omit<ScaleOptions, "foldPaceMs" | "profileDir">> & Pick<ScaleOptions, "foldPaceMs" | "profileDir">;

/** A pinned cell: each gateway moved to the gateway CPU once spawned, and its loop probe on. */
interface CellPinning {
  pin(pid: number): void;
}

const MODEL_A = "bench/scale-a";
const MODEL_B = "bench/scale-b";
const PODS = 4;
/** Above this busy fraction of all cores during a loaded window, the host is called saturated. */
const SATURATED = 0.9;
const progress = (line: string) => process.stderr.write(`[scale] ${line}\n`);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const round = (x: number, d = 2) => Number(x.toFixed(d));
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);


interface DebugState {
  ready: boolean;
  pods: unknown[];
  ledger: { charges: number; liveGateways: Array<{ gateway: string }> };
}

interface Gateway {
  id: string;
  pid: number;
  port: number;
  state(): Promise<DebugState>;
  metrics(): Promise<string>;
  stop(): Promise<void>;
}

async function gateway(id: string, pool: string, natsUrl: string, o: Opts, profileDir?: string, pinning?: CellPinning): Promise<Gateway> {
  const proc: ServiceProcess = spawnJetroute(
    id,
    [
      "gateway", "--pool", pool, "--nats", natsUrl, "--id", id, "--port", "0", "--admin-port", "0", "--host", "127.0.0.1", "--heartbeat-ms", String(o.heartbeatMs),
      "--release-batch-ms", String(o.releaseBatchMs), "--strategy", "least-request", "--consistency", "eventual", "--no-snapshots",
      // The gateway refuses a pace at or above the rate guard's window (25 ms): widen it for long paces (no limits here).
      ...(o.foldPaceMs !== undefined ? ["--fold-pace-ms", String(o.foldPaceMs), ...(o.foldPaceMs >= 25 ? ["--rate-confirm-ms", String(o.foldPaceMs + 25)] : [])] : []),
    ],
    { env: { JETROUTE_LOG_LEVEL: "warn", ...(pinning ? { JETROUTE_LOOP_CPU_PROBE: "1" } : {}) }, ...(profileDir ? { nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${profileDir}`] } : {}) },
  );
  try {
    if (pinning && proc.proc.pid !== undefined) pinning.pin(proc.proc.pid);
    const line = await proc.waitForLine<{ port: number; adminPort: number }>((v) => typeof v.port === "number" && typeof v.adminPort === "number", 30_000);
    if (proc.proc.pid === undefined) throw new Error(`${id} has no pid`);
    const url = `http://127.0.0.1:${line.adminPort}/debug/state`;
    const metrics = async () => await (await fetch(`http://127.0.0.1:${line.adminPort}/metrics`)).text();
    return { id, pid: proc.proc.pid, port: line.port, state: async () => (await (await fetch(url)).json()) as DebugState, metrics, stop: () => proc.stop() };
  } catch (err) {
    await proc.stop();
    throw err;
  }
}

async function waitFor(what: string, ok: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await ok())) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** One cell: fresh processes, an idle window, a loaded window, an idle window. `r1` is the same round's R = 1 replica's CPU per second (µs/s, idle subtracted). */
/**
 * The bulk fold: CHARGES messages `fromSeq` .. `toSeq` (all stored) folded in one catch-up by this
 * process — the gateway's follower, reading as the gateway does (`paceMs`: paced batches, which
 * back to back when the messages are stored; 0: the client's ordered consumer), into a fresh
 * GatewayState that knows the pods. CPU µs from the first message to the last, the least of two
 * timed passes after an untimed one (code warm-up; this process is otherwise idle).
 */
export async function bulkFoldUs(h: NatsHandles, prefix: string, fromSeq: number, toSeq: number, paceMs: number): Promise<number> {
  const subjects = new Subjects(prefix);
  const log = createLogger("scale-bulk", "error");
  const cpu = () => {
    const c = process.cpuUsage();
    return c.user + c.system;
  };
  const timed: number[] = [];
  for (let pass = 0; pass < 3; pass++) {
    const state = new GatewayState({ self: "scale-bulk" });
    const pods = new StreamFollower({
      nats: h, subjects, log, name: "scale-bulk-pods", family: "pods", types: STREAM_EVENT_TYPES.PODS, stream: streamName(prefix, "PODS"), startAt: { kind: "last-per-subject" },
      onEvent: (ev, m) => state.apply(ev, { stream: "pods", ...m }),
    });
    await pods.start();
    await pods.whenCaughtUp();
    await pods.stop();
    let done: () => void = () => undefined;
    const finished = new Promise<void>((r) => {
      done = r;
    });
    let t0 = 0;
    let t1 = 0;
    const charges = new StreamFollower({
      nats: h, subjects, log, name: "scale-bulk-charges", family: "charges", types: STREAM_EVENT_TYPES.CHARGES, stream: streamName(prefix, "CHARGES"),
      startAt: { kind: "sequence", seq: fromSeq + 1 }, paceMs,
      onEvent: (ev, m) => state.apply(ev, { stream: "charges", ...m }),
      onMessage: (subject, seq) => {
        if (t0 === 0) t0 = cpu();
        state.skip({ stream: "charges", subject, seq, serverTs: 0 });
        // The last message's own fold is left out, as the first's before t0 is in: n - 1 folds.
        if (seq >= toSeq && t1 === 0) {
          t1 = cpu();
          done();
        }
      },
    });
    await charges.start();
    await finished;
    await charges.stop();
    if (pass > 0) timed.push(t1 - t0);
  }
  return Math.min(...timed);
}

async function measureCell(natsUrl: string, natsPid: number, h: NatsHandles, R: number, o: Opts, r1: number | undefined, profileDir?: string, pinning?: CellPinning): Promise<ScaleRound> {
  const gws: Gateway[] = [];
  try {
    const started = await Promise.allSettled([
      ...Array.from({ length: R }, (_, i) => gateway(`scale-a${i}`, "a", natsUrl, o, undefined, pinning)),
      gateway("scale-a-observer", "a", natsUrl, o, profileDir, pinning),
      gateway("scale-b", "b", natsUrl, o, undefined, pinning),
    ]);
    for (const s of started) if (s.status === "fulfilled") gws.push(s.value);
    const failed = started.find((s) => s.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
    const loaded = gws.slice(0, R);
    const observer = gws[R] as Gateway;
    const poolA = [...loaded, observer];
    await waitFor("every replica ready, pool a's replicas aware of each other", async () => {
      const states = await Promise.all(gws.map((g) => g.state()));
      return states.every((s, i) => {
        if (!s.ready || s.pods.length !== PODS) return false;
        if (i > R) return true;
        const live = new Set(s.ledger.liveGateways.map((g) => g.gateway));
        return poolA.every((g) => g === gws[i] || live.has(g.id));
      });
    });
    const generators = (durationMs: number, startAt?: number) =>
      loaded.map((g) =>
        runNode(generatorScript(), [
          "--target", `127.0.0.1:${g.port}`, "--rate", String(o.rate), "--concurrency", String(o.concurrency), "--duration-ms", String(durationMs), "--warmup-ms", "0", "--model", MODEL_A,
          ...(startAt !== undefined ? ["--start-at", String(startAt)] : []),
        ]),
      );
    const results = async (gens: ReturnType<typeof generators>): Promise<ExtProcLoadResult[]> => {
      try {
        return (await Promise.all(gens.map((g) => g.firstJson))) as unknown as ExtProcLoadResult[];
      } finally {
        await Promise.allSettled(gens.map((g) => g.stop()));
      }
    };
    // Warm-up (JIT, connections), then every pool-a ledger drains before the idle window. What
    // the warm-up took beyond its window is how long a generator needs to start (and stop) on
    // this host now: the measured window's generators get twice that to start before it opens.
    const warmMs = Math.min(2_000, o.durationMs);
    const warmStart = performance.now();
    await results(generators(warmMs));
    const generatorStartMs = Math.max(0, Math.ceil(performance.now() - warmStart - warmMs));
    await waitFor("pool a's ledgers to drain", async () => (await Promise.all(poolA.map((g) => g.state()))).every((s) => s.ledger.charges === 0), 10_000);
    const pids = [...gws.map((g) => g.pid), natsPid];
    const sample = () => ({ t: performance.now(), cpu: pids.map(processCpuUs), main: pids.map(mainThreadCpuUs), wake: pids.map(mainThreadWakeups), host: hostCpu() });
    const until = (epochMs: number) => new Promise((r) => setTimeout(r, Math.max(0, epochMs - Date.now())));
    // Idle window: every replica heartbeating and sweeping, nothing routed, while the generators
    // start up; they all begin at its end (`--start-at`), so the loaded window is sampled exactly.
    // At least the window's length; longer when generators start slowly (a saturated host: at
    // load ~11 a generator started more than 3 s late and its 1.5 s window routed nothing).
    const i0 = sample();
    const startAt = Date.now() + Math.max(o.durationMs, 2 * generatorStartMs + 250);
    const gens = generators(o.durationMs, startAt);
    await until(startAt);
    // A scrape resets the loop probe's maxima (pinned cell): the loaded window's is read at its end.
    if (pinning) await Promise.all(loaded.map((g) => g.metrics()));
    const i1 = sample();
    const chargesA = streamName(namespaceOf(DEFAULT_PREFIX, "a").prefix, "CHARGES");
    const seqAt = async () => (await h.jsm.streams.info(chargesA)).state.last_seq;
    const fromSeq = await seqAt();
    await until(startAt + o.durationMs);
    const l1 = sample();
    const loopBlockMs = pinning ? Math.max(...(await Promise.all(loaded.map((g) => g.metrics()))).map((t) => 1000 * Number(/^jetroute_gateway_loop_block_cpu_max_seconds(?:\{[^}]*\})? (\S+)$/m.exec(t)?.[1] ?? Number.NaN))) : undefined;
    const toSeq = await seqAt();
    const res = await results(gens);
    const l0 = i1;
    // A second idle window after the load, once the ledgers drain: the idle rate is the mean of the
    // two, so a trend (start-up work fading, a late idle-time GC) does not land on the loaded window.
    await waitFor("pool a's ledgers to drain", async () => (await Promise.all(poolA.map((g) => g.state()))).every((s) => s.ledger.charges === 0), 10_000);
    const j0 = sample();
    await new Promise((r) => setTimeout(r, o.durationMs));
    const j1 = sample();
    const idleRate = pids.map((_, k) => ((i1.cpu[k] as number) - (i0.cpu[k] as number) + (j1.cpu[k] as number) - (j0.cpu[k] as number)) / (i1.t - i0.t + j1.t - j0.t));
    const idleMainRate = pids.map((_, k) => ((i1.main[k] as number) - (i0.main[k] as number) + (j1.main[k] as number) - (j0.main[k] as number)) / (i1.t - i0.t + j1.t - j0.t));
    const idleWakeRate = pids.map((_, k) => ((i1.wake[k] as number) - (i0.wake[k] as number) + (j1.wake[k] as number) - (j0.wake[k] as number)) / (i1.t - i0.t + j1.t - j0.t));
    for (const [i, x] of res.entries()) {
      if (x.immediate > 0 || x.errors > 0) throw new Error(`scale-a${i} answered ${x.immediate} immediate responses and ${x.errors} errors (first: ${x.firstError ?? "-"}): not a routing run`);
    }
    const startLateMs = Math.max(...res.map((x) => x.startLateMs ?? 0));
    const wallMs = l1.t - l0.t;
    const used = pids.map((_, k) => (l1.cpu[k] as number) - (l0.cpu[k] as number));
    const excess = used.map((u, k) => u - (idleRate[k] as number) * wallMs);
    const wakeExcess = pids.map((_, k) => (l1.wake[k] as number) - (l0.wake[k] as number) - (idleWakeRate[k] as number) * wallMs);
    const own = res.map((x) => x.completed);
    const requests = sum(own);
    const cpu = excess.slice(0, R);
    const perOwn = sum(cpu) / requests;
    const perSecond = sum(cpu) / R / (wallMs / 1000);
    // A replica's own routing is what the same round's R = 1 replica spent over as long a window; the rest is the fold.
    const foreign = own.map((n) => requests - n);
    const fold = R > 1 && r1 !== undefined ? ((perSecond - r1) * R * (wallMs / 1000)) / sum(foreign) : null;
    const bExcess = excess[R + 1] as number;
    const bulkUs = await bulkFoldUs(h, namespaceOf(DEFAULT_PREFIX, "a").prefix, fromSeq, toSeq, o.foldPaceMs ?? DEFAULT_FOLD_PACE_MS);
    const observerPerRequest = (excess[R] as number) / requests;
    return {
      replicas: R,
      own,
      cpu_us: cpu.map((x) => Math.round(x)),
      cores: used.slice(0, R).map((u) => round(u / (wallMs * 1000), 3)),
      cpu_us_per_own_request: round(perOwn),
      cpu_us_per_s: Math.round(perSecond),
      own_rps: round(requests / R / (o.durationMs / 1000), 1),
      foreign_rps: round((sum(foreign) / R) / (o.durationMs / 1000), 1),
      fold_cpu_us_per_foreign_request: fold === null ? null : round(fold),
      observer_fold_us_per_request: round(observerPerRequest),
      bulk_fold_us_per_request: round(bulkUs / requests),
      observer_live_over_bulk: round(observerPerRequest / (bulkUs / requests)),
      observer_wakeups_per_request: round((wakeExcess[R] as number) / requests, 3),
      // Per wake-up only where wake-ups rose over idle (a saturated host's processes never sleep).
      observer_us_per_wakeup: (wakeExcess[R] as number) > 0 ? round((excess[R] as number) / (wakeExcess[R] as number), 1) : Number.NaN,
      wakeups_per_own_request: round(sum(wakeExcess.slice(0, R)) / requests, 3),
      us_per_wakeup: sum(wakeExcess.slice(0, R)) > 0 ? round(sum(cpu) / sum(wakeExcess.slice(0, R)), 1) : Number.NaN,
      other_pool_us_per_request: round(bExcess / requests, 3),
      nats_us_per_request: round((excess[R + 2] as number) / requests),
      b_excess_us: Math.round(bExcess),
      requests,
      host_busy_fraction: round(busyFraction(l0.host, l1.host), 3),
      start_late_ms: Math.round(startLateMs),
      generator_cpu_pct: round(median(res.map((x) => x.generatorCpuPct)), 1),
      main_cpu_us_per_own_request: round(sum(pids.slice(0, R).map((_, k) => (l1.main[k] as number) - (l0.main[k] as number) - (idleMainRate[k] as number) * wallMs)) / requests),
      ...(loopBlockMs !== undefined ? { max_own_loop_block_ms: round(loopBlockMs, 3) } : {}),
    };
  } finally {
    await Promise.allSettled(gws.map((g) => g.stop()));
  }
}

/** Least squares of y = a + b·x. */
export function fitLine(points: Array<{ x: number; y: number }>): { intercept: number; slope: number } {
  const n = points.length;
  const mx = sum(points.map((p) => p.x)) / n;
  const my = sum(points.map((p) => p.y)) / n;
  const sxx = sum(points.map((p) => (p.x - mx) ** 2));
  if (n < 2 || sxx === 0) throw new Error("a line needs points at two or more distinct x");
  const slope = sum(points.map((p) => (p.x - mx) * (p.y - my))) / sxx;
  return { intercept: my - slope * mx, slope };
}

function row(R: number, rounds: ScaleRound[]): ScaleResultRow {
  const folds = rounds.map((x) => x.fold_cpu_us_per_foreign_request).filter((x): x is number => x !== null);
  const ownRps = median(rounds.map((x) => x.own_rps));
  return {
    replicas: R,
    fold_cpu_us_per_foreign_request: folds.length > 0 ? median(folds) : null,
    cpu_us_per_own_request: median(rounds.map((x) => x.cpu_us_per_own_request)),
    cpu_us_per_s: median(rounds.map((x) => x.cpu_us_per_s)),
    cores_per_replica: median(rounds.map((x) => round(sum(x.cores) / R, 3))),
    own_rps_per_replica: Math.round(ownRps),
    foreign_rps_per_replica: Math.round(median(rounds.map((x) => x.foreign_rps))),
    observer_fold_us_per_request: median(rounds.map((x) => x.observer_fold_us_per_request)),
    bulk_fold_us_per_request: median(rounds.map((x) => x.bulk_fold_us_per_request)),
    observer_live_over_bulk: median(rounds.map((x) => x.observer_live_over_bulk)),
    observer_wakeups_per_request: median(rounds.map((x) => x.observer_wakeups_per_request)),
    observer_us_per_wakeup: median(rounds.map((x) => x.observer_us_per_wakeup)),
    wakeups_per_own_request: median(rounds.map((x) => x.wakeups_per_own_request)),
    us_per_wakeup: median(rounds.map((x) => x.us_per_wakeup)),
    other_pool_us_per_request: median(rounds.map((x) => x.other_pool_us_per_request)),
    nats_us_per_request: median(rounds.map((x) => x.nats_us_per_request)),
    host_busy_fraction: median(rounds.map((x) => x.host_busy_fraction)),
    rounds,
  };
}

export async function runScaleBench(opts: ScaleOptions = {}): Promise<ScaleResult> {
  const o: Opts = {
    replicas: opts.replicas ?? [1, 2, 4], rate: opts.rate ?? 300, concurrency: opts.concurrency ?? 32, durationMs: opts.durationMs ?? 5_000,
    rounds: opts.rounds ?? 3, heartbeatMs: opts.heartbeatMs ?? 1_000, releaseBatchMs: opts.releaseBatchMs ?? 0, pinned: opts.pinned ?? true,
    ...(opts.foldPaceMs !== undefined ? { foldPaceMs: opts.foldPaceMs } : {}), ...(opts.profileDir !== undefined ? { profileDir: opts.profileDir } : {}),
  };
  if (!o.replicas.includes(1)) throw new Error("scale: the replica counts must include 1 (the routing cost the fold is measured against)");
  if (new Set(o.replicas).size < 2) throw new Error("scale: give two or more distinct replica counts (the fit needs them)");
  const loadStart = loadAverage1m();
  const nats = await startNatsServer();
  const h = await connectNats(nats.url, "jetroute-bench-scale");
  try {
    const natsPid = nats.proc.pid;
    if (natsPid === undefined) throw new Error("nats-server has no pid");
    const kv = await new Kvm(h.nc).open(configBucketName(DEFAULT_PREFIX));
    for (const [pool, model] of [["a", MODEL_A], ["b", MODEL_B]] as const) {
      const ns = namespaceOf(DEFAULT_PREFIX, pool);
      await applyStreams(h.nc, h.jsm, { prefix: ns.prefix, configPrefix: ns.configPrefix });
      // As `jetroute config set-pool <pool> --models <model>` writes it.
      await kv.put(`${POOL_KEY_PREFIX}${pool}`, JSON.stringify({ models: [model] }));
      const s = new Subjects(ns.prefix);
      for (let i = 0; i < PODS; i++) {
        await acked(h.js, s.pod(model, `${pool}-pod-${i}`), { type: "pod", action: "upsert", model, pod: `${pool}-pod-${i}`, address: `127.0.0.1:${19000 + i}`, ready: true, engine: "vllm", ts: Date.now() });
      }
    }
    const cells = new Map<number, ScaleRound[]>(o.replicas.map((R) => [R, []]));
    const order = [...o.replicas].sort((a, b) => a - b);
    for (let r = 0; r < o.rounds; r++) {
      // R = 1 first in every round (the others subtract its routing cost); the rest rotate.
      const rest = order.filter((R) => R !== 1);
      const rotated = [...rest.slice(r % rest.length), ...rest.slice(0, r % rest.length)];
      let r1: number | undefined;
      for (const R of [1, ...rotated]) {
        const profileDir = o.profileDir !== undefined && r === 0 ? `${o.profileDir}/observer-r${R}` : undefined;
        const cell = await measureCell(nats.url, natsPid, h, R, o, r1, profileDir);
        if (R === 1) r1 = cell.cpu_us_per_s;
        (cells.get(R) as ScaleRound[]).push(cell);
        progress(`round ${r + 1}, R = ${R}: ${JSON.stringify(cell)}`);
      }
    }
    const plan = hostPinningPlan();
    let pinned: ScaleResult["pinned"];
    if (o.pinned && plan.available) {
      progress(`pinned: R = 1, every gateway on CPU ${plan.gatewayCpus}, generators and nats-server on CPU ${plan.otherCpus}`);
      setAffinity(natsPid, plan.otherCpus);
      try {
        const c = await withPinning(plan, (pin) => measureCell(nats.url, natsPid, h, 1, o, undefined, undefined, { pin }));
        progress(`pinned: ${JSON.stringify(c)}`);
        pinned = {
          gateway_main_cpu_ms_per_request: round(c.main_cpu_us_per_own_request / 1000, 4),
          gateway_cpu_ms_per_request: round(c.cpu_us_per_own_request / 1000, 4),
          max_own_loop_block_ms: c.max_own_loop_block_ms ?? Number.NaN,
          observer_fold_us_per_request: c.observer_fold_us_per_request,
          other_pool_us_per_request: c.other_pool_us_per_request,
          own_rps: c.own_rps,
          host_busy_fraction: c.host_busy_fraction,
        };
      } finally {
        setAffinity(natsPid, plan.allCpus);
      }
    } else if (o.pinned) progress(`not pinned: ${plan.note}`);
    const results = order.map((R) => row(R, cells.get(R) as ScaleRound[]));
    const points = results.map((x) => ({ replicas: x.replicas, x: x.foreign_rps_per_replica, y: x.cpu_us_per_s }));
    const line = fitLine(points);
    const ownRps = median(results.map((x) => x.own_rps_per_replica));
    const all = results.flatMap((x) => x.rounds);
    const maxBusy = Math.max(...all.map((c) => c.host_busy_fraction));
    return {
      bench: "scale",
      results,
      other_pool_us_per_request: round(sum(all.map((c) => c.b_excess_us)) / sum(all.map((c) => c.requests)), 3),
      fit: { router_us_per_request: round(line.intercept / ownRps), fold_cpu_us_per_foreign_request: round(line.slope), points },
      observer_fold_us_per_request: median(results.map((x) => x.observer_fold_us_per_request)),
      ...(pinned ? { pinned } : {}),
      pinning: o.pinned ? pinningSummary(plan) : { note: "pinned run not asked (--no-pinned)" },
      host: {
        cores: os.availableParallelism(), load_average_start: loadStart, load_average_end: loadAverage1m(), max_busy_fraction: maxBusy, saturated: maxBusy > SATURATED,
        min_rate_fraction: round(Math.min(...all.map((c) => c.own_rps)) / o.rate, 3),
      },
      options: o,
    };
  } finally {
    await h.nc.close();
    await nats.stop();
  }
}
