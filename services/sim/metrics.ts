/**
 * /metrics for a simulated pod, under vLLM V1 or SGLang names. Every duration is simulated engine
 * time in seconds, so a scraper sees the latencies a real engine would report regardless of
 * `timeScale`. Gauges and counters are read from the engine at scrape time; histograms are fed
 * through the engine observer as requests progress.
 */
import type { EngineObserver, EngineSnapshot } from "./engine.js";
import { buckets125, Exposition, Histogram, type Labels } from "./prom-text.js";

export type EngineKind = "vllm" | "sglang";
export const ENGINE_KINDS: readonly EngineKind[] = ["vllm", "sglang"];

export interface PodMetrics {
  readonly observer: EngineObserver;
  render(snapshot: EngineSnapshot): string;
}

export interface MetricsContext {
  model: string;
  maxModelLen: number;
  blockSize: number;
  numGpuBlocks: number;
  prefixCaching: boolean;
}

const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560,
];
const ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];
const REQUEST_LATENCY_BUCKETS = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
];
const SGLANG_ITL_BUCKETS = [
  0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2,
  4, 6, 8,
];
const SGLANG_E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800];

const s = (ms: number): number => ms / 1000;

export function createPodMetrics(kind: EngineKind, ctx: MetricsContext): PodMetrics {
  return kind === "vllm" ? vllmMetrics(ctx) : sglangMetrics(ctx);
}

function vllmMetrics(ctx: MetricsContext): PodMetrics {
  // vLLM's `engine` label is the engine-core index (data-parallel rank), not the engine kind.
  const labels: Labels = { model_name: ctx.model, engine: "0" };
  const h = {
    ttft: new Histogram(TTFT_BUCKETS),
    itl: new Histogram(ITL_BUCKETS),
    e2e: new Histogram(REQUEST_LATENCY_BUCKETS),
    queue: new Histogram(REQUEST_LATENCY_BUCKETS),
    prefill: new Histogram(REQUEST_LATENCY_BUCKETS),
    decode: new Histogram(REQUEST_LATENCY_BUCKETS),
    promptTokens: new Histogram(buckets125(ctx.maxModelLen)),
    generationTokens: new Histogram(buckets125(ctx.maxModelLen)),
  };
  const observer: EngineObserver = {
    onFirstToken: (ms) => h.ttft.observe(s(ms)),
    onInterToken: (ms) => h.itl.observe(s(ms)),
    onFinished: (r) => {
      // vLLM records request-level histograms only for requests that reached the engine core.
      if (r.queueMs === undefined) return;
      h.e2e.observe(s(r.e2eMs));
      h.queue.observe(s(r.queueMs));
      h.prefill.observe(s(r.prefillMs ?? 0));
      h.decode.observe(s(r.decodeMs ?? 0));
      h.promptTokens.observe(r.promptTokens);
      h.generationTokens.observe(r.generationTokens);
    },
  };
  const render = (snap: EngineSnapshot): string => {
    const t = snap.totals;
    const one = (v: number): Array<[Labels, number]> => [[labels, v]];
    return new Exposition()
      .gauge("vllm:num_requests_running", "Number of requests in model execution batches.", one(snap.running))
      .gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", one(snap.waiting))
      .gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", one(snap.kvUsage))
      .counter(
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        one(t.prefixCacheQueries),
      )
      .counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", one(t.prefixCacheHits))
      .counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", one(t.preemptions))
      .counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", one(t.promptTokens))
      .counter("vllm:generation_tokens_total", "Number of generation tokens processed.", one(t.generationTokens))
      .counter(
        "vllm:request_success_total",
        "Count of successfully processed requests.",
        (["stop", "length", "abort"] as const).map((r) => [{ ...labels, finished_reason: r }, t.finished[r]]),
      )
      .histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels, h.promptTokens)
      .histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", labels, h.generationTokens)
      .histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, h.ttft)
      .histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels, h.itl)
      .histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels, h.e2e)
      .histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", labels, h.queue)
      .histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        labels,
        h.prefill,
      )
      .histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", labels, h.decode)
      .gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [
        [
          {
            block_size: String(ctx.blockSize),
            cache_dtype: "auto",
            enable_prefix_caching: ctx.prefixCaching ? "True" : "False",
            engine: "0",
            num_gpu_blocks: String(ctx.numGpuBlocks),
          },
          1,
        ],
      ])
      .toString();
  };
  return { observer, render };
}

/**
 * SGLang refreshes gen_throughput from its decode loop only, every few dozen steps, so the gauge
 * keeps its last value while the engine idles. Here it is the rate over the last
 * THROUGHPUT_STEPS steps that sampled tokens, likewise frozen while idle (and so independent of
 * when, in wall time, a scraper looks).
 */
const THROUGHPUT_STEPS = 40;

function sglangMetrics(ctx: MetricsContext): PodMetrics {
  const labels: Labels = { model_name: ctx.model };
  const ttft = new Histogram(TTFT_BUCKETS);
  const itl = new Histogram(SGLANG_ITL_BUCKETS);
  const e2e = new Histogram(SGLANG_E2E_BUCKETS);
  const recent: Array<{ endMs: number; sampled: number }> = [];
  const observer: EngineObserver = {
    onFirstToken: (ms) => ttft.observe(s(ms)),
    onInterToken: (ms) => itl.observe(s(ms)),
    onStep: (endMs, _scheduled, sampled) => {
      if (sampled === 0) return;
      recent.push({ endMs, sampled });
      if (recent.length > THROUGHPUT_STEPS) recent.shift();
    },
    onFinished: (r) => {
      if (r.reason !== "abort") e2e.observe(s(r.e2eMs));
    },
  };
  const render = (snap: EngineSnapshot): string => {
    // Tokens of every step after the oldest, over the time since the oldest ended.
    const spanMs = (recent.at(-1)?.endMs ?? 0) - (recent[0]?.endMs ?? 0);
    const tokens = recent.slice(1).reduce((sum, r) => sum + r.sampled, 0);
    const t = snap.totals;
    const one = (v: number): Array<[Labels, number]> => [[labels, v]];
    return new Exposition()
      .counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", one(t.promptTokens))
      .counter("sglang:generation_tokens_total", "Number of generation tokens processed.", one(t.generationTokens))
      .gauge("sglang:num_running_reqs", "The number of running requests.", one(snap.running))
      .gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", one(snap.waiting))
      .gauge("sglang:num_used_tokens", "The number of used tokens.", one(snap.usedBlocks * ctx.blockSize))
      .gauge("sglang:token_usage", "The token usage.", one(snap.kvUsage))
      .gauge(
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        one(t.prefixCacheQueries > 0 ? t.prefixCacheHits / t.prefixCacheQueries : 0),
      )
      .gauge("sglang:gen_throughput", "The generation throughput (token/s).", one(spanMs > 0 ? tokens / s(spanMs) : 0))
      .histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, ttft)
      .histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels, itl)
      .histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", labels, e2e)
      .toString();
  };
  return { observer, render };
}
