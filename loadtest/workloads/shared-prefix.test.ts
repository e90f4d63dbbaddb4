import { describe, expect, it } from "vitest";
import { tokenizePrompt } from "../../services/tokenizer/sim-tokenizer.js";
import { buildSharedPrefixWorkload, SHARED_PREFIX_DEFAULTS, type SharedPrefixWorkloadOptions } from "./shared-prefix.js";

const base: SharedPrefixWorkloadOptions = { ...SHARED_PREFIX_DEFAULTS, rate: 20, durationMs: 60_000 };

describe("shared-prefix workload", () => {
  it("is a pure function of its options", () => {
    expect(buildSharedPrefixWorkload(base)).toEqual(buildSharedPrefixWorkload(base));
    expect(buildSharedPrefixWorkload({ ...base, seed: 7 }).schedule[0]).not.toEqual(buildSharedPrefixWorkload(base).schedule[0]);
  });

  it("keeps the system prompts when only the rate changes", () => {
    expect(buildSharedPrefixWorkload({ ...base, rate: 5 }).systemPrompts).toEqual(buildSharedPrefixWorkload(base).systemPrompts);
  });

  it("arrives as a Poisson process of the given rate", () => {
    const w = buildSharedPrefixWorkload({ ...base, durationMs: 200_000 });
    const n = w.schedule.length;
    const expected = (base.rate * 200_000) / 1000;
    // Poisson count: standard deviation sqrt(expected); 4 sigma.
    expect(Math.abs(n - expected)).toBeLessThan(4 * Math.sqrt(expected));
    const gaps = w.schedule.slice(1).map((t, i) => t.atMs - (w.schedule[i] as (typeof w.schedule)[number]).atMs);
    expect(gaps.every((g) => g >= 0)).toBe(true);
    // Exponential gaps: coefficient of variation 1.
    const mean = gaps.reduce((a, b) => a + b, 0) / gaps.length;
    const sd = Math.sqrt(gaps.reduce((a, b) => a + (b - mean) ** 2, 0) / gaps.length);
    expect(mean).toBeCloseTo(1000 / base.rate, -1);
    expect(sd / mean).toBeGreaterThan(0.9);
    expect(sd / mean).toBeLessThan(1.1);
    expect(w.schedule.every((t) => t.atMs < 200_000)).toBe(true);
  });

  it("plays each conversation's turns in order, a think time apart, within its turn count", () => {
    const w = buildSharedPrefixWorkload(base);
    const last = new Map<number, { turn: number; atMs: number }>();
    for (const t of w.schedule) {
      const c = w.conversations[t.conversation];
      expect(c).toBeDefined();
      expect(t.turn).toBeLessThan(c?.turns ?? 0);
      const prev = last.get(t.conversation);
      if (prev) {
        expect(t.turn).toBe(prev.turn + 1);
        expect(t.atMs - prev.atMs).toBeGreaterThanOrEqual(base.think.minMs);
      } else {
        expect(t.turn).toBe(0);
      }
      last.set(t.conversation, t);
      expect(t.maxTokens).toBeGreaterThanOrEqual(base.maxTokens[0]);
      expect(t.maxTokens).toBeLessThanOrEqual(base.maxTokens[1]);
    }
    // Many users, and most get past their first turn.
    expect(w.conversations.length).toBeGreaterThan(50);
    const multi = [...last.values()].filter((t) => t.turn > 0).length;
    expect(multi / last.size).toBeGreaterThan(0.5);
  });

  it("shares a few long system prompts, the first ones more often", () => {
    const w = buildSharedPrefixWorkload({ ...base, durationMs: 200_000 });
    expect(w.systemPrompts).toHaveLength(base.systemPrompts);
    for (const p of w.systemPrompts) {
      const tokens = tokenizePrompt(p, { addSpecialTokens: false }).length;
      // One token per word, plus full stops and the short preamble.
      expect(tokens).toBeGreaterThanOrEqual(base.systemPromptWords[0]);
      expect(tokens).toBeLessThanOrEqual(base.systemPromptWords[1] * 1.2);
    }
    const uses = new Array(base.systemPrompts).fill(0);
    for (const c of w.conversations) uses[c.systemPrompt]++;
    expect(uses.every((u) => u > 0)).toBe(true);
    expect(uses[0]).toBeGreaterThan(uses[base.systemPrompts - 1]);
  });

  it("gives every user message its own text", () => {
    const w = buildSharedPrefixWorkload(base);
    expect(new Set(w.schedule.map((t) => t.userText)).size).toBe(w.schedule.length);
  });

  it("rejects nonsense options", () => {
    expect(() => buildSharedPrefixWorkload({ ...base, rate: 0 })).toThrow(/rate/);
    expect(() => buildSharedPrefixWorkload({ ...base, turns: [3, 2] })).toThrow(/turns/);
    expect(() => buildSharedPrefixWorkload({ ...base, think: { minMs: 5, meanMs: 1 } })).toThrow(/think/);
  });
});
