import { describe, expect, it } from "vitest";
import { ModelConfigView } from "../../views/model-config.js";
import { RouteError } from "../errors.js";
import { parseInput, parseRoute, tenantCacheSalt } from "./parse.js";
import { chatBody, MODEL } from "./testing.js";

const refusal = (f: () => unknown): { status: number; code: string; param: string | null } => {
  try {
    f();
  } catch (err) {
    if (err instanceof RouteError) return { status: err.status, code: err.code, param: err.param };
    throw err;
  }
  throw new Error("expected a RouteError");
};

describe("parse stage - headers and body to a routing plan", () => {
  const config = new ModelConfigView();
  config.set(MODEL, {
    defaultProfile: "chat",
    profiles: {
      chat: { routingStrategy: "prefix-cache", strategyParams: { "prefix-cache": { imbalanceThreshold: 2 } } },
      slo: { routingStrategy: "slo-least-load", slo: { ttftMs: 500 }, requestsPerSecond: 50 },
    },
  });

  it("the default profile's strategy, with its plugin parameters, and what it needs", () => {
    const p = parseRoute({}, chatBody(), config, "least-request");
    expect(p.strategy.name).toBe("prefix-cache");
    expect(p.strategy.needs?.promptTokenIds).toBe(true);
    expect(p.strategyParams).toEqual({ "prefix-cache": { imbalanceThreshold: 2 } });
    expect(p.profile).toBe("chat");
  });

  it("a profile named by header brings its targets and rate limit", () => {
    const p = parseRoute({ "config-profile": "slo" }, chatBody(), config, "least-request");
    expect(p).toMatchObject({ profile: "slo", slo: { ttftMs: 500 }, rps: 50 });
    expect(p.strategy.name).toBe("slo-least-load");
  });

  it("the header's strategy wins over the profile's; an unknown one is a 400 naming the header", () => {
    expect(parseRoute({ "routing-strategy": "random" }, chatBody(), config, "least-request").strategy.name).toBe("random");
    expect(refusal(() => parseRoute({ "routing-strategy": "bogus" }, chatBody(), config, "least-request"))).toEqual({ status: 400, code: "invalid_routing_strategy", param: "routing-strategy" });
  });

  it.each([
    ["body is not JSON", {}, Buffer.from("{nope"), "invalid_json"],
    ["no model", {}, Buffer.from("{}"), "model_required"],
    ["user header too long", { user: "u".repeat(257) }, chatBody(), "invalid_header"],
    ["request id too long", { "x-request-id": "r".repeat(254) }, chatBody(), "invalid_header"],
  ])("%s -> 400 %s", (_name, headers, body, code) => {
    expect(refusal(() => parseRoute(headers as Record<string, string>, body, config, "least-request"))).toMatchObject({ status: 400, code });
  });

  it("plugin parameters a strategy does not take are a 400, not a crash", () => {
    const bad = new ModelConfigView();
    bad.set(MODEL, { profiles: { p: { routingStrategy: "random", strategyParams: { random: { x: 1 } } } }, defaultProfile: "p" });
    expect(refusal(() => parseRoute({}, chatBody(), bad, "least-request")).code).toBe("invalid_routing_strategy");
  });

  it("a tenant's cache salt is written into the body the engine gets, before any salt of the client's", () => {
    const TENANT = "K7c1XyZ0q9vL2mN4";
    const bare = parseRoute({}, chatBody(), config, "least-request", TENANT);
    expect(bare.parsed.cacheSalt).toBe(TENANT);
    expect(JSON.parse((bare.upstreamBody as Buffer).toString())).toEqual({ ...JSON.parse(chatBody().toString()), cache_salt: TENANT });
    // The client's own salt partitions inside the tenant's space; naming another tenant's salt stays inside it too.
    const own = parseRoute({}, chatBody(MODEL, { cache_salt: "team-1" }), config, "least-request", TENANT);
    expect(own.parsed.cacheSalt).toBe(`${TENANT}.team-1`);
    expect(JSON.parse((own.upstreamBody as Buffer).toString()).cache_salt).toBe(`${TENANT}.team-1`);
    const other = parseRoute({}, chatBody(MODEL, { cache_salt: "ZZZZotherTenant00" }), config, "least-request", TENANT);
    expect(other.parsed.cacheSalt).toBe(`${TENANT}.ZZZZotherTenant00`);
    // The client's salt is still checked as a client's.
    expect(refusal(() => parseRoute({}, chatBody(MODEL, { cache_salt: 5 }), config, "least-request", TENANT))).toMatchObject({ status: 400, param: "cache_salt" });
    // No tenant salt: the body goes upstream as the client sent it.
    const plain = parseRoute({}, chatBody(MODEL, { cache_salt: "team-1" }), config, "least-request");
    expect(plain.parsed.cacheSalt).toBe("team-1");
    expect(plain.upstreamBody).toBeUndefined();
    expect(tenantCacheSalt(TENANT, undefined)).toBe(TENANT);
  });
});


describe("parse stage - a tenant's cache salt and the API", () => {
  const messages = Buffer.from(JSON.stringify({ model: MODEL, max_tokens: 8, messages: [{ role: "user", content: "hi" }] }));
  it("/v1/messages from a key with a cache salt is refused (400 cache_isolation_unavailable), not routed without its isolation", () => {
    expect(refusal(() => parseInput({ ":path": "/v1/messages" }, messages, "tenant-a"))).toEqual({ status: 400, code: "cache_isolation_unavailable", param: null });
    // Without a salt, and on the APIs that carry one, the request goes on.
    expect(parseInput({ ":path": "/v1/messages" }, messages).salted).toBe(false);
    const salted = parseInput({ ":path": "/v1/chat/completions" }, chatBody(), "tenant-a");
    expect(salted.salted).toBe(true);
    expect(salted.parsed.body.cache_salt).toBe(tenantCacheSalt("tenant-a", undefined));
  });
});
