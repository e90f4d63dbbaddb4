/**
 * Work proportional to the turn: a later request of a conversation reuses the ids and the block
 * hashes its earlier requests produced, and the result is exactly the full path's (render +
 * whole-text encode + every block hashed), on the real Qwen3 and Llama-3 files, on agent sessions
 * with tools, tool calls and reasoning. Qwen3 strips the reasoning of assistant turns before the
 * last user query, so the rendering of earlier messages changes when a new task arrives: the
 * previous render is then no prefix of the new one, and the cache must fall back to the longest
 * prefix that still matches.
 */
import { describe, expect, it } from "vitest";
import { loadHfTokenizerDir, Tokenizer } from "../services/gateway/tokenization.js";
import { IncrementalBlockHashes } from "../services/gateway/prefix-support.js";
import { prefixEntryBytes } from "../services/tokenizer/prefix-ids.js";
import { SplitPoints } from "../services/tokenizer/split-points.js";
import type { ChatMessage } from "../services/tokenizer/sim-tokenizer.js";
import { chainSeed, promptBlockHashes } from "../services/views/block-hash.js";
import { AGENT_SESSION_DEFAULTS, AGENT_TOOLS, AgentSession } from "../loadtest/workloads/agent-sessions.js";
import { REAL_MODELS, tokenizerDir } from "./harness/real-tokenizers.js";

const small = { ...AGENT_SESSION_DEFAULTS, systemChars: 800, userChars: 120, toolResultChars: [100, 600] as const, answerChars: 150, toolCallsPerTask: [1, 3] as const };

describe.each(REAL_MODELS)("incremental ids and block hashes, %s", (model) => {
  it("every request of agent sessions (tools, tool calls, reasoning) gets the full path's ids and hashes", async () => {
    const cached = new Tokenizer({ modes: { m: `hf:${tokenizerDir(model)}` }, hf: { renderThreads: 0 } });
    const whole = loadHfTokenizerDir(tokenizerDir(model), { prefixCacheBytes: 0, renderThreads: 0 });
    const hashes = new IncrementalBlockHashes();
    const seed = chainSeed("m", null, 16);
    let requests = 0;
    for (let s = 0; s < 6; s++) {
      const session = new AgentSession({ ...small, seed: 100 + s, thinkingChars: s % 2 === 0 ? 80 : 0 });
      for (let step = 0; step < 14; step++) {
        const messages = session.next().slice();
        const opts = s % 3 === 2 ? {} : { tools: AGENT_TOOLS };
        const r = await cached.tokenize("m", { messages: messages as ChatMessage[], ...(opts.tools ? { tools: opts.tools } : {}), addGenerationPrompt: true, addSpecialTokens: false }, undefined);
        expect(r.mode).toBe("hf");
        const expected = await whole.chatIds(messages, opts);
        expect(r.tokens).toEqual(expected);
        const h = hashes.hashes(r.tokens, seed, 16, 8192, cached.prefixReuseOf(r.tokens));
        expect(h).toEqual(promptBlockHashes(expected, seed, 16));
        requests++;
      }
    }
    const st = [...cached.hfTokenizers().values()][0]?.prefixStats;
    expect(requests).toBe(84);
    // All but the first request with and the first without tools reuse a prefix (a session's first
    // request reuses the shared system prompt).
    expect(st?.hits).toBeGreaterThanOrEqual(requests - 2);
    expect(st?.unaligned).toBe(0);
    // Most later turns found their conversation's tail by its anchor, compared as text (no digest
    // of the whole prompt): the path this test checks against the full path's ids.
    expect(st?.anchoredHits).toBeGreaterThan(requests / 2);
    // Most blocks came from earlier requests.
    expect(hashes.stats.reusedBlocks).toBeGreaterThan(hashes.stats.hashedBlocks);
    // One tail entry per conversation (plus the system prompt, rendered with and without tools):
    // earlier turns' entries were superseded, also where Qwen3 re-rendered earlier reasoning.
    expect(st?.entries).toBeLessThanOrEqual(6 + 2);
    expect(st?.superseded).toBeGreaterThan(60);
    await cached.close();
    await whole.close();
  });

  it("the block hashes of a reused prefix are those of its own ids, whatever seed and block size", async () => {
    const t = loadHfTokenizerDir(tokenizerDir(model), { renderThreads: 0 });
    const hashes = new IncrementalBlockHashes();
    const session = new AgentSession({ ...small, seed: 7 });
    for (let step = 0; step < 8; step++) {
      const ids = await t.chatIds(session.next().slice());
      // Alternate block sizes and a salted seed: each (seed, size) keeps its own chain.
      for (const [seed, size] of [[chainSeed("m", null, 16), 16], [chainSeed("m", null, 32), 32], [chainSeed("m", null, 16, "salt"), 16]] as const) {
        expect(hashes.hashes(ids, seed, size, 8192, t.prefixReuseOf(ids))).toEqual(promptBlockHashes(ids, seed, size));
      }
      // maxBlocks cuts the chain where the full path cuts it.
      expect(hashes.hashes(ids, chainSeed("m", null, 16), 16, 5, t.prefixReuseOf(ids))).toEqual(promptBlockHashes(ids, chainSeed("m", null, 16), 16, 5));
    }
    await t.close();
  });
});

