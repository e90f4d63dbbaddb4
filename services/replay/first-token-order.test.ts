/**
 * A request's first token and another request's routing decision in the same millisecond: the
 * gateway knows which came first, a timestamp does not. Strategies that read the shared ledger's
 * prefill/decode split (`predicted-latency`, `least-token-load`) see the earlier request in
 * prefill when the decision came first, and decoding when its first token did. Replay must
 * rebuild the same split: it goes by the record's `firstTokenAfterCharge` (the gateway's charge
 * count when the first token arrived), not by the first token's time.
 */
import { describe, expect, it } from "vitest";
import type { ReplayMessage } from "./engine.js";
import { replay, synthRecording } from "./testing.js";

/** The recording without the records' `firstTokenAfterCharge` (as a gateway of an older build wrote them). */
const unstamped = (messages: readonly ReplayMessage[]): ReplayMessage[] =>
  messages.map((m) => {
    if (m.stream !== "decisions") return m;
    const { firstTokenAfterCharge: _, ...rest } = m.data as Record<string, unknown>;
    return { ...m, data: rest };
  });

describe("replay - first tokens in the same millisecond as later routing decisions", () => {
  // Durations and first tokens on a coarse grid, so many first tokens land on a decision's millisecond.
  const rec = synthRecording({
    seed: 7,
    gateways: ["g1", "g2"],
    requests: 600,
    burst: 2,
    gapMs: [0, 4],
    durationMs: [40, 160],
    strategies: ["predicted-latency", "least-token-load"],
    stream: true,
    firstTokens: "after",
    request: (_, r) => ({ ...r, durationMs: r.durationMs - (r.durationMs % 4), ttftMs: 8 + ((r.durationMs >> 2) % 6) * 4 }),
  });
  const win = { fromMs: rec.fromMs, toMs: rec.toMs };

  it("the latency model learned along the way (the predictions are not the prior's)", () => {
    const last = rec.records.filter((r) => r.strategy === "predicted-latency").at(-1);
    expect(last?.prediction?.source).toBe("class");
  });

  it("replays every pick exactly", () => {
    const { report } = replay(rec.messages, win);
    expect(report.decisions.evaluated).toBe(600);
    expect(report.fidelity.residuals).toEqual({});
    expect(report.fidelity.ratio).toBe(1);
  });

  it("is not vacuous: going by the first tokens' times alone, some picks are not reproduced", () => {
    const { report } = replay(unstamped(rec.messages), win);
    expect(report.fidelity.ratio).toBeLessThan(1);
  });
});
