import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { type EngineLoad, extractEngineLoad } from "./engine-load.js";
import { parsePrometheusText } from "./prom-text.js";

const fixture = (name: string) =>
  parsePrometheusText(readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8"));
const load = (text: string, engine: "vllm" | "sglang" = "vllm", model?: string) =>
  extractEngineLoad(parsePrometheusText(text), engine, model);

const EMPTY: EngineLoad = {
  running: null,
  waiting: null,
  kvCacheUsage: null,
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
  pdPrefillQueue: null,
  pdDecodeQueue: null,
  histograms: {},
};

const VLLM_0_11: EngineLoad = {
  running: 12,
  waiting: 3,
  kvCacheUsage: 0.4172480087912088,
  prefixCacheQueries: 2841733,
  prefixCacheHits: 1640208,
  cacheHitRate: null,
  promptTokens: 2841733,
  generationTokens: 403461,
  genThroughput: null,
  preemptions: 17,
  blockSize: 16,
  numGpuBlocks: 7282,
  runningLoras: ["sql-lora", "chat-lora"],
  waitingLoras: [],
  maxLora: 4,
  pdPrefillQueue: null,
  pdDecodeQueue: null,
  histograms: {
    ttft: { sum: 287.4193119812012, count: 1344 },
    itl: { sum: 10491.377246379852, count: 402115 },
    e2e: { sum: 9773.902212619781, count: 1342 },
    queue: { sum: 287.90331768989563, count: 1342 },
    prefill: { sum: 141.6620237827301, count: 1342 },
    decode: { sum: 9160.455396413803, count: 1342 },
    promptTokens: { sum: 2841733, count: 1342 },
    generationTokens: { sum: 403461, count: 1342 },
  },
};

describe("engine-load - vLLM", () => {
  it("reads every field from a 0.11 exposition", () => {
    expect(extractEngineLoad(fixture("vllm-0.11.txt"), "vllm")).toEqual(VLLM_0_11);
  });

  it("reads the same figures from the OpenMetrics rendering", () => {
    const { histograms, ...scalars } = extractEngineLoad(fixture("vllm-0.11-openmetrics.txt"), "vllm");
    const { histograms: _, ...expected } = VLLM_0_11;
    expect(scalars).toEqual(expected);
    // The OpenMetrics fixture carries only the TTFT histogram.
    expect(histograms).toEqual({ ttft: VLLM_0_11.histograms.ttft });
  });

  it("selects the served model by its model_name label", () => {
    expect(extractEngineLoad(fixture("vllm-0.11.txt"), "vllm", "meta-llama/Llama-3.1-8B-Instruct")).toEqual(VLLM_0_11);
  });

  it("falls back to the names older servers use", () => {
    const old = extractEngineLoad(fixture("vllm-0.8-old-names.txt"), "vllm");
    expect(old).toMatchObject({
      running: 7,
      waiting: 0,
      kvCacheUsage: 0.2731253,
      prefixCacheQueries: 512003,
      prefixCacheHits: 198304,
      preemptions: 0,
      blockSize: 16,
      numGpuBlocks: 27525,
      runningLoras: [],
      waitingLoras: [],
      maxLora: null,
    });
    expect(old.histograms.itl).toEqual({ sum: 10491.377246379852, count: 402115 });
  });

  it.each([
    [
      "kvCacheUsage",
      "vllm:kv_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc 0.9\n",
      "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.5\n",
      0.5,
    ],
    [
      "prefixCacheHits",
      "vllm:prefix_cache_hits_total 10\nvllm:gpu_prefix_cache_hits_total 99\n",
      "vllm:gpu_prefix_cache_hits_total 99\nvllm:prefix_cache_hits_total 10\n",
      10,
    ],
  ] as const)("prefers the current name for %s when both are exported", (field, text, reversed, expected) => {
    expect(load(text)[field]).toBe(expected);
    expect(load(reversed)[field]).toBe(expected);
  });

  it("prefers inter_token_latency_seconds over time_per_output_token_seconds", () => {
    const text = [
      'vllm:time_per_output_token_seconds_bucket{le="+Inf"} 9',
      "vllm:time_per_output_token_seconds_sum 9.9",
      "vllm:time_per_output_token_seconds_count 9",
      'vllm:inter_token_latency_seconds_bucket{le="+Inf"} 4',
      "vllm:inter_token_latency_seconds_sum 0.4",
      "vllm:inter_token_latency_seconds_count 4",
      "",
    ].join("\n");
    expect(load(text).histograms).toEqual({ itl: { sum: 0.4, count: 4 } });
  });

  it("takes the LoRA sample with the newest timestamp value, not the last line", () => {
    const text = [
      "# TYPE vllm:lora_requests_info gauge",
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters="a"} 1700000000.0',
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1700000009.0',
      'vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters=""} 1700000005.0',
      "",
    ].join("\n");
    expect(load(text)).toMatchObject({ runningLoras: ["a", "b"], waitingLoras: ["c"], maxLora: 2 });
  });

  it("reads nothing from a cache config whose block counts are not known yet", () => {
    const parsed = load('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n');
    expect(parsed.blockSize).toBe(16);
    expect(parsed.numGpuBlocks).toBeNull();
  });
});

