import { describe, expect, it } from "vitest";
import type { PodEvent } from "../../schemas/events.js";
import { GatewayState } from "../views/gateway-state.js";
import { ENGINE_ADAPTERS_TTL_MS } from "../views/pod-set.js";
import { adaptersFromModels, engineAdapters, MAX_ENGINE_ADAPTERS, maxModelLenFromModels } from "./adapters.js";

describe("engine-reported LoRA adapters", () => {
  it("reads adapters (entries with a parent) from vLLM's /v1/models", () => {
    const body = { object: "list", data: [{ id: "base", parent: null }, { id: "sql", parent: "base" }, { id: "bad name", parent: "base" }, { id: 7 }, { id: "x", parent: "" }] };
    expect(adaptersFromModels(body, "base")).toEqual(["sql"]);
    expect(adaptersFromModels({ detail: "Not Found" }, "base")).toBeUndefined();
    expect(adaptersFromModels(null, "base")).toBeUndefined();
  });
  it("unions the model list with the LoRA metric, bounded; undefined whenever /v1/models was not read (the metric only adds)", () => {
    expect(engineAdapters(undefined, [], [], "base")).toBeUndefined();
    // The metric alone would replace the pod's list with the running adapters, dropping idle loaded ones.
    expect(engineAdapters(undefined, ["busy"], ["queued"], "base")).toBeUndefined();
    expect(engineAdapters([], [], [], "base")).toEqual([]);
    expect(engineAdapters(["b"], ["a", "b"], ["c", "base"], "base")).toEqual(["a", "b", "c"]);
    expect(engineAdapters(Array.from({ length: 400 }, (_, i) => `a${i}`), [], [], "base")).toHaveLength(MAX_ENGINE_ADAPTERS);
  });
  it("the gateway fold routes an adapter to pods whose engine reports it, merged with what PODS lists", () => {
    const g = new GatewayState();
    const pod = (name: string, adapters?: string[]): PodEvent => ({ type: "pod", action: "upsert", model: "base", pod: name, address: `10.0.0.${name.length}:8000`, ready: true, engine: "vllm", ...(adapters ? { adapters } : {}), ts: 1 });
    let seq = 0;
    const meta = (stream: "pods" | "load") => ({ stream, subject: "x", seq: ++seq, serverTs: 1_000 + seq });
    g.apply(pod("p1", ["listed"]), meta("pods"));
    g.apply(pod("p22"), meta("pods"));
    const sample = (p: string, adapters?: string[]) => ({ type: "load" as const, model: "base", pod: p, ts: 5, stale: false, load: null, ...(adapters ? { adapters } : {}) });
    g.apply(sample("p22", ["sql"]), meta("load"));
    expect(g.pods.readyPods("sql").map((p) => p.pod)).toEqual(["p22"]);
    g.apply(sample("p1", ["sql"]), meta("load"));
    expect(g.pods.readyPods("sql").map((p) => p.pod)).toEqual(["p1", "p22"]);
    expect(g.pods.get("base", "p1")?.adapters).toEqual(["listed", "sql"]);
    // A PODS update keeps the engine's adapters; a sample without `adapters` changes nothing.
    g.apply(pod("p1", ["listed"]), meta("pods"));
    g.apply(sample("p1"), meta("load"));
    expect(g.pods.get("base", "p1")?.adapters).toEqual(["listed", "sql"]);
    // Unloaded on the engine: gone from routing; the listed one stays.
    g.apply(sample("p1", []), meta("load"));
    expect(g.pods.readyPods("sql").map((p) => p.pod)).toEqual(["p22"]);
    expect(g.pods.readyPods("listed").map((p) => p.pod)).toEqual(["p1"]);
    // Samples for pods PODS does not know are ignored.
    g.apply(sample("ghost", ["sql"]), meta("load"));
    expect(g.pods.get("base", "ghost")).toBeUndefined();
  });
  it("engine adapters expire once the pod's samples stop carrying them (scraper gone, --no-read-models): no adapter routed forever", () => {
    const g = new GatewayState();
    g.apply({ type: "pod", action: "upsert", model: "base", pod: "p1", address: "10.0.0.1:8000", ready: true, engine: "vllm", ts: 1 }, { stream: "pods", subject: "x", seq: 1, serverTs: 1_000 });
    g.apply({ type: "load", model: "base", pod: "p1", ts: 5, stale: false, load: null, adapters: ["sql"] }, { stream: "load", subject: "y", seq: 1, serverTs: 1_100 });
    g.sweep(2_000, { liveNow: 2_000 });
    expect(g.pods.readyPods("sql").map((p) => p.pod)).toEqual(["p1"]);
    // Still refreshed by samples: kept.
    g.sweep(9_000, { liveNow: 9_000 });
    g.apply({ type: "load", model: "base", pod: "p1", ts: 6, stale: false, load: null, adapters: ["sql"] }, { stream: "load", subject: "y", seq: 2, serverTs: 9_000 });
    g.sweep(9_000 + ENGINE_ADAPTERS_TTL_MS - 1, { liveNow: 9_000 + ENGINE_ADAPTERS_TTL_MS - 1 });
    expect(g.pods.knows("sql")).toBe(true);
    // Nothing refreshes it any more: after the TTL the adapter is gone (404), the base model stays.
    g.sweep(9_000 + ENGINE_ADAPTERS_TTL_MS + 1, { liveNow: 9_000 + ENGINE_ADAPTERS_TTL_MS + 1 });
    expect(g.pods.knows("sql")).toBe(false);
    expect(g.pods.readyPods("base").map((p) => p.pod)).toEqual(["p1"]);
  });
});

describe("engine-reported context length", () => {
  it("is the base model's max_model_len on /v1/models; absent or malformed: unknown", () => {
    const body = { data: [{ id: "sql", parent: "base", max_model_len: 99 }, { id: "base", parent: null, max_model_len: 32_768 }] };
    expect(maxModelLenFromModels(body, "base")).toBe(32_768);
    // Served under another name: the first entry without a parent.
    expect(maxModelLenFromModels(body, "other")).toBe(32_768);
    for (const n of [0, -1, 1.5, "4096", null, 2 ** 40]) expect(maxModelLenFromModels({ data: [{ id: "base", max_model_len: n }] }, "base")).toBeUndefined();
    expect(maxModelLenFromModels({ data: [{ id: "base" }] }, "base")).toBeUndefined();
    expect(maxModelLenFromModels({ detail: "x" }, "base")).toBeUndefined();
    expect(maxModelLenFromModels(null, "base")).toBeUndefined();
  });
});
