/**
 * A `releases` batch (a gateway's releases of one pod over a few ms, services/shared/publish.ts)
 * folds exactly as the same releases sent one by one: same ledger, same usage and rate windows.
 */
import { describe, expect, it } from "vitest";
import type { ChargeEvent, ReleaseBatch, ReleaseEvent } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { type EventMeta, GatewayState } from "./gateway-state.js";

const M = "org/model";
const T0 = 1_700_000_000_000;

function fold(batched: boolean, self = "self"): GatewayState {
  const s = new GatewayState({ self });
  let seq = 0;
  const meta = (): EventMeta => ({ stream: "charges", subject: "jr.x", seq: ++seq, serverTs: T0 + seq });
  s.apply({ type: "pod", action: "upsert", model: M, pod: "p0", address: "10.0.0.1:8000", ready: true, engine: "vllm", ts: T0 }, { stream: "pods", subject: "jr.pods", seq: 1, serverTs: T0 });
  const charges: ChargeEvent[] = Array.from({ length: 6 }, (_, i) => ({ type: "charge", id: (i + 1).toString(36), gateway: "gw-a", model: M, pod: "p0", ts: T0 + i, ttlMs: 600_000, promptTokens: 100 + i, user: i % 2 ? "alice" : "bob" }));
  for (const c of charges) s.apply(c, meta());
  // Four of six end: with engine counts (rate correction, completion tokens), one without.
  const releases: ReleaseEvent[] = charges.slice(0, 4).map((c, i) => ({
    type: "release", id: c.id, gateway: "gw-a", model: M, pod: "p0", ts: T0 + 50 + i, outcome: "completed",
    ...(i < 3 ? { promptTokens: 120 + i, chargedPromptTokens: c.promptTokens, chargedAt: c.ts, completionTokens: 30 + i } : {}),
    ...(c.user ? { user: c.user } : {}), afterCharge: 6,
  }));
  if (batched) {
    const batch: ReleaseBatch = { type: "releases", gateway: "gw-a", model: M, pod: "p0", releases: releases.map(({ type: _t, gateway: _g, model: _m, pod: _p, ...item }) => item) };
    expect(checkEvent("releases", batch).ok).toBe(true);
    // One message where the unbatched fold had four: it carries the last one's sequence, so the cursors agree.
    seq += releases.length;
    const r = s.apply(batch, { stream: "charges", subject: "jr.x", seq, serverTs: T0 + seq });
    expect(r.applied).toBe(true);
  } else for (const r of releases) s.apply(r, meta());
  return s;
}

describe("releases batch", () => {
  it("folds as the same releases one by one", () => {
    const one = fold(false);
    const batch = fold(true);
    const now = T0 + 1_000;
    expect(batch.ledger.outstanding(M, "p0")).toEqual({ requests: 2, promptTokens: 104 + 105, prefillRequests: 2, prefillTokens: 104 + 105 });
    expect(batch.snapshot(now)).toEqual(one.snapshot(now));
  });

  it("is ignored as an own echo", () => {
    const s = new GatewayState({ self: "gw-a" });
    const r = s.apply({ type: "releases", gateway: "gw-a", model: M, pod: "p0", releases: [{ id: "1", ts: T0, outcome: "completed" }] }, { stream: "charges", subject: "jr.x", seq: 1, serverTs: T0 });
    expect(r).toEqual({ applied: false, ignored: "own-echo" });
    expect(s.cursors.charges).toBe(1);
  });

  it("schema: at least one release, no unknown fields, bounded", () => {
    const base = { type: "releases", gateway: "g", model: M, pod: "p0" };
    expect(checkEvent("releases", { ...base, releases: [] }).ok).toBe(false);
    expect(checkEvent("releases", { ...base, releases: [{ id: "1", ts: 1, outcome: "completed", extra: 1 }] }).ok).toBe(false);
    expect(checkEvent("releases", { ...base, releases: [{ id: "1", ts: 1, outcome: "done" }] }).ok).toBe(false);
    expect(checkEvent("releases", { ...base, releases: Array.from({ length: 1025 }, (_, i) => ({ id: String(i), ts: 1, outcome: "completed" })) }).ok).toBe(false);
  });
});
