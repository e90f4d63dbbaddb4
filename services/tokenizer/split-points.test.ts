import { describe, expect, it } from "vitest";
import { BoundedQueue, QueueFullError } from "./bounded-queue.js";
import { ByteLru } from "./byte-lru.js";
import { planSplits, SplitPoints } from "./split-points.js";

const tok = (id: number, content: string, extra: Record<string, boolean> = {}) => ({ id, content, normalized: false, special: true, ...extra });

describe("split points", () => {
  it("cuts after raw-matched added tokens that nothing overlaps", () => {
    const plan = planSplits({ added_tokens: [tok(1, "<|im_start|>"), tok(2, "<|im_end|>")], pre_tokenizer: { type: "ByteLevel" } });
    expect(plan.boundaryTokens).toEqual(["<|im_start|>", "<|im_end|>"]);
    const text = "<|im_start|>user\nhi<|im_end|>\n";
    expect(new SplitPoints(plan).of(text)).toEqual([12, 29]);
  });

  it("refuses tokens whose match depends on what follows, or that another token contains or overlaps", () => {
    const plan = planSplits({
      added_tokens: [
        tok(1, "<a>", { rstrip: true }),
        tok(2, "<b>", { single_word: true }),
        tok(3, "<c>"),
        tok(4, "<c>x"), // contains <c>
        tok(5, "<d>"),
        tok(6, ">y"), // overlaps the end of <d>
        tok(7, "<e>", { normalized: true }),
        tok(8, "[f]"),
      ],
      pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Split" }, { type: "ByteLevel" }] },
    });
    expect(plan.boundaryTokens).toEqual(["<c>x", "[f]"]);
  });

  it("no cuts when a pre-tokenizer depends on the piece's position", () => {
    const first = planSplits({ added_tokens: [tok(1, "<s>")], pre_tokenizer: { type: "Metaspace", prepend_scheme: "first" } });
    expect(first.boundaryTokens).toEqual([]);
    expect(first.unsafe).toMatch(/prepend_scheme/);
    expect(new SplitPoints(first).of("<s>a<s>b")).toEqual([]);
    expect(planSplits({ added_tokens: [tok(1, "<s>")], pre_tokenizer: { type: "Metaspace", prepend_scheme: "always" } }).boundaryTokens).toEqual(["<s>"]);
    expect(planSplits({ added_tokens: [tok(1, "<s>")], pre_tokenizer: { type: "SomethingNew" } }).unsafe).toMatch(/not known/);
  });
});

describe("byte-bounded LRU", () => {
  it("evicts the least recently used to stay within its bytes, and never stores an entry over the bound", () => {
    const lru = new ByteLru<string>(100);
    expect(lru.set("a", "A", 40)).toBe(true);
    lru.set("b", "B", 40);
    expect(lru.get("a")).toBe("A"); // b is now the least recently used
    lru.set("c", "C", 40);
    expect(lru.has("b")).toBe(false);
    expect([lru.has("a"), lru.has("c"), lru.bytes, lru.evicted]).toEqual([true, true, 80, 1]);
    expect(lru.set("huge", "H", 101)).toBe(false);
    expect(lru.size).toBe(2);
  });
});

describe("bounded queue", () => {
  it("runs at most `concurrency` jobs, queues up to `maxQueued`, refuses the rest at once", async () => {
    const q = new BoundedQueue(1, 1);
    const gates: Array<() => void> = [];
    const job = () => new Promise<number>((resolve) => gates.push(() => resolve(gates.length)));
    const a = q.run(job);
    const b = q.run(job);
    await expect(q.run(job)).rejects.toBeInstanceOf(QueueFullError);
    expect([q.active, q.queued, q.refused]).toEqual([1, 1, 1]);
    gates[0]?.();
    await a;
    for (let i = 0; i < 50 && gates.length < 2; i++) await Promise.resolve();
    gates[1]?.();
    await b;
    expect([q.active, q.queued]).toEqual([0, 0]);
  });
});
