import { describe, expect, it } from "vitest";
import { checkPoolModels, parseInferencePool, poolEndpoints, servedModelsOf } from "./inference-pool.js";
import { poolPolicyOf, referencesPool } from "./pool-policy.js";


const pool = (spec: Record<string, unknown>) => ({ apiVersion: "inference.networking.k8s.io/v1", metadata: { name: "p", namespace: "ns" }, spec });
const pod = (name: string, labels: Record<string, string>, ip?: string, ready = true) => ({
  metadata: { name, namespace: "ns", labels },
  status: { ...(ip ? { podIP: ip } : {}), conditions: [{ type: "Ready", status: ready ? "True" : "False" }] },
});

describe("InferencePool v1 -> endpoints (pure)", () => {
  it("validates the pool as the v1 CRD does, naming the problem", () => {
    const ok = parseInferencePool(pool({ selector: { matchLabels: { app: "a" } }, targetPorts: [{ number: 8000 }], endpointPickerRef: { name: "picker", port: { number: 9002 } } }));
    expect(ok).toEqual({ ok: true, spec: { selector: { app: "a" }, ports: [8000], appProtocol: "http", picker: { name: "picker", port: 9002, failureMode: "FailClose" } } });
    const problem = (spec: Record<string, unknown>) => {
      const r = parseInferencePool(pool(spec));
      return r.ok ? "ok" : r.problem;
    };
    expect(problem({ selector: { matchLabels: { a: "b" } }, targetPorts: Array.from({ length: 9 }, (_, i) => ({ number: 8000 + i })) })).toBe("too-many-ports");
    expect(problem({ selector: { matchLabels: { a: "b" } }, targetPorts: [{ number: 1 }, { number: 1 }] })).toBe("duplicate-ports");
    expect(problem({ selector: { matchLabels: {} }, targetPorts: [{ number: 1 }] })).toBe("empty-selector");
    expect(problem({ targetPorts: [{ number: 1 }] })).toBe("empty-selector");
    expect(problem({ selector: { matchLabels: { a: "b" } }, targetPorts: [] })).toBe("invalid");
    expect(problem({ selector: { matchLabels: { a: "b" } }, targetPorts: [{ number: 70000 }] })).toBe("invalid");
    expect(problem({ selector: { matchLabels: { a: "b" } }, targetPorts: [{ number: 1 }], appProtocol: "grpc" })).toBe("invalid");
    expect(problem({ selector: { matchLabels: { a: "b" } }, targetPorts: [{ number: 1 }], endpointPickerRef: { name: "x", failureMode: "Maybe" } })).toBe("invalid");
    expect(problem({ selector: { matchLabels: { a: "b" }, matchExpressions: [] }, targetPorts: [{ number: 1 }] })).toBe("invalid");
  });

  it("one endpoint per podIP:targetPort (ranks for several ports), selected pods only, models from the label or the engine, mixed models reported", () => {
    const spec = { selector: { app: "a" }, ports: [8000, 8001], appProtocol: "http" as const };
    const discovered = new Map([["10.0.0.2:8000", { model: "m2", adapters: ["lora"] }]]);
    const e = poolEndpoints({
      namespace: "ns", spec, modelLabel: "model", allowedModels: new Set(["m1", "m2", "lora"]), discovered,
      pods: [pod("a-0", { app: "a", model: "m1" }, "10.0.0.1"), pod("a-1", { app: "a" }, "10.0.0.2", false), pod("b-0", { app: "b", model: "m1" }, "10.0.0.3"), pod("a-2", { app: "a", model: "m1" })],
    });
    expect([...e.desired.values()].map((s) => `${s.model} ${s.pod} ${s.address} ${s.ready}${s.adapters ? ` ${s.adapters}` : ""}`).sort()).toEqual([
      "m1 a-0-rank-0.ns 10.0.0.1:8000 true", "m1 a-0-rank-1.ns 10.0.0.1:8001 true", "m2 a-1-rank-0.ns 10.0.0.2:8000 false lora",
    ]);
    expect(e.undiscovered).toEqual(["10.0.0.2:8001"]);
    expect(e.asked).toEqual(["10.0.0.2:8000", "10.0.0.2:8001"]);
    expect(e.noIp).toBe(1);
    const mixed = poolEndpoints({ namespace: "ns", spec: { ...spec, ports: [8000] }, allowedModels: new Set(["x", "y"]), discovered: new Map([["10.0.0.1:8000", { model: "x", adapters: [] }], ["10.0.0.2:8000", { model: "y", adapters: [] }]]), pods: [pod("a-0", { app: "a" }, "10.0.0.1"), pod("a-1", { app: "a" }, "10.0.0.2")] });
    expect(mixed.mixedModels).toEqual(["x", "y"]);
    expect([...mixed.desired.values()].map((s) => s.pod).sort()).toEqual(["a-0.ns", "a-1.ns"]);
  });

  it("an engine naming a model the pool does not serve is not published; adapters outside the list are dropped; without a list engines are not asked", () => {
    const spec = { selector: { app: "a" }, ports: [8000], appProtocol: "http" as const };
    const discovered = new Map([
      ["10.0.0.1:8000", { model: "team-a/model", adapters: ["team-a/lora", "team-b/private-model"] }],
      ["10.0.0.2:8000", { model: "team-b/private-model", adapters: [] }],
    ]);
    const pods = [pod("a-0", { app: "a" }, "10.0.0.1"), pod("a-1", { app: "a" }, "10.0.0.2")];
    const e = poolEndpoints({ namespace: "ns", spec, allowedModels: new Set(["team-a/model", "team-a/lora"]), discovered, pods });
    expect([...e.desired.values()].map((s) => `${s.model} ${s.pod} ${s.adapters ?? ""}`)).toEqual(["team-a/model a-0.ns team-a/lora"]);
    expect(e.invalid).toEqual([{ id: "ns/a-1", reason: expect.stringMatching(/engine at 10\.0\.0\.2:8000 serves "team-b\/private-model", which is not one of the pool's models/) }]);
    expect(e).toMatchObject({ refusedModels: 1, droppedAdapters: 1 });
    // A label is held to the list too.
    const labelled = poolEndpoints({ namespace: "ns", spec, modelLabel: "model", allowedModels: new Set(["team-a/model"]), discovered: new Map(), pods: [pod("a-2", { app: "a", model: "team-b-model" }, "10.0.0.3")] });
    expect(labelled.desired.size).toBe(0);
    expect(labelled.refusedModels).toBe(1);
    // No list: unlabelled pods are skipped and their engines never asked.
    const unlisted = poolEndpoints({ namespace: "ns", spec, modelLabel: "model", discovered, pods });
    expect(unlisted.desired.size).toBe(0);
    expect(unlisted.asked).toEqual([]);
    expect(unlisted.invalid.map((x) => x.reason)).toEqual([expect.stringMatching(/not asked without --inference-pool-models/), expect.stringMatching(/not asked/)]);
  });

  it("the watcher needs --inference-pool-models or --model-label", () => {
    expect(() => checkPoolModels(undefined, undefined)).toThrow(/needs --inference-pool-models .* or --model-label/);
    expect(() => checkPoolModels([" ", ""], undefined)).toThrow(RangeError);
    expect(checkPoolModels(undefined, "model")).toBeUndefined();
    expect([...(checkPoolModels(["a/b", " c "], undefined) ?? [])]).toEqual(["a/b", "c"]);
    expect(() => checkPoolModels(["has space"], undefined)).toThrow(/not a model name/);
  });

  it("carries the autoscaler's drain mark into the pod's state, and refuses a malformed one", () => {
    const spec = { selector: { app: "a" }, ports: [8000], appProtocol: "http" as const };
    const marked = { ...pod("a-0", { app: "a", m: "x" }, "10.0.0.1"), metadata: { name: "a-0", namespace: "ns", labels: { app: "a", m: "x" }, annotations: { "jetroute.io/drain-deadline": "1767225600000" } } };
    const bad = { ...pod("a-1", { app: "a", m: "x" }, "10.0.0.2"), metadata: { name: "a-1", namespace: "ns", labels: { app: "a", m: "x" }, annotations: { "jetroute.io/drain-deadline": "later" } } };
    const e = poolEndpoints({ namespace: "ns", spec, modelLabel: "m", discovered: new Map(), pods: [marked, bad] });
    expect([...e.desired.values()].map((s) => [s.pod, s.draining])).toEqual([["a-0.ns", { deadline: 1767225600000 }]]);
    expect(e.invalid.map((x) => x.id)).toEqual(["ns/a-1"]);
  });

  it("reads an engine's /v1/models: the base model and its adapters", () => {
    expect(servedModelsOf({ data: [{ id: "base" }, { id: "lora-b", parent: "base" }, { id: "lora-a", parent: "base" }] })).toEqual({ model: "base", adapters: ["lora-a", "lora-b"] });
    expect(servedModelsOf({ data: [] })).toBeUndefined();
    expect(servedModelsOf("nope")).toBeUndefined();
  });
});

describe("InferenceObjective / InferenceModelRewrite -> policy record (pure)", () => {
  const at = (t: string) => ({ creationTimestamp: t });
  it("objectives of this pool only, clamped; rewrites in the API's precedence (exact before generic, oldest first, list order); bad rules reported", () => {
    const p = poolPolicyOf({
      namespace: "ns", pool: "p", apiVersion: "llm-d.ai/v1alpha2", models: ["m", "m"],
      objectives: [
        { metadata: { name: "hi" }, spec: { priority: 100, poolRef: { name: "p" } } },
        { metadata: { name: "zero" }, spec: { poolRef: { name: "p", group: "inference.networking.k8s.io", kind: "InferencePool" } } },
        { metadata: { name: "other" }, spec: { priority: 1, poolRef: { name: "q" } } },
        { metadata: { name: "bad" }, spec: { priority: 1.5, poolRef: { name: "p" } } },
      ],
      rewrites: [
        { metadata: { name: "new", ...at("2026-01-02T00:00:00Z") }, spec: { poolRef: { name: "p" }, rules: [{ targets: [{ modelRewrite: "g" }] }, { matches: [{ model: { value: "a" } }], targets: [{ modelRewrite: "b", weight: 2 }, { modelRewrite: "c", weight: 1 }] }] } },
        { metadata: { name: "old", ...at("2026-01-01T00:00:00Z") }, spec: { poolRef: { name: "p" }, rules: [{ matches: [{ model: { type: "Exact", value: "a" } }], targets: [{ modelRewrite: "d" }] }, { matches: [], targets: [{ modelRewrite: "e", weight: 1 }, { modelRewrite: "f" }] }] } },
      ],
    });
    expect(p.policy.objectives).toEqual({ hi: { priority: 16 }, zero: { priority: 0 } });
    expect(p.clamped).toBe(1);
    expect(p.policy.models).toEqual(["m"]);
    expect(p.policy.rewrites.map((r) => r.from)).toEqual(["old#0", "new#1", "new#0"]);
    expect(p.policy.rewrites[1]).toEqual({ from: "new#1", models: ["a"], targets: [{ model: "b", weight: 2 }, { model: "c", weight: 1 }] });
    expect(p.problems.map((x) => x.reason)).toEqual(["spec.priority must be an integer", "weight must be set on every target or on none"]);
    expect(referencesPool({ spec: { poolRefs: [{ name: "p" }] } }, "p")).toBe(true);
    expect(referencesPool({ spec: { poolRef: { name: "p", group: "other.io" } } }, "p")).toBe(false);
  });
});
