import { describe, expect, it } from "vitest";
import type { PodInfo } from "../../views/pod-set.js";
import { contextLengthOf, contextRefusal, promptTokensAtLeast } from "./context-length.js";

const pod = (name: string) => ({ model: "m", pod: name }) as unknown as PodInfo;
const load = (lens: Record<string, number | undefined>) => ({ get: (_m: string, p: string) => (p in lens ? { maxModelLen: lens[p] } : undefined) });

describe("context length", () => {
  it("the model's context is the largest its ready pods report, unknown while any of them has not told", () => {
    expect(contextLengthOf([pod("a"), pod("b")], load({ a: 4096, b: 8192 }))).toBe(8192);
    expect(contextLengthOf([pod("a"), pod("b")], load({ a: 4096 }))).toBeUndefined();
    expect(contextLengthOf([pod("a"), pod("b")], load({ a: 4096, b: undefined }))).toBeUndefined();
    expect(contextLengthOf([], load({}))).toBeUndefined();
  });

  it("the prompt's size: the tokenizer's count, a completion's ids, else half the character estimate", () => {
    expect(promptTokensAtLeast({ tokens: new Array(900), tokenizerMode: "remote", parsed: { promptTokens: 100 } })).toBe(900);
    // An approximate tokenization is no better than the estimate.
    expect(promptTokensAtLeast({ tokens: new Array(900), tokenizerMode: "approximate", parsed: { promptTokens: 100 } })).toBe(50);
    expect(promptTokensAtLeast({ parsed: { promptTokens: 300, promptTokenIds: new Array(300).fill(1) } })).toBe(300);
    expect(promptTokensAtLeast({ parsed: { promptTokens: 1_001 } })).toBe(501);
  });

  it("refuses with 400 context_length_exceeded only when the prompt surely exceeds every pod's context", () => {
    const pods = [pod("a"), pod("b")];
    const l = load({ a: 32_768, b: 32_768 });
    // A 3.6 MB chat prompt: ~900k estimated tokens, at least 450k.
    const err = contextRefusal("m", { parsed: { promptTokens: 900_000 } }, pods, l);
    expect(err).toMatchObject({ status: 400, code: "context_length_exceeded", param: "messages" });
    expect(err?.message).toMatch(/maximum context length is 32768 tokens, and the prompt has at least 450000 tokens/);
    // An estimate up to twice the context is let through (the engine decides).
    expect(contextRefusal("m", { parsed: { promptTokens: 65_536 } }, pods, l)).toBeUndefined();
    expect(contextRefusal("m", { tokens: new Array(32_769), tokenizerMode: "hf", parsed: { promptTokens: 10 } }, pods, l)?.code).toBe("context_length_exceeded");
    expect(contextRefusal("m", { tokens: new Array(32_768), tokenizerMode: "hf", parsed: { promptTokens: 10 } }, pods, l)).toBeUndefined();
    expect(contextRefusal("m", { parsed: { promptTokens: 40_000, promptTokenIds: new Array(40_000).fill(1) } }, pods, l)?.param).toBe("prompt");
    // Unknown context: nothing refused.
    expect(contextRefusal("m", { parsed: { promptTokens: 10_000_000 } }, pods, load({ a: 32_768 }))).toBeUndefined();
  });
});
