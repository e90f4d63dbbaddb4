/**
 * `node --expose-gc dist/loadtest/bench.js flow`: fleet-wide flow control (issue 19) on simulated
 * pods driven to about 2x their capacity. The whole system as prefix-quality assembles it, each
 * piece its own process: nats-server, `jetroute sim`, pod-watcher, metrics-scraper, N gateway
 * replicas (least-request), the dev front round-robining over them. This process only plays the
 * clients and reads the decision records afterwards.
 *
 * Five runs, each on a fresh assembly, with the same seeded schedule (loadtest/workloads/flow-mix.ts):
 *   off       3 replicas, no `flowControl` in the model config (no flow control; FCFS pods);
 *   on        3 replicas, `flowControl` set before the gateways start (interactive priority 10,
 *             batch priority 0, least-attained fairness, a queue TTL far beyond the run), and
 *             engine priority (issue 36): the pods run `--scheduling-policy priority`, so the
 *             gateways write each request's priority into its body and admit per band;
 *   on-fcfs   the `on` run with FCFS pods: flow control at the gateways only (engine priority off);
 *   on-1      the `on` run with 1 replica;
 *   unloaded  the `on` run given only the schedule's interactive requests, at their own times: the
 *             same requests on an idle fleet, the reference for the interactive TTFT.
 * Every request carries `x-jetroute-objective` and `user` in every run: only the config differs.
 * The model config is written straight into the config bucket (see `writeModelConfig`); when the
 * build's schema refuses `flowControl`, the gateways ignore it, the "on" runs route as "off", and
 * the result says so (`flow_control_supported: false`, `config_rejected_by` per run).
 *
 * Load: 20 % interactive (short prompts, small max_tokens, streamed; TTFT is taken at the client
 * at the first SSE chunk carrying content), 80 % batch (long prompts, not streamed) from two
 * tenants whose demand differs 10:1. Open loop: Poisson arrivals over the window, whatever the
 * system does. After the window the bench waits for every interactive request to finish, then
 * cancels the batch requests still waiting or running (with flow control that ends a run at once;
 * without it the interactive requests sit behind the whole backlog in the engines' queues, so that
 * wait is the drain: about as long as the window at 2x). With the defaults (40 s window) a run
 * without flow control takes ~90 s, one with it ~50 s, the CPU comparison ~40 s.
 *
 * Capacity, from the simulator's timing model (services/sim/engine.ts): a step costs
 * decodeMsPerStep x (1 + decodeBatchSlope x (d - 1)) for d decoding requests plus prefillMsPerToken
 * per prefill token. A saturated pod keeps B = min(maxBatch, KV tokens / mean tokens per request)
 * requests running, so a request costs its prompt in prefill (P x prefillMsPerToken) plus 1/B of
 * each of its M decode steps; prompts are unique (no prefix-cache hits). Capacity (wall requests/s)
 * = pods x timeScale x 1000 / mean engine ms per request over the schedule's mix, with P counted by
 * the simulator's own tokenizer. `--load` multiplies it into the arrival rate. The off run also
 * measures it (successful completions per second over the second half of the window, when the
 * engines are saturated): `capacity_measured_rps` says how far the model is off.
 *
 * Figures:
 * - interactive TTFT p99 (client wall ms) of the interactive requests that got an answer; the ones
 *   that did not are counted (`interactive_failed`), never folded into the percentile;
 * - Jain's index over the two batch tenants, J = (Σx)² / (n Σx²), on their throughput within the
 *   window normalized by their max-min fair share: the batch completions the window delivered,
 *   water-filled over the tenants' offered requests (a tenant asking less than an equal share is
 *   owed all it asked). Normalizing by the offered load instead (x = completed / offered) rates a
 *   FIFO that serves both tenants in proportion to their demand as perfectly fair (J ≈ 1) and fair
 *   queueing, which serves the small tenant in full, as unfair; that variant is reported too
 *   (`jain_fairness_offered`);
 * - expired (429 `queue_timeout`) and dropped (429 `queue_full`), counted from client answers;
 * - priority inversions / dispatches, from the DECISIONS stream read after the run: a dispatch of
 *   band B at t is an inversion when a request of a higher band of the same model, enqueued before
 *   t - 250 ms, was still held anywhere at t (both comparisons strict). Held intervals come from
 *   the records' `flow` ({band, enqueuedAt, waitMs}: held over [enqueuedAt, enqueuedAt + waitMs]),
 *   from rejection records with `flow`, and for requests without any record from the client's own
 *   send and end times. A record without `flow` is a dispatch of its objective's band that did not
 *   wait (so without flow control nothing is ever held at a gateway and the figure is 0 by
 *   construction: the reordering that is missing shows in the TTFT);
 * - gateway CPU per request, unsaturated: after the `on` run, on the same assembly, open-loop load
 *   of short requests only (both objectives, interactive-sized) at `--cpu-load` x their modelled
 *   capacity while the config alternates off/on every phase; CPU of the gateway processes (every
 *   thread, /proc) over each phase's measured part / requests sent in it.
 */
