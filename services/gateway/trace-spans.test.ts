import { describe, expect, it } from "vitest";
import { bounded, exportRequest, MAX_ATTRIBUTE_CHARS, operationOf, otlpEndpointError, parseTraceparent, requestSpans, type RequestTrace, unixNanos } from "./trace-spans.js";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT = "00f067aa0ba902b7";

describe("parseTraceparent - W3C trace context, version 00, strictly", () => {
  const cases: [string, string | undefined, ReturnType<typeof parseTraceparent>][] = [
    ["valid, sampled", `00-${TRACE}-${PARENT}-01`, { traceId: TRACE, parentSpanId: PARENT, sampled: true }],
    ["valid, not sampled", `00-${TRACE}-${PARENT}-00`, { traceId: TRACE, parentSpanId: PARENT, sampled: false }],
    ["absent", undefined, undefined],
    ["empty", "", undefined],
    ["uppercase hex", `00-${TRACE.toUpperCase()}-${PARENT}-01`, undefined],
    ["all-zero trace id", `00-${"0".repeat(32)}-${PARENT}-01`, undefined],
    ["all-zero parent id", `00-${TRACE}-${"0".repeat(16)}-01`, undefined],
    ["another version", `01-${TRACE}-${PARENT}-01`, undefined],
    ["version ff", `ff-${TRACE}-${PARENT}-01`, undefined],
    ["short trace id", `00-${TRACE.slice(1)}-${PARENT}-01`, undefined],
    ["long parent id", `00-${TRACE}-${PARENT}0-01`, undefined],
    ["trailing data", `00-${TRACE}-${PARENT}-01-extra`, undefined],
    ["non-hex", `00-${TRACE.slice(0, 31)}g-${PARENT}-01`, undefined],
    ["whitespace", ` 00-${TRACE}-${PARENT}-01`, undefined],
    ["wrong separators", `00_${TRACE}_${PARENT}_01`, undefined],
  ];
  it.each(cases)("%s", (_name, header, want) => {
    expect(parseTraceparent(header)).toEqual(want);
  });
});

describe("otlpEndpointError", () => {
  it.each([
    ["http://collector:4318", undefined],
    ["https://otel.example.com/base/", undefined],
    ["ftp://collector:4318", "http or https"],
    ["collector:4318", "http or https"],
    ["not a url", "not a URL"],
    ["http://user:pw@collector:4318", "credentials"],
    ["http://collector:4318/?x=1", "query"],
  ])("%s", (url, want) => {
    const err = otlpEndpointError(url);
    if (want === undefined) expect(err).toBeUndefined();
    else expect(err).toContain(want);
  });
});

const base: RequestTrace = {
  traceId: TRACE,
  spanId: "1111111111111111",
  parentSpanId: PARENT,
  stageSpanIds: ["aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc"],
  startMs: 1_700_000_000_000.5,
  endMs: 1_700_000_000_004.25,
  path: "/v1/chat/completions",
  requestModel: "org/model",
  maxTokens: 64,
  stages: [
    { stage: "parse", startMs: 1_700_000_000_000.6, endMs: 1_700_000_000_001 },
    { stage: "select", startMs: 1_700_000_000_001, endMs: 1_700_000_000_002 },
    { stage: "charge", startMs: 1_700_000_000_002, endMs: 1_700_000_000_003 },
  ],
  routed: { model: "org/model-b", pod: "10.0.0.1:8000", strategy: "least-request" },
};

const attr = (s: { attributes: { key: string; value: unknown }[] }, key: string) => s.attributes.find((a) => a.key === key)?.value;

describe("requestSpans", () => {
  it("a routed request: a GenAI request span, child of the client's span, and one child per stage in order", () => {
    const [root, ...stages] = requestSpans(base);
    expect(root).toMatchObject({ traceId: TRACE, spanId: "1111111111111111", parentSpanId: PARENT, name: "chat org/model", kind: 2, status: { code: 0 } });
    expect(root?.startTimeUnixNano).toBe("1700000000000500000");
    expect(root?.endTimeUnixNano).toBe("1700000000004250000");
    expect(attr(root!, "gen_ai.operation.name")).toEqual({ stringValue: "chat" });
    expect(attr(root!, "gen_ai.request.model")).toEqual({ stringValue: "org/model" });
    expect(attr(root!, "gen_ai.request.max_tokens")).toEqual({ intValue: "64" });
    expect(attr(root!, "gen_ai.response.model")).toEqual({ stringValue: "org/model-b" });
    expect(attr(root!, "server.address")).toEqual({ stringValue: "10.0.0.1:8000" });
    expect(attr(root!, "jetroute.strategy")).toEqual({ stringValue: "least-request" });
    expect(attr(root!, "error.type")).toBeUndefined();
    expect(stages.map((s) => s.name)).toEqual(["parse", "select", "charge"]);
    expect(stages.map((s) => s.spanId)).toEqual(base.stageSpanIds);
    for (const s of stages) expect(s).toMatchObject({ traceId: TRACE, parentSpanId: "1111111111111111", kind: 1 });
  });

  it("a refusal: error status, error.type and the refusing stage; no routed attributes", () => {
    const { routed: _r, ...rest } = base;
    const [root, ...stages] = requestSpans({ ...rest, stages: base.stages.slice(0, 1), refusal: { type: "model_not_found", stage: "parse", message: "no such model" } });
    expect(root?.status).toEqual({ code: 2, message: "no such model" });
    expect(attr(root!, "error.type")).toEqual({ stringValue: "model_not_found" });
    expect(attr(root!, "jetroute.refusal.stage")).toEqual({ stringValue: "parse" });
    expect(attr(root!, "server.address")).toBeUndefined();
    expect(stages).toHaveLength(1);
    expect(stages[0]?.status).toEqual({ code: 2 });
  });

  it("no traceparent: a root span; client strings bounded; other operations named", () => {
    const { parentSpanId: _p, ...rest } = base;
    const long = "m".repeat(5_000);
    const [root] = requestSpans({ ...rest, requestModel: long, path: "/v1/embeddings?x=1" });
    expect(root?.parentSpanId).toBeUndefined();
    expect(root?.name).toBe(`embeddings ${"m".repeat(MAX_ATTRIBUTE_CHARS)}`);
    expect((attr(root!, "gen_ai.request.model") as { stringValue: string }).stringValue).toHaveLength(MAX_ATTRIBUTE_CHARS);
    expect(operationOf("/v1/completions")).toBe("text_completion");
    expect(operationOf("/v2/other")).toBeUndefined();
    expect(bounded("abc")).toBe("abc");
  });

  it("unixNanos keeps sub-millisecond precision as an integer string", () => {
    expect(unixNanos(1_700_000_000_123.25)).toBe("1700000000123250000");
    expect(unixNanos(0)).toBe("0");
  });

  it("exportRequest: resourceSpans -> scopeSpans -> spans, with service.name", () => {
    const spans = requestSpans(base);
    const req = exportRequest("svc", spans) as { resourceSpans: { resource: { attributes: unknown[] }; scopeSpans: { spans: unknown[] }[] }[] };
    expect(req.resourceSpans[0]?.resource.attributes).toEqual([{ key: "service.name", value: { stringValue: "svc" } }]);
    expect(req.resourceSpans[0]?.scopeSpans[0]?.spans).toEqual(spans);
  });
});
