import { describe, expect, it } from "vitest";
import { type DecisionInputs, inputsOfRecord, recordedInputs } from "./decision-inputs.js";
import type { DecisionRecord } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";

/** Every input set (blocks excepted: packed with the record, decoded by replay). */
const full: DecisionInputs = {
  cursors: { pods: 1, load: 2, charges: 3, kv: 4, config: 5 },
  rank: { index: 1, count: 3 },
  session: { address: "10.0.0.1:8000" },
  subset: ["10.0.0.1:8000"],
  profile: "slo",
  strategyParams: { "prefix-cache": { threshold: 0.5 } },
  slo: { ttftMs: 200 },
  maxTokens: 64,
  consistency: "strict",
  flow: { band: 2, objective: "chat", enqueuedAt: 100, waitMs: 5 },
  semantic: { virtualModel: "auto", decision: "maths", runnerUp: "default", signals: { m: { value: true, def: "kw" } } },
  rewrite: { from: "alias", to: "org/model", rule: "r#0", pool: "ns/p" },
  enginePriority: -2,
  engineModel: "org/base:tenant-a",
  responseAffinity: { action: "expand", reason: "owner-gone", owner: "pod-1", turns: 3, dropped: 1 },
};

describe("decision inputs - one contract between the charge, the record and replay", () => {
  it("every input survives record -> replay (a field added on one side only fails here)", () => {
    const rec: DecisionRecord = { type: "decision", v: 2, id: "r1", gateway: "gw", model: "org/model", ts: 1, strategy: "least-request", candidates: [], pick: "p0", status: 200, outcome: "completed", ...recordedInputs(full) };
    expect(checkEvent("decision", rec)).toMatchObject({ ok: true });
    expect(inputsOfRecord(rec)).toEqual(full);
    // The record names exactly the inputs' fields.
    const { blocks: _b, ...keys } = Object.fromEntries(Object.keys(full).map((k) => [k, true]));
    expect(Object.keys(recordedInputs(full)).sort()).toEqual(Object.keys(keys).sort());
  });

  it("an engine priority's reason (no priority written) is recorded and read back as such", () => {
    for (const enginePriority of ["fcfs-pod", "off"] as const) {
      const inputs: DecisionInputs = { cursors: full.cursors, flow: { band: 0, enqueuedAt: 1, waitMs: 0 }, enginePriority };
      const rec: DecisionRecord = { type: "decision", v: 2, id: "r1", gateway: "gw", model: "org/model", ts: 1, strategy: "least-request", candidates: [], pick: "p0", status: 200, outcome: "completed", ...recordedInputs(inputs) };
      expect(checkEvent("decision", rec)).toMatchObject({ ok: true });
      expect(inputsOfRecord(rec).enginePriority).toBe(enginePriority);
    }
  });
});
