import { describe, expect, it } from "vitest";
import type { EngineLoadFields } from "../../../schemas/events.js";
import type { Outstanding } from "../../views/charge-ledger.js";
import type { LoadReader, PodLoad } from "../../views/load-view.js";
import { SaturationDetector } from "./saturation.js";
import { flowSettingsOf } from "./settings.js";

const defaults = flowSettingsOf({})?.saturation;
if (!defaults) throw new Error("settings");

function fixture() {
  const inFlight = new Map<string, Outstanding>();
  const samples = new Map<string, PodLoad>();
  const ledger = { outstanding: (_m: string, pod: string) => inFlight.get(pod) ?? { requests: 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 } };
  const load: LoadReader = {
    get: (_m, pod) => samples.get(pod),
    fresh: (_m, pod, now) => {
      const s = samples.get(pod);
      return s && !s.stale && s.load && now - s.ts <= 2_000 ? s.load : undefined;
    },
  };
  const setLoad = (pod: string, ts: number, l: Partial<EngineLoadFields> | null) =>
    samples.set(pod, { ts, stale: l === null, load: l === null ? null : ({ running: 0, waiting: 0, kvCacheUsage: 0, ...l } as EngineLoadFields) });
  const setInFlight = (pod: string, requests: number, promptTokens = 0) => inFlight.set(pod, { requests, promptTokens, prefillRequests: 0, prefillTokens: 0 });
  return { det: new SaturationDetector({ ledger, load }), setLoad, setInFlight };
}
const pod = (name: string) => ({ model: "m", pod: name });

describe("saturation", () => {
  it("a pod is full at the queue depth or the KV threshold (the peers' utilisation detector)", () => {
    const { det, setLoad } = fixture();
    setLoad("a", 1_000, { waiting: 4, kvCacheUsage: 0.5 });
    expect(det.podRoom(pod("a"), defaults, 1_000)).toMatchObject({ full: false, utilization: 0.8 });
    setLoad("a", 1_100, { waiting: 5 });
    expect(det.podRoom(pod("a"), defaults, 1_100)).toMatchObject({ full: true, reason: "queue" });
    setLoad("a", 1_200, { waiting: 0, kvCacheUsage: 0.8 });
    expect(det.podRoom(pod("a"), defaults, 1_200)).toMatchObject({ full: true, reason: "kv" });
  });

  it("requests charged since the sample count as queued at once: dispatches between scrapes cannot overrun the pod", () => {
    const { det, setLoad, setInFlight } = fixture();
    setInFlight("a", 8);
    setLoad("a", 1_000, { running: 8, waiting: 2 });
    expect(det.podRoom(pod("a"), defaults, 1_000).full).toBe(false); // baseline: 8 in flight
    setInFlight("a", 10);
    expect(det.podRoom(pod("a"), defaults, 1_010)).toMatchObject({ full: false, utilization: 0.8 });
    setInFlight("a", 11);
    expect(det.podRoom(pod("a"), defaults, 1_020)).toMatchObject({ full: true, reason: "queue" });
    // The next scrape shows the engine's own queue; the count starts again from it.
    setLoad("a", 1_500, { running: 8, waiting: 1 });
    expect(det.podRoom(pod("a"), defaults, 1_500)).toMatchObject({ full: false, utilization: 0.2 });
    // A release since the sample let the waiting request run: room at once, not at the next scrape.
    setInFlight("a", 7);
    expect(det.podRoom(pod("a"), defaults, 1_510).utilization).toBe(0);
    // Never below an empty queue.
    setInFlight("a", 3);
    expect(det.podRoom(pod("a"), defaults, 1_520).utilization).toBe(0);
  });

  it("ledger limits (every replica's charges) hold whatever the metrics say", () => {
    const { det, setLoad, setInFlight } = fixture();
    const s = { ...defaults, maxInFlightPerPod: 4, maxTokensPerPod: 1_000 };
    setLoad("a", 0, { waiting: 0 });
    setInFlight("a", 3, 500);
    expect(det.podRoom(pod("a"), s, 0).full).toBe(false);
    setInFlight("a", 4, 500);
    expect(det.podRoom(pod("a"), s, 0)).toMatchObject({ full: true, reason: "in-flight" });
    setInFlight("a", 1, 1_000);
    expect(det.podRoom(pod("a"), s, 0)).toMatchObject({ full: true, reason: "tokens" });
  });

  it("stale metrics: fail closed unless a ledger limit is set, but an idle pod always has room", () => {
    const { det, setLoad, setInFlight } = fixture();
    setLoad("a", 0, { waiting: 0 });
    setInFlight("a", 1);
    // 5 s later the sample is stale.
    expect(det.podRoom(pod("a"), defaults, 5_000)).toMatchObject({ full: true, reason: "stale" });
    expect(det.podRoom(pod("a"), { ...defaults, maxInFlightPerPod: 4 }, 5_000).full).toBe(false);
    setInFlight("a", 0);
    expect(det.podRoom(pod("a"), defaults, 5_000).full).toBe(false);
    setLoad("b", 0, null); // the scraper marked it stale
    setInFlight("b", 2);
    expect(det.podRoom(pod("b"), defaults, 0).full).toBe(true);
  });

  it("the model has room when any pod has; baselines are kept only for live pods", () => {
    const { det, setLoad } = fixture();
    setLoad("a", 0, { waiting: 9 });
    setLoad("b", 0, { waiting: 1 });
    expect(det.hasRoom([pod("a"), pod("b")], defaults, 0)).toBe(true);
    expect(det.hasRoom([pod("a")], defaults, 0)).toBe(false);
    expect(det.size).toBe(2);
    det.retain((_m, p) => p === "a");
    expect(det.size).toBe(1);
  });
});
