/**
 * A small end-to-end pass of the prefix-quality bench (needs dist/ built, as `npm test` does):
 * two pods, one precise prefix-cache case, a few seconds of traffic. It checks the plumbing
 * (assembly, streaming client, metric deltas, clean-up), not the figures.
 */
import { describe, expect, it } from "vitest";
import { runPrefixQualityBench } from "./prefix-quality.js";

describe("prefix-quality bench (smoke)", () => {
  it("runs a short precise case end to end and reports engine hits and client TTFT", async () => {
    const r = await runPrefixQualityBench({
      cases: ["prefix-precise"],
      rate: 6,
      durationMs: 5_000,
      warmupMs: 1_500,
      drainTimeoutMs: 5_000,
      engine: { pods: 2, timeScale: 10, kvCacheBlocks: 512 },
      workload: { systemPrompts: 2, systemPromptWords: [300, 400], turns: [2, 3], userWords: [10, 20], maxTokens: [4, 8], think: { minMs: 500, meanMs: 800 } },
    });
    expect(r.bench).toBe("prefix-quality");
    expect(r.results).toHaveLength(1);
    const row = r.results[0];
    expect(row).toMatchObject({ strategy: "prefix-cache", tokenizer: "local", gateways: 1, errors: 0 });
    expect(row?.requests).toBeGreaterThan(5);
    // Two shared system prompts over two pods: most prompt tokens are cached.
    expect(row?.hit_rate).toBeGreaterThan(0.5);
    expect(row?.ttft_p50_ms).toBeGreaterThan(0);
    expect(row?.ttft_p99_ms).toBeGreaterThanOrEqual(row?.ttft_p50_ms ?? 0);
    expect(r.precise_vs_random_ttft_p50).toBeNull();
  }, 60_000);
});
