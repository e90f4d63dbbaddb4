import { describe, expect, it } from "vitest";
import { FLEET_DEFAULTS, parsePodClasses, resolveFleetOptions, SimOptionsError } from "./options.js";

describe("sim pod classes", () => {
  it("parses name[:prefill=][:decode=][:kv=] lists", () => {
    expect(parsePodClasses("fast,slow:prefill=0.625:decode=37.5:kv=32768")).toEqual([{ name: "fast" }, { name: "slow", prefillMsPerToken: 0.625, decodeMsPerStep: 37.5, kvCapacityTokens: 32768 }]);
    expect(() => parsePodClasses("slow:speed=2")).toThrow(SimOptionsError);
    expect(() => parsePodClasses("slow:prefill=")).toThrow(SimOptionsError);
  });

  it("gives each class its engine settings over the fleet's, and bounds max_model_len by the smallest KV", () => {
    const o = resolveFleetOptions({ pods: 4, model: "m", podClasses: [{ name: "fast" }, { name: "slow", prefillMsPerToken: 1, kvCapacityTokens: 4096 }] });
    expect(o.podClasses.map((k) => [k.name, k.engineConfig.prefillMsPerToken, k.engineConfig.decodeMsPerStep, k.engineConfig.kvCapacityTokens])).toEqual([
      ["fast", FLEET_DEFAULTS.prefillMsPerToken, FLEET_DEFAULTS.decodeMsPerStep, FLEET_DEFAULTS.kvCapacityTokens],
      ["slow", 1, FLEET_DEFAULTS.decodeMsPerStep, 4096],
    ]);
    expect(o.maxModelLen).toBe(4096);
    expect(() => resolveFleetOptions({ pods: 1, model: "m", podClasses: [{ name: "has space" }] })).toThrow(/podClasses/);
    expect(() => resolveFleetOptions({ pods: 1, model: "m", podClasses: [{ name: "x", kvCapacityTokens: 3 }] })).toThrow(/kvCapacityTokens/);
    expect(resolveFleetOptions({ pods: 1, model: "m" }).podClasses).toEqual([]);
  });
});