import http from "node:http";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { DeliverPolicy } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { MODEL_CONFIG_KEY_PREFIX } from "../../schemas/config.js";
import { validateModelConfig } from "../../services/routing/mod.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { DEFAULT_PREFIX } from "../../streams/subjects.js";
import { encodeToken } from "../../streams/tokens.js";
import { processCpuUs } from "../proc-cpu.js";
import { type ClientOutcome, type LiveRequest, type OutcomeKind, sendChat } from "./flow-client.js";
import { type BandDispatch, type BandHold, countInversions, INVERSION_BOUND_MS, jainIndex, maxMinFairShares, modelCapacity } from "./flow-figures.js";
import { settledMessageCount } from "../streams-read.js";
import { buildFlowMix, FLOW_MIX_DEFAULTS, type FlowMixOptions, type FlowObjective, type FlowRequest } from "../workloads/flow-mix.js";
import { type Assembly, getJson, PREFIX_QUALITY_ENGINE_DEFAULTS, type PrefixQualityEngineOptions, percentile, startAssembly, waitUntil } from "../assembly.js";

const MODEL = "bench/flow-8b";

export type FlowRunName = "off" | "on" | "on-fcfs" | "on-1" | "unloaded";
export const FLOW_RUNS: readonly FlowRunName[] = ["off", "on", "on-fcfs", "on-1", "unloaded"];

export const FLOW_ENGINE_DEFAULTS: PrefixQualityEngineOptions = {
  ...PREFIX_QUALITY_ENGINE_DEFAULTS,
  pods: 4,
  // 1 wall second = 2 simulated seconds: ~15 requests/s of capacity on 4 pods, so 2x load is ~30
  // requests/s, which the client, the front and three gateways carry on two cores.
  timeScale: 2,
  maxBatch: 8,
  maxNumBatchedTokens: 2048,
  // An 8B-class model: ~2k prefill tokens/s, 25 ms decode steps; a 600-token batch prompt costs
  // about as much prefill as its answer costs decode.
  prefillMsPerToken: 0.5,
  decodeMsPerStep: 25,
  decodeBatchSlope: 0.05,
  // 64k tokens of KV per pod: a full batch (8 x ~750 tokens) never preempts.
  kvCacheBlocks: 4096,
  blockSize: 16,
};

/** The `flowControl` of the `on` runs (before `--flow-config` overrides). */
export const FLOW_CONFIG_DEFAULT = {
  objectives: { interactive: { priority: 10 }, batch: { priority: 0 } },
  defaultObjective: "batch",
  fairness: "least-attained",
  // Nothing should expire at 2x over a run of a few minutes: 10 minutes.
  ttlMs: 600_000,
} as const;

export interface FlowBenchOptions {
  /** Arrival window per run (wall ms). */
  durationMs?: number;
  /** Gateway replicas of the `off` and `on` runs (`on-1` has one). */
  replicas?: number;
  /** Offered load, as a multiple of the modelled capacity. */
  load?: number;
  seed?: number;
  runs?: readonly FlowRunName[];
  /** Measured part of each CPU phase (wall ms); 0 = no CPU comparison. */
  cpuPhaseMs?: number;
  /** Unmeasured start of each CPU phase, after the config changed. */
  cpuSettleMs?: number;
  cpuRounds?: number;
  /** Load of the CPU comparison, x capacity (unsaturated). */
  cpuLoad?: number;
  /** Merged over FLOW_CONFIG_DEFAULT (top-level keys). */
  flowConfig?: Record<string, unknown>;
  engine?: Partial<PrefixQualityEngineOptions>;
  workload?: Partial<Omit<FlowMixOptions, "rate" | "durationMs" | "seed">>;
  /** Keep the services' logs here instead of a temp dir removed at the end. */
  logDir?: string;
}

export interface FlowRunRow {
  run: FlowRunName;
  replicas: number;
  flow_config: boolean;
  /** The pods ran `--scheduling-policy priority` (the gateways write the engine's priority). */
  engine_priority: boolean;
  /** Gateways that refused the model config (a build without flow control refuses `flowControl`). */
  config_rejected_by: number;
  requests: number;
  interactive: number;
  interactive_ok: number;
  interactive_failed: number;
  interactive_ttft_p50_ms: number | null;
  interactive_ttft_p99_ms: number | null;
  interactive_ttft_max_ms: number | null;
  /** Batch requests sent / completed within the window, per tenant. */
  batch: Record<string, { offered: number; completed: number; fair_share: number }>;
  /** Batch requests completed within the window, every tenant. */
  batch_completed: number;
  jain_fairness: number | null;
  jain_fairness_offered: number | null;
  batch_completion_p50_ms: number | null;
  expired: number;
  dropped: number;
  errors: number;
  cancelled_at_end: number;
  first_error?: string;
  dispatches: number;
  inversions: number;
  priority_inversion_ratio: number | null;
  /** Decision records carrying `flow` (requests that waited in a gateway queue). */
  flow_records: number;
  /** Requests answered 200 that have no decision record. */
  records_missing: number;
  /** Max wait in a gateway queue per band, from the records (ms). */
  max_wait_ms: Record<string, number>;
  /** Successful completions per second over the window's second half. */
  completions_rps_second_half: number;
  send_lag_p99_ms: number;
  /** Wall ms from the first arrival to the last request settled. */
  run_ms: number;
}

