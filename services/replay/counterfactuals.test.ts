/** The counterfactual side's shared random sequence: every reader sees the gateway's tie-break numbers. */
import { describe, expect, it } from "vitest";
import { decisionRandom } from "../routing/stages/scheduling.js";
import { DecisionDraws } from "./counterfactuals.js";

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
