import { describe, expect, it } from "vitest";
import type { ChargeEvent } from "../../../schemas/events.js";
import { RouteError } from "../errors.js";
import { Admission } from "./admission.js";
import { FakeClock, MODEL, stateWithPods } from "./testing.js";

const MINUTE = 60_000;

function setup(limits: { rpm?: number; tpm?: number }, o: { replicas?: number; t0?: number } = {}) {
  const clock = new FakeClock(o.t0 ?? 10 * MINUTE);
  const state = stateWithPods(2);
  state.apply({ type: "config-entry", key: "limits", operation: "PUT", value: { users: { alice: limits } } }, { stream: "config", subject: "limits", seq: 1, serverTs: 0 });
  // Other live replicas, as their heartbeats would make them.
  for (let i = 1; i < (o.replicas ?? 1); i++) {
    state.apply({ type: "heartbeat", gateway: `peer-${i}`, ts: clock.t, intervalMs: 1000, startedAt: 0, state: "up" }, { stream: "charges", subject: "hb", seq: i, serverTs: clock.t });
  }
  const admission = new Admission(state, state.configs, clock);
  let n = 0;
  /** Admits and, as the director does, charges in the same step. */
  const send = (tokens = 10) =>
    admission.admit({ model: MODEL, user: "alice", tokens, rps: undefined }, () => {
      const c: ChargeEvent = { type: "charge", id: String(++n), gateway: "self", model: MODEL, pod: "p0", ts: clock.t, ttlMs: 600_000, promptTokens: tokens, user: "alice" };
      state.ownCharge(c, clock.t, { admission: { user: "alice", tokens, ts: clock.t } });
      return c;
    });
  return { clock, state, admission, send };
}

const refused = (f: () => unknown): RouteError => {
  try {
    f();
  } catch (err) {
    if (err instanceof RouteError) return err;
    throw err;
  }
  throw new Error("expected a RouteError");
};

describe("admission - per-user limits on an injected clock", () => {
  it("admits rpm requests in a minute, refuses the next with 429 and the OpenAI rate-limit headers, and admits again when the minute turns", () => {
    const { clock, send } = setup({ rpm: 3 }, { t0: 10 * MINUTE + 59_000 });
    for (let i = 0; i < 3; i++) expect(send()).toMatchObject({ type: "charge" });
    const err = refused(send);
    expect(err.status).toBe(429);
    expect(err.code).toBe("rate_limit_exceeded");
    expect(err.headers).toMatchObject({ "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0", "retry-after": "1" });
    clock.advance(1_000); // the next minute
    expect(send()).toMatchObject({ type: "charge" });
  });

  it("counts prompt tokens against tpm, the request that would cross it included", () => {
    const { send } = setup({ tpm: 25 });
    send(10);
    send(10);
    expect(refused(() => send(10)).message).toMatch(/25 tokens per minute/);
    expect(send(5)).toMatchObject({ promptTokens: 5 });
  });

  it("counts other replicas' charges: limits are shared", () => {
    const { state, send } = setup({ rpm: 2 });
    state.apply({ type: "charge", id: "x", gateway: "peer", model: MODEL, pod: "p1", ts: 10 * MINUTE, ttlMs: 1000, promptTokens: 1, user: "alice" }, { stream: "charges", subject: "c", seq: 9, serverTs: 10 * MINUTE });
    send();
    expect(refused(send).status).toBe(429);
  });

  it("burst guard: with 3 live replicas a request near the limit is held until this replica's admissions are old enough to have been seen, then admitted", async () => {
    const { clock, admission, send } = setup({ rpm: 10 }, { replicas: 3 });
    // seen + 2 x own-unseen must stay below 10: the 4th own admission within 25 ms would reach 3 + 2 x 3 = 9 < 10, the 5th 4 + 2 x 4 >= 10.
    for (let i = 0; i < 4; i++) expect(send()).toMatchObject({ type: "charge" });
    const held = send();
    expect(held).toBeInstanceOf(Promise);
    expect(admission.waits).toBe(1);
    clock.advance(24);
    let done = false;
    (held as Promise<unknown>).then(() => (done = true));
    await Promise.resolve();
    expect(done).toBe(false);
    clock.advance(2);
    await expect(held).resolves.toMatchObject({ type: "charge" });
  });

  it("a user far from the limit is never held, whatever the replica count", () => {
    const { send, admission } = setup({ rpm: 1000 }, { replicas: 8 });
    for (let i = 0; i < 20; i++) expect(send()).not.toBeInstanceOf(Promise);
    expect(admission.waits).toBe(0);
  });
});

describe("admission - per-model requests per second", () => {
  it("refuses past the profile's requestsPerSecond within one second, with reset headers, and admits in the next", () => {
    const clock = new FakeClock(5_000_500);
    const state = stateWithPods(1);
    const a = new Admission(state, state.configs, clock);
    const go = () => a.admit({ model: MODEL, user: undefined, tokens: 1, rps: 2 }, () => state.rates.request(undefined, MODEL, 1, clock.t));
    go();
    go();
    const err = refused(go);
    expect(err.headers["x-ratelimit-limit-requests"]).toBe("2");
    expect(err.headers["x-ratelimit-reset-requests"]).toBe("0.500s");
    clock.advance(500);
    expect(() => go()).not.toThrow();
  });
});

describe("admission - requests without a user", () => {
  it("share one bucket under users.default, fed by every replica's user-less charges; named users keep their own", () => {
    const clock = new FakeClock(10 * MINUTE);
    const state = stateWithPods(2);
    state.apply({ type: "config-entry", key: "limits", operation: "PUT", value: { users: { default: { rpm: 2 } } } }, { stream: "config", subject: "limits", seq: 1, serverTs: 0 });
    const admission = new Admission(state, state.configs, clock);
    let n = 0;
    const send = (user: string | undefined) =>
      admission.admit({ model: MODEL, user, tokens: 1, rps: undefined }, () => {
        const c: ChargeEvent = { type: "charge", id: String(++n), gateway: "self", model: MODEL, pod: "p0", ts: clock.t, ttlMs: 600_000, promptTokens: 1, ...(user ? { user } : {}) };
        state.ownCharge(c, clock.t, {});
        return c;
      });
    // Another replica's request without a user counts against the same bucket.
    state.apply({ type: "charge", id: "peer-1", gateway: "peer", model: MODEL, pod: "p1", ts: clock.t, ttlMs: 600_000, promptTokens: 1 }, { stream: "charges", subject: "c", seq: 2, serverTs: clock.t });
    expect(send(undefined)).toMatchObject({ type: "charge" });
    const err = refused(() => send(undefined));
    expect(err.status).toBe(429);
    expect(err.message).toMatch(/requests without a user exceeded 2 requests per minute/);
    // Named users are counted apart, each under the default.
    expect(send("bob")).toMatchObject({ user: "bob" });
    expect(send("bob")).toMatchObject({ user: "bob" });
    expect(refused(() => send("bob")).message).toMatch(/user `bob` exceeded/);
  });
});
