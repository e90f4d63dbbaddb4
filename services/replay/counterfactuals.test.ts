/** The counterfactual side's shared random sequence: every reader sees the gateway's tie-break numbers. */
import { describe, expect, it } from "vitest";
import { decisionRandom } from "../routing/stages/scheduling.js";
import { ChargeLedger } from "../views/charge-ledger.js";
import { mulberry32 } from "../shared/seeded-random.js";
import { ArmLedger, DecisionDraws } from "./counterfactuals.js";

describe("DecisionDraws", () => {
  const d = { id: "req-1", gateway: "g1", charge: "2s" };

  it("each reader reads decisionRandom's sequence from its start, however the reads interleave", () => {
    const expected = decisionRandom(d.id, d.gateway, d.charge);
    const want = Array.from({ length: 12 }, () => expected());
    const draws = new DecisionDraws(d);
    const a = draws.reader();
    const b = draws.reader();
    const got: number[][] = [[], [], []];
    for (let i = 0; i < 12; i++) {
      (got[0] as number[]).push(a());
      if (i % 3 === 0) (got[1] as number[]).push(b());
    }
    const c = draws.reader();
    for (let i = 0; i < 12; i++) (got[2] as number[]).push(c());
    while ((got[1] as number[]).length < 12) (got[1] as number[]).push(b());
    for (const g of got) expect(g).toEqual(want);
  });

  it("another decision draws another sequence", () => {
    const x = new DecisionDraws(d).reader();
    const y = new DecisionDraws({ ...d, charge: "2t" }).reader();
    expect([x(), x(), x()]).not.toEqual([y(), y(), y()]);
  });
});

describe("ArmLedger", () => {
  // The views' ledger as the counterfactual arms used it before: charges as stream events of gateways
  // that never lapse, releases by gateway and id.
  for (const maxCharges of [10_000_000, 7]) {
    it(`counts as ChargeLedger counts an arm's charges (repeated keys, unknown releases, bound ${maxCharges})`, () => {
      const rnd = mulberry32(11);
      const ref = new ChargeLedger({ maxCharges, heartbeatTimeoutMs: Number.POSITIVE_INFINITY });
      const arm = new ArmLedger(maxCharges);
      const models = ["m1", "m2"];
      const pods = ["p0", "p1", "p2"];
      let ts = 1_000;
      for (let step = 0; step < 3_000; step++) {
        ts += Math.floor(rnd() * 3);
        const gateway = `g${Math.floor(rnd() * 3)}`;
        const id = (1 + Math.floor(rnd() * 40)).toString(36);
        const model = models[Math.floor(rnd() * models.length)] as string;
        const pod = pods[Math.floor(rnd() * pods.length)] as string;
        if (rnd() < 0.55) {
          const promptTokens = Math.floor(rnd() * 500);
          ref.applyFromStream({ type: "charge", id, gateway, model, pod, ts, ttlMs: 3_600_000, promptTokens }, ts, ts);
          arm.charge(`${gateway}/${id}`, model, pod, promptTokens);
        } else expect(arm.release(`${gateway}/${id}`)).toBe(ref.release({ gateway, id }));
        for (const m of models) for (const p of pods) expect(arm.outstanding(m, p), `${step} ${m} ${p}`).toEqual(ref.outstanding(m, p));
      }
      expect(arm.evicted).toBe(ref.evicted);
      if (maxCharges === 7) expect(arm.evicted).toBeGreaterThan(0);
      expect(arm.size).toBeLessThanOrEqual(maxCharges);
    });
  }
});
