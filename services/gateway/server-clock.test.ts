import { describe, expect, it } from "vitest";
import { ServerClock } from "./server-clock.js";

describe("server clock - liveness on the broker's time", () => {
  it("estimates a host running 5 s ahead from the smallest delivery difference, and follows a change within two windows", () => {
    let local = 1_000_000 + 5_000;
    const c = new ServerClock(() => local, 1_000);
    expect(c.skewMs).toBe(0);
    for (const delay of [3, 1, 7, 2]) c.observe(local - 5_000 - delay);
    expect(c.skewMs).toBe(5_001);
    expect(c.now()).toBe(local - 5_001);
    // The host's clock is corrected: after two windows the old estimate is gone.
    local -= 5_000;
    for (let i = 0; i < 3; i++) {
      local += 600;
      c.observe(local - 2);
    }
    expect(c.skewMs).toBe(2);
  });
});
