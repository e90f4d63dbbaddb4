import { describe, expect, it } from "vitest";
import { annotationPatches, planApply, removalIsExact, type WorkloadPod } from "./apply-plan.js";
import { DrainTracker } from "./drain.js";
import { CapacityLearner, planPd } from "./pd-planner.js";
import { chooseVictims } from "./victims.js";

describe("chooseVictims", () => {
  const pods = [
    { pod: "a", ready: true, inFlight: 3, uniqueBlocks: 0 },
    { pod: "b", ready: true, inFlight: 0, uniqueBlocks: 900 },
    { pod: "c", ready: true, inFlight: 0, uniqueBlocks: 10 },
    { pod: "d", ready: false, inFlight: 5, uniqueBlocks: 5000 },
    { pod: "e", ready: true, inFlight: 0, uniqueBlocks: 10 },
  ];
  it("removes not-ready pods first, then the fewest in flight, then the fewest blocks only they cache, then by name", () => {
    expect(chooseVictims(pods, 4).map((v) => v.pod)).toEqual(["d", "c", "e", "b"]);
    expect(chooseVictims(pods, 2).map((v) => v.deletionCost)).toEqual([-1_000_000, -999_999]);
    expect(chooseVictims(pods, 0)).toEqual([]);
  });
});

describe("DrainTracker", () => {
  it("removes an idle pod only once every gateway acknowledged its draining event, and a busy one at the grace deadline", () => {
    const t = new DrainTracker(30_000);
    t.mark("p1", 1000);
    t.mark("p2", 1000);
    const inFlight = new Map([
      ["p1", 0],
      ["p2", 2],
    ]);
    let ackedUpTo = 0;
    const step = (now: number) => t.step({ now, inFlight: (p) => inFlight.get(p) ?? 0, acknowledged: (seq) => seq <= ackedUpTo });
    // Not yet published on PODS: a gateway may still route to it, whatever the ledger says.
    expect(step(2000)).toEqual([]);
    t.published("p1", 41);
    t.published("p2", 42);
    expect(step(3000)).toEqual([]); // published, not acknowledged
    ackedUpTo = 42;
    expect(step(4000)).toEqual([{ pod: "p1", reason: "idle", inFlight: 0, drainedMs: 3000, deletionCost: 0 }]);
    expect(step(20_000)).toEqual([]); // p2 still has 2 in flight
    inFlight.set("p2", 1);
    expect(step(31_000)).toEqual([{ pod: "p2", reason: "grace", inFlight: 1, drainedMs: 30_000, deletionCost: 0 }]);
    expect(t.size).toBe(0);
  });

  it("gives draining pods back on a scale-up, newest mark first", () => {
    const t = new DrainTracker(30_000);
    t.mark("old", 1000);
    t.mark("new", 2000);
    expect(t.reclaim(1)).toEqual(["new"]);
    expect(t.list().map((d) => d.pod)).toEqual(["old"]);
  });
});