export interface FlowBenchResult {
  bench: "flow";
  replicas: number;
  interactive_ttft_p99_ms: number | null;
  interactive_ttft_p99_ms_off: number | null;
  jain_fairness: number | null;
  jain_fairness_off: number | null;
  priority_inversion_ratio: number | null;
  single_replica_interactive_ttft_p99_ms: number | null;
  expired: number | null;
  dropped: number | null;
  /** Issue 36: the `on` run's pods scheduled by priority (false when it ran without). */
  engine_priority: boolean | null;
  interactive_ttft_p99_ms_unloaded: number | null;
  interactive_ttft_p99_ms_engine_priority_off: number | null;
  batch_completed: number | null;
  batch_completed_engine_priority_off: number | null;
  priority_inversion_ratio_off: number | null;
  jain_fairness_offered: number | null;
  jain_fairness_offered_off: number | null;
  gateway_cpu_us_per_request: number | null;
  gateway_cpu_us_per_request_off: number | null;
  gateway_cpu_ratio: number | null;
  targets: {
    interactive_p99_at_most_02x_off: boolean | null;
    jain_at_least_095: boolean | null;
    inversions_at_most_1pct: boolean | null;
    three_replicas_within_12x_of_one: boolean | null;
    cpu_within_5pct_of_off: boolean | null;
    interactive_p99_at_most_2x_unloaded: boolean | null;
    batch_completed_at_least_09x_engine_priority_off: boolean | null;
    no_inversions_beyond_bound: boolean | null;
  };
  /** False when this build's model config schema refuses `flowControl`: then "on" routed as "off". */
  flow_control_supported: boolean;
  capacity_model_rps: number;
  capacity_measured_rps: number | null;
  rate_rps: number;
  load: number;
  duration_ms: number;
  seed: number;
  flow_config: Record<string, unknown>;
  runs: FlowRunRow[];
  cpu: { phases: Array<{ mode: "off" | "on"; requests: number; cpu_us_per_request: number }>; load: number; rate_rps: number; phase_ms: number } | null;
  engine: PrefixQualityEngineOptions;
  workload: Omit<FlowMixOptions, "rate" | "durationMs">;
  bench_ms: number;
  note: string;
}

const round = (x: number, digits = 2): number => Number(x.toFixed(digits));
const roundOrNull = (x: number | null | undefined, digits = 2): number | null => (x === null || x === undefined || !Number.isFinite(x) ? null : round(x, digits));
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function progress(line: string): void {
  process.stderr.write(`[flow] ${line}\n`);
}

// ---------------------------------------------------------------------------------------------
// Config and decision records

function modelConfigKey(model: string): string {
  return `${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`;
}

/**
 * Writes (or, with `undefined`, deletes) the model's config straight into the config bucket:
 * `jetroute config set` would refuse `flowControl` on a build whose schema predates it, and the
 * bench must still run there (its "on" runs then route as "off", which the result says).
 */
async function writeModelConfig(h: NatsHandles, config: Record<string, unknown> | undefined): Promise<void> {
  const kv = await new Kvm(h.nc).open(configBucketName(DEFAULT_PREFIX));
  if (config) await kv.put(modelConfigKey(MODEL), JSON.stringify(config));
  else await kv.delete(modelConfigKey(MODEL));
}

interface FlowField {
  band: number;
  objective?: string;
  enqueuedAt: number;
  waitMs: number;
}

/** The fields of a decision record the bench reads (`flow` is the flow-control contract's). */
interface DecisionLike {
  id: string;
  model: string;
  ts: number;
  outcome: string;
  status: number;
  errorCode?: string;
  pick: string | null;
  pd?: { leg: string };
  flow?: FlowField;
}

const isFlowField = (v: unknown): v is FlowField =>
  typeof v === "object" && v !== null && typeof (v as FlowField).band === "number" && typeof (v as FlowField).enqueuedAt === "number" && typeof (v as FlowField).waitMs === "number";

