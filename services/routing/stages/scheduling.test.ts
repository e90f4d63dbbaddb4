import { describe, expect, it } from "vitest";
import { RouteError } from "../errors.js";
import { parseStrategy } from "../strategies/registry.js";
import { decisionRandom, schedule } from "./scheduling.js";
import { MODEL, stateWithPods } from "./testing.js";

const request = (requestId = "r1") => ({ model: MODEL, requestId, promptTokens: 10 });

describe("scheduling stage - filters, strategy, picker", () => {
  const state = stateWithPods(4);

  it("404 for a model no pod serves, 503 when none is ready or none is in the proxy's subset", () => {
    const run = (model: string, subset?: string[]) => () => schedule({ views: state, strategy: parseStrategy("random"), request: { ...request(), model }, now: 0, random: Math.random, ...(subset ? { subset } : {}) });
    expect(run("nope")).toThrow(RouteError);
    try {
      run("nope")();
    } catch (e) {
      expect((e as RouteError).status).toBe(404);
    }
    try {
      run(MODEL, ["10.9.9.9:1"])();
    } catch (e) {
      expect((e as RouteError).code).toBe("no_ready_pod_in_subset");
    }
    expect(schedule({ views: state, strategy: parseStrategy("random"), request: request(), now: 0, random: Math.random, subset: ["10.0.0.2:8000"] }).pick.pod.pod).toBe("p2");
  });

  it("a random pick is a function of request id, gateway and charge id: replay draws the same", () => {
    const pick = (id: string, charge: string) => schedule({ views: state, strategy: parseStrategy("random"), request: request(id), now: 0, random: decisionRandom(id, "gw", charge) }).pick.pod.pod;
    const picks = Array.from({ length: 64 }, (_, i) => pick(`req-${i}`, String(i)));
    expect(Array.from({ length: 64 }, (_, i) => pick(`req-${i}`, String(i)))).toEqual(picks);
    // ...and still spreads: every pod gets some of 64 requests.
    expect(new Set(picks).size).toBe(4);
  });

  it("ties follow the replica's tie order when several replicas are live: two replicas start from opposite ends", () => {
    const at = (index: number) => schedule({ views: state, strategy: parseStrategy("least-request"), request: request(), now: 0, random: () => 0.99, rank: { index, count: 2 } }).pick.pod.pod;
    expect(at(0)).not.toBe(at(1));
  });

  it("the prefix match is computed only over the filtered candidates and handed to the strategy", () => {
    let seen: string[] = [];
    const s = schedule({
      views: state,
      strategy: parseStrategy("prefix-cache"),
      request: request(),
      now: 0,
      random: () => 0,
      subset: ["10.0.0.1:8000", "10.0.0.3:8000"],
      prefix: (cands) => {
        seen = cands.map((c) => c.pod);
        return { info: { queried: 4, blockSize: 16, matched: (p) => (p === "p3" ? 4 : 0) }, hashes: [], detail: [] };
      },
    });
    expect(seen).toEqual(["p1", "p3"]);
    expect(s.pick.pod.pod).toBe("p3");
  });
});
