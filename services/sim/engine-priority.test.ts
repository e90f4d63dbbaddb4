/**
 * The simulator's priority scheduling against the engines' rules (docs/engine-priority.md): the
 * waiting queue by (urgency, arrival), vLLM's KV-preemption victim, SGLang's preemption of a full
 * batch past its threshold. Times are simulated ms on a manual clock.
 */
import { describe, expect, it } from "vitest";
import { ManualClock } from "./clock.js";
import { type EngineConfig, type FinishReason, SimEngine } from "./engine.js";

const base: EngineConfig = {
  maxBatch: 1,
  maxNumBatchedTokens: 2048,
  prefillMsPerToken: 0,
  decodeMsPerStep: 10,
  decodeBatchSlope: 0,
  kvCapacityTokens: 16_384,
  blockSize: 16,
};

interface Tracked {
  name: string;
  tokenTimes: number[];
  finish: FinishReason | undefined;
}

function setup(config: Partial<EngineConfig>) {
  const clock = new ManualClock();
  const engine = new SimEngine({ ...base, ...config }, clock);
  const order: string[] = [];
  let salt = 0;
  const submit = (name: string, promptLen: number, maxTokens: number, priority?: number): Tracked => {
    const t: Tracked = { name, tokenTimes: [], finish: undefined };
    const first = 1000 * ++salt;
    engine.submit({
      // Distinct prompts: no request gets another's cached blocks.
      promptTokens: Array.from({ length: promptLen }, (_, i) => first + i),
      outputTokens: Array.from({ length: maxTokens }, (_, i) => 200 + i),
      onToken: (_id, index, atMs) => {
        if (index === 0) order.push(name);
        t.tokenTimes.push(atMs);
      },
      onFinish: (reason) => {
        t.finish = reason;
      },
      ...(priority !== undefined ? { priority } : {}),
    });
    return t;
  };
  return { clock, engine, submit, order };
}

/** A long batch request runs; three batch requests then one urgent request queue behind it. */
function urgentBehindBatch(config: Partial<EngineConfig>, urgent: number, batch: number) {
  const s = setup(config);
  s.submit("running", 10, 20, batch);
  s.submit("b1", 10, 2, batch);
  s.submit("b2", 10, 2, batch);
  s.submit("b3", 10, 2, batch);
  s.submit("urgent", 10, 2, urgent);
  s.clock.advance(10_000);
  return s.order;
}

describe("SimEngine priority scheduling: waiting queue order", () => {
  it("FCFS (the default) serves the urgent request last, whatever its priority", () => {
    expect(urgentBehindBatch({}, -10, 0)).toEqual(["running", "b1", "b2", "b3", "urgent"]);
  });

  it("vLLM --scheduling-policy priority: a lower value goes first, ties by arrival", () => {
    expect(urgentBehindBatch({ scheduling: { flavour: "vllm" } }, -10, 0)).toEqual(["running", "urgent", "b1", "b2", "b3"]);
    // Equal priorities keep arrival order.
    expect(urgentBehindBatch({ scheduling: { flavour: "vllm" } }, 0, 0)).toEqual(["running", "b1", "b2", "b3", "urgent"]);
  });

  it("SGLang --enable-priority-scheduling: a higher value goes first, unless low values first", () => {
    expect(urgentBehindBatch({ scheduling: { flavour: "sglang", preemption: false } }, 10, 0)).toEqual(["running", "urgent", "b1", "b2", "b3"]);
    expect(urgentBehindBatch({ scheduling: { flavour: "sglang", preemption: false, lowValuesFirst: true } }, -10, 0)).toEqual([
      "running",
      "urgent",
      "b1",
      "b2",
      "b3",
    ]);
  });

  it("vLLM: a request without priority counts as 0; SGLang: as the least urgent there is", () => {
    const v = setup({ scheduling: { flavour: "vllm" } });
    v.submit("running", 10, 5);
    v.submit("none", 10, 2);
    v.submit("plus1", 10, 2, 1);
    v.submit("minus1", 10, 2, -1);
    v.clock.advance(10_000);
    expect(v.order).toEqual(["running", "minus1", "none", "plus1"]);

    const g = setup({ scheduling: { flavour: "sglang", preemption: false } });
    g.submit("running", 10, 5);
    g.submit("none", 10, 2);
    g.submit("minus5", 10, 2, -5);
    g.clock.advance(10_000);
    expect(g.order).toEqual(["running", "minus5", "none"]);
  });
});