async function readDecisions(h: NatsHandles): Promise<DecisionLike[]> {
  const consumer = await h.js.consumers.get(streamName(DEFAULT_PREFIX, "DECISIONS"), { deliver_policy: DeliverPolicy.All });
  let left = (await consumer.info(true)).num_pending;
  const out: DecisionLike[] = [];
  const decoder = new TextDecoder();
  while (left > 0) {
    // Ask for no more than is left: a pull for more than the stream holds waits out its expiry.
    const batch = await consumer.fetch({ max_messages: Math.min(1_000, left), expires: 5_000 });
    let n = 0;
    for await (const m of batch) {
      n++;
      try {
        const v = JSON.parse(decoder.decode(m.data)) as DecisionLike;
        if (v && typeof v.id === "string" && typeof v.ts === "number") out.push({ ...v, flow: isFlowField(v.flow) ? v.flow : undefined });
      } catch {
        /* not a record */
      }
    }
    if (n === 0) break;
    left -= n;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// One run

interface RunSpec {
  name: FlowRunName;
  replicas: number;
  flow: boolean;
  /** Pods with `--scheduling-policy priority`. */
  enginePriority: boolean;
  /** Only the schedule's interactive requests (the idle-fleet reference). */
  interactiveOnly?: boolean;
}

interface RunContext {
  schedule: readonly FlowRequest[];
  durationMs: number;
  engine: PrefixQualityEngineOptions;
  flowConfig: Record<string, unknown>;
  bands: Record<FlowObjective, number>;
  tenants: readonly string[];
  logDir: string;
  cpu?: { schedule: readonly FlowRequest[]; phaseMs: number; settleMs: number; rounds: number };
}

interface Sent {
  r: FlowRequest;
  id: string;
  lagMs: number;
  outcome: ClientOutcome;
}

interface DriveResult {
  sent: Sent[];
  epochAt(perfMs: number): number;
  runMs: number;
}

/**
 * Plays the schedule open-loop; after the window waits for every interactive request, then
 * cancels whatever is left (see the header). `onStart` gets the run's clock (ms since its start).
 */
async function drive(
  asm: Assembly,
  schedule: readonly FlowRequest[],
  o: { label: string; durationMs: number; idPrefix: string; cancelAtEnd: boolean; onStart?: (now: () => number) => void },
): Promise<DriveResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY });
  const t0 = performance.now();
  const epoch0 = Date.now();
  const now = () => performance.now() - t0;
  const timeoutMs = 3 * o.durationMs + 120_000;
  const live = new Map<number, LiveRequest>();
  const sent: Sent[] = [];
  const interactive: Array<Promise<unknown>> = [];
  let ok = 0;
  let failed = 0;
  let firstError: string | undefined;
  const ticker = setInterval(() => {
    progress(`${o.label}: t=${Math.round(now() / 1000)}s sent=${sent.length} ok=${ok} in-flight=${live.size} failed=${failed}`);
  }, 5_000);
  o.onStart?.(now);
  try {
    for (const r of schedule) {
      const wait = r.atMs - now();
      if (wait > 0) await sleep(wait);
      const lagMs = now() - r.atMs;
      const id = `${o.idPrefix}-${r.index}`;
      const l = sendChat(agent, asm.frontPort, MODEL, r, id, now, timeoutMs);
      live.set(r.index, l);
      const p = l.done.then((outcome) => {
        live.delete(r.index);
        if (outcome.kind === "ok") ok++;
        else if (outcome.kind !== "cancelled") {
          failed++;
          firstError ??= outcome.error ?? `HTTP ${outcome.status} ${outcome.code ?? ""}`;
        }
        sent.push({ r, id, lagMs, outcome });
      });
      if (r.objective === "interactive") interactive.push(p);
    }
    const rest = o.durationMs - now();
    if (rest > 0) await sleep(rest);
    await Promise.all(interactive);
    if (o.cancelAtEnd && live.size > 0) {
      progress(`${o.label}: every interactive request answered at t=${Math.round(now() / 1000)}s; cancelling the ${live.size} batch requests left`);
      for (const l of [...live.values()]) l.cancel();
    }
    // Each outcome is recorded by the first reaction to its `done`, before these run.
    while (live.size > 0) await Promise.all([...live.values()].map((l) => l.done));
    if (firstError) progress(`${o.label}: first error: ${firstError}`);
    return { sent, epochAt: (x) => epoch0 + x, runMs: now() };
  } finally {
    clearInterval(ticker);
    agent.destroy();
  }
}

/** Every gateway has ended every request, then DECISIONS stops growing (at least `atLeast` records). */
async function waitForRecords(asm: Assembly, h: NatsHandles, atLeast: number, label: string): Promise<void> {
  const probe = new http.Agent({ keepAlive: true, maxSockets: 8 });
  try {
    for (const g of asm.gateways) {
      await waitUntil(`gateway ${g.gateway} to end every request`, 60_000, async () => {
        const r = await getJson<{ inFlight?: number }>(probe, `http://127.0.0.1:${g.adminPort}/debug/state`);
        return r.status === 200 && r.body?.inFlight === 0;
      });
    }
  } finally {
    probe.destroy();
  }
  const { count, settled } = await settledMessageCount(h.jsm, streamName(DEFAULT_PREFIX, "DECISIONS"), atLeast, 60_000);
  if (!settled) progress(`${label}: DECISIONS holds ${count} records, ${atLeast} expected at least; going on with what is there`);
}

async function configRejections(asm: Assembly): Promise<number> {
  const probe = new http.Agent({ keepAlive: true, maxSockets: 8 });
  try {
    const states = await Promise.all(asm.gateways.map((g) => getJson<{ configs?: { rejected?: number } }>(probe, `http://127.0.0.1:${g.adminPort}/debug/state`)));
    return states.filter((s) => (s.body?.configs?.rejected ?? 0) > 0).length;
  } finally {
    probe.destroy();
  }
}

function cpuUs(pids: ReadonlyArray<number | undefined>): number {
  let total = 0;
  for (const pid of pids) if (pid !== undefined) total += processCpuUs(pid);
  return total;
}

