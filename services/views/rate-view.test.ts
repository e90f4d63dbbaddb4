import { describe, expect, it } from "vitest";
import { RateView } from "./rate-view.js";

describe("rate view - fixed windows", () => {
  it("counts a user's requests and tokens per minute and a model's requests per second", () => {
    const r = new RateView();
    r.request("alice", "m", 100, 60_000);
    r.request("alice", "m", 50, 60_500);
    expect(r.modelRequests("m", 60_900)).toBe(2);
    r.completion("alice", 30, 61_000);
    r.request(undefined, "m", 10, 61_200);
    expect(r.userRequests("alice", 61_500)).toBe(2);
    expect(r.userTokens("alice", 61_500)).toBe(180);
    expect(r.modelRequests("m", 61_300)).toBe(1);
    // Next minute: a fresh window.
    expect(r.userRequests("alice", 120_000)).toBe(0);
    r.request("alice", "m", 1, 120_001);
    expect(r.userRequests("alice", 120_002)).toBe(1);
    // A late event from the finished window does not count in the new one.
    r.request("alice", "m", 1, 119_999);
    expect(r.userRequests("alice", 120_002)).toBe(1);
  });

  it("is bounded and sweeps finished windows", () => {
    const r = new RateView(3);
    for (const u of ["a", "b", "c", "d"]) r.request(u, "m", 1, 0);
    expect(r.userRequests("a", 0)).toBe(0);
    expect(r.userRequests("d", 0)).toBe(1);
    r.sweep(120_000);
    expect(r.size).toBe(0);
  });
});
