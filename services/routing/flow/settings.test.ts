import { describe, expect, it } from "vitest";
import { modelConfigError } from "../../../schemas/config.js";
import { RouteError } from "../errors.js";
import { ANONYMOUS_FLOW, classify, DEADLINE_HEADER, FAIRNESS_HEADER, FLOW_DEFAULTS, flowSettingsOf, OBJECTIVE_HEADER } from "./settings.js";

const s = flowSettingsOf({ objectives: { chat: { priority: 10, ttlMs: 5_000 }, batch: { priority: 0 }, scavenger: { priority: -1, ttlMs: 100 } }, defaultObjective: "batch", ttlMs: 30_000 });
if (!s) throw new Error("settings");

describe("flow settings", () => {
  it("off without a flowControl entry or with enabled: false; the peers' defaults otherwise", () => {
    expect(flowSettingsOf(undefined)).toBeUndefined();
    expect(flowSettingsOf({ enabled: false, ttlMs: 5 })).toBeUndefined();
    const d = flowSettingsOf({});
    expect(d).toMatchObject({ fairness: "round-robin", order: "fcfs", ttlMs: 60_000, waitingRoomTtlMs: 0, maxRequestsPerBand: 5_000, maxBytesPerBand: 256 * 1024 * 1024, maxRequestsPerUser: 1_000, maxBytesPerUser: 64 * 1024 * 1024, saturation: { queueDepth: 5, kvCacheUsage: 0.8 } });
    expect(d?.saturation.maxInFlightPerPod).toBeUndefined();
    expect(FLOW_DEFAULTS.ttlMs).toBe(60_000);
  });

  it("config set refuses bad flow config with a message naming the field", () => {
    expect(modelConfigError({ flowControl: { defaultObjective: "gold", objectives: { silver: { priority: 1 } } } })).toMatch(/\/flowControl\/defaultObjective.*gold/);
    expect(modelConfigError({ flowControl: { objectives: { a: { priority: 17 } } } })).toMatch(/\/flowControl\/objectives\/a\/priority/);
    expect(modelConfigError({ flowControl: { objectives: { a: { priority: 1.5 } } } })).toMatch(/priority/);
    expect(modelConfigError({ flowControl: { ttlMs: -1 } })).toMatch(/\/flowControl\/ttlMs/);
    expect(modelConfigError({ flowControl: { fairness: "lottery" } })).toMatch(/\/flowControl\/fairness/);
    expect(modelConfigError({ flowControl: { saturation: { kvCacheUsage: 1.5 } } })).toMatch(/\/flowControl\/saturation\/kvCacheUsage/);
    expect(modelConfigError({ flowControl: { objectives: { "bad name": { priority: 1 } } } })).toMatch(/objectives/);
    expect(modelConfigError({ flowControl: { wat: 1 } })).toMatch(/flowControl/);
    // An objective named like an Object.prototype property is not "defined" by inheritance.
    expect(modelConfigError({ flowControl: { defaultObjective: "constructor" } })).toMatch(/defaultObjective/);
    expect(modelConfigError({ flowControl: { objectives: { chat: { priority: 16, ttlMs: 0 } }, defaultObjective: "chat" } })).toBeUndefined();
  });
});

