/**
 * `jetroute replay --autoscale <policy>`: an autoscaling policy re-run over a recorded window in
 * virtual time. The window's requests of the policy's model arrive at their recorded times at a
 * simulated fleet (whatif.ts) that the policy's own evaluator sizes — the same runner the
 * autoscaler service runs (services/autoscaler/runner.ts: windows, panic, rates, scale-down delay,
 * bounds, scale from zero), fed from the simulated fleet's views as the service is fed from the
 * streams. Beside it, the same requests on a static fleet of the recorded size. Pure.
 *
 * Both sides count provisioned pod-seconds over the same horizon (the window, or longer when the
 * last request finishes later) and TTFT target attainment: the share of the window's requests
 * whose first token came within the target (a request never served, or cut, misses it).
 */
import type { AutoscaleMetric, ResolvedPolicy } from "../../schemas/autoscale.js";
import { OutcomeWindow } from "../autoscaler/outcomes.js";
import { createRunner } from "../autoscaler/runner.js";
import type { QueueReading, SignalSources } from "../autoscaler/signals.js";
import type { EngineConfig } from "../sim/engine.js";
import type { ScaleEvent } from "./elastic-fleet.js";
import { type FleetScaler, runWhatIf, type SimClass, type TraceRequest, type WhatIfRun } from "./whatif.js";

export interface AutoscaleWhatIfOptions {
  /** The policy's name (its records' `policy`). */
  name: string;
  /** Validated (autoscalePolicyError) and resolved. */
  policy: ResolvedPolicy;
  /** Routing strategy of both simulated fleets (as parseStrategy takes it). */
  strategy: string;
  /** The static side's pods (the recorded fleet's size). */
  staticPods: number;
  /** The scaled side's pods at the start. Default: staticPods within the policy's bounds. */
  initialPods?: number;
  /** A new pod's creation to Ready (ms). */
  startupMs: number;
  /** The drain handshake (default) or the plain scale subresource. */
  drain?: boolean;
  ttftTargetMs: number;
  /** Epoch ms of the window: the horizon both sides are counted over. */
  fromMs: number;
  toMs: number;
  /** Every simulated pod's engine (default: the simulator's), and its TTFT outside the engine. */
  engine?: Partial<EngineConfig>;
  ttftOffsetMs?: number;
  seed?: number;
  onProgress?: (side: "static" | "autoscaled", done: number, total: number) => void;
}

export interface SideFigures {
  podSeconds: number;
  ttftAttainment: number;
  ttftP50Ms: number | null;
  ttftP99Ms: number | null;
  requests: number;
  completed: number;
  /** Requests cut by a scale-down. */
  aborted: number;
  scaleEvents: number;
  /** Pods at the start, fewest and most provisioned over the run. */
  pods: { initial: number; peak: number };
}

export interface AutoscaleWhatIfReport {
  policy: string;
  model: string;
  algorithm: ResolvedPolicy["algorithm"];
  metric: string | null;
  target: number | null;
  ttftTargetMs: number;
  startupMs: number;
  drain: boolean;
  /** The horizon both sides count pod-seconds over (ms from the window start). */
  horizonMs: number;
  static: SideFigures;
  autoscaled: SideFigures & {
    evaluations: number;
    /** Requests that waited for a pod (a fleet at zero, or every pod still starting). */
    held: number;
    drainedIdle: number;
    drainedAtDeadline: number;
    /** Target-size changes, times in epoch ms (the first 1,000). */
    events: ScaleEvent[];
  };
  /** autoscaled / static. */
  ratios: { podSeconds: number | null; ttftAttainment: number | null };
  warnings: string[];
}

/** Metrics the simulated engines do not report: a policy on one of them never sees a value. */
const UNSIMULATED: readonly string[] = ["load.cacheHitRate", "load.genThroughput", "load.pdPrefillQueue", "load.pdDecodeQueue"];

