/**
 * A short end-to-end pass of the replay bench (needs dist/ built, as `npm test` does: the gateways
 * and the load generators run compiled): a second of recording over three gateway processes, the
 * export, the replays. It checks the plumbing and the fidelity, not the speed.
 */
import { describe, expect, it } from "vitest";
import { runReplayBench, splitCost } from "./replay.js";

describe("replay bench: fixed and per-decision cost", () => {
  it("a warm-up at the start shows as fixed cost, the steady rate as the per-decision cost", () => {
    // 200 ms of warm-up over the first 1,000 decisions, then 50 µs a decision up to 10,000.
    const marks: Array<[number, number]> = [];
    for (let n = 0; n <= 10_000; n += 500) marks.push([n, n <= 1_000 ? 0.2 * (n / 1_000) + n * 50e-6 : 0.2 + n * 50e-6]);
    const { perDecisionUs, fixedMs } = splitCost(marks, 10_000, 0.2 + 10_000 * 50e-6 + 0.01);
    expect(perDecisionUs).toBeGreaterThan(50);
    expect(perDecisionUs).toBeLessThan(52.5);
    expect(fixedMs).toBeGreaterThan(180);
    expect(fixedMs).toBeLessThan(215);
  });

  it("too few marks: everything is per-decision cost", () => {
    expect(splitCost([[10, 0.5]], 10, 0.5)).toEqual({ perDecisionUs: 50_000, fixedMs: 0 });
  });
});

describe("replay bench (smoke)", () => {
  it("records a window over gateway processes, exports it and replays it with 4 strategies", async () => {
    const r = await runReplayBench({ durationMs: 1_500, concurrency: 2, replicas: 3 });
    expect(r).toMatchObject({ bench: "replay", strategies: 4, matches_run_replay: true, from_nats_matches: true });
    expect(r.decisions).toBeGreaterThan(0);
    expect(r.fidelity).toBeGreaterThanOrEqual(0.999);
    // Every recorded decision was evaluated (the window holds them all) and nothing was skipped.
    expect(r.decisions).toBe(r.recorded.decisions_in_stream);
    expect(r.recorded.decisions_in_stream).toBeGreaterThanOrEqual(r.recorded.generator_completed);
    expect(r.skipped).toEqual({});
    expect(r.per_decision_us).toBeGreaterThan(0);
    expect(r.first_replay_seconds).toBeGreaterThan(0);
    for (const k of ["decisions_per_s", "from_nats_decisions_per_s", "messages_per_s", "peak_rss_mb", "peak_heap_mb", "record_seconds", "file_bytes"] as const) {
      expect(r[k], k).toBeGreaterThan(0);
    }
    expect(r.messages).toBeGreaterThan(r.decisions);
    expect(r.max_buffered).toBeGreaterThanOrEqual(0);
    expect(r.counterfactuals.map((c) => c.name)).toEqual(["recorded", "least-request", "random", "power-of-two", "prefix-cache"]);
    expect(r.counterfactuals.every((c) => c.decisions === r.decisions)).toBe(true);
    // The final line is one JSON object.
    expect(JSON.parse(JSON.stringify(r))).toEqual(r);
  }, 120_000);
});