describe("classify", () => {
  it("the header's objective gives the band and TTL; none: the default objective; the API key's wins", () => {
    expect(classify(s, { [OBJECTIVE_HEADER]: "chat" }, undefined, "alice", 1_000)).toEqual({ band: 10, objective: "chat", flow: "alice", enqueuedAt: 1_000, expiresAt: 6_000, deadline: 6_000 });
    expect(classify(s, {}, undefined, "alice", 0)).toMatchObject({ band: 0, objective: "batch", expiresAt: 30_000 });
    expect(classify(s, { [OBJECTIVE_HEADER]: "chat" }, "scavenger", "alice", 0)).toMatchObject({ band: -1, objective: "scavenger", expiresAt: 100 });
    // A key's objective this model does not define: the model's default is its ceiling (not a 400, not a free pick).
    expect(classify(s, { [OBJECTIVE_HEADER]: "chat" }, "gold", "alice", 0)).toMatchObject({ band: 0, objective: "batch" });
    expect(classify(s, {}, "gold", "alice", 0)).toMatchObject({ band: 0, objective: "batch" });
    const none = flowSettingsOf({ ttlMs: 50 });
    expect(none && classify(none, {}, undefined, undefined, 0)).toEqual({ band: 0, flow: ANONYMOUS_FLOW, enqueuedAt: 0, expiresAt: 50, deadline: 50 });
  });

  it("a key's objective is a ceiling: lower objectives may be named, higher ones run at the ceiling, on every model", () => {
    // Pinned to batch (priority 0) on a model defining it: chat (10) is capped, scavenger (-1) allowed.
    expect(classify(s, { [OBJECTIVE_HEADER]: "chat" }, "batch", "k", 0)).toMatchObject({ band: 0, objective: "batch", expiresAt: 30_000 });
    expect(classify(s, { "x-llm-d-inference-objective": "chat" }, "batch", "k", 0)).toMatchObject({ band: 0, objective: "batch" });
    expect(classify(s, { [OBJECTIVE_HEADER]: "scavenger" }, "batch", "k", 0)).toMatchObject({ band: -1, objective: "scavenger" });
    expect(classify(s, {}, "batch", "k", 0)).toMatchObject({ band: 0, objective: "batch" });
    // Pinned to batch on a model without batch: its default is the ceiling; with no default, band 0.
    const noBatch = flowSettingsOf({ objectives: { chat: { priority: 10 }, low: { priority: -2 }, bulk: { priority: -1 } }, defaultObjective: "bulk" });
    if (!noBatch) throw new Error("settings");
    expect(classify(noBatch, { [OBJECTIVE_HEADER]: "chat" }, "batch", "k", 0)).toMatchObject({ band: -1, objective: "bulk" });
    expect(classify(noBatch, { [OBJECTIVE_HEADER]: "low" }, "batch", "k", 0)).toMatchObject({ band: -2, objective: "low" });
    const noDefault = flowSettingsOf({ objectives: { chat: { priority: 10 }, low: { priority: -2 } } });
    if (!noDefault) throw new Error("settings");
    const capped = classify(noDefault, { [OBJECTIVE_HEADER]: "chat" }, "batch", "k", 0);
    expect(capped.band).toBe(0);
    expect(capped.objective).toBeUndefined();
    // A key pinned to a high objective does not lift a request above what it names.
    expect(classify(s, { [OBJECTIVE_HEADER]: "batch" }, "chat", "k", 0)).toMatchObject({ band: 0, objective: "batch" });
    expect(classify(s, {}, "chat", "k", 0)).toMatchObject({ band: 10, objective: "chat" });
  });

  it("an unknown objective is a 400 naming the header and the defined ones", () => {
    for (const name of ["gold", "constructor", "__proto__"]) {
      let err: unknown;
      try {
        classify(s, { [OBJECTIVE_HEADER]: name }, undefined, "u", 0);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(RouteError);
      expect((err as RouteError).status).toBe(400);
      expect((err as RouteError).param).toBe(OBJECTIVE_HEADER);
      expect((err as RouteError).message).toMatch(/defined: chat, batch, scavenger/);
    }
  });

  it("the fairness id names the flow (bounded); the deadline orders EDF and caps the TTL", () => {
    // A fairness id is a flow within its user: least-attained still reads the user's usage.
    expect(classify(s, { [FAIRNESS_HEADER]: "team-a" }, undefined, "alice", 0).flow).toBe("alice\u0000team-a");
    expect(classify(s, { [FAIRNESS_HEADER]: "team-a" }, undefined, undefined, 0).flow).toBe("\u0000team-a");
    expect(() => classify(s, { [FAIRNESS_HEADER]: "x".repeat(257) }, undefined, "alice", 0)).toThrow(/longer than 256/);
    expect(classify(s, { [DEADLINE_HEADER]: "2000" }, undefined, "a", 100)).toMatchObject({ deadline: 2_100, expiresAt: 2_100 });
    // A deadline past the TTL orders EDF but the TTL still ends the wait.
    expect(classify(s, { [DEADLINE_HEADER]: "90000" }, undefined, "a", 0)).toMatchObject({ deadline: 90_000, expiresAt: 30_000 });
    for (const bad of ["-1", "1.5", "1e3", "abc", "9999999999"]) expect(() => classify(s, { [DEADLINE_HEADER]: bad }, undefined, "a", 0)).toThrow(/whole number of milliseconds/);
  });
});
