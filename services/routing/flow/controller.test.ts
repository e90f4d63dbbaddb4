import { describe, expect, it } from "vitest";
import type { FlowControl, ModelConfig } from "../../../schemas/config.js";
import type { Outstanding } from "../../views/charge-ledger.js";
import type { ConfigReader } from "../../views/model-config.js";
import type { PodInfo, PodSetReader } from "../../views/pod-set.js";
import { RouteError } from "../errors.js";
import { FlowController, type FlowOutcome, type Held } from "./controller.js";
import { FleetQueues } from "./fleet.js";
import { classify, flowSettingsOf } from "./settings.js";

const M = "m";

function fixture(flowControl: FlowControl | undefined, podNames = ["a", "b"]) {
  let now = 1_000;
  const pods: PodInfo[] = podNames.map((pod) => ({ model: M, pod, address: `${pod}:1`, engine: "vllm", role: "both", adapters: [], labels: {}, ready: true, updatedAt: 0 }) as unknown as PodInfo);
  const inFlight = new Map<string, number>();
  const podSet = { readyPods: (m: string) => (m === M ? pods : []) } as unknown as PodSetReader;
  let config: ModelConfig | undefined = flowControl ? { flowControl } : undefined;
  const reader = { get: (m: string) => (m === M ? config : undefined) } as unknown as ConfigReader;
  const outcomes: Array<[number, FlowOutcome]> = [];
  const yields: number[] = [];
  const fleet = new FleetQueues({ self: "me" });
  const flow = new FlowController({
    views: {
      pods: podSet,
      load: { get: () => undefined, fresh: () => undefined },
      ledger: { outstanding: (_m: string, pod: string): Outstanding => ({ requests: inFlight.get(pod) ?? 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }) },
      usage: { tokens: (flowKey: string) => (flowKey === "heavy" ? 1e6 : 0), bounds: () => ({ min: 0, max: 0, users: 0 }) },
    },
    config: reader,
    fleet,
    now: () => now,
    hooks: { outcome: (band, o) => void outcomes.push([band, o]), yielded: (band) => void yields.push(band) },
  });
  const log: string[] = [];
  /** Offers a request; a dispatch charges the first pod with room (as least-request would). */
  const offer = (name: string, headers: Record<string, string> = {}, user = "u") => {
    const s = flow.settingsFor(M);
    if (!s) return "off";
    const held: Held = {
      model: M,
      cls: classify(s, headers, undefined, user, now),
      dispatch: () => {
        const p = pods.find((x) => (inFlight.get(x.pod) ?? 0) < 1) ?? pods[0];
        if (p) inFlight.set(p.pod, (inFlight.get(p.pod) ?? 0) + 1);
        log.push(`go ${name}`);
      },
      fail: (err) => void log.push(`${err.code} ${name}`),
    };
    const r = flow.offer(held, 100, s);
    if (r.now) held.dispatch(0, r.subset);
    return r.now ? "now" : "held";
  };
  return {
    flow,
    fleet,
    offer,
    log,
    outcomes,
    yields,
    free: (pod: string) => inFlight.set(pod, Math.max(0, (inFlight.get(pod) ?? 0) - 1)),
    advance: (ms: number) => void (now += ms),
    now: () => now,
    setConfig: (f: FlowControl | undefined) => void (config = f ? { flowControl: f } : undefined),
    dropPods: () => void pods.splice(0),
  };
}

const base: FlowControl = { objectives: { hi: { priority: 5 }, lo: { priority: 0 }, shed: { priority: -1 } }, defaultObjective: "lo", saturation: { maxInFlightPerPod: 1 }, ttlMs: 1_000 };

