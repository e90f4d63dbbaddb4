import { describe, expect, it } from "vitest";
import { runHerdingBench } from "./herding.js";

describe("herding bench", () => {
  it("one replica never stacks a pod, nor do replicas that split a burst evenly and count only their own charges", async () => {
    // Both hold by construction (a replica charges synchronously, and least-request fills its own
    // counts level), so they check the bench's plumbing, not the gateway's luck.
    const r = await runHerdingBench({ replicas: [1, 2], modes: ["off", "eventual", "strict"], bursts: 2, requests: 16, pods: 4, inProcess: true });
    expect(r).toMatchObject({ bench: "herding", spread: "round-robin", replica_kind: "in-process", bursts: 2, requests: 16, pods: 4 });
    expect(r.results.map((x) => `${x.replicas}/${x.mode}`)).toEqual(["1/off", "1/eventual", "1/strict", "2/off", "2/eventual", "2/strict"]);
    for (const row of r.results.filter((x) => x.replicas === 1 || x.mode === "off")) {
      expect(row, JSON.stringify(row)).toMatchObject({ max_over_mean: 1, max_over_mean_worst: 1 });
    }
    for (const row of r.results) {
      expect(row.max_over_mean).toBeGreaterThanOrEqual(1);
      expect(row.max_over_mean_worst).toBeGreaterThanOrEqual(row.max_over_mean);
    }
    expect(r.results.find((x) => x.replicas === 1 && x.mode === "strict")).toMatchObject({ strict_conflicts: 0, strict_fallbacks: 0 });
  });

  it("drives gateway processes (needs the build: npm test builds first)", async () => {
    const r = await runHerdingBench({ replicas: [2], modes: ["off"], bursts: 1, requests: 8, pods: 4 });
    expect(r.replica_kind).toBe("process");
    expect(r.results).toEqual([{ replicas: 2, mode: "off", max_over_mean: 1, max_over_mean_worst: 1 }]);
  });
});
