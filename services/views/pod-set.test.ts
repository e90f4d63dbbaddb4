import { describe, expect, it } from "vitest";
import type { PodEvent } from "../../schemas/events.js";
import { PodSet } from "./pod-set.js";

const pod = (name: string, address: string, source?: string): PodEvent => ({
  type: "pod", action: "upsert", model: "m", pod: name, address, ready: true, engine: "vllm", ts: 1, ...(source !== undefined ? { source } : {}),
});

describe("PodSet.byAddress", () => {
  it("prefers the pod a source vouches for over an unowned one on the same address, in either order", () => {
    for (const order of [["legacy", "sourced"], ["sourced", "legacy"]]) {
      const s = new PodSet();
      for (const n of order) s.apply(n === "legacy" ? pod("vllm-0", "10.0.0.1:8000") : pod("vllm-0.default", "10.0.0.1:8000", "cluster"));
      expect(s.byAddress("10.0.0.1:8000")?.pod).toBe("vllm-0.default");
    }
  });
  it("an address held only by an unowned pod still resolves", () => {
    const s = new PodSet();
    s.apply(pod("old", "10.0.0.2:8000"));
    expect(s.byAddress("10.0.0.2:8000")?.pod).toBe("old");
  });
});

describe("PodSet - scheduling policy", () => {
  it("keeps a pod's schedulingPolicy and drops it when a later event has none", () => {
    const s = new PodSet();
    s.apply({ ...pod("p-0", "10.0.0.9:8000"), schedulingPolicy: "priority-low-values-first" });
    expect(s.readyPods("m")[0]?.schedulingPolicy).toBe("priority-low-values-first");
    s.apply(pod("p-0", "10.0.0.9:8000"));
    expect(s.readyPods("m")[0]).not.toHaveProperty("schedulingPolicy");
  });
});

describe("PodSet - engine-reported adapters", () => {
  const of = (model: string, name: string, address: string, adapters?: string[]): PodEvent => ({
    type: "pod", action: "upsert", model, pod: name, address, ready: true, engine: "vllm", ts: 1, ...(adapters ? { adapters } : {}),
  });

  it("an adapter an engine names like another served model takes none of that model's traffic", () => {
    const s = new PodSet();
    s.apply(of("org/victim", "v-0", "10.0.0.1:8000"));
    s.apply(of("org/rogue", "r-0", "10.0.0.2:8000"));
    s.setEngineAdapters("org/rogue", "r-0", ["org/victim", "sql-lora"]);
    expect(s.readyPods("org/victim").map((p) => p.pod)).toEqual(["v-0"]);
    // Its real adapter is routable, and the refusal is counted.
    expect(s.readyPods("sql-lora").map((p) => p.pod)).toEqual(["r-0"]);
    expect(s.shadowingAdapters).toBe(1);
    // A base model that appears later is protected from then on, too.
    s.setEngineAdapters("org/rogue", "r-0", ["org/later"]);
    expect(s.readyPods("org/later").map((p) => p.pod)).toEqual(["r-0"]);
    s.apply(of("org/later", "l-0", "10.0.0.3:8000"));
    expect(s.readyPods("org/later").map((p) => p.pod)).toEqual(["l-0"]);
  });

  it("an adapter PODS lists for a pod counts even when it is named like another model (the operator's word)", () => {
    const s = new PodSet();
    s.apply(of("org/base", "b-0", "10.0.0.1:8000"));
    s.apply(of("org/other", "o-0", "10.0.0.2:8000", ["org/base"]));
    expect(s.readyPods("org/base").map((p) => p.pod)).toEqual(["b-0", "o-0"]);
    expect(s.shadowingAdapters).toBe(0);
  });
});

describe("PodSet - pod networks (--pod-cidrs)", () => {
  it("a pod published outside the allowed networks is held as absent and counted; moved inside, it is routable", () => {
    const s = new PodSet({ addressAllowed: (a) => a.startsWith("10.") });
    s.apply(pod("inside", "10.0.0.1:8000"));
    s.apply(pod("outside", "169.254.169.254:80"));
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["inside"]);
    expect(s.get("m", "outside")).toBeUndefined();
    expect(s.refusedAddresses).toBe(1);
    // The same pod republished with an allowed address.
    s.apply(pod("outside", "10.0.0.2:8000"));
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["inside", "outside"]);
    expect(s.refusedAddresses).toBe(0);
    // And moved outside again: gone at once.
    s.apply(pod("inside", "8.8.8.8:8000"));
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["outside"]);
    expect(s.refusedAddresses).toBe(1);
  });
});

describe("PodSet - the drain handshake", () => {
  it("a draining pod leaves the routable list at once and comes back when the mark is lifted", () => {
    const s = new PodSet();
    s.apply(pod("a", "10.0.0.1:8000"));
    s.apply(pod("b", "10.0.0.2:8000"));
    s.apply({ ...pod("b", "10.0.0.2:8000"), draining: { deadline: 99 } }, 7);
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["a"]);
    expect(s.get("m", "b")?.draining).toEqual({ deadline: 99 });
    expect(s.lastSeq).toBe(7);
    s.apply(pod("b", "10.0.0.2:8000"), 8);
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["a", "b"]);
  });
});