describe("flow controller", () => {
  it("off for a model without flowControl; straight through while a pod has room", () => {
    expect(fixture(undefined).offer("x")).toBe("off");
    const f = fixture(base);
    expect(f.offer("r1")).toBe("now");
    expect(f.offer("r2")).toBe("now");
    expect(f.offer("r3")).toBe("held");
    expect(f.flow.held).toBe(1);
  });

  it("dispatches highest band first, one per pod with room per pump, and records the outcome", () => {
    const f = fixture(base);
    f.offer("r1");
    f.offer("r2");
    f.offer("lo1", { "x-jetroute-objective": "lo" });
    f.offer("hi1", { "x-jetroute-objective": "hi" });
    f.offer("lo2", { "x-jetroute-objective": "lo" });
    expect(f.flow.pump()).toBe(0);
    f.free("a");
    expect(f.flow.pump()).toBe(1);
    f.free("a");
    f.free("b");
    expect(f.flow.pump()).toBe(2);
    expect(f.log).toEqual(["go r1", "go r2", "go hi1", "go lo1", "go lo2"]);
    expect(f.outcomes).toEqual([
      [5, "dispatched"],
      [0, "dispatched"],
      [0, "dispatched"],
    ]);
  });

  it("a request of a band already held waits its turn even when a pod has room (no overtaking)", () => {
    const f = fixture(base);
    f.offer("r1");
    f.offer("r2");
    f.offer("lo1");
    f.free("a");
    // A new lo arrives before the pump: it queues behind lo1; a hi goes straight through.
    expect(f.offer("lo2")).toBe("held");
    expect(f.offer("hi1", { "x-jetroute-objective": "hi" })).toBe("now");
  });

  it("TTL expiry answers 429 queue_timeout while pods exist, 503 without; the waiting room holds a pod-less model", () => {
    const f = fixture(base);
    f.offer("r1");
    f.offer("r2");
    f.offer("late");
    f.advance(1_000);
    f.flow.pump();
    expect(f.log.at(-1)).toBe("queue_timeout late");
    expect(f.outcomes).toEqual([[0, "expired"]]);

    const g = fixture({ ...base, waitingRoomTtlMs: 500 }, []);
    expect(g.offer("w")).toBe("held");
    g.advance(500);
    g.flow.pump();
    expect(g.log).toEqual(["no_ready_pod w"]);
    const h = fixture(base, []);
    expect(h.offer("x")).toBe("now"); // no waiting room: today's 503 comes from scheduling
  });

  it("a full band refuses the newcomer; a sheddable newcomer replaces the oldest of its band", () => {
    const f = fixture({ ...base, maxRequestsPerBand: 1 });
    f.offer("r1");
    f.offer("r2");
    f.offer("lo1");
    expect(() => f.offer("lo2")).toThrow(RouteError);
    f.offer("s1", { "x-jetroute-objective": "shed" });
    f.offer("s2", { "x-jetroute-objective": "shed" });
    expect(f.log).toContain("queue_full s1");
    expect(f.flow.held).toBe(2);
  });

  it("least-attained: the light flow goes before an older request of the heavy one", () => {
    const f = fixture({ ...base, fairness: "least-attained" });
    f.offer("r1");
    f.offer("r2");
    f.offer("heavy1", {}, "heavy");
    f.offer("light1", {}, "light");
    f.free("a");
    f.flow.pump();
    expect(f.log.at(-1)).toBe("go light1");
  });

  it("yields a band while another replica holds an older higher band, past the bound", () => {
    const f = fixture(base);
    f.offer("r1");
    f.offer("r2");
    f.offer("lo1");
    f.fleet.apply({ gateway: "other", ts: f.now(), models: { [M]: [{ band: 5, count: 1, oldest: f.now() - 300 }] } }, f.now());
    f.free("a");
    expect(f.flow.pump()).toBe(0);
    expect(f.yields.length).toBeGreaterThan(0);
    // The other replica's summary goes stale: we dispatch.
    f.advance(301);
    expect(f.flow.pump()).toBe(1);
  });

  it("flow control turned off releases what is held; drain answers the rest with 503", () => {
    const f = fixture(base);
    f.offer("r1");
    f.offer("r2");
    f.offer("lo1");
    f.setConfig(undefined);
    f.flow.pump();
    expect(f.log.at(-1)).toBe("go lo1");
    const g = fixture(base);
    g.offer("r1");
    g.offer("r2");
    g.offer("lo1");
    expect(g.flow.drain(new RouteError("notReady", "shutting down"))).toBe(1);
    expect(g.log.at(-1)).toBe("gateway_not_ready lo1");
    expect(g.flow.held).toBe(0);
  });

  it("pods that all go while requests are held: 503 at once without a waiting room", () => {
    const f = fixture(base);
    f.offer("r1");
    f.offer("r2");
    f.offer("lo1");
    f.dropPods();
    f.flow.pump();
    expect(f.log.at(-1)).toBe("no_ready_pod lo1");
    expect(f.flow.held).toBe(0);
  });

  it("a request goes to the pods with room only when some are full", () => {
    const f = fixture(base);
    const s = f.flow.settingsFor(M);
    if (!s) throw new Error("settings");
    expect(f.flow.roomy(M, s)).toBeUndefined();
    f.offer("r1");
    expect(f.flow.roomy(M, s)).toEqual(["b:1"]);
    f.offer("r2");
    expect(f.flow.roomy(M, s)).toBeUndefined();
  });

  it("cancel takes a held request out at once", () => {
    const f = fixture(base);
    f.offer("r1");
    f.offer("r2");
    const s = f.flow.settingsFor(M);
    if (!s) throw new Error("settings");
    const r = f.flow.offer({ model: M, cls: classify(s, {}, undefined, "u", f.now()), dispatch: () => undefined, fail: () => undefined }, 10, s);
    expect(f.flow.cancel(M, r.id as number)).toBe(true);
    expect(f.flow.held).toBe(0);
    expect(f.outcomes).toEqual([[0, "cancelled"]]);
    expect(flowSettingsOf(base)?.ttlMs).toBe(1_000);
  });
});

