import { describe, expect, it } from "vitest";
import { classify, flowSettingsOf } from "../routing/flow/settings.js";
import { GatewayState } from "./gateway-state.js";
import { fnv1a32, pickTarget, PoolPolicies } from "./pool-policies.js";

const policy = (pool: string, models: string[], objectives: Record<string, number>, rewrites: Array<{ from: string; models?: string[]; targets: Array<{ model: string; weight: number }> }> = []) => ({
  pool, apiVersion: "llm-d.ai/v1alpha2", models, objectives: Object.fromEntries(Object.entries(objectives).map(([k, v]) => [k, { priority: v }])), rewrites,
});

describe("InferencePool policies in the gateway (pure)", () => {
  it("weighted picks are deterministic per request id and follow the weights", () => {
    const targets = [{ model: "a", weight: 9 }, { model: "b", weight: 1 }];
    expect(pickTarget(targets, "id-1")).toBe(pickTarget(targets, "id-1"));
    let a = 0;
    for (let i = 0; i < 10_000; i++) if (pickTarget(targets, `r${i}`) === "a") a++;
    expect(a).toBeGreaterThan(8_700);
    expect(a).toBeLessThan(9_300);
    expect(fnv1a32("")).toBe(0x811c9dc5);
  });

  it("exact rules before generic ones; generic rules apply to the pool's own models", () => {
    const p = new PoolPolicies();
    expect(p.hasRewrites).toBe(false);
    p.set("inferencepool.ns.p", policy("ns/p", ["m", "m-v2"], {}, [{ from: "x#0", models: ["alias"], targets: [{ model: "m", weight: 1 }] }, { from: "y#0", targets: [{ model: "m-v2", weight: 1 }] }]));
    expect(p.rewrite("alias", "r")).toEqual({ model: "m", rule: "x#0", pool: "ns/p" });
    expect(p.rewrite("m", "r")).toEqual({ model: "m-v2", rule: "y#0", pool: "ns/p" });
    expect(p.rewrite("other", "r")).toBeUndefined();
    p.set("inferencepool.ns.p", undefined);
    expect(p.hasRewrites).toBe(false);
  });

  it("rewrites are scoped to their pool: a rule naming another tenant's model does not capture its requests, nor send the pool's own elsewhere", () => {
    const p = new PoolPolicies();
    p.set("inferencepool.team-a.p", policy("team-a/p", ["team-a/model"], {}, [
      { from: "hijack#0", models: ["team-b/private-model"], targets: [{ model: "team-a/model", weight: 1 }] },
      { from: "leak#0", models: ["team-a/model"], targets: [{ model: "team-b/private-model", weight: 1 }] },
    ]));
    p.set("inferencepool.team-b.p", policy("team-b/p", ["team-b/private-model"], {}));
    // Team B's model is another pool's: pool A's rule does not apply to it.
    expect(p.rewrite("team-b/private-model", "r1")).toBeUndefined();
    // Pool A's own model may not be sent to team B's.
    expect(p.rewrite("team-a/model", "r1")).toBeUndefined();
    expect(p.outOfScope).toBe(2);
    // A model served outside any pool (unpooled pods) is not an alias either.
    const unpooled = new PoolPolicies();
    unpooled.set("inferencepool.team-a.p", policy("team-a/p", ["team-a/model"], {}, [{ from: "hijack#0", models: ["solo"], targets: [{ model: "team-a/model", weight: 1 }] }]));
    const fleet = (served: Record<string, string>) => ({ knows: (m: string) => m in served, readyPods: (m: string) => (m in served ? [{ model: served[m] as string }] : []) });
    expect(unpooled.rewrite("solo", "r1", fleet({ solo: "solo" }))).toBeUndefined();
    // An alias nobody serves, and an adapter the pool's own pods serve, are the pool's.
    expect(unpooled.rewrite("solo", "r1", fleet({}))).toEqual({ model: "team-a/model", rule: "hijack#0", pool: "team-a/p" });
    const adapters = new PoolPolicies();
    adapters.set("inferencepool.team-a.p", policy("team-a/p", ["base"], {}, [{ from: "split#0", models: ["base"], targets: [{ model: "base-lora", weight: 1 }] }]));
    expect(adapters.rewrite("base", "r1", fleet({ base: "base", "base-lora": "base" }))).toEqual({ model: "base-lora", rule: "split#0", pool: "team-a/p" });
    expect(adapters.rewrite("base", "r1", fleet({ base: "base", "base-lora": "other-base" }))).toBeUndefined();
  });

  it("objectives feed flow control's bands through the model config (the model's own win), and the pickers' objective header is honoured", () => {
    const s = new GatewayState();
    const apply = (key: string, value: unknown, seq: number) => s.apply({ type: "config-entry", key, operation: "PUT", value }, { stream: "config", subject: key, seq, serverTs: 0 });
    apply("model.m", { flowControl: { objectives: { batch: { priority: 1 } } } }, 1);
    expect(apply("inferencepool.ns.p", policy("ns/p", ["m"], { interactive: 10, batch: -3 }), 2).applied).toBe(true);
    expect(apply("inferencepool.ns.bad", { pool: "x" }, 3).applied).toBe(false);
    const fc = s.configs.get("m")?.flowControl;
    expect(fc?.objectives).toEqual({ interactive: { priority: 10 }, batch: { priority: 1 } });
    // The same object until something changes (flow control caches its settings per config object).
    expect(s.configs.get("m")?.flowControl).toBe(fc);
    const settings = flowSettingsOf(fc);
    if (!settings) throw new Error("flow control off");
    expect(classify(settings, { "x-gateway-inference-objective": "interactive" }, undefined, "u", 0).band).toBe(10);
    expect(classify(settings, { "x-llm-d-inference-objective": "interactive", "x-jetroute-objective": "batch" }, undefined, "u", 0).band).toBe(1);
    // An objective named by the pickers' header that the model does not define: the default applies (no 400).
    expect(classify(settings, { "x-gateway-inference-objective": "unknown" }, undefined, "u", 0).band).toBe(0);
    expect(classify(settings, { "x-gateway-inference-fairness-id": "f" }, undefined, "u", 0).flow).toBe("u\u0000f");
    // A clone (replay) keeps the policies.
    expect(s.cloneAs("g").configs.get("m")?.flowControl?.objectives?.interactive).toEqual({ priority: 10 });
  });
});
