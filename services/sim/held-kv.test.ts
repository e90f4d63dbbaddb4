import { describe, expect, it } from "vitest";
import { ManualClock } from "./clock.js";
import { type HeldKv, HeldKvRegistry } from "./held-kv.js";

function entry(blocks = 3) {
  const log: string[] = [];
  const kv: HeldKv = { blocks, release: () => log.push("release"), onEnd: (how) => log.push(how) };
  return { kv, log };
}

describe("HeldKvRegistry", () => {
  it("a take frees the blocks once and ends the entry as taken", () => {
    const r = new HeldKvRegistry(new ManualClock());
    const e = entry(5);
    expect(r.hold("req-1", e.kv, 1_000)).toBe(true);
    expect(r.size).toBe(1);
    expect(r.take("req-1")).toBe(5);
    expect(r.take("req-1")).toBeUndefined();
    expect(e.log).toEqual(["release", "taken"]);
    expect(r.size).toBe(0);
  });

  it("expires an entry after its timeout on the simulated clock", () => {
    const clock = new ManualClock();
    const r = new HeldKvRegistry(clock);
    const e = entry();
    r.hold("req-1", e.kv, 1_000);
    clock.advance(999);
    expect(e.log).toEqual([]);
    clock.advance(1);
    expect(e.log).toEqual(["release", "expired"]);
    expect(r.take("req-1")).toBeUndefined();
  });

  it("a second hold under a live key expires the first", () => {
    const r = new HeldKvRegistry(new ManualClock());
    const a = entry(1);
    const b = entry(2);
    r.hold("k", a.kv, 1_000);
    r.hold("k", b.kv, 1_000);
    expect(a.log).toEqual(["release", "expired"]);
    expect(r.take("k")).toBe(2);
  });

  it("drop ends only the given entry", () => {
    const r = new HeldKvRegistry(new ManualClock());
    const a = entry();
    const b = entry();
    r.hold("k", a.kv, 1_000);
    r.drop("k", b.kv);
    expect(r.size).toBe(1);
    r.drop("k", a.kv);
    expect(a.log).toEqual(["release", "dropped"]);
  });

  it("a decode waiting before its prefill takes the KV the moment it is held", async () => {
    const r = new HeldKvRegistry(new ManualClock());
    const waiting = r.waitAndTake("room-1", new AbortController().signal);
    expect(r.waitingDecodes).toBe(1);
    const e = entry(4);
    r.hold("room-1", e.kv, 1_000);
    expect(await waiting).toBe(4);
    expect(e.log).toEqual(["release", "taken"]);
    expect(r.waitingDecodes).toBe(0);
    expect(r.size).toBe(0);
  });

  it("a waiting decode that gives up leaves nothing behind, and the bound refuses extra waiters and entries", async () => {
    const r = new HeldKvRegistry(new ManualClock(), 1);
    const ac = new AbortController();
    const waiting = r.waitAndTake("room-1", ac.signal);
    await expect(r.waitAndTake("room-2", new AbortController().signal)).rejects.toThrow(/too many/);
    ac.abort();
    await expect(waiting).rejects.toThrow();
    expect(r.waitingDecodes).toBe(0);
    expect(r.hold("a", entry().kv, 10)).toBe(true);
    expect(r.hold("b", entry().kv, 10)).toBe(false);
  });

  it("clear forgets entries without releasing (the restarted engine freed them)", () => {
    const clock = new ManualClock();
    const r = new HeldKvRegistry(clock);
    const e = entry();
    r.hold("k", e.kv, 10);
    r.clear();
    clock.advance(100);
    expect(e.log).toEqual([]);
    expect(r.size).toBe(0);
  });
});
