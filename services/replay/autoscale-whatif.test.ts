/**
 * `replay --autoscale`'s pure core on fixed traces worked by hand: requests whose service time is
 * fixed (10 tokens at 100 ms a step, no batch slowdown) arrive so that the fleet holds exactly 1
 * request at every evaluation before a step in load and exactly 4 after it; the policy's own
 * runner then sizes the fleet as its arithmetic says.
 */
import { describe, expect, it } from "vitest";
import { type AutoscalePolicy, autoscalePolicyError, resolvePolicy } from "../../schemas/autoscale.js";
import { type AutoscaleWhatIfOptions, autoscaleTable, policyScaler, runAutoscaleWhatIf } from "./autoscale-whatif.js";
import { type FleetScaler, runWhatIf, type TraceRequest } from "./whatif.js";

const T0 = 1_700_000_000_000;
const MODEL = "m";

/** One request at `t` ms after T0: 16 prompt tokens, 10 output tokens (about 1,000-1,110 ms of service). */
const req = (t: number, i: number): TraceRequest => ({ requestId: `r${i}`, ts: T0 + t, model: MODEL, blockSize: 16, hashes: [], promptTokens: 16, outputTokens: 10 });

/** 1 arrival a second (at k + 0.5 s) until `stepS`, then 4 a second (k + 0.1, 0.3, 0.5, 0.7 s) until `endS`, then `tail` a second again. */
function stepTrace(stepS: number, endS: number, tailEndS = endS): TraceRequest[] {
  const out: TraceRequest[] = [];
  for (let k = 0; k < stepS; k++) out.push(req(k * 1000 + 500, out.length));
  for (let k = stepS; k < endS; k++) for (const o of [100, 300, 500, 700]) out.push(req(k * 1000 + o, out.length));
  for (let k = endS; k < tailEndS; k++) out.push(req(k * 1000 + 500, out.length));
  return out;
}

const ENGINE = { decodeMsPerStep: 100, decodeBatchSlope: 0, maxBatch: 64, prefillMsPerToken: 0.25 };

function policy(p: Partial<AutoscalePolicy> = {}) {
  const raw: AutoscalePolicy = {
    model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", target: 1, minReplicas: 1, maxReplicas: 10,
    intervalMs: 1000, scrapeIntervalMs: 1000, stableWindowMs: 10_000, panicWindowMs: 2_000, panicThreshold: 10, maxScaleUpRate: 10, scaleDownDelayMs: 0, ...p,
  };
  expect(autoscalePolicyError(raw)).toBeUndefined();
  return resolvePolicy(raw);
}

const opts = (o: Partial<AutoscaleWhatIfOptions> & Pick<AutoscaleWhatIfOptions, "policy" | "toMs">): AutoscaleWhatIfOptions => ({
  name: "p", strategy: "least-request", staticPods: 4, initialPods: 1, startupMs: 0, ttftTargetMs: 1000, fromMs: T0, engine: ENGINE, ...o,
});

