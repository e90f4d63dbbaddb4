/**
 * Maps one parsed /metrics exposition of a vLLM or SGLang pod onto the engine-neutral load figures
 * a router scores pods with. Pure: the scraper shell fetches, parses and publishes.
 */
import { histogramSeries, type MetricFamilies, type Sample, samplesNamed } from "./prom-text.js";

export type EngineKind = "vllm" | "sglang";

export interface HistogramSummary {
  sum: number;
  count: number;
}

export type HistogramKey = "ttft" | "itl" | "e2e" | "queue" | "prefill" | "decode" | "promptTokens" | "generationTokens";

export interface EngineLoad {
  running: number | null; // vllm:num_requests_running | sglang:num_running_reqs
  waiting: number | null; // vllm:num_requests_waiting | sglang:num_queue_reqs
  kvCacheUsage: number | null; // 0..1: vllm:kv_cache_usage_perc (fallback vllm:gpu_cache_usage_perc) | sglang:token_usage
  prefixCacheQueries: number | null; // cumulative counters (vllm); null for sglang
  prefixCacheHits: number | null;
  cacheHitRate: number | null; // sglang:cache_hit_rate; for vllm null (the consumer derives it from counter deltas)
  promptTokens: number | null; // cumulative counter
  generationTokens: number | null; // cumulative counter
  genThroughput: number | null; // sglang:gen_throughput tok/s; null for vllm
  preemptions: number | null;
  blockSize: number | null; // from vllm:cache_config_info label block_size
  numGpuBlocks: number | null;
  runningLoras: string[]; // from the newest vllm:lora_requests_info sample
  waitingLoras: string[];
  maxLora: number | null;
  histograms: Partial<Record<HistogramKey, HistogramSummary>>;
  /** SGLang P/D: prefills waiting for their decode to connect (sglang:num_prefill_bootstrap_queue_reqs). */
  pdPrefillQueue?: number | null;
  /** SGLang P/D: decodes waiting for their KV (sglang:num_decode_prealloc_queue_reqs). */
  pdDecodeQueue?: number | null;
}

/** How several label sets of one metric combine into a pod figure. */
type Combine = "sum" | "mean";

type ScalarField =
  | "running"
  | "waiting"
  | "kvCacheUsage"
  | "prefixCacheQueries"
  | "prefixCacheHits"
  | "cacheHitRate"
  | "promptTokens"
  | "generationTokens"
  | "genThroughput"
  | "preemptions"
  | "pdPrefillQueue"
  | "pdDecodeQueue";

interface ScalarSource {
  /** Sample names in order of preference: the first one present wins (newest name first). */
  names: readonly string[];
  combine: Combine;
}

interface EngineMetricNames {
  scalars: Readonly<Record<ScalarField, ScalarSource>>;
  /** Histogram family names, newest name first. */
  histograms: Readonly<Partial<Record<HistogramKey, readonly string[]>>>;
  cacheConfigInfo?: string;
  loraInfo?: string;
}

const NONE: ScalarSource = { names: [], combine: "sum" };

