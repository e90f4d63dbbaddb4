/**
 * Per-band admission (issue 36, part 3): on a pod whose engine schedules by priority, a request's
 * queue limit grows with its band, so a higher band goes to a pod full for lower bands while the
 * lower bands are held; FCFS pods, engine priority "off" and a depth of 0 keep one limit for all.
 */
import { describe, expect, it } from "vitest";
import type { FlowControl, ModelConfig } from "../../../schemas/config.js";
import { modelConfigError } from "../../../schemas/config.js";
import type { EngineLoadFields, SchedulingPolicy } from "../../../schemas/events.js";
import type { Outstanding } from "../../views/charge-ledger.js";
import type { ConfigReader } from "../../views/model-config.js";
import type { PodInfo, PodSetReader } from "../../views/pod-set.js";
import { FlowController, type Held } from "./controller.js";
import { inFlightLimitFor, queueDepthFor } from "./saturation.js";
import { classify, flowSettingsOf } from "./settings.js";

const M = "m";
const objectives = { interactive: { priority: 10 }, batch: { priority: 0 }, scavenger: { priority: -1 } };
const flowOn = (o: Partial<FlowControl> = {}): FlowControl => ({ objectives, defaultObjective: "batch", ...o }) as FlowControl;
const sat = (o: Partial<FlowControl> = {}) => {
  const s = flowSettingsOf(flowOn(o))?.saturation;
  if (!s) throw new Error("settings");
  return s;
};

describe("per-band queue depth (queueDepthFor)", () => {
  it("grows by the depth per band for every band in play below the request's, on a priority pod only", () => {
    const s = sat();
    expect(s.perBand).toEqual({ depth: 5, bands: [-1, 0, 10], urgencies: [-1, 0, 10] });
    const prio = { schedulingPolicy: "priority" as SchedulingPolicy };
    expect([-1, 0, 5, 10, 16].map((b) => queueDepthFor(prio, b, s))).toEqual([5, 10, 15, 15, 20]);
    // An FCFS pod, or a band-blind question: the base depth.
    expect(queueDepthFor({}, 10, s)).toBe(5);
    expect(queueDepthFor(prio, undefined, s)).toBe(5);
    expect(queueDepthFor(prio, 10, sat({ saturation: { queueDepth: 4, queueDepthPerBand: 2 } }))).toBe(8);
  });

  it("bands the mapping gives one urgency count once, and a band sharing the urgency of a lower one gets no room over it", () => {
    const s = sat({ enginePriority: { bands: { "10": 0 } } });
    expect(s.perBand?.urgencies).toEqual([-1, 0, 0]);
    const prio = { schedulingPolicy: "priority" as SchedulingPolicy };
    // Band 10 runs as band 0 in the engine: only band -1 is below it.
    expect(queueDepthFor(prio, 10, s)).toBe(10);
    expect(queueDepthFor(prio, 0, s)).toBe(10);
    expect(queueDepthFor(prio, -1, s)).toBe(5);
  });

  it("off when the engines get no priority or the depth per band is 0", () => {
    expect(sat({ enginePriority: "off" }).perBand).toBeUndefined();
    expect(sat({ saturation: { queueDepthPerBand: 0 } }).perBand).toBeUndefined();
    expect(queueDepthFor({ schedulingPolicy: "priority" }, 10, sat({ enginePriority: "off" }))).toBe(5);
  });

  it("the ledger's in-flight limit grows by the same budget on a priority pod; unset stays unset", () => {
    const s = sat({ saturation: { maxInFlightPerPod: 5, queueDepth: 1, queueDepthPerBand: 1 } });
    const prio = { schedulingPolicy: "priority" as SchedulingPolicy };
    expect([-1, 0, 10].map((b) => inFlightLimitFor(prio, b, s))).toEqual([5, 6, 7]);
    expect(inFlightLimitFor({}, 10, s)).toBe(5);
    expect(inFlightLimitFor(prio, undefined, s)).toBe(5);
    expect(inFlightLimitFor(prio, 10, sat())).toBeUndefined();
    expect(inFlightLimitFor(prio, 10, sat({ enginePriority: "off", saturation: { maxInFlightPerPod: 5 } }))).toBe(5);
  });

  it("the config schema takes a non-negative queueDepthPerBand and names a bad one", () => {
    expect(modelConfigError({ flowControl: flowOn({ saturation: { queueDepthPerBand: 3 } }) } as ModelConfig)).toBeUndefined();
    expect(modelConfigError({ flowControl: flowOn({ saturation: { queueDepthPerBand: -1 } }) } as unknown as ModelConfig)).toMatch(/queueDepthPerBand/);
  });
});

