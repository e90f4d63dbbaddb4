/**
 * Incremental rendering of message-local templates (services/tokenizer/message-local.ts,
 * incremental-render.ts): which templates qualify, and that a later turn rendered from the
 * previous turn's pieces is exactly the full render, on the real Llama-3 template (qualifies) —
 * with tools, tool calls and an edited history; Qwen3's (does not) takes the windowed path.
 */
import { Template } from "@huggingface/jinja";
import { describe, expect, it } from "vitest";
import { loadHfTokenizerDir } from "../services/gateway/tokenization.js";
import { IncrementalRender } from "../services/tokenizer/incremental-render.js";
import { messageLocalLoop } from "../services/tokenizer/message-local.js";
import { AGENT_SESSION_DEFAULTS, AGENT_TOOLS, AgentSession } from "../loadtest/workloads/agent-sessions.js";
import { readConfig, tokenizerDir } from "./harness/real-tokenizers.js";

const local = (src: string) => messageLocalLoop(new Template(src).parsed);
const small = { ...AGENT_SESSION_DEFAULTS, systemChars: 600, userChars: 100, toolResultChars: [80, 400] as const, answerChars: 120, toolCallsPerTask: [1, 2] as const };

describe("message-local templates", () => {
  it("the real templates: Llama-3's is message-local, Qwen3's is not", () => {
    expect(local(readConfig("llama3").chat_template as string)).toMatchObject({ at: 1, iterableNames: ["messages", "loop_messages"] });
    expect(typeof local(readConfig("qwen3").chat_template as string)).toBe("string");
  });

  it("accepts a loop whose pieces depend on their message and on being first only", () => {
    expect(typeof local("{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{{ m.role + ': ' + m.content | trim }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}")).toBe("object");
    expect(typeof local("{{ bos_token }}{% for m in messages %}{% set c = m.content %}{% if loop.index == 1 %}{% set c = c | upper %}{% endif %}{{ c }}{% for t in m.tool_calls or [] %}{{ loop.index0 }}{{ t | tojson }}{% endfor %}{% endfor %}")).toBe("object");
  });

  it.each([
    ["the last message", "{% for m in messages %}{{ m.content }}{% if not loop.last %},{% endif %}{% endfor %}"],
    ["the message count", "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages | length }}"],
    ["a neighbour", "{% for m in messages %}{{ m.content }}{% if messages[loop.index0 - 1].role == 'tool' %}!{% endif %}{% endfor %}"],
    ["the position as a number", "{% for m in messages %}{{ loop.index0 }}{{ m.content }}{% endfor %}"],
    ["state across iterations (namespace)", "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}"],
    ["a value set in an earlier iteration", "{% for m in messages %}{% if m.role == 'user' %}{% set last = m.content %}{% endif %}{{ last }}{% endfor %}"],
    ["a value set before the loop", "{% set sep = '|' %}{% for m in messages %}{{ m.content }}{{ sep }}{% endfor %}"],
    ["a value the loop set, after it", "{% for m in messages %}{% set x = m.content %}{% endfor %}{{ x }}"],
    ["two loops over messages", "{% for m in messages %}{{ m.role }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"],
    ["a macro", "{% macro f(x) %}{{ x }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}"],
    ["break", "{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{{ m.content }}{% endfor %}"],
  ])("refuses a template that reads %s", (_what, src) => {
    expect(typeof local(src)).toBe("string");
  });

  it("the split render equals the full render for a simple template, turn by turn, and reuses pieces", () => {
    const src = "{{ bos_token }}{% set msgs = messages %}{% for m in msgs %}{% if loop.first %}[first]{% endif %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    const where = local(src);
    if (typeof where === "string") throw new Error(where);
    const inc = new IncrementalRender(src, where, 1 << 20);
    const full = new Template(src);
    const msgs: Record<string, unknown>[] = [{ role: "system", content: " s " }];
    for (let t = 0; t < 6; t++) {
      msgs.push({ role: t % 2 ? "assistant" : "user", content: `turn ${t} ` });
      const ctx = { bos_token: "<s>", add_generation_prompt: t % 3 !== 0, messages: msgs.slice() };
      expect(inc.render("default", ctx)).toBe(full.render(ctx));
    }
    expect(inc.stats.hits).toBeGreaterThan(0);
  });

  it("pre and post are kept with the conversation's entry (rendered once per context), unless the template reads the clock", () => {
    const src = "{{ bos_token }}{% if tools %}[tools {{ tools | length }}]{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    const clock = src.replace("{{ bos_token }}", "{{ bos_token }}{% if false %}{{ strftime_now('%d') }}{% endif %}");
    for (const [template, rendersPerTurn] of [[src, 0], [clock, 2]] as const) {
      const where = local(template);
      if (typeof where === "string") throw new Error(where);
      const inc = new IncrementalRender(template, where, 1 << 20);
      const full = new Template(template);
      let edgeRenders = 0;
      for (const part of ["pre", "post"] as const) {
        const t = (inc as unknown as Record<string, Template>)[part] as Template;
        const render = t.render.bind(t);
        t.render = (c) => {
          edgeRenders++;
          return render(c);
        };
      }
      const msgs: Record<string, unknown>[] = [{ role: "system", content: "s" }];
      for (let turn = 0; turn < 6; turn++) {
        msgs.push({ role: turn % 2 ? "assistant" : "user", content: `turn ${turn}` });
        // A change of tools or add_generation_prompt is another context (another entry): edges rendered again.
        const ctx = { bos_token: "<s>", tools: turn < 3 ? null : [{ a: 1 }, { b: 2 }], add_generation_prompt: turn !== 4, messages: msgs.slice() };
        const before = edgeRenders;
        expect(inc.render("default", ctx)).toBe(full.render(ctx));
        if (turn > 0 && turn !== 3 && turn !== 4 && turn !== 5) expect(edgeRenders - before).toBe(rendersPerTurn);
      }
    }
  });
});

