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

  it("retries a check that throws or rejects", async () => {
    let n = 0;
    await waitFor(() => {
      if (++n < 3) throw new Error("not up yet");
      return true;
    });
    await waitFor(async () => {
      if (++n < 6) throw new Error("not up yet");
      return true;
    });
    expect(n).toBe(6);
  });

  it("times out saying what it waited for, and what the check last threw", async () => {
    await expect(waitFor(() => false, 50, "the impossible")).rejects.toThrow("timed out after 50 ms waiting for the impossible");
    let reading = 0;
    const lazy = waitFor(() => ++reading > 1e9, 50, () => `a reading over 1e9 (last ${reading})`);
    await expect(lazy).rejects.toThrow(/waiting for a reading over 1e9 \(last [1-9]\d*\)$/);
    const err = await waitFor(async () => Promise.reject(new Error("connection refused")), 50, "a server").catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toBe("timed out after 50 ms waiting for a server (the check last threw: connection refused)");
    expect(((err as Error).cause as Error).message).toBe("connection refused");
    // A check that returned false after throwing reports no stale error.
    let k = 0;
    await expect(
      waitFor(() => {
        if (k++ === 0) throw new Error("once");
        return false;
      }, 50, "nothing"),
    ).rejects.toThrow(/^timed out after 50 ms waiting for nothing$/);
  });
});