/** Two pods with engine load samples (waiting requests) the test sets; charges land in the ledger. */
function fixture(policy: SchedulingPolicy | undefined, fc: FlowControl = flowOn()) {
  let now = 10_000;
  const pods = ["a", "b"].map((pod) => ({ model: M, pod, address: `${pod}:1`, engine: "vllm", role: "both", adapters: [], labels: {}, ready: true, updatedAt: 0, ...(policy ? { schedulingPolicy: policy } : {}) }) as unknown as PodInfo);
  const inFlight = new Map<string, number>();
  const waiting = new Map<string, number>();
  const config: ModelConfig = { flowControl: fc };
  const flow = new FlowController({
    views: {
      pods: { readyPods: (m: string) => (m === M ? pods : []) } as unknown as PodSetReader,
      load: {
        get: (_m, pod) => ({ ts: 1, stale: false, load: { running: 8, waiting: waiting.get(pod) ?? 0, kvCacheUsage: 0.1 } as EngineLoadFields }),
        fresh: (_m, pod) => ({ running: 8, waiting: waiting.get(pod) ?? 0, kvCacheUsage: 0.1 }) as EngineLoadFields,
      },
      ledger: { outstanding: (_m: string, pod: string): Outstanding => ({ requests: inFlight.get(pod) ?? 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }) },
      usage: { tokens: () => 0, bounds: () => ({ min: 0, max: 0, users: 0 }) },
    },
    config: { get: (m: string) => (m === M ? config : undefined) } as unknown as ConfigReader,
    fleet: undefined,
    now: () => now,
  });
  const log: string[] = [];
  const offer = (name: string, objective: string, user = "u") => {
    const s = flow.settingsFor(M);
    if (!s) throw new Error("flow control off");
    const held: Held = {
      model: M,
      cls: classify(s, { "x-jetroute-objective": objective }, undefined, user, now),
      dispatch: (_w, subset) => {
        // As least-request would: the pod with the fewest in flight among those with room.
        const among = pods.filter((p) => !subset || subset.includes(p.address));
        const p = among.reduce((x, y) => ((inFlight.get(y.pod) ?? 0) < (inFlight.get(x.pod) ?? 0) ? y : x));
        inFlight.set(p.pod, (inFlight.get(p.pod) ?? 0) + 1);
        log.push(`${name}@${p.pod}`);
      },
      fail: (err) => void log.push(`${err.code} ${name}`),
    };
    const r = flow.offer(held, 100, s);
    if (r.now) held.dispatch(0, r.subset);
    return r.now ? "now" : "held";
  };
  return {
    flow,
    offer,
    log,
    setWaiting: (pod: string, n: number) => waiting.set(pod, n),
    /** A waiting request started running on `pod` (the engine's queue shrank by one). */
    ran: (pod: string) => waiting.set(pod, Math.max(0, (waiting.get(pod) ?? 0) - 1)),
    advance: (ms: number) => void (now += ms),
    explain: (objective: string) => {
      const s = flow.settingsFor(M);
      if (!s) throw new Error("off");
      return flow.explain(M, classify(s, { "x-jetroute-objective": objective }, undefined, "u", now), s);
    },
  };
}

