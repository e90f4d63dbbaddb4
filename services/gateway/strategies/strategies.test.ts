import { describe, expect, it } from "vitest";
import type { EngineLoadFields } from "../../../schemas/events.js";
import type { Outstanding } from "../../views/charge-ledger.js";
import type { PodInfo } from "../../views/pod-set.js";
import { leastRequestStrategy } from "./least-request.js";
import { randomStrategy } from "./random.js";
import { findStrategy, strategyNames } from "./registry.js";
import type { RoutingContext } from "./types.js";

const pod = (name: string): PodInfo => ({
  model: "m", pod: name, address: `10.0.0.${name.slice(1)}:8000`, engine: "vllm", role: "combined", adapters: [], labels: {}, ready: true, updatedAt: 0,
});
const load = (waiting: number): EngineLoadFields => ({
  running: 0, waiting, kvCacheUsage: 0, prefixCacheQueries: null, prefixCacheHits: null, cacheHitRate: null, promptTokens: null,
  generationTokens: null, genThroughput: null, preemptions: null, blockSize: null, numGpuBlocks: null, runningLoras: [], waitingLoras: [], maxLora: null, histograms: {},
});

function ctx(inFlight: Record<string, number | undefined>, waiting: Record<string, number | undefined> = {}, random = () => 0): RoutingContext {
  const pods = Object.keys(inFlight).map(pod);
  return {
    request: { model: "m", requestId: "r", headers: {}, promptTokens: 10 },
    pods,
    now: 1000,
    random,
    ledger: { outstanding: (_m, p): Outstanding => ({ requests: inFlight[p] ?? 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }) },
    load: {
      fresh: (_m, p) => (waiting[p] === undefined ? undefined : load(waiting[p] as number)),
      get: () => undefined,
    },
  };
}

describe("least-request - table", () => {
  it.each([
    { name: "fewest in flight wins", inFlight: { p1: 3, p2: 1, p3: 2 }, waiting: {}, want: "p2" },
    { name: "engine queue breaks a ledger tie", inFlight: { p1: 1, p2: 1 }, waiting: { p1: 5, p2: 0 }, want: "p2" },
    { name: "ledger outweighs engine queue", inFlight: { p1: 0, p2: 1 }, waiting: { p1: 50, p2: 0 }, want: "p1" },
    { name: "missing metrics: ledger alone decides", inFlight: { p1: 2, p2: 1 }, waiting: { p1: undefined, p2: undefined }, want: "p2" },
  ])("$name", ({ inFlight, waiting, want }) => {
    expect(leastRequestStrategy.pick(ctx(inFlight, waiting)).pod.pod).toBe(want);
  });

  it("breaks exact ties at random, covering every tied pod", () => {
    const seen = new Set<string>();
    for (const r of [0, 0.34, 0.67, 0.99]) seen.add(leastRequestStrategy.pick(ctx({ p1: 1, p2: 0, p3: 0, p4: 0 }, {}, () => r)).pod.pod);
    expect([...seen].sort()).toEqual(["p2", "p3", "p4"]);
  });

  it("reports every candidate's score", () => {
    const p = leastRequestStrategy.pick(ctx({ p1: 2, p2: 1 }));
    expect(p.candidates.map((c) => [c.pod.pod, c.score])).toEqual([["p1", 2], ["p2", 1]]);
  });
});

describe("random - table", () => {
  it.each([
    [0, "p1"],
    [0.5, "p2"],
    [0.999999, "p3"],
  ])("random()=%s picks %s", (r, want) => {
    expect(randomStrategy.pick(ctx({ p1: 0, p2: 0, p3: 0 }, {}, () => r)).pod.pod).toBe(want);
  });
});

describe("registry", () => {
  it("finds strategies by name and refuses unknown ones", () => {
    expect(strategyNames()).toEqual([
      "random",
      "least-request",
      "power-of-two",
      "least-latency",
      "least-kv-cache",
      "least-gpu-cache",
      "least-busy-time",
      "throughput",
      "session-affinity",
      "vtc-basic",
      "slo",
      "slo-least-load",
      "slo-pack-load",
      "prefix-cache",
      "prefix-cache-preble",
    ]);
    expect(findStrategy("least-request")).toBe(leastRequestStrategy);
    expect(findStrategy("random")).toBe(randomStrategy);
    expect(findStrategy("nope")).toBeUndefined();
  });

  it("every base strategy exposes a scorer named like it", () => {
    for (const name of strategyNames()) expect(findStrategy(name)?.scorer?.name).toBe(name);
  });
});