/** The scaler that runs `policy`'s evaluator on the simulated fleet, as the service runs it on the streams. */
export function policyScaler(name: string, policy: ResolvedPolicy, o: { initialPods: number; startupMs: number; drain: boolean }): FleetScaler {
  if (policy.algorithm === "pd") throw new RangeError(`policy ${name}: the what-if runs kpa and apa policies; a pd policy sizes prefill and decode roles, which the simulated fleet does not split`);
  const runner = createRunner(name, policy);
  const outcomes = new OutcomeWindow();
  return {
    model: policy.model,
    intervalMs: policy.intervalMs,
    initialPods: o.initialPods,
    startupMs: o.startupMs,
    drain: o.drain,
    drainGraceMs: policy.drainGraceMs,
    observe: (model, x) => outcomes.add(model, x),
    evaluate(now, view) {
      const sources: SignalSources = { pods: view.pods, load: view.load, ledger: view.ledger, queues: (m) => heldReading(view.held(m), now), outcomes };
      return runner.evaluate({ now, autoscaler: "whatif" }, sources).desired;
    },
  };
}

/** The what-if's waiting room on its one virtual clock: the oldest request's age by `now`. */
function heldReading(h: { queued: number; oldest?: number }, now: number): QueueReading {
  return h.oldest === undefined ? { queued: h.queued } : { queued: h.queued, oldestAgeMs: Math.max(0, now - h.oldest) };
}

const round = (x: number, d = 3) => Math.round(x * 10 ** d) / 10 ** d;

function sideOf(run: WhatIfRun, requests: number, targetMs: number, podSeconds: number): SideFigures {
  let within = 0;
  for (const t of run.ttftsMs) if (t <= targetMs) within++;
  return {
    podSeconds: round(podSeconds, 2),
    ttftAttainment: requests > 0 ? round(within / requests) : 1,
    ttftP50Ms: run.summary.ttft.p50Ms === null ? null : round(run.summary.ttft.p50Ms, 1),
    ttftP99Ms: run.summary.ttft.p99Ms === null ? null : round(run.summary.ttft.p99Ms, 1),
    requests,
    completed: run.summary.completed,
    aborted: run.aborted,
    scaleEvents: run.scaling?.eventCount ?? 0,
    pods: { initial: 0, peak: 0 },
  };
}

/** Runs both sides over the trace (requests of other models are left out, and said so). */
export function runAutoscaleWhatIf(trace: readonly TraceRequest[], o: AutoscaleWhatIfOptions): AutoscaleWhatIfReport {
  const p = o.policy;
  const warnings: string[] = [];
  const mine = trace.filter((r) => r.model === p.model);
  if (mine.length < trace.length) warnings.push(`${trace.length - mine.length} requests of other models than ${p.model} left out`);
  if (mine.length === 0) throw new RangeError(`no request of model ${JSON.stringify(p.model)} (the policy's /model) in the window`);
  if (p.metric !== undefined && UNSIMULATED.includes(p.metric)) warnings.push(`the simulated engines do not report ${p.metric}: the policy sees no value and holds its count`);
  if (!Number.isInteger(o.staticPods) || o.staticPods < 1) throw new RangeError(`staticPods must be an integer >= 1, got ${o.staticPods}`);
  if (!(o.ttftTargetMs > 0)) throw new RangeError(`the TTFT target must be > 0 ms, got ${o.ttftTargetMs}`);
  if (!(o.startupMs >= 0) || !Number.isFinite(o.startupMs)) throw new RangeError(`the start-up delay must be >= 0 ms, got ${o.startupMs}`);
  const drain = o.drain !== false;
  const initialPods = o.initialPods ?? Math.min(p.maxReplicas, Math.max(p.minReplicas, o.staticPods));
  const scaler = policyScaler(o.name, p, { initialPods, startupMs: o.startupMs, drain });
  const cls = (pods: number): Record<string, SimClass[]> => ({ [p.model]: [{ podClass: "", pods, engine: o.engine ?? {}, ttftOffsetMs: o.ttftOffsetMs ?? 0 }] });
  const common = { strategy: o.strategy, podsPerModel: { [p.model]: o.staticPods }, startMs: o.fromMs, endMs: o.toMs, scrapeIntervalMs: p.scrapeIntervalMs, seed: o.seed ?? 1 };
  const statik = runWhatIf(mine, { ...common, classes: cls(o.staticPods), onProgress: (d, t) => o.onProgress?.("static", d, t) });
  const scaled = runWhatIf(mine, { ...common, classes: cls(initialPods), scaler, onProgress: (d, t) => o.onProgress?.("autoscaled", d, t) });
  const s = scaled.scaling;
  if (!s) throw new Error("the scaled run reported no scaling figures");
  const horizonMs = Math.max(o.toMs - o.fromMs, statik.summary.makespanMs, s.endMs);
  const staticSide = sideOf(statik, mine.length, o.ttftTargetMs, (o.staticPods * horizonMs) / 1000);
  staticSide.pods = { initial: o.staticPods, peak: o.staticPods };
  const scaledSide = sideOf(scaled, mine.length, o.ttftTargetMs, s.podSeconds + (s.podsAtEnd * Math.max(0, horizonMs - s.endMs)) / 1000);
  scaledSide.pods = { initial: initialPods, peak: s.peakPods };
  return {
    policy: o.name,
    model: p.model,
    algorithm: p.algorithm,
    metric: (p.metric as AutoscaleMetric | undefined) ?? null,
    target: p.target ?? null,
    ttftTargetMs: o.ttftTargetMs,
    startupMs: o.startupMs,
    drain,
    horizonMs: Math.round(horizonMs),
    static: staticSide,
    autoscaled: {
      ...scaledSide,
      evaluations: s.evaluations,
      held: s.held,
      drainedIdle: s.drainedIdle,
      drainedAtDeadline: s.drainedAtDeadline,
      events: s.events.map((e) => ({ ...e, atMs: Math.round(o.fromMs + e.atMs) })),
    },
    ratios: {
      podSeconds: staticSide.podSeconds > 0 ? round(scaledSide.podSeconds / staticSide.podSeconds) : null,
      ttftAttainment: staticSide.ttftAttainment > 0 ? round(scaledSide.ttftAttainment / staticSide.ttftAttainment) : null,
    },
    warnings,
  };
}

