import { describe, expect, it } from "vitest";
import {
  applyChatTemplate,
  BOS_ID,
  detokenize,
  GENERATION_WORD_IDS,
  GENERATION_WORDS,
  NUM_SPECIAL_IDS,
  SPECIAL_TOKENS,
  splitPieces,
  tokenizeChat,
  tokenizePrompt,
  VOCAB_SIZE,
} from "./sim-tokenizer.js";

const system = { role: "system", content: "You are a terse assistant for the routing team. Answer in one line." };

describe("sim tokenizer", () => {
  it("is deterministic and stays inside the vocabulary", () => {
    const text = "Hello, world! Prefix caching needs stable ids: 42 × 3 = 126. Ünïcödé 文字 🚀";
    const a = tokenizePrompt(text);
    const b = tokenizePrompt(text);
    expect(a).toEqual(b);
    // Pinned values: a change here silently breaks prefix matching between gateway and engines.
    expect(tokenizePrompt("Hello world", { addSpecialTokens: false })).toEqual([23115, 13661]);
    for (const id of a.slice(1)) {
      expect(id).toBeGreaterThanOrEqual(NUM_SPECIAL_IDS);
      expect(id).toBeLessThan(VOCAB_SIZE);
    }
  });

  it("covers every character of the input", () => {
    const text = "  a\tb\n\nc-- ...  long_identifier_without_any_breaks_at_all 文字🚀 <|eot_id|>x";
    expect(splitPieces(text).join("")).toBe(text);
  });

  it("splits long unbroken runs so they cost more than one token", () => {
    expect(tokenizePrompt("a".repeat(60), { addSpecialTokens: false })).toHaveLength(5);
  });

  it("prepends BOS only when special tokens are requested", () => {
    expect(tokenizePrompt("hi")[0]).toBe(BOS_ID);
    expect(tokenizePrompt("hi", { addSpecialTokens: false })).toHaveLength(1);
  });

  it("gives two prompts with a shared prefix an identical token prefix", () => {
    const shared = "Summarise the following incident report for the on-call engineer.\n\n";
    const a = tokenizePrompt(`${shared}The gateway dropped requests.`);
    const b = tokenizePrompt(`${shared}Disk filled up on node 7.`);
    const sharedIds = tokenizePrompt(shared);
    expect(a.slice(0, sharedIds.length)).toEqual(sharedIds);
    expect(b.slice(0, sharedIds.length)).toEqual(sharedIds);
    expect(a[sharedIds.length]).not.toBe(b[sharedIds.length]);
  });

  it("gives conversations that share their first turns an identical token prefix", () => {
    const first = [system, { role: "user", content: "What is a KV cache?" }];
    const a = tokenizeChat([...first, { role: "assistant", content: "Stored keys." }, { role: "user", content: "Why?" }]);
    const b = tokenizeChat([...first, { role: "assistant", content: "Stored keys." }, { role: "user", content: "How big?" }]);
    const prefix = tokenizeChat(first, { addGenerationPrompt: false });
    expect(prefix.length).toBeGreaterThan(20);
    expect(a.slice(0, prefix.length)).toEqual(prefix);
    expect(b.slice(0, prefix.length)).toEqual(prefix);
    expect(a).not.toEqual(b);
  });

  it("applies the chat template with role markers and a generation prompt", () => {
    const text = applyChatTemplate([system, { role: "user", content: [{ type: "text", text: "Hi" }] }]);
    expect(text).toBe(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
        "You are a terse assistant for the routing team. Answer in one line.<|eot_id|>" +
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    );
    const ids = tokenizeChat([{ role: "user", content: "Hi" }]);
    expect(ids[0]).toBe(BOS_ID);
    expect(ids.filter((id) => id === BOS_ID)).toHaveLength(1);
    expect(ids.filter((id) => id === SPECIAL_TOKENS["<|start_header_id|>"])).toHaveLength(2);
    const without = tokenizeChat([{ role: "user", content: "Hi" }], { addGenerationPrompt: false });
    expect(without.at(-1)).toBe(SPECIAL_TOKENS["<|eot_id|>"]);
  });

  it("detokenizes generated words exactly and renders unknown ids deterministically", () => {
    expect(new Set(GENERATION_WORD_IDS).size).toBe(GENERATION_WORDS.length);
    const text = GENERATION_WORDS.slice(0, 5).join("");
    const ids = tokenizePrompt(text, { addSpecialTokens: false });
    expect(ids).toEqual(GENERATION_WORD_IDS.slice(0, 5));
    expect(detokenize(ids)).toBe(text);
    expect(detokenize([BOS_ID, 31999])).toBe("<|begin_of_text|><#31999>");
  });
});
