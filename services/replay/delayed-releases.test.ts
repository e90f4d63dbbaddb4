/**
 * A gateway batching its releases (services/shared/publish.ts) publishes a release up to a window
 * after it made it, so in CHARGES the release can sit after charges made later. Replay must apply
 * it before those charges, as the live gateway had it: it goes by the release's `afterCharge`.
 */
import { describe, expect, it } from "vitest";
import type { ReplayMessage } from "./engine.js";
import { replay, synthRecording } from "./testing.js";

type Ev = { type?: string; gateway?: string; id?: string; afterCharge?: number };

/** Moves every release `by` CHARGES messages later (renumbering the stream), stamped or not with `afterCharge`. */
function delayReleases(messages: readonly ReplayMessage[], by: number, stamp: boolean): ReplayMessage[] {
  const out: ReplayMessage[] = [];
  const held: Array<{ m: ReplayMessage; left: number }> = [];
  let charges = 0;
  const emit = (m: ReplayMessage) => out.push(m);
  for (const m of messages) {
    const ev = m.data as Ev;
    if (m.stream === "charges") {
      if (ev.type === "release") {
        held.push({ m: { ...m, data: stamp ? { ...ev, afterCharge: charges } : ev }, left: by });
        continue;
      }
      if (ev.type === "charge" && ev.id) charges = Math.max(charges, Number.parseInt(ev.id, 36));
      emit(m);
      for (const h of held) h.left--;
      while (held.length > 0 && (held[0] as { left: number }).left <= 0) emit((held.shift() as { m: ReplayMessage }).m);
    } else emit(m);
  }
  for (const h of held) emit(h.m);
  // CHARGES renumbered in the new order (the stream assigns sequences as messages arrive).
  let seq = 0;
  const renumbered = out.map((m) => (m.stream === "charges" ? { ...m, seq: ++seq } : m));
  return renumbered;
}

/**
 * As `delayReleases` with stamps, but the held releases of one pod go out as one `releases` batch
 * (as a gateway's release batcher sends them), optionally each batch twice (a publish retried).
 */
function batchReleases(messages: readonly ReplayMessage[], by: number, twice: boolean): ReplayMessage[] {
  const out: ReplayMessage[] = [];
  let held: Array<{ m: ReplayMessage; ev: Ev & { model?: string; pod?: string } }> = [];
  let charges = 0;
  let since = 0;
  const flush = () => {
    const byPod = new Map<string, typeof held>();
    for (const h of held) byPod.set(h.ev.pod ?? "", [...(byPod.get(h.ev.pod ?? "") ?? []), h]);
    for (const group of byPod.values()) {
      const first = group[0] as (typeof held)[number];
      const items = group.map(({ ev }) => {
        const { type: _t, gateway: _g, model: _m, pod: _p, ...item } = ev as Record<string, unknown>;
        return item;
      });
      const m: ReplayMessage = { ...first.m, subject: first.m.subject.replace(".release.", ".releases."), data: { type: "releases", gateway: first.ev.gateway, model: first.ev.model, pod: first.ev.pod, releases: items } };
      out.push(m);
      if (twice) out.push({ ...m });
    }
    held = [];
  };
  for (const m of messages) {
    const ev = m.data as Ev & { model?: string; pod?: string };
    if (m.stream === "charges") {
      if (ev.type === "release") {
        held.push({ m, ev: { ...ev, afterCharge: charges } });
        continue;
      }
      if (ev.type === "charge" && ev.id) charges = Math.max(charges, Number.parseInt(ev.id, 36));
      out.push(m);
      if (held.length > 0 && ++since >= by) {
        since = 0;
        flush();
      }
    } else out.push(m);
  }
  flush();
  let seq = 0;
  return out.map((m) => (m.stream === "charges" ? { ...m, seq: ++seq } : m));
}

describe("replay - releases published after later charges (batched)", () => {
  // One gateway, overlapping requests: its own releases decide where its later charges go.
  const rec = synthRecording({ seed: 5, gateways: ["g1"], requests: 400, burst: 4, gapMs: [0, 20], durationMs: [20, 120], strategies: ["least-request"] });
  const win = { fromMs: rec.fromMs, toMs: rec.toMs };

  it("the recording replays exactly as it is", () => {
    expect(replay(rec.messages, win).report.fidelity.ratio).toBe(1);
  });

  it("releases moved after later charges, stamped with afterCharge: still reproduced", () => {
    const { report } = replay(delayReleases(rec.messages, 3, true), win);
    expect(report.decisions.evaluated).toBe(400);
    expect(report.fidelity.ratio).toBe(1);
  });

  it("is not vacuous: the same moved releases without afterCharge are not all reproduced", () => {
    const { report } = replay(delayReleases(rec.messages, 3, false), win);
    expect(report.fidelity.ratio).toBeLessThan(1);
  });

  it("releases batched per pod into `releases` events after later charges: still reproduced", () => {
    const moved = batchReleases(rec.messages, 4, false);
    expect(moved.some((m) => (m.data as Ev).type === "releases")).toBe(true);
    const { report } = replay(moved, win);
    expect(report.decisions.evaluated).toBe(400);
    expect(report.fidelity.ratio).toBe(1);
  });

  it("each batch published twice (a retried publish): the copy changes nothing", () => {
    const { report } = replay(batchReleases(rec.messages, 4, true), win);
    expect(report.decisions.evaluated).toBe(400);
    expect(report.fidelity.ratio).toBe(1);
  });
});
