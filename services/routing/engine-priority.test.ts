import { describe, expect, it } from "vitest";
import { modelConfigError } from "../../schemas/config.js";
import { validateModelConfig } from "./config-check.js";
import {
  bodyForLeg,
  bodyWithEnginePriority,
  type EnginePriorityPod,
  type EnginePrioritySetting,
  enginePriorityConfigError,
  enginePriorityFor,
  urgencyTable,
} from "./engine-priority.js";

const vllm: EnginePriorityPod = { engine: "vllm", schedulingPolicy: "priority" };
const sglang: EnginePriorityPod = { engine: "sglang", schedulingPolicy: "priority" };
const sglangLow: EnginePriorityPod = { engine: "sglang", schedulingPolicy: "priority-low-values-first" };
const vllmFcfs: EnginePriorityPod = { engine: "vllm" };
const sglangFcfs: EnginePriorityPod = { engine: "sglang" };

describe("enginePriorityFor: the value written into the body", () => {
  it.each<[string, number | undefined, EnginePriorityPod, EnginePrioritySetting, ReturnType<typeof enginePriorityFor>]>([
    // Default mapping: urgency = band; vLLM lower = more urgent, SGLang higher, unless low values first.
    ["interactive on vLLM", 10, vllm, undefined, { action: "set", value: -10, urgency: 10 }],
    ["batch on vLLM is 0, not -0", 0, vllm, undefined, { action: "set", value: 0, urgency: 0 }],
    ["sheddable on vLLM", -1, vllm, undefined, { action: "set", value: 1, urgency: -1 }],
    ["interactive on SGLang", 10, sglang, undefined, { action: "set", value: 10, urgency: 10 }],
    ["sheddable on SGLang", -16, sglang, undefined, { action: "set", value: -16, urgency: -16 }],
    ["interactive on SGLang low-values-first", 10, sglangLow, undefined, { action: "set", value: -10, urgency: 10 }],
    ["vLLM told low-values-first: its own sign anyway", 10, { engine: "vllm", schedulingPolicy: "priority-low-values-first" }, undefined, { action: "set", value: -10, urgency: 10 }],
    // A mapping: named bands, the rest band × scale.
    ["named band on vLLM", 10, vllm, { bands: { "10": 100 } }, { action: "set", value: -100, urgency: 100 }],
    ["named band on SGLang", 10, sglang, { bands: { "10": 100 } }, { action: "set", value: 100, urgency: 100 }],
    ["unnamed band scaled", 5, sglang, { scale: 3, bands: { "10": 100 } }, { action: "set", value: 15, urgency: 15 }],
    ["empty object = default", 7, vllm, {}, { action: "set", value: -7, urgency: 7 }],
    // Nothing written.
    ["FCFS vLLM pod", 10, vllmFcfs, undefined, { action: "leave", reason: "fcfs-pod" }],
    ["FCFS SGLang pod (it may abort on a priority)", 10, sglangFcfs, { scale: 2 }, { action: "leave", reason: "fcfs-pod" }],
    ["model says off", 10, vllm, "off", { action: "leave", reason: "off" }],
    ["no band (flow control off for the model)", undefined, sglang, undefined, { action: "leave", reason: "no-band" }],
  ])("%s", (_name, band, pod, setting, expected) => {
    expect(enginePriorityFor(band, pod, setting)).toEqual(expected);
    const d = enginePriorityFor(band, pod, setting);
    if (d.action === "set") expect(Object.is(d.value, -0)).toBe(false);
  });

  it("keeps the bands' order in each engine's convention for every band, default and scaled", () => {
    for (const setting of [undefined, { scale: 5 }, { bands: { "16": 1000, "-16": -1000 } }] as EnginePrioritySetting[]) {
      for (const pod of [vllm, sglang, sglangLow]) {
        const values = urgencyTable(setting).map(({ band }) => enginePriorityFor(band, pod, setting)).map((d) => (d.action === "set" ? d.value : Number.NaN));
        const moreUrgentFirst = pod.engine === "vllm" || pod.schedulingPolicy === "priority-low-values-first" ? values : values.map((v) => -v);
        // Higher band -> engine value at least as urgent.
        for (let i = 1; i < moreUrgentFirst.length; i++) expect(moreUrgentFirst[i]).toBeLessThanOrEqual(moreUrgentFirst[i - 1] as number);
      }
    }
  });

  it("with SGLang's default threshold (10), the default mapping does not let band 10 preempt band 0; scale 2 does", () => {
    const gap = (setting: EnginePrioritySetting) => {
      const hi = enginePriorityFor(10, sglang, setting);
      const lo = enginePriorityFor(0, sglang, setting);
      return hi.action === "set" && lo.action === "set" ? hi.value - lo.value : Number.NaN;
    };
    expect(gap(undefined) > 10).toBe(false);
    expect(gap({ scale: 2 }) > 10).toBe(true);
  });
});

