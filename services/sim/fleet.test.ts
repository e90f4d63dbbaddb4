import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { type SimFleet, SimOptionsError, startSimFleet } from "./fleet.js";
import { waitFor } from "../../test/harness/wait.js";
import { json, metricValue, postJson, scrape } from "./testing.js";

const MODEL = "demo/llama-3.1-8b";
const fleets: SimFleet[] = [];

async function fleet(options: Partial<Parameters<typeof startSimFleet>[0]> = {}): Promise<SimFleet> {
  const f = await startSimFleet({ pods: 1, model: MODEL, timeScale: 100, ...options });
  fleets.push(f);
  return f;
}

afterEach(async () => {
  await Promise.all(fleets.splice(0).map((f) => f.close()));
});

const chat = (content: string, extra: object = {}) => ({
  model: MODEL,
  messages: [{ role: "user", content }],
  ...extra,
});

const VLLM_NAMES = [
  "vllm:num_requests_running",
  "vllm:num_requests_waiting",
  "vllm:kv_cache_usage_perc",
  "vllm:prompt_tokens_total",
  "vllm:generation_tokens_total",
  "vllm:request_success_total",
  "vllm:num_preemptions_total",
  "vllm:prefix_cache_queries_total",
  "vllm:prefix_cache_hits_total",
  "vllm:cache_config_info",
];
const VLLM_HISTOGRAMS = [
  "vllm:time_to_first_token_seconds",
  "vllm:inter_token_latency_seconds",
  "vllm:e2e_request_latency_seconds",
  "vllm:request_queue_time_seconds",
  "vllm:request_prefill_time_seconds",
  "vllm:request_decode_time_seconds",
  "vllm:request_prompt_tokens",
  "vllm:request_generation_tokens",
];
const SGLANG_NAMES = [
  "sglang:num_running_reqs",
  "sglang:num_queue_reqs",
  "sglang:token_usage",
  "sglang:cache_hit_rate",
  "sglang:gen_throughput",
  "sglang:prompt_tokens_total",
  "sglang:generation_tokens_total",
];
const SGLANG_HISTOGRAMS = ["sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"];

describe("startSimFleet", () => {
  it("starts one server per pod on distinct ports with the requested engines", async () => {
    const f = await fleet({ pods: 3, engine: ["vllm", "sglang"], namePrefix: "gpu-" });
    expect(f.pods.map((p) => [p.name, p.engine])).toEqual([
      ["gpu-0", "vllm"],
      ["gpu-1", "sglang"],
      ["gpu-2", "vllm"],
    ]);
    expect(new Set(f.pods.map((p) => p.port)).size).toBe(3);
    for (const p of f.pods) {
      expect(p.address).toBe(`127.0.0.1:${p.port}`);
      expect((await fetch(`http://${p.address}/health`)).status).toBe(200);
    }
  });

  it("rejects invalid options with a message naming the option", async () => {
    await expect(startSimFleet({ pods: 0, model: MODEL })).rejects.toThrow(SimOptionsError);
    await expect(startSimFleet({ pods: 1, model: MODEL, maxModelLen: 100_000 })).rejects.toThrow(/maxModelLen/);
    await expect(startSimFleet({ pods: 1, model: MODEL, timeScale: 0 })).rejects.toThrow(/timeScale/);
  });

  it("fails on a taken port and leaves no earlier pod listening", async () => {
    let blocker: Server | undefined;
    let base = 0;
    // Find a port P whose predecessor is free, hold P, and ask for pods on P-1 and P.
    for (let attempt = 0; attempt < 20 && base === 0; attempt++) {
      const s = createServer();
      await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
      const p = (s.address() as AddressInfo).port;
      const probe = createServer();
      const free = await new Promise<boolean>((r) => {
        probe.once("error", () => r(false));
        probe.listen(p - 1, "127.0.0.1", () => r(true));
      });
      if (free) await new Promise((r) => probe.close(r));
      if (free) {
        blocker = s;
        base = p - 1;
      } else await new Promise((r) => s.close(r));
    }
    expect(base).toBeGreaterThan(0);
    try {
      await expect(startSimFleet({ pods: 2, model: MODEL, basePort: base })).rejects.toMatchObject({ code: "EADDRINUSE" });
      await expect(fetch(`http://127.0.0.1:${base}/health`)).rejects.toThrow();
    } finally {
      await new Promise((r) => blocker?.close(r));
    }
  });
});

