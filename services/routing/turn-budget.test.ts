import { describe, expect, it } from "vitest";
import { Director } from "./director.js";
import type { PrefixSupport } from "./ports.js";
import type { RoutedRequest } from "./request.js";
import { chatBody, FakeClock, MemorySink, MODEL, stateWithPods } from "./stages/testing.js";
import { shouldYieldTurn, type TurnSlicing } from "./turn-budget.js";

/** A yield the test releases by hand: each call parks until `release()`. */
class ManualTurns implements TurnSlicing {
  readonly parked: Array<() => void> = [];
  yields = 0;
  constructor(readonly budgetMs: number) {}
  yieldTurn(): Promise<void> {
    this.yields++;
    return new Promise((resolve) => this.parked.push(resolve));
  }
  /** Releases every parked yield (and those its continuations park) until none is left. */
  async drain(): Promise<void> {
    for (let i = 0; i < 1_000 && this.parked.length > 0; i++) {
      (this.parked.shift() as () => void)();
      await new Promise((r) => setImmediate(r));
    }
  }
}

function prefixSupport(log: string[]): PrefixSupport {
  return {
    tokenizer: { modeFor: () => "hf", tokenize: async () => ({ tokens: Uint32Array.from({ length: 64 }, (_, i) => i), mode: "hf" }) },
    match: (_m, candidates, tokens) => {
      log.push("match");
      return { info: { queried: tokens.length, blockSize: 16, matched: (pod: string) => (pod === candidates[1]?.pod ? 4 : 0) }, hashes: [1n, 2n, 3n, 4n], detail: candidates.map((c, i) => ({ pod: c.pod, indexBlocks: i === 1 ? 4 : 0, indexGpuBlocks: 0, indexWeighted: 0, routedBlocks: 0 })) };
    },
    recordRouted: () => {},
    blocks: () => {
      log.push("blocks");
      return { size: 16, mode: "precise", hashes: [1n, 2n, 3n, 4n] };
    },
  };
}

function director(turns?: TurnSlicing, log: string[] = []) {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(3, "gw");
  const sink = new MemorySink();
  const d = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now, prefix: prefixSupport(log), ...(turns ? { turns } : {}) });
  return { d, sink };
}

const large = { headers: { "x-request-id": "big-1", "routing-strategy": "prefix-cache" }, body: Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "system", content: "lorem ipsum dolor sit amet ".repeat(8_000) }, { role: "user", content: "go" }] })) };
const short = { headers: { "x-request-id": "short-1" }, body: chatBody() };

describe("turn slicing (turn-budget.ts): a large request's prepare work in short turns", () => {
  it("yields once a turn has used its budget, not before", () => {
    expect(shouldYieldTurn(0.5, 2)).toBe(false);
    expect(shouldYieldTurn(2, 2)).toBe(true);
    expect(shouldYieldTurn(7, 2)).toBe(true);
    expect(shouldYieldTurn(0, 0)).toBe(true);
  });

  it("a sliced request picks the same pod with the same decision inputs as one run back to back", async () => {
    const plain = director();
    const a = (await plain.d.route(large)) as RoutedRequest;
    const turns = new ManualTurns(0);
    const log: string[] = [];
    const sliced = director(turns, log);
    const p = sliced.d.route(large);
    await turns.drain();
    const b = (await p) as RoutedRequest;
    expect(turns.yields).toBeGreaterThan(3);
    expect(b.pod.pod).toBe(a.pod.pod);
    expect(b.pod.pod).toBe("p1");
    expect(b.inputs).toEqual(a.inputs);
    // The block hashes are computed in the tokenize stage's own turn, before select matches.
    expect(log.slice(0, 2)).toEqual(["blocks", "match"]);
  });

  it("a short request routed while a large one is parked between its slices is answered first", async () => {
    // A budget no short stage reaches: the large request yields after its awaiting stage (tokenize).
    const turns = new ManualTurns(60_000);
    const { d } = director(turns);
    const order: string[] = [];
    const big = Promise.resolve(d.route(large)).then((r) => {
      order.push("large");
      return r;
    });
    // The large request has its ids and has handed the loop back: it waits at a yield.
    for (let i = 0; i < 100 && turns.parked.length === 0; i++) await new Promise((r) => setImmediate(r));
    expect(turns.parked.length).toBe(1);
    const s = Promise.resolve(d.route(short)).then((r) => {
      order.push("short");
      return r;
    });
    const sr = await s;
    expect(sr.pod.model).toBe(MODEL);
    expect(order).toEqual(["short"]);
    await turns.drain();
    await big;
    expect(order).toEqual(["short", "large"]);
  });

  it("with slicing on, a short request never hands the loop back (no yield after its awaiting stage)", async () => {
    const turns = new ManualTurns(60_000);
    const { d } = director(turns);
    const r = (await d.route(short)) as RoutedRequest;
    expect(r.pod.model).toBe(MODEL);
    expect(turns.parked.length).toBe(0);
  });

  it("without slicing a request with no awaiting stage stays synchronous", () => {
    const { d } = director();
    expect(d.route(short)).not.toBeInstanceOf(Promise);
  });
});