function analyse(spec: RunSpec, d: DriveResult, records: readonly DecisionLike[], ctx: RunContext, configRejectedBy: number): FlowRunRow {
  const { durationMs, bands } = ctx;
  const byId = new Map(d.sent.map((s) => [s.id, s]));
  const inter = d.sent.filter((s) => s.r.objective === "interactive");
  const interOk = inter.filter((s) => s.outcome.kind === "ok" && s.outcome.firstTokenAt !== undefined);
  const ttfts = interOk.map((s) => (s.outcome.firstTokenAt as number) - s.outcome.sentAt).sort((a, b) => a - b);

  // Batch tenants: offered = sent in the window (all of the schedule), completed = answered in it.
  const batchSent = d.sent.filter((s) => s.r.objective === "batch");
  const perTenant = ctx.tenants
    .map((t) => {
      const mine = batchSent.filter((s) => s.r.user === t);
      return { t, offered: mine.length, completed: mine.filter((s) => s.outcome.kind === "ok" && s.outcome.endAt <= durationMs).length };
    })
    .filter((x) => x.offered > 0);
  const completedTotal = perTenant.reduce((a, x) => a + x.completed, 0);
  const fair = maxMinFairShares(
    perTenant.map((x) => x.offered),
    completedTotal,
  );
  const batch: FlowRunRow["batch"] = Object.fromEntries(perTenant.map((x, i) => [x.t, { offered: x.offered, completed: x.completed, fair_share: round(fair[i] as number, 2) }]));
  const jain = completedTotal > 0 ? jainIndex(perTenant.map((x, i) => x.completed / (fair[i] as number))) : null;
  const jainOffered = jainIndex(perTenant.map((x) => x.completed / x.offered));
  const batchE2e = batchSent.filter((s) => s.outcome.kind === "ok").map((s) => s.outcome.endAt - s.outcome.sentAt).sort((a, b) => a - b);

  // Dispatches and held intervals (see the header).
  const dispatches: BandDispatch[] = [];
  const holds: BandHold[] = [];
  const dispatched = new Set<string>();
  const rejectedWithFlow = new Map<string, DecisionLike>();
  const maxWait: Record<string, number> = {};
  let flowRecords = 0;
  for (const rec of records) {
    if (rec.pd?.leg === "prefill") continue;
    const mine = byId.get(rec.id);
    const band = rec.flow?.band ?? (mine ? bands[mine.r.objective] : undefined);
    if (band === undefined) continue;
    if (rec.flow) {
      flowRecords++;
      maxWait[band] = Math.max(maxWait[band] ?? 0, rec.flow.waitMs);
    }
    if (rec.outcome === "rejected") {
      if (rec.flow) rejectedWithFlow.set(rec.id, rec);
      continue;
    }
    dispatched.add(rec.id);
    dispatches.push({ model: rec.model, band, at: rec.ts });
    if (rec.flow) holds.push({ model: rec.model, band, enqueuedAt: rec.flow.enqueuedAt, leftAt: rec.flow.enqueuedAt + rec.flow.waitMs });
  }
  let recordsMissing = 0;
  for (const s of d.sent) {
    if (dispatched.has(s.id)) continue;
    if (s.outcome.kind === "ok") {
      recordsMissing++;
      continue;
    }
    const rej = rejectedWithFlow.get(s.id)?.flow;
    if (rej) holds.push({ model: MODEL, band: rej.band, enqueuedAt: rej.enqueuedAt, leftAt: rej.enqueuedAt + rej.waitMs });
    else holds.push({ model: MODEL, band: bands[s.r.objective], enqueuedAt: d.epochAt(s.outcome.sentAt), leftAt: d.epochAt(s.outcome.endAt) });
  }
  const inversions = countInversions(dispatches, holds);

  const half = durationMs / 2;
  const secondHalf = d.sent.filter((s) => s.outcome.kind === "ok" && s.outcome.endAt > half && s.outcome.endAt <= durationMs).length;
  const lags = d.sent.map((s) => s.lagMs).sort((a, b) => a - b);
  const count = (k: OutcomeKind) => d.sent.filter((s) => s.outcome.kind === k).length;
  const firstError = d.sent.find((s) => s.outcome.kind === "error")?.outcome.error;
  return {
    run: spec.name,
    replicas: spec.replicas,
    flow_config: spec.flow,
    engine_priority: spec.enginePriority,
    config_rejected_by: configRejectedBy,
    requests: d.sent.length,
    interactive: inter.length,
    interactive_ok: interOk.length,
    interactive_failed: inter.length - interOk.length,
    interactive_ttft_p50_ms: roundOrNull(percentile(ttfts, 0.5), 1),
    interactive_ttft_p99_ms: roundOrNull(percentile(ttfts, 0.99), 1),
    interactive_ttft_max_ms: roundOrNull(ttfts.at(-1), 1),
    batch,
    batch_completed: completedTotal,
    jain_fairness: roundOrNull(jain, 4),
    jain_fairness_offered: roundOrNull(jainOffered, 4),
    batch_completion_p50_ms: roundOrNull(percentile(batchE2e, 0.5), 1),
    expired: count("expired"),
    dropped: count("dropped"),
    errors: count("error"),
    cancelled_at_end: count("cancelled"),
    ...(firstError ? { first_error: firstError } : {}),
    dispatches: dispatches.length,
    inversions,
    priority_inversion_ratio: dispatches.length > 0 ? round(inversions / dispatches.length, 4) : null,
    flow_records: flowRecords,
    records_missing: recordsMissing,
    max_wait_ms: Object.fromEntries(Object.entries(maxWait).map(([b, w]) => [b, round(w, 1)])),
    completions_rps_second_half: round(secondHalf / (half / 1000), 2),
    send_lag_p99_ms: round(percentile(lags, 0.99), 1),
    run_ms: Math.round(d.runMs),
  };
}

/**
 * The CPU comparison, on an assembly whose saturating run is over: open-loop load at the CPU
 * rate while the config alternates off/on each phase; the gateways' CPU over each phase's measured
 * part (after the settle time that lets every replica apply the change), per request sent in it.
 */
