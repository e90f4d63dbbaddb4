import { describe, expect, it } from "vitest";
import { FleetQueues } from "../routing/flow/fleet.js";
import { heldAgeMs, queueReadingOf, readSignal, type SignalSources } from "./signals.js";

const T = 1_700_000_000_000;

describe("flow.waitMs on one clock", () => {
  it("a held request's age is the publisher's reported age plus our time since receipt", () => {
    // The gateway's clock is 60 s behind ours: its ts and oldest are both 60 s early.
    const gwNow = T - 60_000;
    expect(heldAgeMs(gwNow, gwNow - 500, T, T + 200)).toBe(700);
    // Nonsense parts count as 0, never as a negative wait.
    expect(heldAgeMs(gwNow, gwNow + 5_000, T, T - 10)).toBe(0);
  });

  it("the fleet's reading takes the longest wait across gateways, each on its own clock", () => {
    const behind = { ts: T - 60_000, receivedAt: T, models: { m: [{ count: 2, oldest: T - 60_000 - 400 }] } };
    const ahead = { ts: T + 30_000, receivedAt: T - 100, models: { m: [{ count: 1, oldest: T + 30_000 - 900 }], other: [{ count: 5, oldest: 0 }] } };
    expect(queueReadingOf("m", [behind, ahead], T + 100)).toEqual({ queued: 3, oldestAgeMs: 1_100 });
    expect(queueReadingOf("none", [behind], T)).toEqual({ queued: 0 });
  });

  it("through FleetQueues and readSignal: a gateway 60 s behind reads as its real wait, not 60 s", () => {
    let now = T;
    const fleet = new FleetQueues({ self: "autoscaler", boundMs: 0, staleMs: 5_000 });
    const gw = T - 60_000;
    expect(fleet.apply({ gateway: "gw-behind", ts: gw, models: { m: [{ band: 0, count: 4, oldest: gw - 250 }] } }, now)).toBe(true);
    now += 50;
    const s = { queues: (model: string) => queueReadingOf(model, fleet.received(), now) } as unknown as SignalSources;
    expect(readSignal("flow.waitMs", { model: "m" }, [], s, now, 1_000)).toEqual({ value: 300, missing: 0 });
    expect(readSignal("flow.queued", { model: "m" }, [], s, now, 1_000)).toEqual({ value: 4, missing: 0 });
  });
});
