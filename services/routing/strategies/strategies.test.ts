import { describe, expect, it } from "vitest";
import type { Outstanding } from "../../views/charge-ledger.js";
import type { PodInfo } from "../../views/pod-set.js";
import { leastRequestStrategy } from "./least-request.js";
import { randomStrategy } from "./random.js";
import { findStrategy, strategyNames } from "./registry.js";
import { sample } from "./testing.js";
import { pickBest, type RoutingContext, type Scored, tieOrderOf } from "./types.js";

const pod = (name: string): PodInfo => ({
  model: "m", pod: name, address: `10.0.0.${name.slice(1)}:8000`, engine: "vllm", role: "combined", adapters: [], labels: {}, ready: true, updatedAt: 0,
});
const load = (waiting: number) => sample({ waiting });

function ctx(inFlight: Record<string, number | undefined>, waiting: Record<string, number | undefined> = {}, random = () => 0): RoutingContext {
  const pods = Object.keys(inFlight).map(pod);
  return {
    request: { model: "m", requestId: "r", promptTokens: 10 },
    pods,
    now: 1000,
    random,
    ledger: { outstanding: (_m, p): Outstanding => ({ requests: inFlight[p] ?? 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }) },
    load: {
      fresh: (_m, p) => (waiting[p] === undefined ? undefined : load(waiting[p] as number)),
      get: () => undefined,
    },
  };
}

describe("least-request - table", () => {
  it.each([
    { name: "fewest in flight wins", inFlight: { p1: 3, p2: 1, p3: 2 }, waiting: {}, want: "p2" },
    { name: "engine queue breaks a ledger tie", inFlight: { p1: 1, p2: 1 }, waiting: { p1: 5, p2: 0 }, want: "p2" },
    { name: "ledger outweighs engine queue", inFlight: { p1: 0, p2: 1 }, waiting: { p1: 50, p2: 0 }, want: "p1" },
    { name: "missing metrics: ledger alone decides", inFlight: { p1: 2, p2: 1 }, waiting: { p1: undefined, p2: undefined }, want: "p2" },
  ])("$name", ({ inFlight, waiting, want }) => {
    expect(leastRequestStrategy.pick(ctx(inFlight, waiting)).pod.pod).toBe(want);
  });

  it("breaks exact ties at random, covering every tied pod", () => {
    const seen = new Set<string>();
    for (const r of [0, 0.34, 0.67, 0.99]) seen.add(leastRequestStrategy.pick(ctx({ p1: 1, p2: 0, p3: 0, p4: 0 }, {}, () => r)).pod.pod);
    expect([...seen].sort()).toEqual(["p2", "p3", "p4"]);
  });

  it("reports every candidate's score", () => {
    const p = leastRequestStrategy.pick(ctx({ p1: 2, p2: 1 }));
    expect(p.candidates.map((c) => [c.pod.pod, c.score])).toEqual([["p1", 2], ["p2", 1]]);
  });
});

describe("tie order - replicas stagger their ties", () => {
  const scored = (loads: number[]): Scored[] => loads.map((score, i) => ({ pod: pod(`p${i}`), score }));
  /** One replica spreading `n` requests from an idle state, charging each pick (as the director does). */
  function spread(n: number, index: number, count: number, pods = 8, shift = 0): number[] {
    const loads = new Array<number>(pods).fill(0);
    const order = tieOrderOf(index, count, shift);
    for (let i = 0; i < n; i++) {
      const p = pickBest(scored(loads), "lower", () => 0, order);
      const i = Number(p.pod.pod.slice(1));
      loads[i] = (loads[i] ?? 0) + 1;
    }
    return loads;
  }
  const add = (a: number[], b: number[]) => a.map((x, i) => x + (b[i] ?? 0));

  it.each([
    { name: "one replica: no order (ties stay random)", index: 0, count: 1, want: undefined },
    { name: "replica 0 of 2 walks forward from the start", index: 0, count: 2, want: { boundary: 0, slots: 1, reverse: false, shift: 0 } },
    { name: "replica 1 of 2 walks backward from the end", index: 1, count: 2, want: { boundary: 1, slots: 1, reverse: true, shift: 0 } },
    { name: "replica 2 of 4 starts the second arc", index: 2, count: 4, want: { boundary: 1, slots: 2, reverse: false, shift: 0 } },
    { name: "replica 2 of 3 has the second arc alone", index: 2, count: 3, want: { boundary: 1, slots: 2, reverse: false, shift: 0 } },
  ])("$name", ({ index, count, want }) => {
    expect(tieOrderOf(index, count, 0)).toEqual(want);
  });

  it("two replicas splitting a burst unevenly fill the pods exactly evenly", () => {
    for (let a = 0; a <= 64; a++) {
      const loads = add(spread(a, 0, 2), spread(64 - a, 1, 2));
      expect(Math.max(...loads), `shares ${a}/${64 - a}`).toBe(8);
    }
  });

  it("the shared rotation keeps the pairing (shares 5 + 3 over 8 pods land on 8 pods)", () => {
    for (const shift of [0, 0.1, 0.5, 0.93]) {
      expect(add(spread(5, 0, 2, 8, shift), spread(3, 1, 2, 8, shift)), `shift ${shift}`).toEqual(new Array(8).fill(1));
    }
  });

  it("four replicas with remainders that fit their arcs do not overlap", () => {
    // Arcs of 4 pods: replicas 0/1 share pods 0-3, replicas 2/3 pods 4-7.
    const loads = [spread(3, 0, 4), spread(1, 1, 4), spread(2, 2, 4), spread(2, 3, 4)].reduce(add);
    expect(loads).toEqual(new Array(8).fill(1));
  });

  it("without an order ties follow the random draw", () => {
    expect(pickBest(scored([0, 0, 0]), "lower", () => 0.99).pod.pod).toBe("p2");
    expect(pickBest(scored([0, 0, 0]), "lower", () => 0).pod.pod).toBe("p0");
  });

  it("the order only breaks ties: a better score still wins", () => {
    expect(pickBest(scored([1, 1, 0, 1]), "lower", () => 0, tieOrderOf(1, 2, 0)).pod.pod).toBe("p2");
  });
});

describe("random - table", () => {
  it.each([
    [0, "p1"],
    [0.5, "p2"],
    [0.999999, "p3"],
  ])("random()=%s picks %s", (r, want) => {
    expect(randomStrategy.pick(ctx({ p1: 0, p2: 0, p3: 0 }, {}, () => r)).pod.pod).toBe(want);
  });
});

describe("registry", () => {
  it("finds strategies by name and refuses unknown ones", () => {
    expect(strategyNames()).toEqual([
      "random",
      "least-request",
      "power-of-two",
      "least-latency",
      "least-kv-cache",
      "least-gpu-cache",
      "least-busy-time",
      "least-token-load",
      "throughput",
      "session-affinity",
      "vtc-basic",
      "slo",
      "slo-least-load",
      "slo-pack-load",
      "prefix-cache",
      "prefix-cache-preble",
      "predicted-latency",
      "predicted-latency-targets",
      "pd",
    ]);
    expect(findStrategy("least-request")).toBe(leastRequestStrategy);
    expect(findStrategy("random")).toBe(randomStrategy);
    expect(findStrategy("nope")).toBeUndefined();
  });

  it("every base strategy but pd exposes a scorer named like it", () => {
    // pd picks two pods (prefill and decode) and is exclusive: no single metric to combine.
    for (const name of strategyNames().filter((n) => n !== "pd")) expect(findStrategy(name)?.scorer?.name).toBe(name);
    expect(findStrategy("pd")?.exclusive).toBe(true);
  });
});
