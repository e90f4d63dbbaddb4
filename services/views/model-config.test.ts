import { describe, expect, it } from "vitest";
import { modelConfigError } from "../../schemas/config.js";
import { ModelConfigView } from "./model-config.js";

const view = () => {
  const v = new ModelConfigView();
  v.set("m", {
    defaultProfile: "chat",
    profiles: {
      chat: { routingStrategy: "prefix-cache" },
      batch: { routingStrategy: "least-request", routingConfig: { promptTokensGte: 4000 } },
      short: { routingStrategy: "random", routingConfig: { promptTokensLt: 100, maxTokensLt: 64 } },
    },
  });
  v.set("locked", { lockedRoutingStrategy: "least-latency" });
  return v;
};

describe("model config - strategy selection (locked > header > profile > default)", () => {
  it.each([
    { model: "locked", headers: { "routing-strategy": "random" }, p: 10, want: ["least-latency", "locked"] },
    { model: "m", headers: { "routing-strategy": "random" }, p: 10, want: ["random", "header"] },
    { model: "m", headers: {}, p: 10, want: ["prefix-cache", "profile"] },
    { model: "m", headers: { "config-profile": "batch" }, p: 10, want: ["least-request", "profile"] },
    { model: "m", headers: { "config-profile": "auto" }, p: 5000, want: ["least-request", "profile"] },
    { model: "m", headers: { "config-profile": "auto" }, p: 50, max: 10, want: ["random", "profile"] },
    { model: "m", headers: { "config-profile": "auto" }, p: 500, want: ["prefix-cache", "profile"] },
    { model: "m", headers: { "config-profile": "nope" }, p: 10, want: ["prefix-cache", "profile"] },
    { model: "unconfigured", headers: {}, p: 10, want: ["least-request", "default"] },
  ])("$model $headers prompt=$p", ({ model, headers, p, max, want }) => {
    const c = view().choose(model, headers as Record<string, string>, { promptTokens: p, maxTokens: max }, "least-request");
    expect([c.spec, c.source]).toEqual(want);
  });

  it("validates configs, naming the field", () => {
    expect(modelConfigError({ profiles: { a: { routingStrategy: "x" } }, defaultProfile: "a" })).toBeUndefined();
    expect(modelConfigError({ defaultProfile: "missing" })).toMatch(/defaultProfile/);
    expect(modelConfigError({ profiles: { a: { requestsPerSecond: -1 } } })).toMatch(/requestsPerSecond/);
    expect(modelConfigError({ lockedRoutingStrategy: 3 })).toMatch(/lockedRoutingStrategy/);
    expect(modelConfigError({ unknown: true })).toBeDefined();
  });
});

/** Names every plain object answers to through its prototype. */
const PROTOTYPE_NAMES = Object.getOwnPropertyNames(Object.prototype);

describe("model config - client strings are looked up as own names only", () => {
  it("a user named like an Object.prototype member gets the default limits, not none", () => {
    const v = new ModelConfigView();
    v.setLimits({ users: { default: { rpm: 2 }, alice: { rpm: 10 } } });
    expect(PROTOTYPE_NAMES).toEqual(expect.arrayContaining(["constructor", "__proto__", "toString", "hasOwnProperty", "valueOf"]));
    for (const user of PROTOTYPE_NAMES) expect(v.userLimits(user), user).toEqual({ rpm: 2 });
    expect(v.userLimits("alice")).toEqual({ rpm: 10 });
    expect(v.userLimits(undefined)).toEqual({ rpm: 2 });
    // Without a default entry, an unlisted user (a prototype name included) has no limit.
    v.setLimits({ users: { alice: { rpm: 10 } } });
    for (const user of PROTOTYPE_NAMES) expect(v.userLimits(user), user).toBeUndefined();
  });

  it("a config-profile header naming an Object.prototype member selects the default profile", () => {
    const v = new ModelConfigView();
    v.set("m", { defaultProfile: "chat", profiles: { chat: { routingStrategy: "prefix-cache", requestsPerSecond: 1 } } });
    for (const profile of PROTOTYPE_NAMES) {
      const c = v.choose("m", { "config-profile": profile }, { promptTokens: 10 }, "least-request") as { spec: string; profile?: string; requestsPerSecond?: number };
      expect([c.spec, c.profile, c.requestsPerSecond], profile).toEqual(["prefix-cache", "chat", 1]);
    }
  });
});

describe("model config - the model's request rate", () => {
  const v = new ModelConfigView();
  v.set("m", {
    defaultProfile: "chat",
    profiles: { chat: { routingStrategy: "prefix-cache", requestsPerSecond: 1 }, batch: { routingStrategy: "least-request" }, bulk: { requestsPerSecond: 5 } },
  });
  const rps = (headers: Record<string, string>) => (v.choose("m", headers, { promptTokens: 10 }, "least-request") as { requestsPerSecond?: number }).requestsPerSecond;

  it("naming a profile that sets no rate keeps the default profile's limit (no escape by header)", () => {
    expect(rps({})).toBe(1);
    expect(rps({ "config-profile": "batch" })).toBe(1);
    expect(rps({ "config-profile": "batch", "routing-strategy": "random" })).toBe(1);
    expect(rps({ "config-profile": "no-such-profile" })).toBe(1);
  });
  it("a profile with its own rate applies it", () => {
    expect(rps({ "config-profile": "bulk" })).toBe(5);
  });
  it("a model without any rate has none", () => {
    const w = new ModelConfigView();
    w.set("n", { defaultProfile: "a", profiles: { a: { routingStrategy: "random" } } });
    expect((w.choose("n", {}, { promptTokens: 1 }, "least-request") as { requestsPerSecond?: number }).requestsPerSecond).toBeUndefined();
  });
});
