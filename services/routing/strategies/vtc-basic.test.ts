import { describe, expect, it } from "vitest";
import { UsageView } from "../../views/usage-view.js";
import { ctxOf, NOW } from "./testing.js";
import { ringPlace, vtcBasicStrategy } from "./vtc-basic.js";

const PODS = ["p1", "p2", "p3", "p4"];

/** A usage reader with fixed figures (bounds default: no active users -> bucket 4500). */
const fixed = (tokens: number, bounds = { min: 0, max: 0, users: 0 }) => ({ tokens: () => tokens, bounds: () => bounds });

describe("vtc-basic - table", () => {
  it.each<{ name: string; tokens: number; inFlight?: Record<string, number>; want: string }>([
    { name: "a user with no usage lands on the first pod", tokens: 0, want: "p1" },
    { name: "usage moves the user along the ring (1 bucket -> second pod)", tokens: 4500, want: "p2" },
    { name: "2.9 buckets -> nearest is the fourth pod", tokens: 4500 * 2.9, want: "p4" },
    { name: "the ring wraps: 3.9 buckets is nearest the first pod", tokens: 4500 * 3.9, want: "p1" },
    { name: "halfway between two pods the less loaded wins", tokens: 4500 * 0.5, inFlight: { p1: 10, p2: 0 }, want: "p2" },
    { name: "load only nudges: 100 in flight cannot outweigh one pod of distance", tokens: 0, inFlight: { p1: 99 }, want: "p1" },
  ])("$name", ({ tokens, inFlight, want }) => {
    const p = vtcBasicStrategy.pick(ctxOf({ pods: PODS, headers: { user: "u" }, usage: fixed(tokens), inFlight: inFlight ?? {} }));
    expect(p.pod.pod).toBe(want);
    expect(p.fallback).toBeUndefined();
  });

  it.each<{ name: string; headers: Record<string, string>; usage?: ReturnType<typeof fixed> }>([
    { name: "no user header", headers: {}, usage: fixed(0) },
    { name: "no usage view wired", headers: { user: "u" } },
  ])("$name: least-request", ({ headers, usage }) => {
    const p = vtcBasicStrategy.pick(ctxOf({ pods: PODS, headers, ...(usage ? { usage } : {}), inFlight: { p1: 3, p2: 3, p3: 0, p4: 3 } }));
    expect(p.pod.pod).toBe("p3");
    expect(p.fallback).toBe("least-request");
  });

  it("fairness direction: a heavy user is sent away from the light users, and back once its usage expires", () => {
    const usage = new UsageView();
    usage.record({ user: "light", promptTokens: 100, completionTokens: 0, ts: NOW });
    usage.record({ user: "heavy", promptTokens: 1000, completionTokens: 2000, ts: NOW }); // 1000 + 2 × 2000 = 5000
    const pick = (user: string, now = NOW) => vtcBasicStrategy.pick(ctxOf({ pods: PODS, headers: { user }, usage, now })).pod.pod;
    // bucket = max(1000, (100 + 5000) / 2) = 2550: light at 0.04 -> p1, heavy at 1.96 -> p3.
    expect(pick("light")).toBe("p1");
    expect(pick("heavy")).toBe("p3");
    expect(pick("newcomer")).toBe("p1");
    expect(pick("heavy", NOW + 6 * 60_000)).toBe("p1");
  });

  it("places users on the ring in [0, n)", () => {
    expect(ringPlace(0, 1000, 4)).toBe(0);
    expect(ringPlace(2500, 1000, 4)).toBe(2.5);
    expect(ringPlace(4000, 1000, 4)).toBe(0);
    expect(ringPlace(5500, 1000, 4)).toBe(1.5);
  });
});