describe("flow controller - the replica's memory bound and a user's share", () => {
  /** Two models, every pod full: whatever is offered is held. */
  function saturated(limits: { maxHeldBytes?: number; maxHeldRequests?: number }, fc: FlowControl = base) {
    const pod = (model: string) => ({ model, pod: `${model}-p`, address: `${model}:1`, ready: true }) as unknown as PodInfo;
    const flow = new FlowController({
      views: {
        pods: { readyPods: (m: string) => [pod(m)] } as unknown as PodSetReader,
        load: { get: () => undefined, fresh: () => undefined },
        ledger: { outstanding: (): Outstanding => ({ requests: 1, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }) },
        usage: { tokens: () => 0, bounds: () => ({ min: 0, max: 0, users: 0 }) },
      },
      config: { get: () => ({ flowControl: fc }) } as unknown as ConfigReader,
      fleet: undefined,
      now: () => 0,
      limits,
    });
    const failed: string[] = [];
    const offer = (model: string, bytes: number, user = "u", headers: Record<string, string> = {}) => {
      const s = flow.settingsFor(model)!;
      const held: Held = { model, cls: classify(s, headers, undefined, user, 0), dispatch: () => undefined, fail: (e) => void failed.push(e.code) };
      try {
        return flow.offer(held, bytes, s).now ? "now" : "held";
      } catch (e) {
        return (e as RouteError).code;
      }
    };
    return { flow, offer, failed };
  }

  it("bytes held across every model stay under maxHeldBytes: the excess gets 429 queue_full, naming the gateway's bound", () => {
    const { flow, offer } = saturated({ maxHeldBytes: 1_000 });
    expect(offer("m1", 400, "a")).toBe("held");
    expect(offer("m2", 400, "b")).toBe("held");
    expect(offer("m2", 201, "c")).toBe("queue_full");
    expect(offer("m1", 200, "c")).toBe("held");
    expect(flow.heldBytes).toBe(1_000);
    let err: unknown;
    try {
      const s = flow.settingsFor("m1")!;
      flow.offer({ model: "m1", cls: classify(s, {}, undefined, "d", 0), dispatch: () => undefined, fail: () => undefined }, 1, s);
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ status: 429, code: "queue_full" });
    expect((err as Error).message).toMatch(/this gateway holds as many requests as its memory bound allows/);
  });

  it("requests held across models stay under maxHeldRequests", () => {
    const { flow, offer } = saturated({ maxHeldRequests: 3 });
    expect([offer("m1", 1, "a"), offer("m2", 1, "b"), offer("m3", 1, "c"), offer("m1", 1, "d")]).toEqual(["held", "held", "held", "queue_full"]);
    expect(flow.held).toBe(3);
  });

  it("a sheddable request of the same model makes room under the replica bound; another model's requests are never shed for it", () => {
    const { offer, failed } = saturated({ maxHeldBytes: 1_000 });
    expect(offer("m1", 500, "a", { "x-jetroute-objective": "shed" })).toBe("held");
    expect(offer("m2", 500, "b")).toBe("held");
    // A lo (band 0) request of m1 sheds m1's sheddable one.
    expect(offer("m1", 500, "c")).toBe("held");
    expect(failed).toEqual(["queue_full"]);
    // Nothing of m1 left to shed for m2: refused, m1's held request stays.
    expect(offer("m2", 1, "d")).toBe("queue_full");
  });

  it("one user's share of a band is capped (count and bytes, every fairness id together); other users still get in", () => {
    const { flow, offer } = saturated({}, { ...base, maxRequestsPerUser: 2, maxBytesPerUser: 1_000 });
    expect(offer("m1", 100, "mallory", { "x-jetroute-fairness-id": "1" })).toBe("held");
    expect(offer("m1", 100, "mallory", { "x-jetroute-fairness-id": "2" })).toBe("held");
    expect(offer("m1", 100, "mallory", { "x-jetroute-fairness-id": "3" })).toBe("queue_full");
    expect(offer("m1", 999, "alice")).toBe("held");
    expect(offer("m1", 2, "alice")).toBe("queue_full");
    expect(flow.held).toBe(3);
  });

  it("defaults fit the deployed heap: 384 MiB per replica, 256 MiB per band, 64 MiB per user in a band", () => {
    const s = flowSettingsOf({})!;
    expect(s.maxBytesPerBand).toBe(256 * 1024 * 1024);
    expect(s.maxBytesPerUser).toBe(64 * 1024 * 1024);
    expect(s.maxRequestsPerUser).toBe(1_000);
    const { offer } = saturated({});
    // 3.6 MB chat bodies count about 7.2 MB each (held-bytes.ts): a user gets 9 in (64 MiB), then queue_full.
    const results = Array.from({ length: 12 }, () => offer("m1", 7_200_000 + 2_048, "flood"));
    expect(results.filter((r) => r === "held")).toHaveLength(9);
    expect(results.slice(9).every((r) => r === "queue_full")).toBe(true);
  });
});
