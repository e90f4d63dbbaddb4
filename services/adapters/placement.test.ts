import { describe, expect, it } from "vitest";
import type { AdapterSpec } from "../../schemas/adapters.js";
import { desiredReplicas, type PlacementAdapter, type PlacementPod, place, type SlotState } from "./placement.js";

const BASE = "llama";
const pod = (name: string, adapters: Record<string, SlotState> = {}, o: Partial<PlacementPod> = {}): PlacementPod => ({
  pod: name, model: BASE, labels: { app: "llama" }, ready: true, maxLoras: 2, load: 0, adapters: new Map(Object.entries(adapters)), busy: false, ...o,
});
const adapter = (name: string, spec: Partial<AdapterSpec> = {}, demand = { rps: 0, queued: 0 }, o: Partial<PlacementAdapter> = {}): PlacementAdapter => ({
  name, spec: { baseModel: BASE, artifactURL: `hf://org/${name}`, ...spec }, demand, ...o,
});
const moves = (pods: PlacementPod[], adapters: PlacementAdapter[]) => place({ pods, adapters }).moves.map((m) => `${m.action} ${m.adapter}@${m.pod}`);

describe("desiredReplicas", () => {
  it.each([
    [{ replicas: 2 }, { rps: 100, queued: 0 }, 4, 2],
    [{ replicas: 6 }, { rps: 0, queued: 0 }, 4, 4],
    [{}, { rps: 0, queued: 0 }, 3, 3],
    [{ minReplicas: 0, maxReplicas: 4 }, { rps: 0, queued: 0 }, 4, 0],
    [{ minReplicas: 0, maxReplicas: 4 }, { rps: 0, queued: 3 }, 4, 1],
    [{ minReplicas: 0, maxReplicas: 4, targetRps: 5 }, { rps: 11, queued: 0 }, 4, 3],
    [{ minReplicas: 1, maxReplicas: 2, targetRps: 5 }, { rps: 50, queued: 0 }, 4, 2],
    [{ minReplicas: 2 }, { rps: 0, queued: 0 }, 4, 2],
    [{ minReplicas: 0, maxReplicas: 8 }, { rps: 100, queued: 0 }, 3, 3],
  ] as Array<[Partial<AdapterSpec>, { rps: number; queued: number }, number, number]>)("%j with %j over %i candidates -> %i", (spec, demand, candidates, want) => {
    expect(desiredReplicas({ artifactURL: "/a", ...spec }, demand, candidates).desired).toBe(want);
  });
});

