import { describe, expect, it } from "vitest";
import { ApiError } from "./errors.js";
import { FaultState, parseFaults } from "./faults.js";

describe("parseFaults", () => {
  it("accepts the documented fields and {}", () => {
    expect(parseFaults({})).toEqual({});
    const all = { status: 503, count: 2, hang: false, sideChannel: "delay", sideChannelDelayMs: 300, bootstrap: "drop" };
    expect(parseFaults(all)).toEqual(all);
  });

  it("rejects unknown fields, bad values and count without status", () => {
    for (const bad of [null, [], { status: 200 }, { status: 503.5 }, { count: 2 }, { status: 500, count: 0 }, { hang: "yes" }, { sideChannel: "slow" }, { bootstrap: "delay" }, { statu: 500 }]) {
      expect(() => parseFaults(bad), JSON.stringify(bad)).toThrow(ApiError);
    }
  });
});

describe("FaultState", () => {
  it("uses up `count` statuses, then serves", () => {
    const f = new FaultState();
    f.set({ status: 502, count: 2 });
    expect(f.next()).toEqual({ kind: "status", status: 502 });
    expect(f.current).toEqual({ status: 502, count: 1 });
    expect(f.next()).toEqual({ kind: "status", status: 502 });
    expect(f.next()).toEqual({ kind: "serve" });
  });

  it("without count, answers the status until cleared", () => {
    const f = new FaultState();
    f.set({ status: 500 });
    for (let i = 0; i < 5; i++) expect(f.next().kind).toBe("status");
    f.set({});
    expect(f.next().kind).toBe("serve");
  });

  it("holds hung requests until the hang is cleared; a leaving client drops its waiter", async () => {
    const f = new FaultState();
    f.set({ hang: true });
    expect(f.next()).toEqual({ kind: "hang" });
    const staying = f.waitUnhung(new AbortController().signal);
    const ac = new AbortController();
    const leaving = f.waitUnhung(ac.signal);
    expect(f.hungRequests).toBe(2);
    ac.abort();
    await expect(leaving).rejects.toThrow();
    expect(f.hungRequests).toBe(1);
    f.set({ sideChannel: "drop" });
    await expect(staying).resolves.toBeUndefined();
    expect(f.hungRequests).toBe(0);
  });
});