describe("planPd", () => {
  it("sizes prefill by uncached prompt tokens and decode by output tokens (worked by hand)", () => {
    // 10 req/s x 2,000 prompt tokens x (1 - 0.5) = 10,000 prefill tok/s / 4,000 per pod -> 3
    // 10 req/s x 200 output tokens = 2,000 decode tok/s / 500 per pod -> 4
    const p = planPd({ requestsPerS: 10, meanPromptTokens: 2000, meanOutputTokens: 200, prefixHitRate: 0.5 }, { prefillTokensPerS: 4000, decodeTokensPerS: 500 }, { maxPods: 16 });
    expect(p).toMatchObject({ prefill: 3, decode: 4, overBudget: false, prefillTokensPerS: 10_000, decodeTokensPerS: 2000 });
  });
  it("shares a too-small budget in proportion, at least one pod per role", () => {
    const p = planPd({ requestsPerS: 10, meanPromptTokens: 2000, meanOutputTokens: 200, prefixHitRate: 0.5 }, { prefillTokensPerS: 4000, decodeTokensPerS: 500 }, { maxPods: 4 });
    // 3 + 4 = 7 > 4: prefill round(4 x 3/7) = 2, decode 2
    expect(p).toMatchObject({ prefill: 2, decode: 2, overBudget: true, unbudgeted: { prefill: 3, decode: 4 } });
    const tiny = planPd({ requestsPerS: 10, meanPromptTokens: 100_000, meanOutputTokens: 1, prefixHitRate: 0 }, { prefillTokensPerS: 4000, decodeTokensPerS: 500 }, { maxPods: 2 });
    expect(tiny).toMatchObject({ prefill: 1, decode: 1 });
  });
  it("asks for zero pods with no demand", () => {
    expect(planPd({ requestsPerS: 0, meanPromptTokens: 0, meanOutputTokens: 0, prefixHitRate: 0 }, { prefillTokensPerS: 1, decodeTokensPerS: 1 }, { maxPods: 4 })).toMatchObject({ prefill: 0, decode: 0 });
  });
});

describe("CapacityLearner", () => {
  it("rises on intervals within target, falls to a throughput that missed it, and ignores empty intervals", () => {
    const c = new CapacityLearner(1000, 500);
    c.observe(600, 200); // within target but below the prior: proves nothing new
    expect([c.value, c.fromHistory]).toEqual([1000, false]);
    c.observe(1500, 450);
    expect(c.value).toBe(1500);
    c.observe(1200, 900); // missed the target at 1,200: the pods cannot do 1,500
    expect(c.value).toBe(1200);
    c.observe(0, 10_000);
    c.observe(800, undefined);
    expect(c.value).toBe(1200);
  });
});

describe("GatewayAcks", () => {
  it("a draining event is acknowledged once every live gateway's beat has folded past it; a gateway without podsSeq never acknowledges", async () => {
    const { GatewayAcks } = await import("./acks.js");
    const a = new GatewayAcks();
    a.observe({ gateway: "g1", state: "up", podsSeq: 10 });
    a.observe({ gateway: "g2", state: "up", podsSeq: 12 });
    expect(a.acknowledged(11, ["g1", "g2"])).toBe(false);
    expect(a.waitingFor(11, ["g1", "g2"])).toEqual(["g1"]);
    a.observe({ gateway: "g1", state: "up", podsSeq: 11 });
    a.observe({ gateway: "g1", state: "up", podsSeq: 9 }); // a late part of an older beat
    expect(a.acknowledged(11, ["g1", "g2"])).toBe(true);
    a.observe({ gateway: "old", state: "up" });
    expect(a.acknowledged(1, ["g1", "old"])).toBe(false);
    // A gateway that is not live (gone, its charges dropped by the ledger) is not waited for.
    expect(a.acknowledged(11, ["g1", "g2"])).toBe(true);
  });
});