describe("batching and queueing", () => {
  it("makes the (maxBatch+1)-th concurrent request wait, visibly in /metrics and in its latency", async () => {
    // 200 ms decode steps at 5x: every request takes 20 steps, 4 s simulated, ~800 ms wall (long
    // enough that the three arrivals overlap and a scrape sees the queue on a loaded host).
    const f = await fleet({ maxBatch: 2, timeScale: 5, decodeMsPerStep: 200, decodeBatchSlope: 0, prefillMsPerToken: 0 });
    const address = f.pods[0]?.address ?? "";
    // Finish times from one start, before the first request leaves: however late a loaded host
    // sends each, none can finish before its steps have run.
    const t0 = performance.now();
    const timed = async (i: number) => {
      const res = await postJson(address, "/v1/chat/completions", chat(`request ${i}`, { max_tokens: 20 }));
      await json(res);
      return performance.now() - t0;
    };
    const all = [timed(0), timed(1), timed(2)];
    // Arrivals join the batch at the next step boundary, so wait for the steady state.
    let during = "";
    await waitFor(
      async () => {
        during = await scrape(address);
        return metricValue(during, "vllm:num_requests_running") === 2 && metricValue(during, "vllm:num_requests_waiting") === 1;
      },
      5_000,
      "2 running and 1 waiting",
      10,
    );
    expect(metricValue(during, "vllm:num_requests_running")).toBe(2);
    expect(metricValue(during, "vllm:num_requests_waiting")).toBe(1);
    const latencies = (await Promise.all(all)).sort((a, b) => a - b);
    // A request alone takes 800 ms of wall time; the one that queued waited for a slot first, so it
    // cannot finish before ~1,600 ms after the start however loaded the machine is.
    expect(latencies[0]).toBeGreaterThanOrEqual(760);
    expect(latencies[2]).toBeGreaterThanOrEqual(1_520);

    const after = await scrape(address);
    expect(metricValue(after, "vllm:num_requests_running")).toBe(0);
    expect(metricValue(after, "vllm:num_requests_waiting")).toBe(0);
    // Simulated time: the third request queued until a slot freed, 4 s after the first arrived;
    // the margin leaves room for the requests' arrivals to spread out on a loaded machine.
    expect(metricValue(after, "vllm:request_queue_time_seconds_sum")).toBeGreaterThan(1);
    expect(metricValue(after, "vllm:request_queue_time_seconds_count")).toBe(3);
  });

  it("frees the batch slot when a streaming client disconnects", async () => {
    const f = await fleet({ maxBatch: 1, timeScale: 10, decodeMsPerStep: 50 });
    const address = f.pods[0]?.address ?? "";
    const controller = new AbortController();
    const res = await postJson(address, "/v1/chat/completions", chat("a very long answer please", { max_tokens: 5_000, stream: true }), {
      signal: controller.signal,
    });
    const reader = res.body?.getReader();
    await reader?.read(); // the first chunk: the request is running
    expect(metricValue(await scrape(address), "vllm:num_requests_running")).toBe(1);
    controller.abort();
    let m = "";
    await waitFor(async () => metricValue((m = await scrape(address)), "vllm:num_requests_running") === 0, 5_000, "nothing running", 10);
    expect(metricValue(m, "vllm:num_requests_running")).toBe(0);
    expect(metricValue(m, "vllm:request_success_total", { finished_reason: "abort" })).toBe(1);
    // The slot is really free: a new request completes although the aborted one had 5000 tokens to go.
    const next = await postJson(address, "/v1/chat/completions", chat("short", { max_tokens: 2 }));
    expect((await json(next)).usage.completion_tokens).toBe(2);
  });

  it("frees the batch slot when a non-streaming client disconnects, including while queued", async () => {
    const f = await fleet({ maxBatch: 1, timeScale: 10, decodeMsPerStep: 50 });
    const address = f.pods[0]?.address ?? "";
    const running = new AbortController();
    const queued = new AbortController();
    const p1 = postJson(address, "/v1/completions", { prompt: "one", max_tokens: 5_000 }, { signal: running.signal }).catch(() => undefined);
    const p2 = postJson(address, "/v1/completions", { prompt: "two", max_tokens: 5_000 }, { signal: queued.signal }).catch(() => undefined);
    let busy = "";
    await waitFor(async () => metricValue((busy = await scrape(address)), "vllm:num_requests_waiting") === 1, 5_000, "one request waiting", 10);
    expect(metricValue(busy, "vllm:num_requests_running")).toBe(1);
    queued.abort();
    running.abort();
    await Promise.all([p1, p2]);
    let idle = "";
    await waitFor(
      async () => {
        idle = await scrape(address);
        return metricValue(idle, "vllm:num_requests_running") === 0 && metricValue(idle, "vllm:num_requests_waiting") === 0;
      },
      5_000,
      "nothing running or waiting",
      10,
    );
    expect(metricValue(idle, "vllm:num_requests_running")).toBe(0);
    expect(metricValue(idle, "vllm:num_requests_waiting")).toBe(0);
    expect(metricValue(idle, "vllm:kv_cache_usage_perc")).toBe(0);
    const state = await json(fetch(`http://${address}/debug/state`));
    expect(state.totals.finished).toEqual({ stop: 0, length: 0, abort: 2 });
  });

  it("reports KV usage of the running requests", async () => {
    const f = await fleet({ timeScale: 10, decodeMsPerStep: 50, kvCapacityTokens: 1_024, blockSize: 16 });
    const address = f.pods[0]?.address ?? "";
    const controller = new AbortController();
    const res = await postJson(address, "/v1/completions", { prompt: Array.from({ length: 160 }, (_, i) => 1000 + i), max_tokens: 500, stream: true }, {
      signal: controller.signal,
    });
    await res.body?.getReader().read();
    const usage = metricValue(await scrape(address), "vllm:kv_cache_usage_perc") ?? 0;
    controller.abort();
    // 160 prompt tokens plus a few decoded ones: 11-12 blocks of 64.
    expect(usage).toBeGreaterThanOrEqual(11 / 64);
    expect(usage).toBeLessThanOrEqual(13 / 64);
  });
});