describe("split points: the first-character scan finds what the plain regex finds", () => {
  it.each(REAL_MODELS)("%s", (model) => {
    const t = loadHfTokenizerDir(tokenizerDir(model), { renderThreads: 0 });
    const splits = new SplitPoints(t.splitPlan);
    const escapeRe = (x: string) => x.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    const re = new RegExp([...t.splitPlan.boundaryTokens].sort((a, b) => b.length - a.length).map(escapeRe).join("|"), "g");
    const session = new AgentSession({ ...small, seed: 5 });
    for (let step = 0; step < 10; step++) {
      const text = `<|<${t.renderChat(session.next().slice())}<|im_end|<|eot_id|<`;
      // A scan from any offset finds the cuts at or after it that the whole scan finds.
      const all = splits.of(text);
      for (const from of [0, 1, 7, Math.floor(text.length / 3), ...all.slice(0, 5).flatMap((c) => [c - 3, c - 1, c, c + 1]), text.length]) {
        expect(splits.of(text, from)).toEqual(all.filter((c) => c >= from));
        expect(splits.of(text, from, 1)).toEqual(all.filter((c) => c >= from).slice(0, 1));
      }
      expect(splits.of(text)).toEqual([...text.matchAll(re)].map((m) => (m.index as number) + m[0].length));
    }
    void t.close();
  });
});