async function cpuPhases(asm: Assembly, h: NatsHandles, ctx: RunContext): Promise<NonNullable<FlowBenchResult["cpu"]>["phases"]> {
  const c = ctx.cpu as NonNullable<RunContext["cpu"]>;
  const gwPids = asm.gateways.map((g) => g.pid);
  const phaseLen = c.settleMs + c.phaseMs;
  const plan = Array.from({ length: 2 * c.rounds }, (_, i) => (i % 2 === 0 ? "off" : "on") as "off" | "on");
  let now: () => number = () => 0;
  let started: () => void = () => {};
  const running = new Promise<void>((r) => {
    started = r;
  });
  const driving = drive(asm, c.schedule, {
    label: "cpu",
    durationMs: plan.length * phaseLen,
    idPrefix: "cpu",
    cancelAtEnd: true,
    onStart: (n) => {
      now = n;
      started();
    },
  });
  await running;
  const until = (ms: number) => sleep(Math.max(0, ms - now()));
  const windows: Array<{ mode: "off" | "on"; from: number; to: number; cpu: number }> = [];
  for (const [i, mode] of plan.entries()) {
    await until(i * phaseLen);
    await writeModelConfig(h, mode === "on" ? { flowControl: ctx.flowConfig } : undefined);
    await until(i * phaseLen + c.settleMs);
    const from = now();
    const cpuFrom = cpuUs(gwPids);
    await until((i + 1) * phaseLen);
    windows.push({ mode, from, to: now(), cpu: cpuUs(gwPids) - cpuFrom });
  }
  const d = await driving;
  return windows.flatMap((w) => {
    const n = d.sent.filter((s) => s.outcome.sentAt >= w.from && s.outcome.sentAt < w.to).length;
    return n > 0 ? [{ mode: w.mode, requests: n, cpu_us_per_request: round(w.cpu / n, 1) }] : [];
  });
}

