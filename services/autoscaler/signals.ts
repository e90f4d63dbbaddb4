/**
 * The fleet signals a policy scales on, read from the same views a gateway folds (pods, load,
 * shared ledger), flow control's queue summaries and a window of decision outcomes. Pure.
 *
 * - `load.<field>`: the field summed over the policy's ready pods with a fresh sample (a stale or
 *   missing sample adds nothing and is counted in `missing`);
 * - `ledger.inFlight`, `ledger.promptTokens`: every gateway's outstanding charges on those pods;
 * - `flow.queued`: requests held by flow control for the model, over every gateway replica;
 *   `flow.waitMs`: how long the oldest of them has waited;
 * - `ttft.pNN`, `tpot.pNN`: percentiles of the outcomes in the policy's stable window.
 */
import type { AutoscaleMetric, AutoscalePolicy } from "../../schemas/autoscale.js";
import type { EngineLoadFields } from "../../schemas/events.js";
import type { LedgerReader } from "../views/charge-ledger.js";
import type { LoadReader } from "../views/load-view.js";
import type { PodInfo, PodSetReader } from "../views/pod-set.js";
import type { OutcomeWindow } from "./outcomes.js";

export interface FleetViews {
  readonly pods: PodSetReader;
  readonly load: LoadReader;
  readonly ledger: LedgerReader;
}

/** Flow control's held requests of one model across the fleet (from the gateways' summaries). */
export interface QueueReading {
  queued: number;
  /** How long the oldest held request has waited by now (ms), on one clock; undefined when none. */
  oldestAgeMs?: number;
}

/** One gateway's summary as the autoscaler received it: `ts` and bands' `oldest` on the gateway's clock, `receivedAt` on ours. */
export interface ReceivedSummary {
  ts: number;
  receivedAt: number;
  models: Readonly<Record<string, ReadonlyArray<{ count: number; oldest: number }>>>;
}

/**
 * How long a request reported held has waited by `now`, without comparing two hosts' clocks: its
 * age at publication (`ts - oldest`, both on the publisher's clock) plus the time since we received
 * the summary (`now - receivedAt`, both on ours). A gateway whose clock is a minute behind reads as
 * the wait it reports, not as a minute more. Negative parts (a summary with `oldest` after `ts`, a
 * receive time after `now`) count as 0.
 */
export function heldAgeMs(ts: number, oldest: number, receivedAt: number, now: number): number {
  return Math.max(0, ts - oldest) + Math.max(0, now - receivedAt);
}

/** The fleet's held requests of `model`: their number, and the longest wait by `now` (heldAgeMs). */
export function queueReadingOf(model: string, summaries: Iterable<ReceivedSummary>, now: number): QueueReading {
  let queued = 0;
  let oldestAgeMs: number | undefined;
  for (const r of summaries) {
    for (const b of r.models[model] ?? []) {
      if (b.count <= 0) continue;
      queued += b.count;
      const age = heldAgeMs(r.ts, b.oldest, r.receivedAt, now);
      if (oldestAgeMs === undefined || age > oldestAgeMs) oldestAgeMs = age;
    }
  }
  return oldestAgeMs === undefined ? { queued } : { queued, oldestAgeMs };
}

export interface SignalSources extends FleetViews {
  queues(model: string): QueueReading;
  outcomes: OutcomeWindow;
  /** Pods the drain handshake has taken out (not counted as capacity). */
  draining?: (model: string, pod: string) => boolean;
}

/** The policy's pods: ready, of its model and role, not draining. */
export function policyPods(p: Pick<AutoscalePolicy, "model" | "role">, s: Pick<SignalSources, "pods" | "draining">): PodInfo[] {
  return s.pods.readyPods(p.model).filter((x) => x.model === p.model && (p.role === undefined || x.role === p.role) && !s.draining?.(x.model, x.pod));
}

export interface SignalReading {
  value: number | undefined;
  /** Pods whose figure was unknown (stale load sample). */
  missing: number;
}

export function readSignal(metric: AutoscaleMetric, p: Pick<AutoscalePolicy, "model" | "role">, pods: readonly PodInfo[], s: SignalSources, now: number, windowMs: number): SignalReading {
  if (metric.startsWith("load.")) {
    const field = metric.slice(5) as keyof EngineLoadFields;
    let sum = 0;
    let seen = 0;
    for (const pod of pods) {
      const v = s.load.fresh(pod.model, pod.pod, now)?.[field];
      if (typeof v === "number" && Number.isFinite(v)) {
        sum += v;
        seen++;
      }
    }
    // No pod and no demand signal: zero pods carry zero load (a fleet at zero reads 0, not "unknown").
    return { value: seen > 0 || pods.length === 0 ? sum : undefined, missing: pods.length - seen };
  }
  if (metric === "ledger.inFlight" || metric === "ledger.promptTokens") {
    let sum = 0;
    for (const pod of pods) {
      const o = s.ledger.outstanding(pod.model, pod.pod);
      sum += metric === "ledger.inFlight" ? o.requests : o.promptTokens;
    }
    return { value: sum, missing: 0 };
  }
  if (metric === "flow.queued") return { value: s.queues(p.model).queued, missing: 0 };
  if (metric === "flow.waitMs") {
    const q = s.queues(p.model);
    return { value: q.queued > 0 && q.oldestAgeMs !== undefined ? q.oldestAgeMs : 0, missing: 0 };
  }
  const [kind, pct] = metric.split(".") as ["ttft" | "tpot", string];
  const v = s.outcomes.percentile(p.model, kind, Number(pct.slice(1)) / 100, now, windowMs);
  return { value: v, missing: 0 };
}