// Ratios are averaged, not summed: with data parallelism each engine reports the usage of its own
// equally sized cache, so the pod's usage is the mean. Counts and rates add up.
const ENGINES: Readonly<Record<EngineKind, EngineMetricNames>> = {
  vllm: {
    scalars: {
      running: { names: ["vllm:num_requests_running"], combine: "sum" },
      waiting: { names: ["vllm:num_requests_waiting"], combine: "sum" },
      // gpu_cache_usage_perc was renamed in 0.9 and dropped later; older servers are still deployed.
      kvCacheUsage: { names: ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"], combine: "mean" },
      // Same rename for the prefix cache counters (gpu_ prefix before 0.9).
      prefixCacheQueries: {
        names: ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"],
        combine: "sum",
      },
      prefixCacheHits: { names: ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"], combine: "sum" },
      cacheHitRate: NONE,
      promptTokens: { names: ["vllm:prompt_tokens_total"], combine: "sum" },
      generationTokens: { names: ["vllm:generation_tokens_total"], combine: "sum" },
      genThroughput: NONE,
      preemptions: { names: ["vllm:num_preemptions_total"], combine: "sum" },
      pdPrefillQueue: NONE,
      pdDecodeQueue: NONE,
    },
    histograms: {
      ttft: ["vllm:time_to_first_token_seconds"],
      // time_per_output_token_seconds measured the same thing before the rename.
      itl: ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"],
      e2e: ["vllm:e2e_request_latency_seconds"],
      queue: ["vllm:request_queue_time_seconds"],
      prefill: ["vllm:request_prefill_time_seconds"],
      decode: ["vllm:request_decode_time_seconds"],
      promptTokens: ["vllm:request_prompt_tokens"],
      generationTokens: ["vllm:request_generation_tokens"],
    },
    cacheConfigInfo: "vllm:cache_config_info",
    loraInfo: "vllm:lora_requests_info",
  },
  sglang: {
    scalars: {
      running: { names: ["sglang:num_running_reqs"], combine: "sum" },
      waiting: { names: ["sglang:num_queue_reqs"], combine: "sum" },
      kvCacheUsage: { names: ["sglang:token_usage"], combine: "mean" },
      prefixCacheQueries: NONE,
      prefixCacheHits: NONE,
      cacheHitRate: { names: ["sglang:cache_hit_rate"], combine: "mean" },
      promptTokens: { names: ["sglang:prompt_tokens_total"], combine: "sum" },
      generationTokens: { names: ["sglang:generation_tokens_total"], combine: "sum" },
      genThroughput: { names: ["sglang:gen_throughput"], combine: "sum" },
      preemptions: NONE,
      pdPrefillQueue: { names: ["sglang:num_prefill_bootstrap_queue_reqs"], combine: "sum" },
      pdDecodeQueue: { names: ["sglang:num_decode_prealloc_queue_reqs"], combine: "sum" },
    },
    histograms: {
      ttft: ["sglang:time_to_first_token_seconds"],
      itl: ["sglang:inter_token_latency_seconds"],
      e2e: ["sglang:e2e_request_latency_seconds"],
      queue: ["sglang:queue_time_seconds"],
    },
  },
};

const SCALAR_FIELDS = Object.keys(ENGINES.vllm.scalars) as ScalarField[];

/**
 * Reads the router's load figures out of a parsed exposition.
 *
 * Label sets: with `model`, only samples whose `model_name` label equals it count (samples without
 * a `model_name` label, such as vLLM's info gauges, always count). vLLM's `model_name` is the first
 * served model name, not a LoRA adapter name. Without `model`, every label set counts. Several
 * label sets that remain (data-parallel engines, several models) are summed for counts, counters
 * and throughput, and averaged for ratios (KV cache usage, SGLang's cache hit rate).
 *
 * A metric the engine does not export is `null` (or absent from `histograms`), never 0. NaN and
 * infinite samples are ignored as if absent. Never throws.
 */
export function extractEngineLoad(families: MetricFamilies, engine: EngineKind, model?: string): EngineLoad {
  const names = ENGINES[engine];
  const pick = (samples: Sample[]): Sample[] =>
    model === undefined ? samples : samples.filter((s) => s.labels.model_name === undefined || s.labels.model_name === model);

  const scalars = {} as Record<ScalarField, number | null>;
  for (const field of SCALAR_FIELDS) {
    const source = names.scalars[field];
    scalars[field] = null;
    for (const name of source.names) {
      const value = combine(pick(samplesNamed(families, name)), source.combine);
      if (value !== null) {
        scalars[field] = value;
        break;
      }
    }
  }

  const histograms: Partial<Record<HistogramKey, HistogramSummary>> = {};
  for (const [key, candidates] of Object.entries(names.histograms) as [HistogramKey, readonly string[]][]) {
    for (const name of candidates) {
      const summary = summarize(families, name, model);
      if (summary !== null) {
        histograms[key] = summary;
        break;
      }
    }
  }

  const cache = names.cacheConfigInfo === undefined ? [] : pick(samplesNamed(families, names.cacheConfigInfo));
  const lora = names.loraInfo === undefined ? undefined : newest(pick(samplesNamed(families, names.loraInfo)));

  return {
    ...scalars,
    // Every data-parallel engine runs the same cache config, so the first readable block size holds for all.
    blockSize: firstInt(cache, "block_size"),
    numGpuBlocks: sumInts(cache, "num_gpu_blocks"),
    runningLoras: adapterList(lora?.labels.running_lora_adapters),
    waitingLoras: adapterList(lora?.labels.waiting_lora_adapters),
    maxLora: lora === undefined ? null : parseCount(lora.labels.max_lora),
    histograms,
  };
}

function combine(samples: Sample[], how: Combine): number | null {
  let total = 0;
  let n = 0;
  for (const s of samples) {
    if (!Number.isFinite(s.value)) continue;
    total += s.value;
    n++;
  }
  if (n === 0) return null;
  return how === "sum" ? total : total / n;
}

function summarize(families: MetricFamilies, name: string, model: string | undefined): HistogramSummary | null {
  let sum = 0;
  let count = 0;
  let found = false;
  for (const series of histogramSeries(families, name)) {
    if (model !== undefined && series.labels.model_name !== undefined && series.labels.model_name !== model) continue;
    if (series.sum === null || series.count === null) continue;
    if (!Number.isFinite(series.sum) || !Number.isFinite(series.count)) continue;
    sum += series.sum;
    count += series.count;
    found = true;
  }
  return found ? { sum, count } : null;
}

/** vLLM sets the LoRA info gauge to the wall-clock time of each update, so the largest value is the current state. */
function newest(samples: Sample[]): Sample | undefined {
  let best: Sample | undefined;
  for (const s of samples) {
    if (Number.isNaN(s.value)) continue;
    if (best === undefined || s.value > best.value) best = s;
  }
  return best;
}

function adapterList(label: string | undefined): string[] {
  if (label === undefined || label === "") return [];
  return label
    .split(",")
    .map((name) => name.trim())
    .filter((name) => name !== "");
}

/** Non-negative integer label value; vLLM writes "None" before the value is known. */
function parseCount(label: string | undefined): number | null {
  if (label === undefined || !/^\d+$/.test(label)) return null;
  return Number(label);
}

function firstInt(samples: Sample[], label: string): number | null {
  for (const s of samples) {
    const value = parseCount(s.labels[label]);
    if (value !== null) return value;
  }
  return null;
}

function sumInts(samples: Sample[], label: string): number | null {
  let total: number | null = null;
  for (const s of samples) {
    const value = parseCount(s.labels[label]);
    if (value !== null) total = (total ?? 0) + value;
  }
  return total;
}
