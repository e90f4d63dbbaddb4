/**
 * The request tracer on a real Director (in-memory fold): observation only. The routed request and
 * a refusal's error are the ones the Director returned; /debug/explain's prepare-only walk and a
 * request routed past an untraced router leave no spans; the stage timeline is the driver's.
 */
import { describe, expect, it } from "vitest";
import { Director, REQUEST_PATH, RouteError, stagesOf } from "../routing/mod.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "../routing/stages/testing.js";
import { RequestTracer } from "./otlp-traces.js";
import type { OtlpSpan } from "./trace-spans.js";

function setup() {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(2, "gw");
  const spans: OtlpSpan[] = [];
  let wall = 1_700_000_000_000;
  const tracer = new RequestTracer({ add: (s) => void spans.push(...s) }, () => (wall += 0.5));
  const director = new Director({
    gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink: new MemorySink(), config: state.configs, clock, now: clock.now,
    onStage: (stage, seconds, ctx) => tracer.stage(stage, seconds, ctx),
  });
  return { director, tracer, spans };
}

const headers = { ":method": "POST", ":path": "/v1/chat/completions", "x-request-id": "r-1" };

describe("RequestTracer", () => {
  it("a routed request: the Director's own result, a request span and the driver's stages in order", () => {
    const { director, tracer, spans } = setup();
    const router = tracer.wrap(director);
    const r = router.route({ headers, body: chatBody() });
    if (r instanceof Promise) throw new Error("expected a synchronous route");
    expect(director.inFlight.get(r.chargeId)).toBe(r);
    const [root, ...stages] = spans;
    expect(root?.name).toBe(`chat ${MODEL}`);
    expect(root?.attributes).toContainEqual({ key: "server.address", value: { stringValue: r.pod.address } });
    expect(stages.map((s) => s.name)).toEqual(stagesOf(REQUEST_PATH).map((s) => s.name));
    // Each stage ends no earlier than it starts, and none starts before the request did.
    for (const s of stages) {
      expect(BigInt(s.endTimeUnixNano)).toBeGreaterThanOrEqual(BigInt(s.startTimeUnixNano));
      expect(BigInt(s.endTimeUnixNano)).toBeLessThanOrEqual(BigInt(root!.endTimeUnixNano));
    }
  });

  it("a refusal is rethrown unchanged; its span names the stage the driver named", () => {
    const { director, tracer, spans } = setup();
    let thrown: unknown;
    try {
      void tracer.wrap(director).route({ headers, body: chatBody("org/unknown") });
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(RouteError);
    const stage = (thrown as RouteError).refusal?.stage;
    expect(stage).toBeDefined();
    expect(spans[0]?.attributes).toContainEqual({ key: "jetroute.refusal.stage", value: { stringValue: stage } });
    expect(spans.at(-1)?.name).toBe(stage);
  });

  it("stages of a request the tracer did not open (explain's prepare, an unwrapped router) leave no spans", () => {
    const { director, spans } = setup();
    void director.prepare({ headers, body: chatBody() });
    void director.route({ headers, body: chatBody() });
    expect(spans).toEqual([]);
  });
});
