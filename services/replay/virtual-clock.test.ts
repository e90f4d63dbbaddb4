import { describe, expect, it } from "vitest";
import { mulberry32 } from "../shared/seeded-random.js";
import { VirtualClock } from "./virtual-clock.js";

describe("VirtualClock", () => {
  it("fires timers in time order, jumping time to each", () => {
    const clock = new VirtualClock();
    const seen: Array<[string, number]> = [];
    for (const [name, at] of [["c", 30], ["a", 10], ["d", 40], ["b", 20]] as const) clock.at(at, () => seen.push([name, clock.now()]));
    expect(clock.run()).toBe(4);
    expect(seen).toEqual([["a", 10], ["b", 20], ["c", 30], ["d", 40]]);
    expect(clock.now()).toBe(40);
  });

  it("fires timers due at the same instant in the order they were set", () => {
    const clock = new VirtualClock();
    const seen: number[] = [];
    for (let i = 0; i < 50; i++) clock.at(i % 2 === 0 ? 5 : 7, () => seen.push(i));
    clock.run();
    const evens = Array.from({ length: 25 }, (_, k) => 2 * k);
    expect(seen).toEqual([...evens, ...evens.map((e) => e + 1)]);
  });

  it("a cancelled timer never fires, and cancelling twice or after firing is harmless", () => {
    const clock = new VirtualClock();
    const seen: string[] = [];
    const cancelA = clock.at(10, () => seen.push("a"));
    const cancelB = clock.at(20, () => seen.push("b"));
    clock.at(30, () => seen.push("c"));
    cancelA();
    cancelA();
    expect(clock.pending).toBe(2);
    clock.runUntil(25);
    cancelB();
    clock.run();
    expect(seen).toEqual(["b", "c"]);
    expect(clock.pending).toBe(0);
  });

  it("runUntil fires what is due (and what those timers set within the span), then moves time forward", () => {
    const clock = new VirtualClock();
    const seen: Array<[string, number]> = [];
    clock.at(5, () => {
      seen.push(["first", clock.now()]);
      clock.at(8, () => seen.push(["chained", clock.now()]));
      clock.at(15, () => seen.push(["later", clock.now()]));
    });
    expect(clock.runUntil(10)).toBe(2);
    expect(seen).toEqual([["first", 5], ["chained", 8]]);
    expect(clock.now()).toBe(10);
    expect(clock.nextAt()).toBe(15);
    // A timer set in the past fires at the current time: time never runs backwards.
    clock.at(3, () => seen.push(["past", clock.now()]));
    clock.run();
    expect(seen.slice(2)).toEqual([["past", 10], ["later", 15]]);
  });

  it("keeps exact order over many random timers with heavy cancellation (heap and compaction)", () => {
    const clock = new VirtualClock();
    const rnd = mulberry32(7);
    const expected: Array<{ at: number; seq: number }> = [];
    const seen: number[] = [];
    for (let seq = 0; seq < 20_000; seq++) {
      const at = Math.floor(rnd() * 500);
      const cancel = clock.at(at, () => seen.push(seq));
      if (rnd() < 0.7) cancel();
      else expected.push({ at, seq });
    }
    expect(clock.pending).toBe(expected.length);
    clock.run();
    expected.sort((a, b) => a.at - b.at || a.seq - b.seq);
    expect(seen).toEqual(expected.map((e) => e.seq));
  });
});
