import { describe, expect, it } from "vitest";
import { ManualClock } from "./clock.js";
import { type EngineConfig, type FinishedRequest, type FinishReason, SimEngine } from "./engine.js";
import { testEngineConfig } from "./testing.js";

const base = testEngineConfig;

interface Tracked {
  tokenTimes: number[];
  finish: FinishReason | undefined;
  abort(): void;
}

function setup(config: Partial<EngineConfig> = {}) {
  const clock = new ManualClock();
  const finished: FinishedRequest[] = [];
  const engine = new SimEngine({ ...base, ...config }, clock, { onFinished: (r) => finished.push(r) });
  const submit = (promptLen: number, maxTokens: number): Tracked => {
    const t: Tracked = { tokenTimes: [], finish: undefined, abort: () => {} };
    const handle = engine.submit({
      promptTokens: Array.from({ length: promptLen }, (_, i) => 100 + i),
      outputTokens: Array.from({ length: maxTokens }, (_, i) => 200 + i),
      onToken: (_id, _index, atMs) => t.tokenTimes.push(atMs),
      onFinish: (reason) => {
        t.finish = reason;
      },
    });
    t.abort = handle.abort;
    return t;
  };
  return { clock, engine, finished, submit };
}

describe("SimEngine", () => {
  it("prefills in promptTokens × prefillMsPerToken, then decodes one token per step", () => {
    const { clock, submit, finished } = setup();
    const r = submit(100, 3);
    clock.advance(1_000);
    expect(r.tokenTimes).toEqual([100, 110, 120]);
    expect(r.finish).toBe("length");
    expect(finished[0]).toMatchObject({ reason: "length", queueMs: 0, prefillMs: 100, decodeMs: 20, e2eMs: 120 });
  });

  it("slows decode mildly as the batch grows", () => {
    const { clock, submit } = setup({ prefillMsPerToken: 0 });
    const a = submit(10, 4);
    const b = submit(10, 3);
    clock.advance(1_000);
    // b joins at a's next step boundary (10). Decoding alone a step is 10 ms; two decoding
    // together take 10 × (1 + 0.1 × (2 − 1)) = 11 ms.
    expect(a.tokenTimes).toEqual([0, 10, 20, 31]);
    expect(b.tokenTimes).toEqual([20, 31, 41]);
  });

  it("makes the request beyond maxBatch wait for a free slot", () => {
    const { clock, engine, submit, finished } = setup({ maxBatch: 2, decodeBatchSlope: 0 });
    submit(10, 5);
    submit(10, 5);
    const third = submit(10, 5);
    // Arrivals join at step boundaries: after the first step two run and the third still waits.
    clock.advance(15);
    expect(engine.snapshot()).toMatchObject({ running: 2, waiting: 1 });
    clock.advance(1_000);
    // The first request frees its slot at 60; the third prefills beside the second's decode.
    expect(third.tokenTimes[0]).toBe(80);
    expect(finished.map((f) => f.queueMs)).toEqual([0, 10, 60]);
  });

  it("stalls decoding requests while a long prompt prefills in the same step", () => {
    const { clock, submit } = setup({ maxNumBatchedTokens: 512, decodeBatchSlope: 0 });
    const decoder = submit(10, 4);
    clock.advance(10); // decoder's first token at 10
    submit(1_000, 1);
    clock.advance(2_000);
    // The prompt joins at 20; the next steps carry 511 then 489 prefill tokens beside the decoder's one.
    expect(decoder.tokenTimes).toEqual([10, 20, 20 + 10 + 511, 20 + 10 + 511 + 10 + 489]);
  });

  it("preempts the newest request when the KV cache is full and still completes everything", () => {
    const { clock, engine, submit } = setup({ kvCapacityTokens: 64, blockSize: 16, prefillMsPerToken: 0.1 });
    const a = submit(20, 20);
    const b = submit(20, 20);
    clock.advance(10_000);
    expect(a.tokenTimes).toHaveLength(20);
    expect(b.tokenTimes).toHaveLength(20);
    const snap = engine.snapshot();
    expect(snap.totals.preemptions).toBeGreaterThan(0);
    expect(snap.totals.finished.length).toBe(2);
    expect(snap.usedBlocks).toBe(0);
    // vLLM counts a preempted request's second cache lookup apart: only the first admissions count.
    expect(snap.totals.prefixCacheQueries).toBe(40);
  });

  it("reports KV usage as blocks held by running requests over total blocks", () => {
    const { clock, engine, submit } = setup({ kvCapacityTokens: 1_600, blockSize: 16 });
    submit(100, 50);
    clock.advance(100); // prompt computed, first token sampled
    // The decode step in flight holds 101 tokens → 7 blocks of 16, out of 100.
    expect(engine.snapshot().kvUsage).toBeCloseTo(0.07, 5);
  });

  it("frees the slot of an aborted request so a waiting one starts at once", () => {
    const { clock, engine, submit, finished } = setup({ maxBatch: 1, prefillMsPerToken: 0, decodeBatchSlope: 0 });
    const long = submit(10, 1_000);
    const next = submit(10, 2);
    clock.advance(25);
    long.abort();
    expect(long.finish).toBe("abort");
    expect(engine.snapshot()).toMatchObject({ running: 0, waiting: 1, usedBlocks: 0 });
    clock.advance(100);
    // The step in flight when the abort landed ends at 30; the waiting request is scheduled then.
    expect(next.tokenTimes).toEqual([30, 40]);
    expect(finished.map((f) => f.reason)).toEqual(["abort", "length"]);
    expect(engine.snapshot().totals.finished).toEqual({ stop: 0, length: 1, abort: 1 });
  });

  it("rejects a request that could never fit in the KV cache", () => {
    const { submit } = setup({ kvCapacityTokens: 64 });
    expect(() => submit(60, 10)).toThrow(RangeError);
  });
});
