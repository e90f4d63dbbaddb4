import { describe, expect, it } from "vitest";
import { pinningPlan, pinningSummary } from "./pinning.js";

describe("pinning - plan", () => {
  it("puts the gateway on the last CPU and everything else on the rest", () => {
    expect(pinningPlan(2, true, "linux")).toMatchObject({ available: true, gatewayCpus: "1", otherCpus: "0", allCpus: "0-1" });
    expect(pinningPlan(8, true, "linux")).toMatchObject({ available: true, gatewayCpus: "7", otherCpus: "0-6", allCpus: "0-7" });
  });

  it("falls back to shared-box figures with the reason where pinning cannot apply", () => {
    const one = pinningPlan(1, true, "linux");
    expect(one.available).toBe(false);
    expect(pinningSummary(one)).toEqual({ note: expect.stringContaining("one CPU") });
    expect(pinningPlan(4, false, "linux").note).toContain("taskset");
    expect(pinningPlan(4, true, "darwin").note).toContain("Linux");
  });
});
