import { describe, expect, it } from "vitest";
import { DemandWindow, SUMMARY_STALE_MS } from "./demand.js";
import { modelAdapterStatus, phaseOf, statusChanged } from "./status.js";

describe("DemandWindow", () => {
  it("counts requests per second over the window, forgetting what slid out", () => {
    const d = new DemandWindow(10_000);
    for (let i = 0; i < 20; i++) d.add("a", 1_000 + i * 100); // 20 requests in 2 s
    expect(d.rps("a", 3_000)).toBe(2);
    expect(d.rps("a", 11_500)).toBe(1); // the first second slid out
    expect(d.rps("a", 20_000)).toBe(0);
    expect(d.rps("b", 3_000)).toBe(0);
  });
  it("sums the gateways' waiting requests; a stale summary no longer counts", () => {
    const d = new DemandWindow();
    d.applySummary("g1", { a: [{ count: 2 }, { count: 1 }] }, 1_000);
    d.applySummary("g2", { a: [{ count: 4 }], b: [{ count: 1 }] }, 1_200);
    expect(d.queued("a", 1_300)).toBe(7);
    expect(d.queued("a", 1_000 + SUMMARY_STALE_MS + 1)).toBe(4);
  });
  it("forgets adapters no longer declared", () => {
    const d = new DemandWindow();
    d.add("gone", 1_000);
    d.retain((a) => a !== "gone");
    expect(d.rps("gone", 1_000)).toBe(0);
  });
});

describe("status", () => {
  const base = { loaded: [] as string[], loading: [] as string[], candidates: ["p0", "p1"], desired: 1, failed: [] as Array<{ pod: string; error: string; attempts: number }> };
  it.each([
    [{ ...base }, "Pending"],
    [{ ...base, loaded: ["p0"] }, "Running"],
    [{ ...base, failed: [{ pod: "p0", error: "404: no", attempts: 3 }] }, "Failed"],
    [{ ...base, loaded: ["p1"], failed: [{ pod: "p0", error: "404: no", attempts: 3 }] }, "Running"],
    [{ ...base, invalid: "/artifactURL: required" }, "Failed"],
    [{ ...base, deleted: true }, "Deleted"],
  ])("%j -> %s", (s, phase) => expect(phaseOf(s)).toBe(phase));

  it("conditions keep their transition time while unchanged; a change of substance is a write", () => {
    const s1 = modelAdapterStatus({ ...base, loading: ["p0"] }, undefined, "T1");
    const s2 = modelAdapterStatus({ ...base, loaded: ["p0"] }, s1, "T2");
    const conds = (s: Record<string, unknown>) => s.conditions as Array<{ type: string; status: string; reason: string; lastTransitionTime: string }>;
    expect(conds(s2).find((c) => c.type === "Initialized")?.lastTransitionTime).toBe("T1");
    expect(conds(s2).find((c) => c.type === "Ready")).toMatchObject({ status: "True", reason: "Loaded", lastTransitionTime: "T2" });
    expect(s2).toMatchObject({ phase: "Running", instances: ["p0"], readyReplicas: 1, desiredReplicas: 1 });
    expect(statusChanged(s1, s2)).toBe(true);
    expect(statusChanged(s2, modelAdapterStatus({ ...base, loaded: ["p0"] }, s2, "T3"))).toBe(false);
    const failed = modelAdapterStatus({ ...base, failed: [{ pod: "p1", error: "404: No adapter found", attempts: 3 }] }, s2, "T4");
    expect(conds(failed).find((c) => c.type === "Failed")).toMatchObject({ reason: "LoadFailed", message: "loading on p1 failed 3 time(s): 404: No adapter found" });
  });
});