describe("/metrics", () => {
  it("exposes every vLLM name with histogram buckets, sum and count", async () => {
    const f = await fleet();
    const address = f.pods[0]?.address ?? "";
    await json(postJson(address, "/v1/chat/completions", chat("measure me", { max_tokens: 4 })));
    const m = await scrape(address);
    for (const name of VLLM_NAMES) expect(metricValue(m, name), name).toBeDefined();
    for (const name of VLLM_HISTOGRAMS) {
      // One observation per request, except inter-token latency: one per gap between 4 tokens.
      const observations = name === "vllm:inter_token_latency_seconds" ? 3 : 1;
      expect(m).toContain(`# TYPE ${name} histogram`);
      expect(metricValue(m, `${name}_bucket`, { le: "+Inf" }), name).toBe(observations);
      expect(metricValue(m, `${name}_count`), name).toBe(observations);
      expect(metricValue(m, `${name}_sum`), name).toBeDefined();
    }
    expect(metricValue(m, "vllm:time_to_first_token_seconds_bucket", { le: "0.001" })).toBe(0);
    expect(metricValue(m, "vllm:generation_tokens_total")).toBe(4);
    expect(metricValue(m, "vllm:request_success_total", { finished_reason: "length" })).toBe(1);
    expect(metricValue(m, "vllm:cache_config_info", { block_size: "16", num_gpu_blocks: "4096" })).toBe(1);
    expect(m).toContain(`vllm:num_requests_running{model_name="${MODEL}",engine="0"} 0.0`);
  });

  it("reports latencies in simulated seconds, independent of the time scale", async () => {
    // 400 prompt tokens × 1 ms = 0.4 s simulated TTFT, delivered in ~4 ms of wall time.
    const f = await fleet({ timeScale: 100, prefillMsPerToken: 1, decodeMsPerStep: 10 });
    const address = f.pods[0]?.address ?? "";
    await json(postJson(address, "/v1/completions", { prompt: Array.from({ length: 400 }, (_, i) => 500 + i), max_tokens: 3 }));
    const m = await scrape(address);
    expect(metricValue(m, "vllm:time_to_first_token_seconds_sum")).toBeCloseTo(0.4, 1);
    expect(metricValue(m, "vllm:time_to_first_token_seconds_bucket", { le: "0.25" })).toBe(0);
    expect(metricValue(m, "vllm:time_to_first_token_seconds_bucket", { le: "0.5" })).toBe(1);
    expect(metricValue(m, "vllm:request_decode_time_seconds_sum")).toBeCloseTo(0.02, 2);
  });

  it("exposes SGLang names on an sglang pod", async () => {
    const f = await fleet({ pods: 2, engine: ["vllm", "sglang"] });
    const sglang = f.pods[1]?.address ?? "";
    await json(postJson(sglang, "/v1/chat/completions", chat("sglang please", { max_tokens: 3 })));
    const m = await scrape(sglang);
    for (const name of SGLANG_NAMES) expect(metricValue(m, name, { model_name: MODEL }), name).toBeDefined();
    for (const name of SGLANG_HISTOGRAMS) {
      expect(metricValue(m, `${name}_count`), name).toBeGreaterThan(0);
      expect(metricValue(m, `${name}_bucket`, { le: "+Inf" }), name).toBeGreaterThan(0);
    }
    expect(metricValue(m, "sglang:generation_tokens_total")).toBe(3);
    // Two decode steps of 15 ms produced 2 tokens: 2 / 0.030 s.
    expect(metricValue(m, "sglang:gen_throughput")).toBeCloseTo(66.67, 1);
    expect(m).not.toContain("vllm:");
  });
});
