/**
 * The replay engine's counterfactual side: each `--strategies` entry re-picks every evaluated
 * decision on the views that decision had, except that its load is a ledger of its own picks (each
 * charged at the decision time and released after the recorded duration), as if the whole fleet
 * had used it. The recorded picks run as the first arm ("recorded") through the same accounting.
 * Steps must come in time order across gateways, since the ledgers are shared by the whole fleet:
 * the engine adds a step when it has evaluated a decision and runs them once no earlier decision
 * can still come. Pure: no I/O, no clock.
 */
import { MinHeap } from "../shared/min-heap.js";
import type { DecisionRecord, EngineLoadFields } from "../../schemas/events.js";
import { forgetIdleTotals, type LedgerReader, type Outstanding, ZERO_OUTSTANDING } from "../views/charge-ledger.js";
import type { LoadReader, PodLoad } from "../views/load-view.js";
import type { LatencyReader } from "../views/latency-model.js";
import type { PodInfo, PodSetReader } from "../views/pod-set.js";
import type { UsageReader } from "../views/usage-view.js";
import { decisionRandom, type PrefixMatchResult, type SchedulingInput, schedule, parseStrategy, chargeSeqOf, type RoutingRequest, type Strategy } from "../routing/mod.js";
import type { RegretEntry, ReplayReport, StrategySummary, TimelinePoint } from "./report-types.js";

/**
 * One decision's seeded random sequence (`decisionRandom`: request id, gateway, charge id), drawn
 * once and read again from the start by each strategy that picks on that decision: the recorded
 * strategy's re-pick and every counterfactual see the very numbers the gateway's tie-breaks saw,
 * without hashing the seed once per strategy.
 */
export class DecisionDraws {
  private readonly xs: number[] = [];
  private source: (() => number) | undefined;
  constructor(private readonly d: Pick<DecisionRecord, "id" | "gateway" | "charge">) {}
  /** A generator reading the sequence from its start. */
  reader(): () => number {
    let i = 0;
    return () => {
      const xs = this.xs;
      if (i === xs.length) {
        this.source ??= decisionRandom(this.d.id, this.d.gateway, this.d.charge as string);
        xs.push(this.source());
      }
      return xs[i++] as number;
    };
  }
}

/** What a counterfactual step needs of one decision's views, kept when its fidelity was checked. */
export interface ArmTask {
  d: DecisionRecord;
  /** The decision's seeded random sequence (shared with its fidelity check). */
  draws: DecisionDraws;
  request: RoutingRequest;
  candidates: readonly PodInfo[];
  loads: Map<string, { fresh: EngineLoadFields | undefined; get: PodLoad | undefined }>;
  usage: UsageReader;
  match: PrefixMatchResult | undefined;
  /** The recorded gateway's latency model (predicted-latency*): its window as of the decision's time. */
  latency?: LatencyReader;
}

export interface CounterfactualOptions {
  /** The report window (for the timeline buckets). */
  fromMs: number;
  toMs: number;
  timelineBuckets: number;
  topRegrets: number;
}

/**
 * A counterfactual arm's load: the charges of its own picks, per pod, each counted from its
 * decision until its recorded end. It counts as the views' ChargeLedger counts such charges (a
 * repeated charge key is counted once, a release of an unknown key changes nothing, at most
 * `maxCharges` are held and the oldest goes beyond), without what a gateway's ledger needs beside
 * them: heartbeats, expiry (an arm's charges are released, and no gateway of the recording lapses
 * in its ledger) and first tokens (an arm's charges stay prefill work, as they did there). The key
 * (gateway/charge id) is built once per decision and shared by every arm.
 * Memory: one entry (~100 bytes) per charge in flight in the arm, plus one totals object per pod.
 */
export class ArmLedger implements LedgerReader {
  private readonly entries = new Map<string, { model: string; pod: string; totals: Outstanding; promptTokens: number }>();
  private readonly totals = new Map<string, Map<string, Outstanding>>();
  evicted = 0;

  constructor(readonly maxCharges = 10_000_000) {}

  get size(): number {
    return this.entries.size;
  }

  charge(key: string, model: string, pod: string, promptTokens: number): boolean {
    if (this.entries.has(key)) return false;
    if (this.entries.size >= this.maxCharges) {
      const oldest = this.entries.keys().next();
      if (!oldest.done) this.release(oldest.value);
      this.evicted++;
    }
    let pods = this.totals.get(model);
    if (!pods) this.totals.set(model, (pods = new Map()));
    let t = pods.get(pod);
    if (!t) pods.set(pod, (t = { requests: 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }));
    this.entries.set(key, { model, pod, totals: t, promptTokens });
    t.requests++;
    t.promptTokens += promptTokens;
    t.prefillRequests++;
    t.prefillTokens += promptTokens;
    return true;
  }