describe("SimEngine priority scheduling: preemption", () => {
  // 4 blocks of 16 tokens; two requests of 20 + 20 tokens hold 2 blocks each until one needs a third.
  const tight: Partial<EngineConfig> = { maxBatch: 2, kvCapacityTokens: 64, prefillMsPerToken: 0.1 };

  it("FCFS: when KV runs out the newest running request is preempted", () => {
    const s = setup(tight);
    const low = s.submit("low", 20, 20, 5);
    const high = s.submit("high", 20, 20, 0);
    s.clock.advance(10_000);
    expect(s.engine.snapshot().totals.preemptions).toBeGreaterThan(0);
    // The newer request lost its KV: the older one finishes first.
    expect(low.tokenTimes.at(-1)).toBeLessThan(high.tokenTimes.at(-1) as number);
  });

  it("vLLM priority: the victim is the running request with the largest (priority, arrival), not the newest", () => {
    const s = setup({ ...tight, scheduling: { flavour: "vllm" } });
    const low = s.submit("low", 20, 20, 5);
    const high = s.submit("high", 20, 20, 0);
    s.clock.advance(10_000);
    expect(s.engine.snapshot().totals.preemptions).toBeGreaterThan(0);
    expect(high.tokenTimes).toHaveLength(20);
    expect(low.tokenTimes).toHaveLength(20);
    // The older but less urgent request was preempted: the urgent one finishes first.
    expect(high.tokenTimes.at(-1)).toBeLessThan(low.tokenTimes.at(-1) as number);
  });

  it("vLLM priority: ties in priority preempt the later arrival", () => {
    const s = setup({ ...tight, scheduling: { flavour: "vllm" } });
    const first = s.submit("first", 20, 20, 3);
    const second = s.submit("second", 20, 20, 3);
    s.clock.advance(10_000);
    expect(first.tokenTimes.at(-1)).toBeLessThan(second.tokenTimes.at(-1) as number);
  });

  it("vLLM priority: a full batch never preempts for a more urgent waiting request", () => {
    const s = setup({ maxBatch: 1, scheduling: { flavour: "vllm" } });
    const batch = s.submit("batch", 10, 10, 10);
    s.clock.advance(25);
    const urgent = s.submit("urgent", 10, 2, -100);
    s.clock.advance(10_000);
    expect(s.engine.snapshot().totals.preemptions).toBe(0);
    // The urgent request starts only when the batch request's slot frees (its 10th token at 90).
    expect(batch.tokenTimes.at(-1)).toBe(90);
    expect(urgent.tokenTimes[0]).toBeGreaterThanOrEqual(90);
  });

  it("SGLang: a full batch preempts the least urgent, latest running request for a waiting one more urgent by more than the threshold", () => {
    const s = setup({ maxBatch: 2, scheduling: { flavour: "sglang" } });
    const early = s.submit("early", 10, 50, 0);
    const late = s.submit("late", 10, 50, 0);
    s.clock.advance(25);
    const urgent = s.submit("urgent", 10, 2, 11);
    s.clock.advance(10_000);
    expect(s.engine.snapshot().totals.preemptions).toBe(1);
    // Joined at the next step boundary, not after a batch request finished.
    expect(urgent.tokenTimes[0]).toBeLessThan(50);
    // The later of the two equally urgent requests was the victim.
    expect(early.tokenTimes.at(-1)).toBeLessThan(late.tokenTimes.at(-1) as number);
    expect(late.finish).toBe("length");
  });

  it("SGLang: no preemption at a gap equal to the threshold (default 10), nor with preemption disabled", () => {
    for (const [config, priority] of [
      [{ flavour: "sglang" }, 10],
      [{ flavour: "sglang", preemptionThreshold: 20 }, 15],
      [{ flavour: "sglang", preemption: false }, 100],
    ] as const) {
      const s = setup({ maxBatch: 2, scheduling: config });
      s.submit("a", 10, 20, 0);
      s.submit("b", 10, 20, 0);
      s.clock.advance(25);
      const urgent = s.submit("urgent", 10, 2, priority);
      s.clock.advance(10_000);
      expect(s.engine.snapshot().totals.preemptions).toBe(0);
      expect(urgent.tokenTimes[0]).toBeGreaterThanOrEqual(190);
    }
  });

  it("SGLang with low values first: the sign flips for preemption too", () => {
    const s = setup({ maxBatch: 1, scheduling: { flavour: "sglang", lowValuesFirst: true, preemptionThreshold: 0 } });
    s.submit("batch", 10, 50, 1);
    s.clock.advance(25);
    const urgent = s.submit("urgent", 10, 2, 0);
    s.clock.advance(10_000);
    expect(s.engine.snapshot().totals.preemptions).toBe(1);
    expect(urgent.tokenTimes[0]).toBeLessThan(50);
  });
});
