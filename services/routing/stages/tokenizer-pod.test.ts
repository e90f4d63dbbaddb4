import { describe, expect, it } from "vitest";
import { pod as podOf } from "../strategies/testing.js";
import { tokenizerPodFor } from "./tokenizer-pod.js";

const pods = (n: number) => Array.from({ length: n }, (_, i) => podOf(`vllm-${i}`));
const bodies = (n: number) => Array.from({ length: n }, (_, i) => Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: `question ${i}` }] })));

describe("tokenizerPodFor - remote tokenization spread over the model's pods", () => {
  it("spreads distinct prompts over every pod, not the alphabetically first", () => {
    const counts = new Map<string, number>();
    for (const b of bodies(4_000)) {
      const p = tokenizerPodFor(pods(4), b)?.pod as string;
      counts.set(p, (counts.get(p) ?? 0) + 1);
    }
    expect([...counts.keys()].sort()).toEqual(["vllm-0", "vllm-1", "vllm-2", "vllm-3"]);
    for (const n of counts.values()) expect(n / 4_000).toBeGreaterThan(0.2);
  });

  it("the same prompt goes to the same pod whatever the order the pods are listed in", () => {
    for (const b of bodies(50)) {
      expect(tokenizerPodFor(pods(5), b)?.pod).toBe(tokenizerPodFor([...pods(5)].reverse(), b)?.pod);
    }
  });

  it("a pod leaving moves only the prompts it had", () => {
    const all = pods(5);
    const without = all.filter((p) => p.pod !== "vllm-2");
    for (const b of bodies(500)) {
      const before = tokenizerPodFor(all, b)?.pod;
      const after = tokenizerPodFor(without, b)?.pod;
      if (before !== "vllm-2") expect(after).toBe(before);
    }
  });

  it("no pod: none", () => {
    expect(tokenizerPodFor([], Buffer.from("{}"))).toBeUndefined();
  });
});