describe("engine-load - SGLang", () => {
  it("reads every field SGLang exports", () => {
    expect(extractEngineLoad(fixture("sglang.txt"), "sglang")).toEqual({
      ...EMPTY,
      running: 9,
      waiting: 2,
      kvCacheUsage: 0.33,
      cacheHitRate: 0.5372,
      promptTokens: 1904227,
      generationTokens: 288130,
      genThroughput: 412.7351937014245,
      // SGLang exports its P/D queues even when not disaggregated (this one: the decode one only).
      pdDecodeQueue: 0,
      histograms: {
        ttft: { sum: 205.13378477096558, count: 955 },
        itl: { sum: 3374.296019554138, count: 287136 },
        e2e: { sum: 3551.0770478248596, count: 955 },
        queue: { sum: 14.62093186378479, count: 955 },
      },
    });
  });

  it("reads the P/D queues of prefill and decode servers", () => {
    const prefill = 'sglang:num_prefill_bootstrap_queue_reqs{model_name="m"} 3.0\nsglang:num_decode_prealloc_queue_reqs{model_name="m"} 0.0\n';
    expect(load(prefill, "sglang")).toMatchObject({ pdPrefillQueue: 3, pdDecodeQueue: 0 });
    expect(load('sglang:num_decode_prealloc_queue_reqs{model_name="m"} 5\n', "sglang")).toMatchObject({ pdPrefillQueue: null, pdDecodeQueue: 5 });
    expect(load(prefill, "vllm")).toMatchObject({ pdPrefillQueue: null, pdDecodeQueue: null });
  });

  it("does not read vLLM names as SGLang or the other way round", () => {
    expect(extractEngineLoad(fixture("vllm-0.11.txt"), "sglang")).toEqual(EMPTY);
    expect(extractEngineLoad(fixture("sglang.txt"), "vllm")).toEqual(EMPTY);
  });
});

