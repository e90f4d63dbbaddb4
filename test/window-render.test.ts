/**
 * Windowed rendering (services/tokenizer/window-loop.ts, window-render.ts): templates whose message
 * loop reads more than its own message — Qwen3's reads the last user query's position, its
 * neighbours' roles and whether a message is the last — render a later turn from the previous
 * turn's pieces, exactly: every request of agent sessions (tools, tool calls, reasoning, new tasks
 * that change which assistant turns keep their reasoning) is compared with the full render and,
 * through the tokenizer, with the full path's ids; edited histories and templates that carry
 * values across iterations fall back to the full render with the same text.
 */
import { Template } from "@huggingface/jinja";
import { describe, expect, it } from "vitest";
import { loadHfTokenizerDir } from "../services/gateway/tokenization.js";
import { WindowRender } from "../services/tokenizer/window-render.js";
import { windowLoop } from "../services/tokenizer/window-loop.js";
import { AGENT_SESSION_DEFAULTS, AGENT_TOOLS, AgentSession } from "../loadtest/workloads/agent-sessions.js";
import { readConfig, tokenizerDir } from "./harness/real-tokenizers.js";

const small = { ...AGENT_SESSION_DEFAULTS, systemChars: 600, userChars: 100, toolResultChars: [80, 400] as const, answerChars: 120, toolCallsPerTask: [1, 3] as const };
const win = (src: string) => windowLoop(new Template(src).parsed);
const windowed = (src: string) => {
  const parsed = new Template(src).parsed;
  const where = windowLoop(parsed);
  if (typeof where === "string") throw new Error(where);
  return new WindowRender(parsed, where, 1 << 22);
};

/** Renders turn after turn with a windowed renderer and the full template; both must agree on every turn. */
function turnByTurn(src: string, turns: Record<string, unknown>[][], extra: Record<string, unknown> = {}): WindowRender {
  const w = windowed(src);
  const full = new Template(src);
  for (const messages of turns) {
    const ctx = { bos_token: "<s>", add_generation_prompt: true, ...extra, messages };
    expect(w.render("default", ctx)).toBe(full.render(ctx));
  }
  return w;
}

const grow = (n: number) => Array.from({ length: n }, (_, i) => Array.from({ length: i + 1 }, (_, j) => ({ role: j % 3 === 0 ? "user" : j % 3 === 1 ? "assistant" : "tool", content: `m${j}` })));

describe("windowed templates", () => {
  it("the real Qwen3 template qualifies; its reads of the context are found", () => {
    const w = win(readConfig("qwen3").chat_template as string);
    if (typeof w === "string") throw new Error(w);
    expect(w.loopvar).toBe("message");
    expect(w.tracked.size).toBeGreaterThanOrEqual(5);
    expect(w.locals).toEqual(new Set(["message", "content", "reasoning_content", "tool_call"]));
  });

  it.each([
    ["the last message", "{% for m in messages %}{{ m.content }}{% if not loop.last %},{% endif %}{% endfor %}"],
    ["a neighbour", "{% for m in messages %}{{ m.content }}{% if messages[loop.index0 - 1].role == 'tool' %}!{% endif %}{% endfor %}"],
    ["the position as a number", "{% for m in messages %}{{ loop.index0 }}{{ m.content }}{% endfor %}{{ messages | length }}"],
    ["a value computed before the loop", "{% set ns = namespace(q=-1) %}{% for m in messages[::-1] %}{% if m.role == 'user' and ns.q == -1 %}{% set ns.q = (messages|length - 1) - loop.index0 %}{% endif %}{% endfor %}{% for m in messages %}{% if loop.index0 > ns.q %}[after]{% endif %}{{ m.content }}{% endfor %}"],
  ])("renders exactly, turn by turn, a template that reads %s", (_what, src) => {
    const w = turnByTurn(src, grow(9));
    // The first two turns are misses (a conversation is known by its first two messages).
    expect(w.stats.hits).toBe(7);
    expect(w.stats.reusedPieces).toBeGreaterThan(0);
  });

  it("re-renders the pieces whose context reads changed (the last message, a neighbour), reuses the rest", () => {
    const src = "{% for m in messages %}<{{ m.content }}{% if loop.last %} last{% endif %}{% if messages[loop.index0 + 1].role == 'tool' %} next-tool{% endif %}>{% endfor %}";
    const w = turnByTurn(src, grow(12));
    // From the third turn (the first two are misses), each renders the new message and the previous last one again.
    expect(w.stats.renderedPieces).toBe(2 * 10);
    expect(w.stats.reusedPieces).toBe((10 * 11) / 2);
  });

  it.each([
    ["attribute assignment in the loop", "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}"],
    ["break", "{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{{ m.content }}{% endfor %}"],
    ["a macro", "{% macro f(x) %}{{ x }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}"],
    ["reassigned messages", "{% set messages = messages[1:] %}{% for m in messages %}{{ m.content }}{% endfor %}"],
    ["strftime_now of the message", "{% for m in messages %}{{ strftime_now(m.content) }}{% endfor %}"],
  ])("refuses %s", (_what, src) => {
    expect(typeof win(src)).toBe("string");
  });

  it("a value set in an earlier iteration: gives up (the caller renders whole)", () => {
    const src = "{% for m in messages %}{% if m.role == 'user' %}{% set last = m.content %}{% endif %}{{ last }}{% endfor %}";
    const w = windowed(src);
    const messages = [{ role: "user", content: "a" }, { role: "assistant", content: "b" }];
    expect(w.render("default", { messages })).toBeUndefined();
    expect(w.stats.failed).toBe(1);
    expect(w.has("default", { messages })).toBe(false);
  });
});