describe("incremental render on the real Llama-3 template", () => {
  it("every request of agent sessions renders exactly as the full template, reusing earlier turns", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("llama3"), { renderThreads: 0 });
    const whole = loadHfTokenizerDir(tokenizerDir("llama3"), { renderThreads: 0, renderCacheBytes: 0 });
    expect(t.notMessageLocal.size).toBe(0);
    for (let s = 0; s < 4; s++) {
      const session = new AgentSession({ ...small, seed: 40 + s });
      for (let step = 0; step < 12; step++) {
        const messages = session.next().slice();
        const o = s % 2 ? { tools: AGENT_TOOLS } : {};
        expect(await t.renderChatOffLoop(messages, o)).toBe(whole.renderChat(messages, o));
        expect(await t.chatIds(messages, o)).toEqual(await whole.chatIds(messages, o));
      }
    }
    // Both calls per request render: the second of each pair reuses all messages.
    expect(t.renderStats?.hits).toBeGreaterThan(4 * 12);
    expect(t.renderStats?.entries).toBe(4);
    await Promise.all([t.close(), whole.close()]);
  });

  it("an edited earlier message, a shorter history, another add_generation_prompt: rendered whole, same text", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("llama3"), { renderThreads: 0 });
    const session = new AgentSession({ ...small, seed: 77 });
    let messages = session.next().slice();
    for (let i = 0; i < 6; i++) messages = session.next().slice();
    await t.renderChatOffLoop(messages);
    const edited = messages.map((m, i) => (i === 3 ? { ...m, content: `${String(m.content)} (edited)` } : m));
    const misses = t.renderStats?.misses ?? 0;
    expect(await t.renderChatOffLoop(edited)).toBe(t.renderChat(edited));
    expect(await t.renderChatOffLoop(messages.slice(0, 4))).toBe(t.renderChat(messages.slice(0, 4)));
    expect(await t.renderChatOffLoop(messages, { addGenerationPrompt: false })).toBe(t.renderChat(messages, { addGenerationPrompt: false }));
    expect(t.renderStats?.misses).toBeGreaterThanOrEqual(misses + 2);
    await t.close();
  });

  it("Qwen3 is not message-local: it renders through the windowed path (test/window-render.test.ts)", async () => {
    const t = loadHfTokenizerDir(tokenizerDir("qwen3"), { renderThreads: 0 });
    expect([...t.notMessageLocal.keys()]).toEqual(["default"]);
    expect(t.rendersWhole.size).toBe(0);
    expect([...t.windowStats().keys()]).toEqual(["default"]);
    await t.close();
  });
});
