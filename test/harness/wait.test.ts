import { describe, expect, it } from "vitest";
import { waitFor } from "./wait.js";

describe("waitFor", () => {
  it("resolves once a sync or async check holds, with the ms it waited", async () => {
    let n = 0;
    expect(await waitFor(() => ++n >= 3, 1_000, "three checks")).toBeGreaterThanOrEqual(0);
    expect(n).toBe(3);
    const at = Date.now() + 30;
    expect(await waitFor(async () => Date.now() >= at, 1_000, "30 ms")).toBeGreaterThanOrEqual(25);
  });

  it("times out saying what it waited for, a function of what was last seen if need be", async () => {
    await expect(waitFor(() => false, 50, "the impossible")).rejects.toThrow(/^timed out after 50 ms waiting for the impossible$/);
    let reading = 0;
    const lazy = waitFor(() => ++reading > 1e9, 50, () => `a reading over 1e9 (last ${reading})`);
    await expect(lazy).rejects.toThrow(/waiting for a reading over 1e9 \(last [1-9]\d*\)$/);
  });

  it("fails at once with the error of a check that throws or rejects: an assertion in a check stays one", async () => {
    const t0 = performance.now();
    await expect(
      waitFor(() => {
        expect(1).toBe(2);
        return true;
      }, 5_000),
    ).rejects.toThrow("expected 1 to be 2");
    await expect(waitFor(async () => Promise.reject(new Error("connection refused")), 5_000)).rejects.toThrow("connection refused");
    expect(performance.now() - t0).toBeLessThan(1_000);
  });
});
