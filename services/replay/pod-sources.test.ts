/**
 * Replay judges pod-watcher sources the way the gateways did: a source silent beyond the
 * gateways' `--pod-source-timeout-ms` takes its pods out of the replayed candidate sets too, so
 * the decisions made while it was silent are reproduced.
 */
import { describe, expect, it } from "vitest";
import type { PodSourceHeartbeat } from "../../schemas/events.js";
import { podEvent, replay, synthRecording, T0 } from "./testing.js";

const TIMEOUT_MS = 1_000;
/** Source `watch-b` vouches for p2 and p3 and beats every 250 ms until T0 + 2 s, then goes silent. */
const SILENT_FROM = T0 + 2_000;

function recording() {
  const beats = [];
  for (let at = T0 - 500; at <= SILENT_FROM; at += 250) {
    const hb: PodSourceHeartbeat = { type: "pod-source", source: "watch-b", watcher: "w1", pods: 2, intervalMs: 250, ts: at };
    beats.push({ at, stream: "pods" as const, subject: "jr.podsrc.watch-b", data: hb });
  }
  return synthRecording({
    seed: 11,
    gateways: ["g1"],
    requests: 120,
    gapMs: 40,
    durationMs: [20, 60],
    strategies: ["random"],
    podSourceTimeoutMs: TIMEOUT_MS,
    inject: [
      { at: T0 - 600, stream: "pods", subject: "jr.pods.p2", data: podEvent("p2", T0 - 600, { source: "watch-b" }) },
      { at: T0 - 600, stream: "pods", subject: "jr.pods.p3", data: podEvent("p3", T0 - 600, { source: "watch-b" }) },
      ...beats,
    ],
  });
}

describe("replay - pod-watcher source liveness", () => {
  it("the recorded gateway stopped routing to a silent source's pods; replay with the same timeout reproduces its picks", () => {
    const rec = recording();
    const late = rec.records.filter((r) => r.ts > SILENT_FROM + TIMEOUT_MS + 10);
    const early = rec.records.filter((r) => r.ts < SILENT_FROM);
    // The scenario is real: before the silence all four pods were picked, after it only p0 and p1.
    expect(new Set(early.map((r) => r.pick))).toEqual(new Set(["p0", "p1", "p2", "p3"]));
    expect(late.length).toBeGreaterThan(40);
    expect(new Set(late.map((r) => r.pick))).toEqual(new Set(["p0", "p1"]));
    const { report } = replay(rec.messages, { fromMs: rec.fromMs, toMs: rec.toMs, state: { podSourceTimeoutMs: TIMEOUT_MS } });
    expect(report.decisions.evaluated).toBe(120);
    // Decisions within one sweep period (250 ms) of the timeout may see the source either way.
    expect(report.fidelity.ratio).toBeGreaterThanOrEqual(0.97);
  });

  it("is not vacuous: replayed without the timeout, the silent source's pods stay candidates and picks differ", () => {
    const rec = recording();
    const { report } = replay(rec.messages, { fromMs: rec.fromMs, toMs: rec.toMs, state: { podSourceTimeoutMs: 0 } });
    expect(report.fidelity.ratio).toBeLessThan(0.85);
  });
});