describe("replay --autoscale (pure core)", () => {
  it("a step from 1 to 4 in flight at 30 s: KPA's stable window brings 2, 3, 4 pods at 31, 34 and 37 s; pod-seconds as worked by hand", () => {
    // Stable average at 30 + j s (10 one-second buckets): (4j + (10 - j)) / 10 = 1 + 0.3j; pods = ceil of it
    // (target 1): 2 for j = 1..3, 3 for j = 4..6, 4 from j = 7. No panic (4 / 1 < threshold 10).
    const r = runAutoscaleWhatIf(stepTrace(30, 60), opts({ policy: policy(), toMs: T0 + 60_000 }));
    expect(r.autoscaled.events.map((e) => [e.atMs - T0, e.from, e.to])).toEqual([
      [31_000, 1, 2],
      [34_000, 2, 3],
      [37_000, 3, 4],
    ]);
    // The horizon: the window (60 s), or the last finish if later (the last requests end about 60.8 s).
    const h = r.horizonMs / 1000;
    expect(h).toBeGreaterThanOrEqual(60);
    expect(h).toBeLessThan(61.5);
    // 1 pod for 31 s, 2 for 3 s, 3 for 3 s, then 4 to the horizon.
    expect(r.autoscaled.podSeconds).toBeCloseTo(31 + 2 * 3 + 3 * 3 + 4 * (h - 37), 1);
    expect(r.static.podSeconds).toBeCloseTo(4 * h, 1);
    expect(r.autoscaled).toMatchObject({ requests: 150, completed: 150, aborted: 0, scaleEvents: 3, held: 0, pods: { initial: 1, peak: 4 } });
    // Service is about 1 s and never waits: every first token within the target on both sides.
    expect(r.static.ttftAttainment).toBe(1);
    expect(r.autoscaled.ttftAttainment).toBe(1);
    expect(r.ratios.podSeconds).toBeCloseTo(r.autoscaled.podSeconds / r.static.podSeconds, 2);
    expect(autoscaleTable(r)).toMatch(/pod-seconds\s+\d+\.\d\s+\d+\.\d \(0\.\d\dx\)/);
  });

  it("a start-up delay shifts every new pod's Ready by it, and pod-seconds count the pod from its creation", () => {
    const r = runAutoscaleWhatIf(stepTrace(30, 60), opts({ policy: policy(), toMs: T0 + 60_000, startupMs: 5_000 }));
    // Pods still starting are not ready: KPA's rate bound and counts use ready pods, so the
    // decisions are the same (ceil(1 + 0.3j) never exceeds 10 x ready), made on the same ticks.
    expect(r.autoscaled.events.map((e) => [e.atMs - T0, e.to])).toEqual([
      [31_000, 2],
      [34_000, 3],
      [37_000, 4],
    ]);
    const h = r.horizonMs / 1000;
    expect(r.autoscaled.podSeconds).toBeCloseTo(31 + 2 * 3 + 3 * 3 + 4 * (h - 37), 1);
  });

  it("a scale-down under load: the drain handshake cuts nothing (its pods leave idle), the plain scale-down cuts what the removed pods stream", () => {
    // 4 in flight for 20 s on 4 pods (1 each, least-request), target 2 per pod: KPA asks for 2
    // once its start-up panic ends (a stable window after the start), while every pod holds a request.
    const p = policy({ target: 2, stableWindowMs: 4_000, panicWindowMs: 2_000 });
    const trace = stepTrace(0, 20);
    const drained = runAutoscaleWhatIf(trace, opts({ policy: p, toMs: T0 + 20_000, initialPods: 4 }));
    expect(drained.autoscaled.events[0]).toMatchObject({ from: 4, to: 2 });
    expect(drained.autoscaled.aborted).toBe(0);
    expect(drained.autoscaled.completed).toBe(trace.length);
    expect(drained.autoscaled.drainedIdle).toBe(2);
    const plain = runAutoscaleWhatIf(trace, opts({ policy: p, toMs: T0 + 20_000, initialPods: 4, drain: false }));
    expect(plain.autoscaled.events[0]).toMatchObject({ from: 4, to: 2 });
    expect(plain.autoscaled.aborted).toBe(2);
    expect(plain.autoscaled.aborted + plain.autoscaled.completed).toBe(trace.length);
    expect(plain.autoscaled.ttftAttainment).toBeLessThan(1);
  });

  it("scale from zero: the first request waits for the pod its arrival brings up (start-up 5 s)", () => {
    const trace = [req(500, 0)];
    const r = runAutoscaleWhatIf(trace, opts({ policy: policy({ minReplicas: 0 }), toMs: T0 + 20_000, initialPods: 0, startupMs: 5_000, ttftTargetMs: 10_000 }));
    // Held at 0.5 s; the tick at 1 s sees it waiting and asks for 1 pod, Ready at 6 s; then one
    // prefill step (100 ms step floor plus 4 ms of prompt at most).
    expect(r.autoscaled.held).toBe(1);
    expect(r.autoscaled.events[0]).toMatchObject({ atMs: T0 + 1_000, from: 0, to: 1 });
    expect(r.autoscaled.ttftP50Ms).toBeGreaterThanOrEqual(5_500);
    expect(r.autoscaled.ttftP50Ms).toBeLessThanOrEqual(5_700);
    expect(r.autoscaled.completed).toBe(1);
  });

  it("refuses what it cannot run, naming why", () => {
    const pd = resolvePolicy({ model: MODEL, algorithm: "pd", minReplicas: 1, maxReplicas: 4, pd: { ttftMs: 500, tpotMs: 50, maxPods: 4 } });
    expect(() => policyScaler("x", pd, { initialPods: 1, startupMs: 0, drain: true })).toThrow(/kpa and apa/);
    expect(() => runAutoscaleWhatIf([{ ...req(0, 0), model: "other" }], opts({ policy: policy(), toMs: T0 + 1_000 }))).toThrow(/no request of model "m"/);
    const warned = runAutoscaleWhatIf([req(0, 0)], opts({ policy: policy({ metric: "load.genThroughput" }), toMs: T0 + 2_000 }));
    expect(warned.warnings.join("\n")).toMatch(/do not report load.genThroughput/);
  });
});