describe("bodyWithEnginePriority", () => {
  it("sets the value over whatever the client sent, leaves the body alone otherwise", () => {
    const body = { model: "m", prompt: "hi", priority: -1000 };
    expect(bodyWithEnginePriority(body, { action: "set", value: -10, urgency: 10 })).toEqual({ model: "m", prompt: "hi", priority: -10 });
    expect(body.priority).toBe(-1000);
    expect(bodyWithEnginePriority({ model: "m" }, { action: "set", value: 0, urgency: 0 })).toEqual({ model: "m", priority: 0 });
    expect(bodyWithEnginePriority({ model: "m", priority: 5 }, { action: "set", value: 5, urgency: 5 })).toBeUndefined();
    expect(bodyWithEnginePriority(body, { action: "leave", reason: "fcfs-pod" })).toBeUndefined();
  });
});

describe("flowControl.enginePriority validation", () => {
  it.each<[unknown, RegExp]>([
    ["on", /\/flowControl\/enginePriority: must be "off" or an object/],
    [5, /must be "off" or an object/],
    [["off"], /must be "off" or an object/],
    [{ scale: 0 }, /\/flowControl\/enginePriority\/scale: must be an integer from 1 to 1000/],
    [{ scale: 1.5 }, /scale/],
    [{ weight: 2 }, /\/flowControl\/enginePriority\/weight: unknown field/],
    [{ bands: [] }, /\/flowControl\/enginePriority\/bands: must be an object/],
    [{ bands: { "17": 1 } }, /\/flowControl\/enginePriority\/bands\/17: bands are integers from -16 to 16/],
    [{ bands: { "07": 1 } }, /bands\/07: .*without leading zeros/],
    [{ bands: { "-0": 1 } }, /bands\/-0/],
    [{ bands: { x: 1 } }, /bands\/x/],
    [{ bands: { "3": 2.5 } }, /\/flowControl\/enginePriority\/bands\/3: the urgency must be an integer/],
    [{ bands: { "3": 2_000_000 } }, /bands\/3: the urgency/],
    [{ bands: { "10": -5 } }, /band 10 maps to urgency -5, below band 0's 0; a higher band must never get a lower urgency/],
    [{ bands: { "-1": 3 } }, /band 0 maps to urgency 0, below band -1's 3/],
  ])("refuses %j naming the field", (setting, message) => {
    expect(enginePriorityConfigError(setting)).toMatch(message);
    // `jetroute config set` and the gateways' fold use validateModelConfig.
    expect(validateModelConfig({ flowControl: { enginePriority: setting } })).toMatch(message);
  });

  it("checks the order over the model's objectives' bands too", () => {
    const objectives = { interactive: { priority: 10 }, premium: { priority: 12 }, batch: { priority: 0 } };
    // Band 12 (unnamed) keeps 12, below interactive's 100.
    const config = { flowControl: { objectives, enginePriority: { bands: { "10": 100 } } } };
    expect(validateModelConfig(config)).toMatch(/band 12 maps to urgency 12, below band 10's 100/);
    expect(validateModelConfig({ flowControl: { objectives, enginePriority: { bands: { "10": 100, "12": 120 } } } })).toBeUndefined();
    // A band no objective uses is not in play.
    expect(validateModelConfig({ flowControl: { objectives: { batch: { priority: 0 }, interactive: { priority: 10 } }, enginePriority: { bands: { "10": 100 } } } })).toBeUndefined();
  });

  it.each<[unknown]>([[undefined], ["off"], [{}], [{ scale: 2 }], [{ bands: { "10": 100, "0": 0, "-1": -50 } }], [{ bands: { "3": 50 } }], [{ scale: 10, bands: { "16": 160, "-16": -1000 } }]])(
    "accepts %j",
    (setting) => {
      expect(enginePriorityConfigError(setting)).toBeUndefined();
      const config = setting === undefined ? { flowControl: {} } : { flowControl: { enginePriority: setting } };
      expect(modelConfigError(config)).toBeUndefined();
      expect(validateModelConfig(config)).toBeUndefined();
    },
  );
});

describe("a P/D leg's body (bodyForLeg)", () => {
  const decode = { model: "m", priority: -10 };
  it("a leg whose pod schedules by priority gets its own value; an FCFS leg gets the client's own value, or none", () => {
    expect(bodyForLeg(decode, { model: "m" }, { action: "set", value: 10, urgency: 10 })).toEqual({ model: "m", priority: 10 });
    expect(bodyForLeg(decode, { model: "m", priority: 3 }, { action: "leave", reason: "fcfs-pod" })).toEqual({ model: "m", priority: 3 });
    expect(bodyForLeg(decode, { model: "m" }, { action: "leave", reason: "fcfs-pod" })).toEqual({ model: "m" });
    // Nothing to change: the same object (no copy of a large body).
    const same = { model: "m" };
    expect(bodyForLeg(same, same, { action: "leave", reason: "off" })).toBe(same);
    expect(bodyForLeg(decode, {}, { action: "set", value: -10, urgency: 10 })).toBe(decode);
  });
});