describe("place (table)", () => {
  const cases: Array<{ name: string; pods: PlacementPod[]; adapters: PlacementAdapter[]; want: string[] }> = [
    { name: "scale from zero: a waiting request places one replica on the least loaded pod", pods: [pod("p0", {}, { load: 3 }), pod("p1", {}, { load: 1 })], adapters: [adapter("a", { minReplicas: 0, maxReplicas: 2 }, { rps: 0, queued: 1 })], want: ["load a@p1"] },
    { name: "idle adapter with minReplicas 0 is not placed", pods: [pod("p0"), pod("p1")], adapters: [adapter("a", { minReplicas: 0, maxReplicas: 2 })], want: [] },
    { name: "no replicas given: every selected pod, one move per pod", pods: [pod("p0"), pod("p1"), pod("p2", {}, { labels: { app: "other" } })], adapters: [adapter("a", { podSelector: { matchLabels: { app: "llama" } } })], want: ["load a@p0", "load a@p1"] },
    { name: "fixed replicas 1: nothing to do when hosted", pods: [pod("p0", { a: "loaded" }), pod("p1")], adapters: [adapter("a", { replicas: 1 })], want: [] },
    { name: "fixed replicas exceeded: the most loaded host unloads", pods: [pod("p0", { a: "loaded" }, { load: 5 }), pod("p1", { a: "loaded" }, { load: 1 })], adapters: [adapter("a", { replicas: 1 })], want: ["unload a@p0"] },
    { name: "failover: the host is gone from the pod list, another pod loads it", pods: [pod("p1")], adapters: [adapter("a", { replicas: 1 })], want: ["load a@p1"] },
    { name: "a pod restarted empty gets its adapter back", pods: [pod("p0"), pod("p1", { a: "loaded" })], adapters: [adapter("a", { replicas: 2 })], want: ["load a@p0"] },
    { name: "an unready host does not count; a ready pod takes over", pods: [pod("p0", { a: "loaded" }, { ready: false }), pod("p1")], adapters: [adapter("a", { replicas: 1 })], want: ["load a@p1"] },
    { name: "at max_loras: the coldest adapter is unloaded for a hotter one", pods: [pod("p0", { c: "loaded", w: "loaded" })], adapters: [adapter("c", { minReplicas: 0, maxReplicas: 1 }, { rps: 0.1, queued: 0 }), adapter("w", { minReplicas: 0, maxReplicas: 1 }, { rps: 2, queued: 0 }), adapter("h", { minReplicas: 0, maxReplicas: 1 }, { rps: 0, queued: 2 })], want: ["unload c@p0"] },
    { name: "at max_loras: a hotter resident is not evicted for a colder one", pods: [pod("p0", { x: "loaded", y: "loaded" })], adapters: [adapter("x", { minReplicas: 0, maxReplicas: 1 }, { rps: 3, queued: 0 }), adapter("y", { minReplicas: 0, maxReplicas: 1 }, { rps: 3, queued: 0 }), adapter("n", { minReplicas: 1, maxReplicas: 1 }, { rps: 0.5, queued: 0 })], want: [] },
    { name: "an operator's own adapter keeps its slot", pods: [pod("p0", { mine: "loaded", c: "loaded" })], adapters: [adapter("c", { minReplicas: 0, maxReplicas: 1 }, { rps: 1, queued: 0 }), adapter("h", { minReplicas: 0, maxReplicas: 1 }, { rps: 0, queued: 1 })], want: ["unload c@p0"] },
    { name: "a full pod beside a free one: the free one loads, nothing evicted", pods: [pod("p0", { c: "loaded", d: "loaded" }), pod("p1", {}, { load: 9 })], adapters: [adapter("c", { minReplicas: 0, maxReplicas: 1 }), adapter("d", { minReplicas: 0, maxReplicas: 1 }), adapter("h", { minReplicas: 0, maxReplicas: 1 }, { rps: 0, queued: 1 })], want: ["load h@p1"] },
    { name: "a surplus replica is evicted before a colder single one", pods: [pod("p0", { s: "loaded", c: "loaded" }), pod("p1", { s: "loaded" }, { maxLoras: 1 })], adapters: [adapter("s", { minReplicas: 0, maxReplicas: 2 }, { rps: 4, queued: 0 }), adapter("c", { minReplicas: 0, maxReplicas: 1 }, { rps: 0.2, queued: 0 }), adapter("h", { minReplicas: 0, maxReplicas: 1 }, { rps: 0, queued: 1 })], want: ["unload s@p0"] },
    { name: "deleted: unloaded everywhere", pods: [pod("p0", { a: "loaded" }), pod("p1", { a: "loaded" })], adapters: [adapter("a", {}, undefined, { deleted: true })], want: ["unload a@p0", "unload a@p1"] },
    { name: "selector changed: the pod no longer selected unloads", pods: [pod("p0", { a: "loaded" }, { labels: { app: "x" } }), pod("p1", { a: "loaded" })], adapters: [adapter("a", { podSelector: { matchLabels: { app: "llama" } } })], want: ["unload a@p0"] },
    { name: "a busy pod gets no move", pods: [pod("p0", {}, { busy: true }), pod("p1", {}, { load: 5 })], adapters: [adapter("a", { replicas: 1 })], want: ["load a@p1"] },
    { name: "a blocked pod (failed loads) is not tried", pods: [pod("p0"), pod("p1", {}, { load: 5 })], adapters: [adapter("a", { replicas: 1 }, undefined, { blocked: new Set(["p0"]) })], want: ["load a@p1"] },
    { name: "a loading replica counts as hosting", pods: [pod("p0", { a: "loading" }), pod("p1")], adapters: [adapter("a", { replicas: 1 })], want: [] },
    { name: "other base models' pods are never candidates", pods: [pod("q0", {}, { model: "qwen" })], adapters: [adapter("a", { replicas: 1 })], want: [] },
    { name: "hottest first when slots are short", pods: [pod("p0", {}, { maxLoras: 1 })], adapters: [adapter("cold", { minReplicas: 0, maxReplicas: 1 }, { rps: 0.5, queued: 0 }), adapter("hot", { minReplicas: 0, maxReplicas: 1 }, { rps: 9, queued: 0 })], want: ["load hot@p0"] },
  ];
  it.each(cases)("$name", ({ pods, adapters, want }) => {
    expect(moves(pods, adapters)).toEqual(want);
  });

  it("every move carries a reason; plans say desired, candidates and hosts", () => {
    const r = place({ pods: [pod("p0", { c: "loaded", d: "loaded" })], adapters: [adapter("c", { minReplicas: 0, maxReplicas: 1 }, { rps: 0.1, queued: 0 }), adapter("d", { minReplicas: 0, maxReplicas: 1 }, { rps: 1, queued: 0 }), adapter("h", { minReplicas: 0, maxReplicas: 1 }, { rps: 0, queued: 1 })] });
    expect(r.moves[0]?.reason).toMatch(/p0 at max_loras \(2\/2\): c is colder \(0\.1 rps, 0 waiting\) than h \(0 rps, 1 waiting\)/);
    expect(r.plans.get("h")).toMatchObject({ desired: 1, candidates: 1, hosts: [], base: BASE });
    expect(r.plans.get("c")).toMatchObject({ hosts: [] });
  });

  it("an adapter named like a model some pod serves is placed nowhere and unloaded where loaded, with the reason", () => {
    const pods = [pod("q1", {}, { model: "qwen" }), pod("q2", {}, { model: "qwen" }), pod("l3", { qwen: "loaded" })];
    const r = place({ pods, adapters: [adapter("qwen", { replicas: 1 }, { rps: 5, queued: 3 })] });
    expect(r.moves.map((m) => `${m.action} ${m.adapter}@${m.pod}`)).toEqual(["unload qwen@l3"]);
    expect(r.moves[0]?.reason).toMatch(/adapter name qwen is a base model some pod serves/);
    expect(r.plans.get("qwen")).toMatchObject({ desired: 0, candidates: 0, reason: expect.stringMatching(/^refused: /) });
  });

  it("never loads beyond max_loras, whatever the demand (property over random fleets)", () => {
    let seed = 7;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    for (let round = 0; round < 200; round++) {
      const names = Array.from({ length: 12 }, (_, i) => `a${i}`);
      const pods = Array.from({ length: 4 }, (_, i) => {
        const loaded: Record<string, SlotState> = {};
        for (const n of names) if (rnd() < 0.15 && Object.keys(loaded).length < 3) loaded[n] = "loaded";
        return pod(`p${i}`, loaded, { maxLoras: 3, load: Math.floor(rnd() * 5) });
      });
      const adapters = names.map((n) => adapter(n, { minReplicas: 0, maxReplicas: 3 }, { rps: rnd() * 20, queued: rnd() < 0.2 ? 1 : 0 }));
      const r = place({ pods, adapters });
      const perPod = new Map<string, number>();
      for (const m of r.moves) perPod.set(m.pod, (perPod.get(m.pod) ?? 0) + 1);
      for (const n of perPod.values()) expect(n).toBe(1);
      for (const p of pods) {
        const loads = r.moves.filter((m) => m.pod === p.pod && m.action === "load").length;
        expect(p.adapters.size + loads).toBeLessThanOrEqual(p.maxLoras);
      }
    }
  });
});
