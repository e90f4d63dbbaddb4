/**
 * Test fixtures for strategies: pods, engine samples, a routing context over a real LoadView (so
 * staleness is the real rule) and a fake ledger. Used by the *.test.ts files only.
 */
import type { EngineLoadFields } from "../../../schemas/events.js";
import type { Outstanding } from "../../views/charge-ledger.js";
import { LoadView } from "../../views/load-view.js";
import type { PodInfo } from "../../views/pod-set.js";
import type { UsageReader } from "../../views/usage-view.js";
import { routingRequestOf } from "./request.js";
import type { RoutingContext, SloTargets } from "./types.js";

export const NOW = 100_000;

export const pod = (name: string): PodInfo => ({
  model: "m",
  pod: name,
  address: `10.0.0.${name.replace(/\D/g, "") || "1"}:8000`,
  engine: "vllm",
  role: "combined",
  adapters: [],
  labels: {},
  ready: true,
  updatedAt: 0,
});

/** A histogram whose mean is `mean` over `count` observations. */
export const hist = (mean: number, count = 10) => ({ sum: mean * count, count });

export function sample(fields: Partial<EngineLoadFields> = {}): EngineLoadFields {
  return {
    running: 0,
    waiting: 0,
    kvCacheUsage: 0,
    prefixCacheQueries: null,
    prefixCacheHits: null,
    cacheHitRate: null,
    promptTokens: null,
    generationTokens: null,
    genThroughput: null,
    preemptions: null,
    blockSize: null,
    numGpuBlocks: null,
    runningLoras: [],
    waitingLoras: [],
    maxLora: null,
    histograms: {},
    ...fields,
  };
}

/** A vLLM sample with the latency histograms a latency estimate needs (seconds, tokens). */
export function vllmSample(m: { queue?: number; prefill: number; decode: number; itl?: number; prompt?: number; gen?: number }, fields: Partial<EngineLoadFields> = {}): EngineLoadFields {
  const histograms: Record<string, { sum: number; count: number }> = {
    queue: hist(m.queue ?? 0),
    prefill: hist(m.prefill),
    decode: hist(m.decode),
    promptTokens: hist(m.prompt ?? 100),
    generationTokens: hist(m.gen ?? 100),
  };
  if (m.itl !== undefined) histograms.itl = hist(m.itl);
  return sample({ ...fields, histograms });
}

/** Load of one pod: a sample, `"stale"` (a sample older than the staleness bound), or absent. */
export type PodLoadSpec = EngineLoadFields | "stale" | "flagged-stale" | undefined;

export interface CtxSpec {
  pods: string[];
  inFlight?: Record<string, number>;
  promptTokensInFlight?: Record<string, number>;
  /** Prompt tokens of the requests still in prefill, per pod (token-load strategies). */
  prefillTokensInFlight?: Record<string, number>;
  load?: Record<string, PodLoadSpec>;
  headers?: Record<string, string>;
  promptTokens?: number;
  random?: () => number;
  usage?: UsageReader;
  slo?: SloTargets;
  now?: number;
}

export function ctxOf(spec: CtxSpec): RoutingContext {
  const now = spec.now ?? NOW;
  const load = new LoadView(2_000);
  for (const [p, l] of Object.entries(spec.load ?? {})) {
    if (l === undefined) continue;
    if (l === "stale") load.apply({ type: "load", model: "m", pod: p, ts: now - 5_000, stale: false, load: sample() });
    else if (l === "flagged-stale") load.apply({ type: "load", model: "m", pod: p, ts: now, stale: true, load: null });
    else load.apply({ type: "load", model: "m", pod: p, ts: now - 10, stale: false, load: l });
  }
  return {
    request: routingRequestOf("m", "r", spec.headers ?? {}, spec.promptTokens ?? 100, () => spec.pods.map(pod)),
    pods: spec.pods.map(pod),
    now,
    random: spec.random ?? (() => 0),
    ledger: {
      outstanding: (_m, p): Outstanding => ({ requests: spec.inFlight?.[p] ?? 0, promptTokens: spec.promptTokensInFlight?.[p] ?? 0, prefillRequests: 0, prefillTokens: spec.prefillTokensInFlight?.[p] ?? 0 }),
    },
    load,
    ...(spec.usage ? { usage: spec.usage } : {}),
    ...(spec.slo ? { slo: spec.slo } : {}),
  };
}

/** A deterministic "random" source returning `values` in turn, cycling. */
export function seq(...values: number[]): () => number {
  let i = 0;
  return () => values[i++ % values.length] as number;
}