describe("engine-load - missing and odd values", () => {
  it("returns null for everything on an empty exposition", () => {
    expect(load("")).toEqual(EMPTY);
    expect(load("", "sglang")).toEqual(EMPTY);
  });

  it("keeps a zero the engine reported", () => {
    expect(load("vllm:num_requests_waiting 0\nvllm:num_preemptions_total 0\n")).toMatchObject({
      waiting: 0,
      preemptions: 0,
      running: null,
    });
  });

  it.each([
    ["NaN", null],
    ["+Inf", null],
    ["-Inf", null],
  ])("reads a %s gauge as null", (value, expected) => {
    expect(load(`vllm:kv_cache_usage_perc ${value}\n`).kvCacheUsage).toBe(expected);
  });

  it("skips a NaN label set but keeps the others", () => {
    const text = 'vllm:num_requests_running{engine="0"} NaN\nvllm:num_requests_running{engine="1"} 4\n';
    expect(load(text).running).toBe(4);
  });

  it("falls back to the old name when the new one only says NaN", () => {
    expect(load("vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.25\n").kvCacheUsage).toBe(0.25);
  });

  it("omits a histogram without _sum or _count", () => {
    const text = 'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3\nvllm:e2e_request_latency_seconds_count 2\n';
    expect(load(text).histograms).toEqual({});
  });

  it("takes the histogram count from +Inf when _count is missing", () => {
    const text = 'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3\nvllm:time_to_first_token_seconds_sum 0.6\n';
    expect(load(text).histograms).toEqual({ ttft: { sum: 0.6, count: 3 } });
  });

  it("still reads the load when other lines are malformed", () => {
    const parsed = parsePrometheusText("vllm:num_requests_running 2\nvllm:num_requests_waiting{oops 1\n");
    expect(parsed.errors).toHaveLength(1);
    expect(extractEngineLoad(parsed, "vllm")).toMatchObject({ running: 2, waiting: null });
  });
});

describe("engine-load - several label sets", () => {
  // Two models behind one endpoint, and two data-parallel engines for the first.
  const text = [
    'vllm:num_requests_running{engine="0",model_name="a"} 3',
    'vllm:num_requests_running{engine="1",model_name="a"} 5',
    'vllm:num_requests_running{engine="0",model_name="b"} 7',
    'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2',
    'vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.4',
    'vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.9',
    'vllm:prompt_tokens_total{engine="0",model_name="a"} 100',
    'vllm:prompt_tokens_total{engine="1",model_name="a"} 50',
    'vllm:prompt_tokens_total{engine="0",model_name="b"} 1',
    'vllm:time_to_first_token_seconds_sum{engine="0",model_name="a"} 1.5',
    'vllm:time_to_first_token_seconds_count{engine="0",model_name="a"} 10',
    'vllm:time_to_first_token_seconds_sum{engine="1",model_name="a"} 0.5',
    'vllm:time_to_first_token_seconds_count{engine="1",model_name="a"} 5',
    'vllm:time_to_first_token_seconds_sum{engine="0",model_name="b"} 100',
    'vllm:time_to_first_token_seconds_count{engine="0",model_name="b"} 1',
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0',
    'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1200"} 1.0',
    "",
  ].join("\n");

  it("sums counts and averages ratios across all label sets without a model", () => {
    const all = load(text);
    expect(all.running).toBe(15);
    expect(all.kvCacheUsage).toBeCloseTo(0.5, 12);
    expect(all.promptTokens).toBe(151);
    expect(all.histograms.ttft).toEqual({ sum: 102, count: 16 });
  });

  it("keeps only the requested model's label sets", () => {
    const a = load(text, "vllm", "a");
    expect(a.running).toBe(8);
    expect(a.kvCacheUsage).toBeCloseTo(0.3, 12);
    expect(a.promptTokens).toBe(150);
    expect(a.histograms.ttft).toEqual({ sum: 2, count: 15 });
    expect(load(text, "vllm", "b")).toMatchObject({ running: 7, kvCacheUsage: 0.9, promptTokens: 1 });
  });

  it("applies label-free info metrics to every model and sums blocks across engines", () => {
    expect(load(text, "vllm", "b")).toMatchObject({ blockSize: 16, numGpuBlocks: 2200 });
    expect(load(text)).toMatchObject({ blockSize: 16, numGpuBlocks: 2200 });
  });

  it("reads nothing for a model the pod does not serve", () => {
    const other = load(text, "vllm", "c");
    expect(other).toMatchObject({ running: null, kvCacheUsage: null, promptTokens: null, histograms: {} });
  });
});
