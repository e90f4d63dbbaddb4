import { describe, expect, it } from "vitest";
import { ManualClock } from "./clock.js";
import { type EngineConfig, type RequestHandle, SimEngine, type SubmitRequest } from "./engine.js";
import { testEngineConfig } from "./testing.js";

const base = testEngineConfig;

function setup(config: Partial<EngineConfig> = {}) {
  const clock = new ManualClock();
  const ttfts: number[] = [];
  const engine = new SimEngine({ ...base, ...config }, clock, { onFirstToken: (ms) => ttfts.push(ms) });
  const submit = (promptLen: number, maxTokens: number, extra: Partial<SubmitRequest> = {}) => {
    const tokenTimes: number[] = [];
    let finished = false;
    const handle: RequestHandle = engine.submit({
      promptTokens: Array.from({ length: promptLen }, (_, i) => 100 + i),
      outputTokens: Array.from({ length: maxTokens }, (_, i) => 200 + i),
      onToken: (_id, _i, atMs) => tokenTimes.push(atMs),
      onFinish: () => {
        finished = true;
      },
      ...extra,
    });
    return { handle, tokenTimes, finished: () => finished };
  };
  return { clock, engine, submit, ttfts };
}

describe("SimEngine prefill/decode support", () => {
  it("a holdKv request keeps its blocks (counted as used) after finishing until releaseKv", () => {
    const { clock, engine, submit } = setup();
    const r = submit(100, 1, { holdKv: true });
    clock.advance(1_000);
    expect(r.finished()).toBe(true);
    expect(engine.snapshot()).toMatchObject({ running: 0, waiting: 0, heldRequests: 1, usedBlocks: 7 });
    expect(r.handle.blockIds()).toHaveLength(7);
    r.handle.releaseKv();
    expect(engine.snapshot()).toMatchObject({ heldRequests: 0, usedBlocks: 0 });
    r.handle.releaseKv();
    expect(engine.snapshot().usedBlocks).toBe(0);
    // The released blocks stay in the prefix cache: a repeat of the prompt hits it.
    expect(engine.snapshot().cachedBlocks).toBe(6);
  });

  it("a request without holdKv frees its blocks when it finishes; releaseKv is a no-op", () => {
    const { clock, engine, submit } = setup();
    const r = submit(100, 1);
    clock.advance(1_000);
    r.handle.releaseKv();
    expect(engine.snapshot()).toMatchObject({ heldRequests: 0, usedBlocks: 0 });
  });

  it("a prefilled request samples its first token after one decode step, not a prefill", () => {
    const { clock, submit } = setup();
    const local = submit(1_000, 3);
    clock.advance(5_000);
    expect(local.tokenTimes).toEqual([1_000, 1_010, 1_020]);
    const s = setup();
    const transferred = s.submit(1_000, 3, { prefilled: true });
    s.clock.advance(5_000);
    expect(transferred.tokenTimes).toEqual([10, 20, 30]);
  });

  it("a prefilled request joining a batch puts no prefill tokens into the decoders' steps", () => {
    const { clock, submit } = setup({ decodeBatchSlope: 0 });
    const decoder = submit(10, 4);
    clock.advance(10); // decoder's first token at 10 (10 prefill tokens)
    submit(1_500, 2, { prefilled: true });
    clock.advance(1_000);
    // Every later step is a pure decode step of 10 ms; a local prefill would have added 1,500 ms.
    expect(decoder.tokenTimes).toEqual([10, 20, 30, 40]);
  });

  it("a holdKv request aborted while running frees its blocks and holds nothing", () => {
    const { clock, engine, submit } = setup();
    const r = submit(500, 1, { holdKv: true });
    clock.advance(100);
    r.handle.abort();
    expect(engine.snapshot()).toMatchObject({ heldRequests: 0, usedBlocks: 0, running: 0 });
  });

  it("abortAll (an engine restart) also frees held blocks", () => {
    const { clock, engine, submit } = setup();
    submit(100, 1, { holdKv: true });
    clock.advance(1_000);
    engine.abortAll();
    expect(engine.snapshot()).toMatchObject({ heldRequests: 0, usedBlocks: 0 });
  });

  it("starts latency metrics at arrivedAtMs when the request reached the pod earlier", () => {
    const { clock, submit, ttfts } = setup();
    clock.advance(50);
    submit(10, 1, { arrivedAtMs: 20, prefilled: true });
    clock.advance(100);
    // Submitted at 50, first token one decode step later at 60, measured from 20.
    expect(ttfts).toEqual([40]);
  });
});
