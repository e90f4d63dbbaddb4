import { describe, expect, it } from "vitest";
import { buildFlowMix, FLOW_MIX_DEFAULTS, type FlowMixOptions } from "./flow-mix.js";

const base: FlowMixOptions = { ...FLOW_MIX_DEFAULTS, rate: 30, durationMs: 200_000 };

describe("flow-mix workload", () => {
  it("is a pure function of its options", () => {
    expect(buildFlowMix(base)).toEqual(buildFlowMix(base));
    expect(buildFlowMix({ ...base, seed: 7 })[0]).not.toEqual(buildFlowMix(base)[0]);
  });

  it("keeps the i-th request when only the rate or the duration changes", () => {
    const strip = (w: ReturnType<typeof buildFlowMix>) => w.slice(0, 200).map(({ atMs: _, ...r }) => r);
    expect(strip(buildFlowMix({ ...base, rate: 5 }))).toEqual(strip(buildFlowMix(base)));
    expect(strip(buildFlowMix({ ...base, durationMs: 20_000 }))).toEqual(strip(buildFlowMix(base)));
  });

  it("arrives as a Poisson process with the asked shares of interactive requests and of tenants", () => {
    const w = buildFlowMix(base);
    const expected = (base.rate * base.durationMs) / 1000;
    expect(Math.abs(w.length - expected)).toBeLessThan(4 * Math.sqrt(expected));
    expect(w.every((r, i) => i === 0 || r.atMs >= (w[i - 1] as (typeof w)[number]).atMs)).toBe(true);
    expect(w.every((r) => r.atMs >= 0 && r.atMs < base.durationMs)).toBe(true);
    const interactive = w.filter((r) => r.objective === "interactive");
    expect(interactive.length / w.length).toBeCloseTo(0.2, 1);
    const big = w.filter((r) => r.user === "tenant-big").length;
    const small = w.filter((r) => r.user === "tenant-small").length;
    expect(big + small).toBe(w.length - interactive.length);
    expect(big / small).toBeGreaterThan(8);
    expect(big / small).toBeLessThan(12.5);
    expect(interactive.every((r) => r.user.startsWith("chat-") && r.maxTokens <= 16)).toBe(true);
  });

  it("sizes each class within its ranges, every prompt distinct from its first words", () => {
    const w = buildFlowMix({ ...base, durationMs: 20_000 });
    for (const r of w) {
      const c = r.objective === "interactive" ? base.interactive : base.batch;
      const words = r.prompt.split(" ").length - 2;
      expect(words).toBeGreaterThanOrEqual(c.promptWords[0]);
      expect(words).toBeLessThanOrEqual(c.promptWords[1]);
      expect(r.maxTokens).toBeGreaterThanOrEqual(c.maxTokens[0]);
      expect(r.maxTokens).toBeLessThanOrEqual(c.maxTokens[1]);
    }
    expect(new Set(w.map((r) => r.prompt.slice(0, 40))).size).toBe(w.length);
  });

  it("refuses bad options, naming them", () => {
    expect(() => buildFlowMix({ ...base, rate: 0 })).toThrow(/rate/);
    expect(() => buildFlowMix({ ...base, interactiveShare: 1.5 })).toThrow(/interactiveShare/);
    expect(() => buildFlowMix({ ...base, batch: { promptWords: [5, 2], maxTokens: [1, 2] } })).toThrow(/batch.promptWords/);
  });
});