/** A scaler that follows a script: the desired count from each time (virtual ms) on. */
function scripted(steps: Array<[number, number]>, o: Partial<FleetScaler> = {}): FleetScaler {
  return {
    model: MODEL, intervalMs: 500, initialPods: 1, startupMs: 0, drain: true, drainGraceMs: 30_000,
    observe: () => undefined,
    evaluate: (now) => steps.filter(([at]) => at <= now).at(-1)?.[1] ?? 1,
    ...o,
  };
}

describe("runWhatIf with an injected scaler (the fleet sized over time)", () => {
  const run = (trace: TraceRequest[], scaler: FleetScaler, endS: number) =>
    runWhatIf(trace, { strategy: "least-request", podsPerModel: {}, engine: ENGINE, startMs: T0, endMs: T0 + endS * 1000, scrapeIntervalMs: 500, scaler });

  it("pods count from their creation, a start-up delay included: 1 pod to 2 s, then 3 to the end", () => {
    const r = run([req(100, 0)], scripted([[0, 1], [2_000, 3]], { startupMs: 1_000 }), 10);
    const s = r.scaling;
    expect(s?.events).toEqual([{ atMs: 2_000, from: 1, to: 3 }]);
    expect(s?.endMs).toBe(10_000);
    expect(s?.podSeconds).toBeCloseTo(1 * 2 + 3 * 8, 6);
    expect(s?.peakPods).toBe(3);
    expect(r.pendingTimers).toBe(0);
    expect(r.ledgerSize).toBe(0);
  });

  it("a pod taken back from draining serves the requests held while no pod was routable", () => {
    // 0.1 s: a 1 s request; 0.5 s: scale to 0 (the pod drains, busy); 0.6 s: a request finds no
    // routable pod and waits; 1.0 s: scale to 1 takes the draining pod back and the request goes.
    const r = run([req(100, 0), req(600, 1)], scripted([[0, 1], [500, 0], [1_000, 1]]), 3);
    expect(r.scaling).toMatchObject({ held: 1, drainedIdle: 0, peakPods: 1 });
    expect(r.summary.completed).toBe(2);
    expect(r.ttftsMs[1]).toBeGreaterThanOrEqual(400);
    expect(r.ttftsMs[1]).toBeLessThan(700);
    expect(r.scaling?.podSeconds).toBeCloseTo(3, 6);
  });

  it("scaled to zero while idle: the pod leaves at once and pod-seconds stop", () => {
    const r = run([req(100, 0)], scripted([[0, 1], [2_000, 0]]), 5);
    expect(r.scaling).toMatchObject({ drainedIdle: 1, podsAtEnd: 0 });
    expect(r.scaling?.podSeconds).toBeCloseTo(2, 6);
  });
});

