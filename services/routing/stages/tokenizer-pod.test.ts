import { describe, expect, it } from "vitest";
import { bodyKey, tokenizerPodFor } from "./tokenizer-pod.js";

const pods = (n: number) => Array.from({ length: n }, (_, i) => ({ pod: `vllm-${i}` }));
const bodies = (n: number) => Array.from({ length: n }, (_, i) => Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: `question ${i}` }] })));

describe("tokenizerPodFor - remote tokenization spread over the model's pods", () => {
  it("spreads distinct prompts over every pod, not the alphabetically first", () => {
    const counts = new Map<string, number>();
    for (const b of bodies(4_000)) {
      const p = tokenizerPodFor(pods(4), bodyKey(b))?.pod as string;
      counts.set(p, (counts.get(p) ?? 0) + 1);
    }
    expect([...counts.keys()].sort()).toEqual(["vllm-0", "vllm-1", "vllm-2", "vllm-3"]);
    for (const n of counts.values()) expect(n / 4_000).toBeGreaterThan(0.2);
  });

  it("the same prompt goes to the same pod whatever the order the pods are listed in", () => {
    for (const b of bodies(50)) {
      const k = bodyKey(b);
      expect(tokenizerPodFor(pods(5), k)?.pod).toBe(tokenizerPodFor([...pods(5)].reverse(), k)?.pod);
    }
  });

  it("a pod leaving moves only the prompts it had", () => {
    const all = pods(5);
    const without = all.filter((p) => p.pod !== "vllm-2");
    for (const b of bodies(500)) {
      const k = bodyKey(b);
      const before = tokenizerPodFor(all, k)?.pod;
      const after = tokenizerPodFor(without, k)?.pod;
      if (before !== "vllm-2") expect(after).toBe(before);
    }
  });

  it("no pod: none", () => {
    expect(tokenizerPodFor([], 1)).toBeUndefined();
  });
});
