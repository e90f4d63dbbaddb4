/** PodSet's managed LoRA adapters (ADAPTERS stream): routable only where the controller's load succeeded. */
import { describe, expect, it } from "vitest";
import type { AdapterPlacement } from "../../schemas/adapters.js";
import type { PodEvent } from "../../schemas/events.js";
import { MAX_ADAPTERS } from "../../schemas/adapters.js";
import { MANAGED_ADAPTER_GRACE_MS, PodSet } from "./pod-set.js";

const pod = (name: string, model = "llama", adapters?: string[]): PodEvent => ({
  type: "pod", action: "upsert", model, pod: name, address: `10.0.0.${name.slice(-1)}:8000`, ready: true, engine: "vllm", ts: 1, ...(adapters ? { adapters } : {}),
});
const placement = (adapter: string, pods: Array<[string, "loading" | "loaded" | "unloading"]>, o: Partial<AdapterPlacement> = {}): AdapterPlacement => ({
  type: "adapter", adapter, baseModel: "llama", controller: "c", ts: 1, phase: pods.some(([, s]) => s === "loaded") ? "Running" : "Pending",
  pods: pods.map(([pod, state]) => ({ pod, state })), desired: 1, candidates: 2, demand: { rps: 0, queued: 0 }, moves: [], reason: "test", ...o,
});
const names = (s: PodSet, m: string) => s.readyPods(m).map((p) => p.pod);

