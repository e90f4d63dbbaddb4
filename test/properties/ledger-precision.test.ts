/**
 * The charge ledger keeps per-pod totals as running float64 sums. A token count large enough to
 * push a sum past 2^53 would round every other charge on the pod away (a pod that is loaded would
 * read idle, or negative, until all its charges ended). Property: the schema refuses such counts
 * (the event is dead-lettered), and for every count it accepts, releasing a charge leaves the
 * pod's totals exactly what the remaining charges add up to.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { type ChargeEvent, MAX_COUNT } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { ChargeLedger } from "../../services/views/charge-ledger.js";

const NOW = 1_750_000_000_000;
const charge = (id: string, promptTokens: number): ChargeEvent => ({ type: "charge", id, gateway: "peer", model: "m", pod: "p", ts: NOW, ttlMs: 60_000, promptTokens });
const RUNS = process.env.JETROUTE_SOAK ? 100_000 : 10_000;

describe("charge ledger - totals stay exact", () => {
  it("a token count past the schema's bound is refused, so it can never reach a ledger", () => {
    fc.assert(
      fc.property(fc.oneof(fc.constantFrom(1e300, Number.MAX_SAFE_INTEGER, 2 ** 60, MAX_COUNT + 1), fc.integer({ min: MAX_COUNT + 1, max: Number.MAX_SAFE_INTEGER })), (huge) => {
        expect(checkEvent("charge", charge("big", huge)).ok).toBe(false);
      }),
      { numRuns: RUNS },
    );
  });

  it("for any accepted counts, releasing one charge restores the others' totals exactly", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: MAX_COUNT }), { minLength: 1, maxLength: 64 }), fc.integer({ min: 0, max: MAX_COUNT }), (others, big) => {
        expect(checkEvent("charge", charge("big", big)).ok).toBe(true);
        const l = new ChargeLedger({ heartbeatTimeoutMs: 3_000 });
        l.applyFromStream({ type: "heartbeat", gateway: "peer", ts: NOW, intervalMs: 1_000, startedAt: NOW, state: "up" }, NOW, NOW);
        for (const [i, n] of others.entries()) l.applyFromStream(charge(`c${i}`, n), NOW, NOW);
        l.applyFromStream(charge("big", big), NOW, NOW);
        l.applyFromStream({ type: "release", id: "big", gateway: "peer", model: "m", pod: "p", ts: NOW, outcome: "completed" }, NOW, NOW);
        const sum = others.reduce((a, b) => a + b, 0);
        expect(l.outstanding("m", "p")).toEqual({ requests: others.length, promptTokens: sum, prefillRequests: others.length, prefillTokens: sum });
      }),
      { numRuns: RUNS },
    );
  });
});