/** The report as a table (what `replay --autoscale` prints without --json). */
export function autoscaleTable(r: AutoscaleWhatIfReport): string {
  const rows: Array<[string, string, string]> = [
    ["", "static", "autoscaled"],
    ["pods (start / peak)", `${r.static.pods.initial}`, `${r.autoscaled.pods.initial} / ${r.autoscaled.pods.peak}`],
    ["pod-seconds", r.static.podSeconds.toFixed(1), `${r.autoscaled.podSeconds.toFixed(1)}${r.ratios.podSeconds !== null ? ` (${r.ratios.podSeconds.toFixed(2)}x)` : ""}`],
    [`TTFT <= ${r.ttftTargetMs} ms`, r.static.ttftAttainment.toFixed(3), `${r.autoscaled.ttftAttainment.toFixed(3)}${r.ratios.ttftAttainment !== null ? ` (${r.ratios.ttftAttainment.toFixed(2)}x)` : ""}`],
    ["TTFT p50 / p99 (ms)", `${fmt(r.static.ttftP50Ms)} / ${fmt(r.static.ttftP99Ms)}`, `${fmt(r.autoscaled.ttftP50Ms)} / ${fmt(r.autoscaled.ttftP99Ms)}`],
    ["requests completed", `${r.static.completed} of ${r.static.requests}`, `${r.autoscaled.completed} of ${r.autoscaled.requests}`],
    ["cut by scale-down", `${r.static.aborted}`, `${r.autoscaled.aborted}`],
    ["scale events", "0", `${r.autoscaled.scaleEvents}`],
  ];
  const w0 = Math.max(...rows.map((x) => x[0].length));
  const w1 = Math.max(...rows.map((x) => x[1].length));
  const lines = [
    `policy ${r.policy}: ${r.algorithm}${r.metric ? ` on ${r.metric}, target ${r.target} per pod` : ""} (model ${r.model}); start-up ${r.startupMs} ms, ${r.drain ? "drain handshake" : "no drain handshake"}, over ${(r.horizonMs / 1000).toFixed(1)} s`,
    ...rows.map(([a, b, c]) => `${a.padEnd(w0)}  ${b.padStart(w1)}  ${c}`),
  ];
  const ev = r.autoscaled.events;
  if (ev.length > 0) {
    const shown = ev.slice(0, 20).map((e) => `${new Date(e.atMs).toISOString().slice(11, 23)} ${e.from}->${e.to}`);
    lines.push(`scale events: ${shown.join(", ")}${r.autoscaled.scaleEvents > shown.length ? `, ... (${r.autoscaled.scaleEvents} in all)` : ""}`);
  }
  for (const w of r.warnings) lines.push(`warning: ${w}`);
  return lines.join("\n");
}

const fmt = (x: number | null) => (x === null ? "-" : x.toFixed(0));