describe("PodSet - managed adapters", () => {
  it("a managed adapter is known with no replica (requests wait, not 404) and names its base", () => {
    const s = new PodSet();
    s.apply(pod("p0"));
    s.applyPlacement(placement("sql", []), 1000);
    expect(s.knows("sql")).toBe(true);
    expect(names(s, "sql")).toEqual([]);
    expect(s.baseOf("sql")).toBe("llama");
    expect(s.baseOf("llama")).toBeUndefined();
  });

  it("routable only once loaded: loading and unloading pods get nothing, whatever the engine lists", () => {
    const s = new PodSet();
    s.apply(pod("p0"));
    s.apply(pod("p1"));
    s.apply(pod("p2"));
    s.setEngineAdapters("llama", "p0", ["sql"]);
    s.setEngineAdapters("llama", "p1", ["sql"]);
    s.applyPlacement(placement("sql", [["p0", "loading"], ["p1", "unloading"], ["p2", "loaded"]]), 1000);
    expect(names(s, "sql")).toEqual(["p2"]);
    s.applyPlacement(placement("sql", [["p0", "loaded"], ["p2", "loaded"]]), 1100);
    expect(names(s, "sql")).toEqual(["p0", "p2"]);
  });

  it("a pod whose engine stops listing the adapter after the grace leaves its list (restarted empty)", () => {
    const s = new PodSet();
    s.apply(pod("p0"), 0, 1000);
    s.applyPlacement(placement("sql", [["p0", "loaded"]]), 1000);
    // A sample read before the load finished arrives just after: within the grace, it hides nothing.
    s.setEngineAdapters("llama", "p0", []);
    expect(names(s, "sql")).toEqual(["p0"]);
    s.sweepSources(1000 + MANAGED_ADAPTER_GRACE_MS + 1, 0);
    s.setEngineAdapters("llama", "p0", []);
    expect(names(s, "sql")).toEqual([]);
    // The controller loads it again: a new record makes it routable again.
    s.applyPlacement(placement("sql", []), 5000);
    s.setEngineAdapters("llama", "p0", ["sql"]);
    s.applyPlacement(placement("sql", [["p0", "loaded"]]), 5100);
    expect(names(s, "sql")).toEqual(["p0"]);
  });

  it("only pods of the base model; removed pods drop out; a deleted adapter is forgotten", () => {
    const s = new PodSet();
    s.apply(pod("p0"));
    s.apply(pod("p1", "qwen"));
    s.applyPlacement(placement("sql", [["p0", "loaded"], ["p1", "loaded"]]), 1000);
    expect(names(s, "sql")).toEqual(["p0"]);
    s.apply({ ...pod("p0"), action: "remove" });
    expect(names(s, "sql")).toEqual([]);
    s.applyPlacement(placement("sql", [], { deleted: true, phase: "Deleted" }), 2000);
    expect(s.knows("sql")).toBe(false);
  });

  it("unmanaged adapters keep routing by engine lists and PODS", () => {
    const s = new PodSet();
    s.apply(pod("p0", "llama", ["listed"]));
    s.setEngineAdapters("llama", "p0", ["engine-only"]);
    s.applyPlacement(placement("sql", []), 1000);
    expect(names(s, "listed")).toEqual(["p0"]);
    expect(names(s, "engine-only")).toEqual(["p0"]);
  });

  it("an update of a managed adapter changes its list alone, as a full rebuild would", () => {
    const s = new PodSet();
    for (let i = 0; i < 4; i++) s.apply(pod(`p${i}`));
    s.applyPlacement(placement("sql", [["p0", "loaded"]]), 1000);
    s.applyPlacement(placement("other", [["p1", "loaded"]]), 1000);
    s.applyPlacement(placement("sql", [["p2", "loaded"], ["p3", "loaded"], ["p0", "unloading"]]), 1100);
    expect(names(s, "sql")).toEqual(["p2", "p3"]);
    expect(names(s, "other")).toEqual(["p1"]);
    s.sweepSources(1200, 0);
    s.apply(pod("p2"));
    expect(names(s, "sql")).toEqual(["p2", "p3"]);
  });

  it("bounded: MAX_ADAPTERS managed at most; catching up 10,000 records is linear", () => {
    const s = new PodSet();
    for (let i = 0; i < 8; i++) s.apply(pod(`p${i}`));
    for (let i = 0; i < MAX_ADAPTERS; i++) s.applyPlacement(placement(`adapter-${i}`, [["p0", "loading"]]), 1000);
    // Each one's update (the load done) touches its own list only.
    for (let i = 0; i < MAX_ADAPTERS; i++) s.applyPlacement(placement(`adapter-${i}`, [["p0", "loaded"]]), 1001);
    s.applyPlacement(placement("one-too-many", [["p0", "loaded"]]), 1002);
    expect(s.managedAdapters).toBe(MAX_ADAPTERS);
    expect(s.managedRefused).toBe(1);
    expect(s.knows("one-too-many")).toBe(false);
    expect(names(s, `adapter-${MAX_ADAPTERS - 1}`)).toEqual(["p0"]);
  }, 60_000);

  it("a managed adapter named like a base model some pod serves is refused: the model keeps its pods (both paths)", () => {
    const s = new PodSet();
    s.apply(pod("q1", "qwen"));
    s.apply(pod("q2", "qwen"));
    s.apply(pod("l3", "llama"));
    // Incremental path: the placement record alone.
    s.applyPlacement(placement("qwen", [["l3", "loaded"]]), 1000);
    expect(names(s, "qwen")).toEqual(["q1", "q2"]);
    expect(s.shadowingManaged).toBe(1);
    expect(s.shadowingAdapters).toBe(1);
    // Full rebuild (any pod event), and a newer record: still the model's own pods.
    s.apply(pod("l3", "llama"));
    s.applyPlacement(placement("qwen", [["l3", "loaded"]]), 1100);
    expect(names(s, "qwen")).toEqual(["q1", "q2"]);
    // Placed before any pod served that name: routable as an adapter until a pod of that model appears.
    const t = new PodSet();
    t.apply(pod("l3", "llama"));
    t.applyPlacement(placement("qwen", [["l3", "loaded"]]), 1000);
    expect(names(t, "qwen")).toEqual(["l3"]);
    t.apply(pod("q1", "qwen"));
    expect(names(t, "qwen")).toEqual(["q1"]);
    expect(t.shadowingManaged).toBe(1);
  });
});