async function runOne(spec: RunSpec, ctx: RunContext): Promise<{ row: FlowRunRow; cpu?: NonNullable<FlowBenchResult["cpu"]>["phases"] }> {
  const tag = `flow-${spec.name}`;
  progress(`${spec.name}: starting ${ctx.engine.pods} pods${spec.enginePriority ? " scheduling by priority" : ""}, ${spec.replicas} gateway replica(s), flow control ${spec.flow ? "configured" : "off"}`);
  const t0 = performance.now();
  const asm = await startAssembly({ strategy: "least-request", tokenizer: null, gateways: spec.replicas, kvEvents: false }, ctx.engine, ctx.logDir, tag, {
    model: MODEL,
    gatewayIdPrefix: `flow-gw`,
    // Every rejection's record is wanted (their held times count for the inversions).
    gatewayArgs: ["--rejection-records-per-s", "100000"],
    ...(spec.enginePriority ? { simArgs: ["--scheduling-policy", "priority"] } : {}),
    // Held requests are requests whose ext_proc stream is not answered yet: Envoy's per-message
    // timeout must outlast the queue TTL, or the front answers for the gateway.
    frontArgs: ["--message-timeout-ms", String(Math.max(600_000, Number(ctx.flowConfig.ttlMs ?? 0) + 60_000))],
    beforeGateways: spec.flow
      ? async (url) => {
          const h = await connectNats(url, "jetroute-bench-flow");
          try {
            await writeModelConfig(h, { flowControl: ctx.flowConfig });
          } finally {
            await h.nc.close();
          }
        }
      : undefined,
  });
  progress(`${spec.name}: assembled in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  let h: NatsHandles | undefined;
  try {
    h = await connectNats(asm.natsUrl, "jetroute-bench-flow");
    const rejectedBy = spec.flow ? await configRejections(asm) : 0;
    if (rejectedBy > 0) progress(`${spec.name}: ${rejectedBy} gateway(s) refused the flowControl config: this run routes as without flow control`);
    const schedule = spec.interactiveOnly ? ctx.schedule.filter((r) => r.objective === "interactive") : ctx.schedule;
    const d = await drive(asm, schedule, { label: spec.name, durationMs: ctx.durationMs, idPrefix: spec.name, cancelAtEnd: true });
    const ok = d.sent.filter((s) => s.outcome.kind === "ok").length;
    await waitForRecords(asm, h, ok, spec.name);
    const records = await readDecisions(h);
    const row = analyse(spec, d, records, ctx, rejectedBy);
    progress(
      `${spec.name}: interactive TTFT p50 ${row.interactive_ttft_p50_ms} ms p99 ${row.interactive_ttft_p99_ms} ms (${row.interactive_failed} failed); ` +
        `Jain ${row.jain_fairness} (offered-normalized ${row.jain_fairness_offered}); batch ${JSON.stringify(row.batch)}; ` +
        `inversions ${row.inversions}/${row.dispatches}; expired ${row.expired}, dropped ${row.dropped}, errors ${row.errors}, cancelled ${row.cancelled_at_end}; ` +
        `${row.flow_records} records with flow, ${row.records_missing} missing; max wait at the gateways per band ${JSON.stringify(row.max_wait_ms)} ms; ${row.completions_rps_second_half} completions/s in the second half`,
    );
    let cpu: NonNullable<FlowBenchResult["cpu"]>["phases"] | undefined;
    if (ctx.cpu && spec.flow) {
      progress(`cpu: ${ctx.cpu.rounds} rounds of off/on phases (${ctx.cpu.settleMs} ms settle + ${ctx.cpu.phaseMs} ms measured each) on the ${spec.name} assembly`);
      cpu = await cpuPhases(asm, h, ctx);
      progress(`cpu: ${cpu.map((p) => `${p.mode} ${p.cpu_us_per_request} µs/request (${p.requests})`).join(", ")}`);
    }
    return { row, ...(cpu ? { cpu } : {}) };
  } finally {
    await h?.nc.close().catch(() => {});
    await asm.stop();
  }
}

// ---------------------------------------------------------------------------------------------

function table(rows: readonly FlowRunRow[]): string {
  const cols: Array<[string, (r: FlowRunRow) => unknown]> = [
    ["run", (r) => r.run],
    ["gw", (r) => r.replicas],
    ["eng prio", (r) => (r.engine_priority ? "on" : "off")],
    ["int p50 ms", (r) => r.interactive_ttft_p50_ms],
    ["int p99 ms", (r) => r.interactive_ttft_p99_ms],
    ["int failed", (r) => r.interactive_failed],
    ["Jain", (r) => r.jain_fairness],
    ["batch done", (r) => r.batch_completed],
    ["Jain/offered", (r) => r.jain_fairness_offered],
    ["inversions", (r) => `${r.inversions}/${r.dispatches}`],
    ["expired", (r) => r.expired],
    ["dropped", (r) => r.dropped],
    ["errors", (r) => r.errors],
    ["flow recs", (r) => r.flow_records],
    ["run s", (r) => (r.run_ms / 1000).toFixed(1)],
  ];
  const cells = [cols.map(([h]) => h), ...rows.map((r) => cols.map(([, f]) => String(f(r) ?? "-")))];
  const widths = cols.map((_, i) => Math.max(...cells.map((c) => (c[i] as string).length)));
  return cells.map((c) => c.map((v, i) => v.padStart(widths[i] as number)).join("  ")).join("\n");
}

export async function runFlowBench(opts: FlowBenchOptions = {}): Promise<FlowBenchResult> {
  const started = performance.now();
  const engine: PrefixQualityEngineOptions = { ...FLOW_ENGINE_DEFAULTS, ...opts.engine };
  const durationMs = opts.durationMs ?? 40_000;
  const replicas = opts.replicas ?? 3;
  const load = opts.load ?? 2;
  const seed = opts.seed ?? FLOW_MIX_DEFAULTS.seed;
  const runs = opts.runs ?? FLOW_RUNS;
  const cpuPhaseMs = opts.cpuPhaseMs ?? 8_000;
  const cpuSettleMs = opts.cpuSettleMs ?? 1_500;
  const cpuRounds = opts.cpuRounds ?? 2;
  const cpuLoad = opts.cpuLoad ?? 0.5;
  const wl: Omit<FlowMixOptions, "rate" | "durationMs"> = { ...FLOW_MIX_DEFAULTS, ...opts.workload, seed };
  const flowConfig: Record<string, unknown> = { ...FLOW_CONFIG_DEFAULT, ...opts.flowConfig };
  const objectives = (flowConfig.objectives ?? {}) as Record<string, { priority?: number }>;
  const bands: Record<FlowObjective, number> = { interactive: objectives.interactive?.priority ?? 0, batch: objectives.batch?.priority ?? 0 };
  const schemaError = validateModelConfig({ flowControl: flowConfig });
  if (schemaError) progress(`this build refuses the flowControl config (${schemaError}): the "on" runs will route as without flow control`);

  // The i-th request is the same at every rate: a long sample at rate 1 gives the mix's cost.
  const capacity = modelCapacity(buildFlowMix({ ...wl, rate: 1, durationMs: 1_200_000 }).slice(0, 1_000), engine);
  const rate = load * capacity.rps;
  const schedule = buildFlowMix({ ...wl, rate, durationMs });
  progress(
    `capacity model: ${capacity.rps.toFixed(2)} requests/s (${engine.pods} pods x time scale ${engine.timeScale}; ${capacity.engineMsPerRequest.toFixed(0)} engine ms per request at batch ${capacity.batchSize}, ` +
      `mean prompt ${capacity.meanPromptTokens.toFixed(0)} tokens, mean max_tokens ${capacity.meanMaxTokens.toFixed(0)}); offering ${rate.toFixed(2)} requests/s (${load}x) for ${durationMs} ms: ` +
      `${schedule.length} requests, ${schedule.filter((r) => r.objective === "interactive").length} interactive`,
  );
  const logDir = opts.logDir ?? mkdtempSync(path.join(os.tmpdir(), "jetroute-flow-"));
  mkdirSync(logDir, { recursive: true });
  // The CPU comparison sends short requests only (batch-objective ones shaped as interactive):
  // the same objectives and streaming at a rate several times higher with the engines still
  // unsaturated, so per-request work, not the gateways' idle timers, dominates the figure.
  const cpuMix: Omit<FlowMixOptions, "rate" | "durationMs"> = { ...wl, batch: wl.interactive };
  const cpuRate = cpuLoad * modelCapacity(buildFlowMix({ ...cpuMix, rate: 1, durationMs: 1_200_000 }).slice(0, 1_000), engine).rps;
  const ctx: RunContext = {
    schedule,
    durationMs,
    engine,
    flowConfig,
    bands,
    tenants: wl.tenants.map((t) => t.user),
    logDir,
    ...(cpuPhaseMs > 0
      ? { cpu: { schedule: buildFlowMix({ ...cpuMix, rate: cpuRate, durationMs: 2 * cpuRounds * (cpuSettleMs + cpuPhaseMs) }), phaseMs: cpuPhaseMs, settleMs: cpuSettleMs, rounds: cpuRounds } }
      : {}),
  };
  const specs: Record<FlowRunName, RunSpec> = {
    off: { name: "off", replicas, flow: false, enginePriority: false },
    on: { name: "on", replicas, flow: true, enginePriority: true },
    "on-fcfs": { name: "on-fcfs", replicas, flow: true, enginePriority: false },
    "on-1": { name: "on-1", replicas: 1, flow: true, enginePriority: true },
    unloaded: { name: "unloaded", replicas, flow: true, enginePriority: true, interactiveOnly: true },
  };

  try {
    const rows: FlowRunRow[] = [];
    let cpu: NonNullable<FlowBenchResult["cpu"]>["phases"] | undefined;
    for (const name of runs) {
      // The CPU comparison runs once, on the first flow-controlled assembly.
      const m = await runOne(specs[name], cpu ? { ...ctx, cpu: undefined } : ctx);
      rows.push(m.row);
      cpu ??= m.cpu;
    }
    const row = (n: FlowRunName) => rows.find((r) => r.run === n);
    const off = row("off");
    const on = row("on");
    const one = row("on-1");
    const fcfs = row("on-fcfs");
    const idle = row("unloaded");
    const p99Idle = idle?.interactive_ttft_p99_ms ?? null;
    const p99Fcfs = fcfs?.interactive_ttft_p99_ms ?? null;
    const meanCpu = (mode: "off" | "on") => {
      const ps = (cpu ?? []).filter((p) => p.mode === mode);
      return ps.length > 0 ? ps.reduce((a, p) => a + p.cpu_us_per_request, 0) / ps.length : null;
    };
    const cpuOn = meanCpu("on");
    const cpuOff = meanCpu("off");
    const cpuRatio = cpuOn !== null && cpuOff !== null && cpuOff > 0 ? cpuOn / cpuOff : null;
    const p99On = on?.interactive_ttft_p99_ms ?? null;
    const p99Off = off?.interactive_ttft_p99_ms ?? null;
    const p99One = one?.interactive_ttft_p99_ms ?? null;
    const measured = off ? off.completions_rps_second_half : null;
    const supported = schemaError === undefined && rows.every((r) => r.config_rejected_by === 0);
    process.stderr.write(`\n${table(rows)}\n\n`);
    if (!supported) process.stderr.write("flow control was not in effect (the build refused its config): the \"on\" rows measure routing without it\n");
    if (cpu) process.stderr.write(`gateway CPU per request, unsaturated (${cpuLoad}x): on ${roundOrNull(cpuOn, 1)} µs, off ${roundOrNull(cpuOff, 1)} µs, ratio ${roundOrNull(cpuRatio, 3)}\n`);
    return {
      bench: "flow",
      replicas,
      interactive_ttft_p99_ms: p99On,
      interactive_ttft_p99_ms_off: p99Off,
      jain_fairness: on?.jain_fairness ?? null,
      jain_fairness_off: off?.jain_fairness ?? null,
      priority_inversion_ratio: on?.priority_inversion_ratio ?? null,
      single_replica_interactive_ttft_p99_ms: p99One,
      expired: on ? on.expired : null,
      dropped: on ? on.dropped : null,
      engine_priority: on ? on.engine_priority : null,
      interactive_ttft_p99_ms_unloaded: p99Idle,
      interactive_ttft_p99_ms_engine_priority_off: p99Fcfs,
      batch_completed: on ? on.batch_completed : null,
      batch_completed_engine_priority_off: fcfs ? fcfs.batch_completed : null,
      priority_inversion_ratio_off: off?.priority_inversion_ratio ?? null,
      jain_fairness_offered: on?.jain_fairness_offered ?? null,
      jain_fairness_offered_off: off?.jain_fairness_offered ?? null,
      gateway_cpu_us_per_request: roundOrNull(cpuOn, 1),
      gateway_cpu_us_per_request_off: roundOrNull(cpuOff, 1),
      gateway_cpu_ratio: roundOrNull(cpuRatio, 3),
      targets: {
        interactive_p99_at_most_02x_off: p99On !== null && p99Off !== null ? p99On <= 0.2 * p99Off : null,
        jain_at_least_095: on?.jain_fairness != null ? on.jain_fairness >= 0.95 : null,
        inversions_at_most_1pct: on?.priority_inversion_ratio != null ? on.priority_inversion_ratio <= 0.01 : null,
        three_replicas_within_12x_of_one: p99On !== null && p99One !== null ? p99On <= 1.2 * p99One : null,
        cpu_within_5pct_of_off: cpuRatio !== null ? cpuRatio <= 1.05 : null,
        interactive_p99_at_most_2x_unloaded: p99On !== null && p99Idle !== null ? p99On <= 2 * p99Idle : null,
        batch_completed_at_least_09x_engine_priority_off: on && fcfs ? on.batch_completed >= 0.9 * fcfs.batch_completed : null,
        no_inversions_beyond_bound: on ? on.inversions === 0 : null,
      },
      flow_control_supported: supported,
      capacity_model_rps: round(capacity.rps, 3),
      capacity_measured_rps: measured,
      rate_rps: round(rate, 3),
      load,
      duration_ms: durationMs,
      seed,
      flow_config: flowConfig,
      runs: rows,
      cpu: cpu ? { phases: cpu, load: cpuLoad, rate_rps: round(cpuRate, 2), phase_ms: cpuPhaseMs } : null,
      engine,
      workload: wl,
      bench_ms: Math.round(performance.now() - started),
      note:
        `TTFT is wall time at the client through the front (simulated engines run ${engine.timeScale}x faster than wall time). ` +
        "jain_fairness normalizes each batch tenant's completions in the window by its max-min fair share of the batch completions; jain_fairness_offered by its offered requests. " +
        `An inversion is a dispatch of a band while a higher band of the model, enqueued more than ${INVERSION_BOUND_MS} ms before, was still held at any gateway.`,
    };
  } finally {
    if (!opts.logDir) rmSync(logDir, { recursive: true, force: true });
  }
}