describe("planApply", () => {
  const pods = ["p0", "p1", "p2", "p3"].map((pod, i) => ({ pod, ready: true, inFlight: 3 - i, uniqueBlocks: 0 }));
  it("scales down by marking the cheapest pods (spec unchanged), then lowers spec by the pods drained", () => {
    const t = new DrainTracker(30_000);
    const marks = planApply({ now: 0, desired: 2, spec: 4, pods, drain: true, removed: [] }, t);
    // p3 and p2 hold the fewest requests (0 and 1)
    expect(marks.map((s) => (s.kind === "mark" ? s.victim.pod : s.kind))).toEqual(["p3", "p2"]);
    // Next round: the same desired count marks nothing more.
    expect(planApply({ now: 1000, desired: 2, spec: 4, pods, drain: true, removed: [] }, t)).toEqual([]);
    t.published("p3", 5);
    const removed = t.step({ now: 2000, inFlight: () => 0, acknowledged: () => true });
    expect(removed.map((r) => r.pod)).toEqual(["p3"]); // p2's event is not on PODS yet
    expect(planApply({ now: 2000, desired: 2, spec: 4, pods, drain: true, removed }, t)).toEqual([{ kind: "scale", replicas: 3, removed }]);
  });
  it("a scale-up takes draining pods back before adding any", () => {
    const t = new DrainTracker(30_000);
    planApply({ now: 0, desired: 2, spec: 4, pods, drain: true, removed: [] }, t);
    // Both marked at once: the later name goes back first (a fixed order every replica agrees on).
    expect(planApply({ now: 1, desired: 3, spec: 4, pods, drain: true, removed: [] }, t)).toEqual([{ kind: "unmark", pod: "p3" }]);
    expect(planApply({ now: 2, desired: 6, spec: 4, pods, drain: true, removed: [] }, t)).toEqual([
      { kind: "unmark", pod: "p2" },
      { kind: "scale", replicas: 6, removed: [] },
    ]);
    expect(t.size).toBe(0);
  });
  it("without the handshake, spec is the desired count and Kubernetes picks the pods", () => {
    const t = new DrainTracker(30_000);
    expect(planApply({ now: 0, desired: 1, spec: 4, pods, drain: false, removed: [] }, t)).toEqual([{ kind: "scale", replicas: 1, removed: [] }]);
    expect(planApply({ now: 0, desired: 4, spec: 4, pods, drain: false, removed: [] }, t)).toEqual([]);
  });
});

describe("annotationPatches", () => {
  it("puts the tracker's marks on the pods, takes stale marks off, and changes nothing that already holds", () => {
    const t = new DrainTracker(30_000);
    t.mark("a.ns", 1000, -1_000_000);
    const pods: WorkloadPod[] = [
      { pod: "a.ns", annotations: {} },
      { pod: "b.ns", annotations: { "jetroute.io/drain-deadline": "5", "controller.kubernetes.io/pod-deletion-cost": "-7" } },
      { pod: "c.ns", annotations: { other: "x" } },
    ];
    expect(annotationPatches(t.list(), pods)).toEqual([
      { pod: "a.ns", annotations: { "controller.kubernetes.io/pod-deletion-cost": "-1000000", "jetroute.io/drain-deadline": "31000" } },
      { pod: "b.ns", annotations: { "controller.kubernetes.io/pod-deletion-cost": null, "jetroute.io/drain-deadline": null } },
    ]);
    // A pod being removed this round keeps its marks (the scale-down needs its deletion cost).
    expect(annotationPatches(t.list(), pods, new Set(["b.ns"])).map((p) => p.pod)).toEqual(["a.ns"]);
    const done = [{ pod: "a.ns", annotations: { "controller.kubernetes.io/pod-deletion-cost": "-1000000", "jetroute.io/drain-deadline": "31000" } }];
    expect(annotationPatches(t.list(), done)).toEqual([]);
    const removed = [{ pod: "a.ns", reason: "idle" as const, inFlight: 0, drainedMs: 1, deletionCost: -1_000_000 }];
    const pod = (name: string, cost: number | undefined, ready = true) => ({ pod: name, ready, annotations: (cost === undefined ? {} : { "controller.kubernetes.io/pod-deletion-cost": String(cost) }) as Record<string, string> });
    // Exactly the removed pod goes: it costs least and every other pod is Ready.
    expect(removalIsExact(removed, [pod("a.ns", -2_000_000), pod("b.ns", -1_000_000), pod("c.ns", undefined)])).toBe(true);
    // Another draining pod costs less: the ReplicaSet would remove that one instead (the bug this guards).
    expect(removalIsExact(removed, [pod("a.ns", -999_999), pod("b.ns", -1_000_000)])).toBe(false);
    // A pod still starting (not Ready) ranks first, whatever the costs.
    expect(removalIsExact(removed, [pod("a.ns", -2_000_000), pod("b.ns", undefined, false)])).toBe(false);
  });
});