describe("flow controller: admission per band", () => {
  it("pods at their in-flight limit for batch: an interactive request still goes to a priority pod; FCFS pods hold it", () => {
    // A deep queue limit, so the in-flight limit alone decides here.
    const fc = flowOn({ saturation: { maxInFlightPerPod: 2, queueDepth: 20, queueDepthPerBand: 1 } });
    const f = fixture("priority", fc);
    for (const n of ["b1", "b2", "b3", "b4"]) expect(f.offer(n, "batch")).toBe("now");
    // Both pods hold 2 in flight: batch (limit 2 + 1 for the scavenger band) still has one each.
    expect(f.offer("b5", "batch")).toBe("now");
    expect(f.offer("b6", "batch")).toBe("now");
    expect(f.offer("b7", "batch")).toBe("held");
    // Interactive (limit 2 + 2): room on both, while the batch request stays held.
    expect(f.offer("i1", "interactive")).toBe("now");
    expect(f.log.at(-1)).toMatch(/^i1@/);

    const fcfs = fixture(undefined, fc);
    for (const n of ["b1", "b2", "b3", "b4"]) expect(fcfs.offer(n, "batch")).toBe("now");
    expect(fcfs.offer("b5", "batch")).toBe("held");
    expect(fcfs.offer("i1", "interactive")).toBe("held");
  });

  it("pods full for batch: an interactive request goes at once while batch is held; FCFS pods hold both", () => {
    // Batch's limit is 10 (5, and 5 for the scavenger band below it), interactive's 15.
    const f = fixture("priority");
    f.setWaiting("a", 10);
    f.setWaiting("b", 10);
    expect(f.offer("b1", "batch")).toBe("held");
    expect(f.offer("i1", "interactive")).toBe("now");
    expect(f.log).toEqual(["i1@a"]);
    // The explanation agrees: batch waits behind the held one, interactive would not wait.
    expect(f.explain("batch").why).toBe("held-ahead");
    expect(f.explain("interactive").why).toBeNull();

    const fcfs = fixture(undefined);
    fcfs.setWaiting("a", 10);
    fcfs.setWaiting("b", 10);
    expect(fcfs.offer("b1", "batch")).toBe("held");
    expect(fcfs.offer("i1", "interactive")).toBe("held");
    expect(fcfs.log).toEqual([]);
  });

  it("engine priority off: one limit for every band, even on priority pods", () => {
    const f = fixture("priority", flowOn({ enginePriority: "off" }));
    f.setWaiting("a", 5);
    f.setWaiting("b", 5);
    expect(f.offer("i1", "interactive")).toBe("held");
  });

  it("the interactive band fills up to its own limit, only among pods with room for it", () => {
    const f = fixture("priority");
    f.setWaiting("a", 14);
    f.setWaiting("b", 20);
    // a: 14 waiting < 15 (interactive's limit over bands -1 and 0); b: full for every band.
    expect(f.offer("i1", "interactive")).toBe("now");
    expect(f.log).toEqual(["i1@a"]);
    // Its charge counts as waiting on a until the next sample: a is now full for interactive too.
    expect(f.offer("i2", "interactive")).toBe("held");
  });

  it("the pump gives room to the highest band first; a lower band goes only when the pod has room for it", () => {
    const f = fixture("priority");
    f.setWaiting("a", 15);
    f.setWaiting("b", 15);
    expect(f.offer("b1", "batch")).toBe("held");
    expect(f.offer("b2", "batch", "v")).toBe("held");
    expect(f.offer("i1", "interactive")).toBe("held");
    expect(f.flow.pump()).toBe(0);
    // One request of a's queue starts running: room for interactive (14 < 15), not for batch (14 >= 10).
    f.ran("a");
    expect(f.flow.pump()).toBe(1);
    expect(f.log).toEqual(["i1@a"]);
    // Both queues drain below batch's limit: batch goes, one per pod with room, fairly between its users.
    for (let i = 0; i < 6; i++) {
      f.ran("a");
      f.ran("b");
    }
    expect(f.flow.pump()).toBe(2);
    expect(f.log.slice(1).map((x) => x.split("@")[0]).sort()).toEqual(["b1", "b2"]);
  });
});
