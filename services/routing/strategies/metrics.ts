/**
 * Per-pod figures the load-based strategies share, derived from one engine load sample and the
 * ledger. Pure. Everything returns `undefined` rather than a made-up number when an input is
 * missing: the calling scorer decides what "missing" means for it.
 *
 * Histograms are cumulative since the engine started, so every mean here is a lifetime mean
 * (sum / count). That is the only thing one sample can give; see README.md ("Lifetime means")
 * for why that is weak and the LoadView support proposed to get recent means from deltas.
 * `histogramsOf` is the single place that would switch to recent means.
 */
import type { EngineLoadFields } from "../../../schemas/events.js";
import type { PodInfo } from "../../views/pod-set.js";
import type { RoutingContext } from "./types.js";

type Histogram = { readonly sum: number; readonly count: number };
type HistogramKey = "ttft" | "itl" | "e2e" | "queue" | "prefill" | "decode" | "promptTokens" | "generationTokens";

/** AIBrix's guess for a request's output length when no pod reports one. */
export const DEFAULT_GENERATION_TOKENS = 100;

/** KV usage above which an engine starts preempting: decode slows (AIBrix's conductor uses ×1.5). */
const KV_PRESSURE = 0.9;
const KV_PRESSURE_FACTOR = 1.5;

export function mean(h: Histogram | undefined): number | undefined {
  if (!h || !(h.count > 0) || !Number.isFinite(h.sum) || h.sum < 0) return undefined;
  return h.sum / h.count;
}

export function histogramsOf(load: EngineLoadFields): Readonly<Partial<Record<HistogramKey, Histogram>>> {
  return load.histograms as Partial<Record<HistogramKey, Histogram>>;
}

/** Lifetime means of one pod, in seconds and tokens. */
export interface PodMeans {
  readonly queueS?: number;
  /** Prefill time of one request (vLLM's prefill histogram; SGLang: TTFT minus queue time). */
  readonly prefillS?: number;
  readonly decodeS?: number;
  readonly ttftS?: number;
  readonly itlS?: number;
  readonly promptTokensPerRequest?: number;
  readonly generationTokensPerRequest?: number;
}

export function podMeans(load: EngineLoadFields): PodMeans {
  const h = histogramsOf(load);
  const queueS = mean(h.queue);
  const ttftS = mean(h.ttft);
  const finished = h.e2e?.count ?? 0;
  // SGLang exports no per-request token histograms; its token counters over finished requests
  // approximate the same mean (the counters also include requests still running, a small bias).
  const perRequest = (hist: Histogram | undefined, counter: number | null) =>
    mean(hist) ?? (counter !== null && counter >= 0 && finished > 0 ? counter / finished : undefined);
  return {
    queueS,
    prefillS: mean(h.prefill) ?? (ttftS !== undefined ? Math.max(0, ttftS - (queueS ?? 0)) : undefined),
    decodeS: mean(h.decode),
    ttftS,
    itlS: mean(h.itl),
    promptTokensPerRequest: perRequest(h.promptTokens, load.promptTokens),
    generationTokensPerRequest: perRequest(h.generationTokens, load.generationTokens),
  };
}

const MEAN_FIELDS = ["queueS", "prefillS", "decodeS", "ttftS", "itlS", "promptTokensPerRequest", "generationTokensPerRequest"] as const;

/**
 * Fills each pod's missing means with the average of the other candidates that have them. A pod
 * that has not finished a request yet (new, or just restarted) has no means; without this it would
 * never get an estimate, so latency strategies would never pick it, so it would never get means.
 * Pods without a sample (`undefined`) stay without: no sample means no evidence the pod is healthy.
 */
export function withPeerDefaults(means: readonly (PodMeans | undefined)[]): (PodMeans | undefined)[] {
  const avg: Partial<Record<(typeof MEAN_FIELDS)[number], number>> = {};
  for (const f of MEAN_FIELDS) {
    let sum = 0;
    let n = 0;
    for (const m of means) {
      const v = m?.[f];
      if (v !== undefined) {
        sum += v;
        n++;
      }
    }
    if (n > 0) avg[f] = sum / n;
  }
  return means.map((m) => {
    if (!m) return undefined;
    const filled: Record<string, number | undefined> = { ...m };
    for (const f of MEAN_FIELDS) if (filled[f] === undefined) filled[f] = avg[f];
    return filled as PodMeans;
  });
}

/** The expected output length of a request: the candidates' average, else AIBrix's guess. */
export function expectedGenerationTokens(means: readonly (PodMeans | undefined)[]): number {
  let sum = 0;
  let n = 0;
  for (const m of means) {
    const g = m?.generationTokensPerRequest;
    if (g !== undefined && g > 0) {
      sum += g;
      n++;
    }
  }
  return n > 0 ? sum / n : DEFAULT_GENERATION_TOKENS;
}

/**
 * Requests that will be prefilled before a new one: the engine's queue, or — when larger — the
 * shared ledger's requests not yet running. The ledger is updated at every pick by every gateway
 * replica, the engine's gauge only every scrape: between two scrapes the ledger sees a burst the
 * engine does not report yet, which keeps metric strategies from herding onto one pod.
 */
export function backlog(ctx: RoutingContext, pod: PodInfo, load: EngineLoadFields): number {
  const inFlight = ctx.ledger.outstanding(pod.model, pod.pod).requests;
  return Math.max(0, load.waiting ?? 0, inFlight - (load.running ?? 0));
}

/** Estimated seconds until a new request of `promptTokens` gets its first token on this pod. */
export function estimateTtftS(m: PodMeans, pending: number, promptTokens: number): number | undefined {
  if (m.prefillS === undefined) return undefined;
  // Prefill time grows with the prompt: scale the pod's mean by this prompt's share of its mean prompt.
  const own = m.promptTokensPerRequest && m.promptTokensPerRequest > 0 && promptTokens > 0 ? (m.prefillS * promptTokens) / m.promptTokensPerRequest : m.prefillS;
  // Whichever is larger of what requests recently waited and what the current queue implies (each
  // pending request prefilled one after another: pessimistic under chunked prefill, never optimistic).
  const queue = Math.max(m.queueS ?? 0, pending * m.prefillS);
  return queue + own;
}

/** Estimated seconds per output token on this pod. */
export function estimateTpotS(m: PodMeans, kvCacheUsage: number | null): number | undefined {
  const perToken = m.itlS ?? (m.decodeS !== undefined && m.generationTokensPerRequest ? m.decodeS / m.generationTokensPerRequest : undefined);
  if (perToken === undefined) return undefined;
  return kvCacheUsage !== null && kvCacheUsage > KV_PRESSURE ? perToken * KV_PRESSURE_FACTOR : perToken;
}

/** Estimated seconds to generate `generationTokens` after the first token. */
export function estimateDecodeS(m: PodMeans, generationTokens: number): number | undefined {
  if (m.decodeS !== undefined) {
    return m.generationTokensPerRequest && m.generationTokensPerRequest > 0 ? (m.decodeS * generationTokens) / m.generationTokensPerRequest : m.decodeS;
  }
  return m.itlS !== undefined ? m.itlS * generationTokens : undefined;
}
