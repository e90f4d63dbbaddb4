import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { decideLease, type LeaseObservation, type LeaseRecord, leaderUntil, observe, renewIntervalMs } from "./lease.js";

describe("lease decisions", () => {
  const lease = (holder: string, version: string, durationMs = 1_000) => ({ holder, durationMs, version, transitions: 2 });
  it("acquires an absent or released lease, renews its own", () => {
    expect(decideLease("me", undefined, undefined, 0)).toEqual({ kind: "acquire", transitions: 0 });
    expect(decideLease("me", lease("", "5"), undefined, 0)).toEqual({ kind: "acquire", transitions: 3 });
    expect(decideLease("me", lease("me", "5"), undefined, 0)).toEqual({ kind: "renew" });
  });
  it("follows a live holder and takes over once its version stood still for a lease duration on our clock", () => {
    let seen = observe(lease("other", "5"), undefined, 100);
    expect(decideLease("me", lease("other", "5"), seen, 100)).toEqual({ kind: "follow", holder: "other", expiresIn: 1_000 });
    seen = observe(lease("other", "5"), seen, 900);
    expect(decideLease("me", lease("other", "5"), seen, 1_099)).toMatchObject({ kind: "follow", expiresIn: 1 });
    expect(decideLease("me", lease("other", "5"), seen, 1_100)).toEqual({ kind: "acquire", transitions: 3 });
    // A renewal (new version) restarts the wait.
    seen = observe(lease("other", "6"), seen, 1_050);
    expect(decideLease("me", lease("other", "6"), seen, 1_100)).toMatchObject({ kind: "follow", expiresIn: 950 });
  });
  it("a holder stops believing itself leader half a lease after its renewal started", () => {
    expect(leaderUntil(1_000, 15_000)).toBe(8_500);
  });
  it("the holder's own duration counts, not the candidate's", () => {
    const seen = observe(lease("other", "5", 3_000), undefined, 0);
    expect(decideLease("me", lease("other", "5", 3_000), seen, 2_999)).toMatchObject({ kind: "follow", expiresIn: 1 });
    expect(decideLease("me", lease("other", "5", 3_000), seen, 3_000)).toMatchObject({ kind: "acquire" });
  });
  it("a candidate that first sees a lease waits a whole duration, however old the lease is", () => {
    // No timestamp in the record is trusted: a lease left by a holder that died long ago still
    // costs a newcomer one duration (the price of needing no clock agreement).
    const seen = observe(lease("long-dead", "5"), undefined, 1e12);
    expect(decideLease("me", lease("long-dead", "5"), seen, 1e12)).toMatchObject({ kind: "follow", expiresIn: 1_000 });
  });
});

/**
 * A holder renewing every renewal interval until it dies, a candidate reading the lease every
 * renewal interval; calls take time. Times are true time; each host reads its own clock, off by
 * `offset`. Returns when (true time) the candidate decides to acquire.
 */
function takeover(o: { durationMs: number; diesAt: number; phase: number; readDelay: number; writeDelay: number; offset: number }): { at: number; lastRenewal: number } {
  const every = renewIntervalMs(o.durationMs);
  const renewals: number[] = [];
  for (let t = 0; t < o.diesAt; t += every) renewals.push(t);
  const lastRenewal = renewals.at(-1) ?? 0;
  const candidateClock = (t: number) => t + o.offset;
  let seen: LeaseObservation | undefined;
  for (let start = o.phase; ; start += every) {
    const readAt = start + o.readDelay;
    // The version read: the last renewal whose write had landed when the read was served.
    const version = renewals.filter((r) => r + o.writeDelay <= readAt).length;
    const record: LeaseRecord | undefined = version === 0 ? undefined : { holder: "holder", durationMs: o.durationMs, version: String(version), transitions: 0 };
    if (record === undefined) continue;
    seen = observe(record, seen, candidateClock(start));
    if (decideLease("candidate", record, seen, candidateClock(readAt)).kind === "acquire") return { at: readAt, lastRenewal };
    if (start > o.diesAt + 10 * o.durationMs) throw new Error("never took over");
  }
}

describe("lease rule - clock skew between hosts (simulated, every clock injected)", () => {
  const timeline = fc.integer({ min: 30, max: 60_000 }).chain((durationMs) =>
    fc.record({
      durationMs: fc.constant(durationMs),
      diesAt: fc.integer({ min: 1, max: 20 * durationMs }),
      phase: fc.integer({ min: 0, max: renewIntervalMs(durationMs) - 1 }),
      // Calls are bounded by the renewal interval (leader.ts), so neither can take longer.
      readDelay: fc.integer({ min: 0, max: renewIntervalMs(durationMs) - 1 }),
      writeDelay: fc.integer({ min: 0, max: renewIntervalMs(durationMs) - 1 }),
      offset: fc.integer({ min: -3_600_000, max: 3_600_000 }),
    }),
  );

  it("the candidate's decisions do not depend on its clock's offset", () => {
    fc.assert(
      fc.property(timeline, (t) => {
        expect(takeover(t).at).toBe(takeover({ ...t, offset: 0 }).at);
      }),
    );
  });

  it("never takes over while the holder may still act; replaces a dead holder within a lease and two renewal intervals", () => {
    fc.assert(
      fc.property(timeline, (t) => {
        const { at, lastRenewal } = takeover(t);
        // Safety: the holder stopped believing itself leader before the candidate acquired.
        expect(at).toBeGreaterThanOrEqual(leaderUntil(lastRenewal, t.durationMs));
        // Liveness: the bound lease.ts states, plus the write of the last renewal in flight.
        expect(at).toBeLessThan(t.diesAt + t.durationMs + 2 * renewIntervalMs(t.durationMs) + t.writeDelay);
      }),
    );
  });

  it("a holder whose clock is far behind or ahead keeps a live lease: the record carries no time the rule reads", () => {
    const live = (renewedAt: number) => ({ holder: "other", durationMs: 1_000, version: String(renewedAt), transitions: 0 });
    let seen: LeaseObservation | undefined;
    // The holder renews every 333 ms (new version); the candidate reads just before each renewal.
    for (let now = 0; now < 10_000; now += 333) {
      seen = observe(live(now), seen, now + 332);
      expect(decideLease("me", live(now), seen, now + 332).kind).toBe("follow");
    }
  });
});