describe("windowed render on the real Qwen3 template", () => {
  it("every request of agent sessions (tools, tool calls, reasoning) renders and encodes exactly as the full path", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("qwen3"), { renderThreads: 0 });
    const whole = loadHfTokenizerDir(tokenizerDir("qwen3"), { renderThreads: 0, renderCacheBytes: 0, prefixCacheBytes: 0 });
    expect(t.rendersWhole.size).toBe(0);
    expect([...t.notMessageLocal.keys()]).toEqual(["default"]);
    for (let s = 0; s < 6; s++) {
      const session = new AgentSession({ ...small, seed: 60 + s, thinkingChars: s % 2 === 0 ? 60 : 0 });
      for (let step = 0; step < 14; step++) {
        const messages = session.next().slice();
        const o = s % 3 === 2 ? { templateKwargs: { enable_thinking: false } } : { tools: AGENT_TOOLS };
        expect(await t.renderChatOffLoop(messages, o)).toBe(whole.renderChat(messages, o));
        expect(await t.chatIds(messages, o)).toEqual(await whole.chatIds(messages, o));
      }
    }
    const st = t.windowStats().get("default");
    expect(st?.failed).toBe(0);
    expect(st?.hits).toBeGreaterThan(6 * 14);
    expect(st?.reusedPieces).toBeGreaterThan(10 * (st?.renderedPieces ?? 0));
    expect(st?.entries).toBe(6);
    await Promise.all([t.close(), whole.close()]);
  });

  it("an edited earlier message, a shorter history, no generation prompt: same text as the full render", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("qwen3"), { renderThreads: 0 });
    const session = new AgentSession({ ...small, seed: 91, thinkingChars: 50 });
    let messages = session.next().slice();
    for (let i = 0; i < 8; i++) messages = session.next().slice();
    await t.renderChatOffLoop(messages, { tools: AGENT_TOOLS });
    const edited = messages.map((m, i) => (i === 3 ? { ...m, content: `${String(m.content)} (edited)` } : m));
    for (const [msgs, o] of [
      [edited, { tools: AGENT_TOOLS }],
      [messages.slice(0, 4), { tools: AGENT_TOOLS }],
      [messages, { tools: AGENT_TOOLS, addGenerationPrompt: false }],
      [messages, { tools: AGENT_TOOLS }],
    ] as const) {
      expect(await t.renderChatOffLoop(msgs, o)).toBe(t.renderChat(msgs, o));
    }
    await t.close();
  });

  it("a long first request renders whole on the worker (not seeded on the calling thread)", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("qwen3"), { renderThreads: 0, windowSeedChars: 100 });
    const session = new AgentSession({ ...small, seed: 5 });
    const messages = session.next().slice();
    expect(await t.renderChatOffLoop(messages)).toBe(t.renderChat(messages));
    expect(t.windowStats().get("default")?.entries).toBe(0);
    await t.close();
  });
});
