import { describe, expect, it } from "vitest";
import { TokenBucket } from "./token-bucket.js";

describe("TokenBucket", () => {
  it("lets a burst through, then the sustained rate, on its clock", () => {
    let now = 0;
    const b = new TokenBucket(10, 5, () => now);
    const takes = (n: number) => Array.from({ length: n }, () => b.take()).filter(Boolean).length;
    expect(takes(8)).toBe(5);
    now += 100; // one token per 100 ms at 10/s
    expect(takes(3)).toBe(1);
    now += 10_000; // refills to the burst, not beyond
    expect(takes(20)).toBe(5);
  });

  it("rate 0 and burst 0: nothing ever passes; a clock going back refills nothing", () => {
    let now = 1_000;
    const none = new TokenBucket(0, 0, () => now);
    expect(none.take()).toBe(false);
    const b = new TokenBucket(1, 1, () => now);
    expect(b.take()).toBe(true);
    now = 0;
    expect(b.take()).toBe(false);
    expect(() => new TokenBucket(-1, 1, () => 0)).toThrow(RangeError);
  });
});
