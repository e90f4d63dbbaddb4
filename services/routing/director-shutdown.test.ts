import { describe, expect, it } from "vitest";
import { Director, type RouteInput } from "./director.js";
import { RouteError } from "./errors.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "./stages/testing.js";

function setup() {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(3, "gw");
  const sink = new MemorySink();
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now });
  const input = (headers: Record<string, string> = {}): RouteInput => ({ headers: { "x-request-id": "req", ...headers }, body: chatBody(MODEL) });
  return { clock, state, sink, director, input };
}

const refusal = (fn: () => unknown) => {
  try {
    fn();
  } catch (err) {
    if (err instanceof RouteError) return { status: err.status, code: err.code };
    throw err;
  }
  throw new Error("expected a RouteError");
};

describe("director - shutting down", () => {
  it("after drain a new request is refused with 503 gateway_not_ready and nothing is charged", () => {
    const { sink, director, input } = setup();
    director.route(input());
    director.drain();
    expect(refusal(() => director.route(input({ "x-request-id": "late" })))).toEqual({ status: 503, code: "gateway_not_ready" });
    expect(sink.charges).toHaveLength(1);
    expect(sink.releases.map((r) => r.outcome)).toEqual(["shutdown"]);
  });

  it("a request held by a rate limit across the drain is refused with gateway_not_ready when its hold ends, not charged", async () => {
    const { clock, state, sink, director, input } = setup();
    state.apply({ type: "config-entry", key: "limits", operation: "PUT", value: { users: { bob: { rpm: 3 } } } }, { stream: "config", subject: "limits", seq: 1, serverTs: 0 });
    state.apply({ type: "heartbeat", gateway: "peer", ts: clock.t, intervalMs: 1000, startedAt: 0, state: "up" }, { stream: "charges", subject: "hb", seq: 1, serverTs: clock.t });
    // With a live peer the burst guard holds the third request of a 3-per-minute user (see director.test.ts).
    director.route(input({ user: "bob" }));
    director.route(input({ user: "bob" }));
    const held = director.route(input({ user: "bob" }));
    expect(held).toBeInstanceOf(Promise);
    director.drain();
    // The hold ends once the two charges are read back and --rate-confirm-ms has passed.
    for (const c of sink.charges) state.ownEchoed(c.id, clock.t);
    clock.advance(30);
    await expect(held).rejects.toMatchObject({ status: 503, code: "gateway_not_ready" });
    expect(sink.charges).toHaveLength(2);
  });
});