  release(key: string): boolean {
    const e = this.entries.get(key);
    if (!e) return false;
    this.entries.delete(key);
    const t = e.totals;
    t.requests--;
    t.promptTokens -= e.promptTokens;
    t.prefillRequests--;
    t.prefillTokens -= e.promptTokens;
    forgetIdleTotals(this.totals, e.model, e.pod, t);
    return true;
  }

  outstanding(model: string, pod: string): Readonly<Outstanding> {
    return this.totals.get(model)?.get(pod) ?? ZERO_OUTSTANDING;
  }
}

interface Arm {
  name: string;
  strategy?: Strategy;
  ledger: ArmLedger;
  summary: StrategySummary;
  spreadSum: number;
  regretSum: number;
}

/** A counterfactual ledger's release heap entry. */
interface Release {
  at: number;
  arm: number;
  /** The charge's ledger key (gateway/charge id). */
  key: string;
}

export class Counterfactuals {
  private readonly arms: Arm[];
  private readonly releases = new MinHeap<Release>((a, b) => a.at < b.at);
  /** Evaluated decisions whose counterfactual step has not run yet, in time order. */
  private readonly tasks: ArmTask[] = [];
  private readonly agreement: number[][];
  private readonly timeline = new Map<number, Map<string, { hit: number; queried: number; spread: number; n: number }>>();
  private readonly regrets: RegretEntry[] = [];

  /** `strategies`: the counterfactual specs; an unknown one fails here, before any work (a StrategySpecError naming it). */
  constructor(
    strategies: readonly string[],
    private readonly o: CounterfactualOptions,
  ) {
    const names = ["recorded", ...strategies];
    this.arms = names.map((name, i) => ({
      name,
      ...(i === 0 ? {} : { strategy: parseStrategy(name) }),
      ledger: new ArmLedger(10_000_000),
      summary: { name, decisions: 0, hitBlocks: 0, queriedBlocks: 0, hitRate: 0, meanSpread: 0, maxSpread: 0, meanRegretBlocks: 0 },
      spreadSum: 0,
      regretSum: 0,
    }));
    this.agreement = names.map(() => names.map(() => 0));
  }

  /** Queues a step, in time order (ties: gateway, then charge order). */
  add(t: ArmTask): void {
    insertTask(this.tasks, t);
  }

  /** Runs the queued steps of decisions strictly before `horizon` (all of them for +Infinity). */
  runBefore(horizon: number): void {
    let n = 0;
    while (n < this.tasks.length && (this.tasks[n] as ArmTask).d.ts < horizon) this.runTask(this.tasks[n++] as ArmTask);
    if (n > 0) this.tasks.splice(0, n);
  }

  private runTask(t: ArmTask): void {
    const d = t.d;
    this.releaseArms(d.ts);
    const m = t.match;
    let best = 0;
    if (m) for (const x of m.detail) best = Math.max(best, m.info.matched(x.pod));
    const pods: PodSetReader = { readyPods: () => t.candidates, knows: () => t.candidates.length > 0, get: () => undefined, byAddress: () => undefined, all: () => t.candidates };
    const load: LoadReader = { fresh: (_m, pod) => t.loads.get(pod)?.fresh, get: (_m, pod) => t.loads.get(pod)?.get };
    const views = { pods, load, ledger: this.arms[0]?.ledger as ArmLedger, usage: t.usage, ...(t.latency ? { latency: t.latency } : {}) };
    const input: SchedulingInput = { request: t.request, ...(d.subset ? { subset: d.subset } : {}), now: d.ts, ...(d.slo ? { slo: d.slo } : {}), ...(m ? { prefix: () => m } : {}), views, strategy: this.arms[0]?.strategy as Strategy, random: Math.random };
    const picks: string[] = [];
    // One key string for every arm (its hash is computed once, at the first Map lookup).
    const key = `${d.gateway}/${d.charge}`;
    const promptTokens = d.routedPromptTokens ?? d.promptTokens ?? 0;
    const releaseAt = d.ts + Math.max(1, d.durationMs ?? 1);
    let timeline: ReturnType<Counterfactuals["bucketOf"]> | undefined;
    for (let i = 0; i < this.arms.length; i++) {
      const arm = this.arms[i] as Arm;
      let pod: string | undefined;
      if (i === 0) pod = d.pick ?? undefined;
      else {
        views.ledger = arm.ledger;
        input.strategy = arm.strategy as Strategy;
        input.random = t.draws.reader();
        try {
          pod = schedule(input).pick.pod.pod;
        } catch {
          pod = undefined;
        }
      }
      picks.push(pod ?? "");
      if (pod === undefined) continue;
      arm.ledger.charge(key, d.model, pod, promptTokens);
      this.releases.push({ at: releaseAt, arm: i, key });
      const spread = spreadOf(arm.ledger, t.candidates);
      const hit = m ? m.info.matched(pod) : 0;
      const queried = m ? m.info.queried : 0;
      const regret = m ? best - hit : 0;
      arm.summary.decisions++;
      arm.summary.hitBlocks += hit;
      arm.summary.queriedBlocks += queried;
      arm.spreadSum += spread;
      arm.regretSum += regret;
      if (spread > arm.summary.maxSpread) arm.summary.maxSpread = spread;
      timeline ??= this.bucketOf(d.ts);
      let e = timeline.get(arm.name);
      if (!e) timeline.set(arm.name, (e = { hit: 0, queried: 0, spread: 0, n: 0 }));
      e.hit += hit;
      e.queried += queried;
      e.spread += spread;
      e.n++;
      if (regret > 0 && m) this.noteRegret({ requestId: d.id, gateway: d.gateway, ts: d.ts, model: d.model, strategy: arm.name, pick: pod, best: m.detail.reduce((a, x) => (m.info.matched(x.pod) > m.info.matched(a) ? x.pod : a), pod), regretBlocks: regret });
    }
    for (let a = 0; a < picks.length; a++) {
      if (picks[a] === "") continue;
      const row = this.agreement[a] as number[];
      for (let b = 0; b < picks.length; b++) if (picks[a] === picks[b]) row[b] = (row[b] ?? 0) + 1;
    }
  }

