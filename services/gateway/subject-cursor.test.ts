import { describe, expect, it } from "vitest";
import { afterLostRace, SubjectCursors } from "./subject-cursor.js";

describe("afterLostRace - what the cursor becomes after a refused compare-and-set", () => {
  const race = (expected: number, server: number, current = expected, serverPredatesView = false) => afterLostRace({ expected, server, current, serverPredatesView });

  it("the subject's messages left the stream (server older than what was expected, 0 = none left): the cursor follows the server down", () => {
    expect(race(41, 0)).toEqual({ kind: "adopt", seq: 0 });
    expect(race(41, 0, 41, true)).toEqual({ kind: "adopt", seq: 0 });
    // Older but not gone entirely (a purge keeping some, a stream recreated and written again).
    expect(race(41, 7)).toEqual({ kind: "adopt", seq: 7 });
  });

  it("the cursor moved past what was expected while the refusal travelled: that newer message is fresher than the refusal; retry as is", () => {
    expect(race(41, 0, 45)).toEqual({ kind: "retry" });
    expect(race(41, 43, 45)).toEqual({ kind: "retry" });
    expect(race(41, 45, 45)).toEqual({ kind: "retry" });
  });

  it("another writer won inside this replica's view: wait for the view to apply it", () => {
    expect(race(41, 44)).toEqual({ kind: "catch-up", seq: 44 });
    expect(race(41, 44, 42)).toEqual({ kind: "catch-up", seq: 44 });
    expect(race(0, 3)).toEqual({ kind: "catch-up", seq: 3 });
  });

  it("another writer won before this replica's view began (it will never be delivered): the server's number is the truth", () => {
    expect(race(0, 3, 0, true)).toEqual({ kind: "adopt", seq: 3 });
    expect(race(41, 44, 41, true)).toEqual({ kind: "adopt", seq: 44 });
  });
});

describe("SubjectCursors - per-subject last sequences", () => {
  it("note only raises; reset takes the server's word also below what was seen, and 0 forgets the subject", () => {
    const c = new SubjectCursors();
    c.seen("a", 10);
    c.note("a", 5);
    expect(c.lastSeq("a")).toBe(10);
    c.reset("a", 4);
    expect(c.lastSeq("a")).toBe(4);
    c.reset("a", 0);
    expect(c.lastSeq("a")).toBe(0);
    expect(c.size).toBe(0);
    // The view's window does not move back with it.
    expect(c.predatesView(9)).toBe(true);
    expect(c.predatesView(10)).toBe(false);
  });

  it("a reset upwards resolves waiters like note", async () => {
    const c = new SubjectCursors();
    c.seen("a", 2);
    const w = c.waitFor("a", 7, 5_000);
    c.reset("a", 7);
    await expect(w).resolves.toBe(true);
  });
});