describe("incremental ids: fallback and bounds", () => {
  it("Qwen3: when a new task strips earlier reasoning, the previous render is no prefix and the reuse falls back to the longest prefix that still matches", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("qwen3"), { renderThreads: 0 });
    const whole = loadHfTokenizerDir(tokenizerDir("qwen3"), { prefixCacheBytes: 0, renderThreads: 0 });
    const session = new AgentSession({ ...small, seed: 11, thinkingChars: 200, toolCallsPerTask: [2, 2] });
    let previous = "";
    let notPrefix = 0;
    for (let step = 0; step < 12; step++) {
      const messages = session.next().slice();
      const text = t.renderChat(messages);
      const before = t.prefixStats?.reusedChars ?? 0;
      expect(await t.chatIds(messages)).toEqual(await whole.chatIds(messages));
      const reused = (t.prefixStats?.reusedChars ?? 0) - before;
      if (previous !== "" && !text.startsWith(previous.slice(0, previous.lastIndexOf("<|im_start|>assistant")))) {
        notPrefix++;
        // Fell back: reused less than the previous prompt — the longest cached prefix that still
        // matches, here the shared system prompt's entry (only tails and named cuts are cached).
        expect(reused).toBeLessThan(previous.length);
        expect(reused).toBeGreaterThan(String(messages[0]?.content).length);
      }
      previous = text;
    }
    // The session had new tasks after reasoning turns: the case happened.
    expect(notPrefix).toBeGreaterThan(0);
    await Promise.all([t.close(), whole.close()]);
  });

  it.each(REAL_MODELS)("%s: an edited history (same first task) does not reuse the anchored tail; ids stay the full path's", async (model) => {
    const t = loadHfTokenizerDir(tokenizerDir(model), { renderThreads: 0 });
    const whole = loadHfTokenizerDir(tokenizerDir(model), { prefixCacheBytes: 0, renderThreads: 0 });
    const session = new AgentSession({ ...small, seed: 21 });
    let messages = session.next().slice();
    for (let step = 0; step < 8; step++) {
      messages = session.next().slice();
      expect(await t.chatIds(messages)).toEqual(await whole.chatIds(messages));
    }
    const st = t.prefixStats as NonNullable<typeof t.prefixStats>;
    // Same system prompt and first task (the anchor), a message after it edited by one character.
    const edited = messages.map((m, i) => (i === 3 && typeof m.content === "string" ? { ...m, content: `${m.content.slice(0, 10)}X${m.content.slice(11)}` } : m));
    expect(edited[3]).not.toEqual(messages[3]);
    const anchored = st.anchoredHits;
    expect(await t.chatIds(edited)).toEqual(await whole.chatIds(edited));
    expect(st.anchoredHits).toBe(anchored);
    // Its tail replaced the conversation's: the original history extends no tail now, and is still exact.
    expect(await t.chatIds(messages)).toEqual(await whole.chatIds(messages));
    expect(st.anchoredHits).toBe(anchored);
    // And the next turn of the edited history extends the edited tail.
    const next = [...edited, { role: "user", content: "and then?" }];
    expect(await t.chatIds(next)).toEqual(await whole.chatIds(next));
    await Promise.all([t.close(), whole.close()]);
  });

  it("a tail reused for a prompt it is no prefix of would give other ids: the full-path comparison catches it", async () => {
    // Mutation: the conversation's tail is made to claim the text of an edited history (same
    // length, one character changed) while keeping the original's ids; the edited prompt then
    // reuses them, and its ids must differ from the full path's, or the comparisons above could not
    // catch a reuse without a true text match.
    const t = loadHfTokenizerDir(tokenizerDir("llama3"), { renderThreads: 0 });
    const whole = loadHfTokenizerDir(tokenizerDir("llama3"), { prefixCacheBytes: 0, renderThreads: 0 });
    const session = new AgentSession({ ...small, seed: 22 });
    let messages = session.next().slice();
    for (let step = 0; step < 5; step++) {
      messages = session.next().slice();
      await t.chatIds(messages);
    }
    const edited = messages.map((m, i) => (i === 3 && typeof m.content === "string" ? { ...m, content: `${m.content.slice(0, 10)}X${m.content.slice(11)}` } : m));
    const lru = (t as unknown as { prefixes: { lru: { map: Map<string, { value: { text?: string } }> } } }).prefixes.lru;
    const tail = [...lru.map.values()].find((e) => e.value.text !== undefined) as { value: { text: string } };
    const editedText = t.renderChat(edited);
    tail.value = { ...tail.value, text: editedText.slice(0, tail.value.text.length) };
    const anchored = t.prefixStats?.anchoredHits ?? 0;
    expect(await t.chatIds(edited)).not.toEqual(await whole.chatIds(edited));
    expect(t.prefixStats?.anchoredHits).toBe(anchored + 1);
    await Promise.all([t.close(), whole.close()]);
  });

  it("a conversation holds one entry of 8 bytes a token, and the cache stays within its byte bound", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("llama3"), { renderThreads: 0 });
    const session = new AgentSession({ ...small, seed: 3 });
    let ids: Uint32Array = new Uint32Array(0);
    for (let step = 0; step < 20; step++) ids = await t.chatIds(session.next().slice());
    const st = t.prefixStats;
    // The system prompt's entry and the conversation's latest tail entry (8 bytes a token and its
    // text, a byte a character: the text is ASCII).
    expect(st?.entries).toBe(2);
    const text = t.renderChat(session.messages.slice());
    expect(st?.bytes).toBeLessThanOrEqual(prefixEntryBytes(ids.length, text.length) + prefixEntryBytes(ids.length / 4));
    const bounded = loadHfTokenizerDir(tokenizerDir("llama3"), { prefixCacheBytes: 32 * 1024, renderThreads: 0 });
    for (let s = 0; s < 12; s++) {
      const other = new AgentSession({ ...small, seed: 50 + s });
      for (let step = 0; step < 6; step++) await bounded.chatIds(other.next().slice());
      expect(bounded.prefixStats?.bytes).toBeLessThanOrEqual(32 * 1024);
    }
    expect(bounded.prefixStats?.evicted).toBeGreaterThan(0);
    await Promise.all([t.close(), bounded.close()]);
  });
});