  private releaseArms(now: number): void {
    while (this.releases.size > 0 && (this.releases.peek() as Release).at <= now) {
      const r = this.releases.pop() as Release;
      this.arms[r.arm]?.ledger.release(r.key);
    }
  }

  /** The timeline bucket of time `ts`: per arm, its sums. */
  private bucketOf(ts: number): Map<string, { hit: number; queried: number; spread: number; n: number }> {
    const width = Math.max(1, Math.ceil((this.o.toMs - this.o.fromMs + 1) / this.o.timelineBuckets));
    const t = this.o.fromMs + Math.floor((ts - this.o.fromMs) / width) * width;
    let per = this.timeline.get(t);
    if (!per) this.timeline.set(t, (per = new Map()));
    return per;
  }

  private noteRegret(e: RegretEntry): void {
    this.regrets.push(e);
    if (this.regrets.length > this.o.topRegrets * 4) {
      this.regrets.sort((a, b) => b.regretBlocks - a.regretBlocks);
      this.regrets.length = this.o.topRegrets;
    }
  }

  /** The report's per-strategy sections, from the steps run so far. */
  report(): Pick<ReplayReport, "strategies" | "timeline" | "agreement" | "topRegrets"> {
    const strategies = this.arms.map((a) => ({
      ...a.summary,
      hitRate: a.summary.queriedBlocks > 0 ? a.summary.hitBlocks / a.summary.queriedBlocks : 0,
      meanSpread: a.summary.decisions > 0 ? a.spreadSum / a.summary.decisions : 0,
      meanRegretBlocks: a.summary.decisions > 0 ? a.regretSum / a.summary.decisions : 0,
    }));
    const names = this.arms.map((a) => a.name);
    const timeline: TimelinePoint[] = [...this.timeline.entries()]
      .sort((a, b) => a[0] - b[0])
      .map(([t, per]) => ({
        t,
        strategies: Object.fromEntries([...per.entries()].map(([n, e]) => [n, { hitRate: e.queried > 0 ? e.hit / e.queried : 0, spread: e.n > 0 ? e.spread / e.n : 0, decisions: e.n }])),
      }));
    const diag = this.agreement.map((row, i) => row[i] ?? 0);
    const matrix = this.agreement.map((row, i) => row.map((v) => ((diag[i] ?? 0) > 0 ? v / (diag[i] as number) : 0)));
    return {
      strategies,
      timeline,
      agreement: { strategies: names, matrix },
      topRegrets: [...this.regrets].sort((a, b) => b.regretBlocks - a.regretBlocks).slice(0, this.o.topRegrets),
    };
  }
}

/** The busiest candidate's requests in flight over the mean (1 when nothing is in flight). */
function spreadOf(ledger: LedgerReader, candidates: readonly PodInfo[]): number {
  if (candidates.length === 0) return 1;
  let max = 0;
  let sum = 0;
  for (const p of candidates) {
    const n = ledger.outstanding(p.model, p.pod).requests;
    sum += n;
    if (n > max) max = n;
  }
  return sum > 0 ? max / (sum / candidates.length) : 1;
}

/** Counterfactual steps in time order (ties: gateway, then charge order). */
function insertTask(list: ArmTask[], t: ArmTask): void {
  let i = list.length;
  const after = (x: ArmTask) => x.d.ts > t.d.ts || (x.d.ts === t.d.ts && (x.d.gateway > t.d.gateway || (x.d.gateway === t.d.gateway && (chargeSeqOf(x.d.charge) ?? 0) > (chargeSeqOf(t.d.charge) ?? 0))));
  while (i > 0 && after(list[i - 1] as ArmTask)) i--;
  list.splice(i, 0, t);
}
