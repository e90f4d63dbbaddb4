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
