import { describe, expect, it } from "vitest";
import type { PodEvent } from "../../schemas/events.js";
import { GatewayState } from "./gateway-state.js";
import { MAX_POD_SOURCES, PodSet } from "./pod-set.js";

const pod = (name: string, source?: string, o: Partial<PodEvent> = {}): PodEvent => ({
  type: "pod", action: "upsert", model: "m", pod: name, address: `10.0.0.1:${8000 + name.length}`, ready: true, engine: "vllm", ...(source ? { source } : {}), ts: 1, ...o,
});

describe("pod set - source liveness", () => {
  it("pods of a silent source leave the routable list after the timeout and return when it speaks", () => {
    const s = new PodSet();
    s.apply(pod("a1", "a"), 1, 1_000);
    s.apply(pod("b1", "b"), 2, 1_000);
    s.apply(pod("legacy"), 3, 1_000);
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["a1", "b1", "legacy"]);
    s.applySource({ type: "pod-source", source: "a", watcher: "w1", pods: 1, intervalMs: 1_000, ts: 5_000 }, 5_000);
    expect(s.sweepSources(5_500, 4_000)).toBe(true); // b silent for 4.5 s
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["a1", "legacy"]);
    expect(s.knows("m")).toBe(true);
    expect(s.get("m", "b1")?.ready).toBe(true); // as published; only routing drops it
    expect(s.sourceInfo().find((x) => x.source === "b")?.silent).toBe(true);
    expect(s.sweepSources(5_600, 4_000)).toBe(false);
    // Any event of the source (here a pod event) vouches again, at once.
    s.apply(pod("b2", "b"), 4, 5_700);
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["a1", "b1", "b2", "legacy"]);
    // Legacy pods (no source) never time out; timeout 0 = off.
    expect(s.sweepSources(1e12, 0)).toBe(false);
    s.sweepSources(1e12, 4_000);
    expect(s.readyPods("m").map((p) => p.pod)).toEqual(["legacy"]);
  });

  it("remembers a bounded number of sources, forgetting those without pods first", () => {
    const s = new PodSet();
    s.apply(pod("kept", "s-with-pod"), 1, 1);
    for (let i = 0; i < MAX_POD_SOURCES + 50; i++) s.applySource({ type: "pod-source", source: `s${i}`, watcher: "w", pods: 0, intervalMs: 1, ts: i }, 10 + i);
    const info = s.sourceInfo();
    expect(info.length).toBe(MAX_POD_SOURCES);
    expect(info.some((x) => x.source === "s-with-pod")).toBe(true);
  });

  it("gateway state: sweeps judge sources on the live clock, heartbeats renew them, snapshots agree", () => {
    const mk = () => new GatewayState({ podSourceTimeoutMs: 3_000 });
    const a = mk();
    const b = mk();
    const feed = (g: GatewayState) => {
      g.apply(pod("p", "src"), { stream: "pods", subject: "jr.pods.m.p", seq: 1, serverTs: 1_000 });
      g.apply({ type: "pod-source", source: "src", watcher: "w", pods: 1, intervalMs: 1_000, ts: 2_000 }, { stream: "pods", subject: "jr.podsrc.src", seq: 2, serverTs: 2_000 });
    };
    feed(a);
    feed(b);
    a.sweep(4_900, { liveNow: 4_900 });
    expect(a.pods.readyPods("m")).toHaveLength(1);
    a.sweep(5_001, { liveNow: 5_001 });
    expect(a.pods.readyPods("m")).toHaveLength(0);
    b.sweep(5_001, { liveNow: 5_001 });
    expect(a.snapshot(5_001)).toEqual(b.snapshot(5_001));
    expect(a.cursors.pods).toBe(2);
    const c = a.cloneAs("x");
    expect(c.pods.readyPods("m")).toHaveLength(0);
    expect(c.podSourceTimeoutMs).toBe(3_000);
  });
});
