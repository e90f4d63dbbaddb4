/**
 * A virtual model's rules: what `config set` (and every gateway's fold) refuses, naming the field;
 * signals measured on bounded text, in linear time; decisions by priority with a runner-up.
 */
import { describe, expect, it } from "vitest";
import type { ModelConfig } from "../../../schemas/config.js";
import type { SemanticConfig } from "../../../schemas/semantic.js";
import { validateModelConfig } from "../config-check.js";
import { parseRequestBody } from "../request-body.js";
import { applyAction, classify, decide } from "../stages/semantic.js";
import { compileRules } from "./rules.js";
import { measureSignals, textsOf, wordCosine, wordsOf } from "./signals.js";
import { AUTO, CODER, GENERAL, MATH, putModelConfig, semanticState } from "./testing.js";

const sem = AUTO.semantic as SemanticConfig;
const withSem = (patch: Partial<SemanticConfig>): ModelConfig => ({ semantic: { ...sem, ...patch } });
const body = (content: string, extra: Record<string, unknown> = {}) => parseRequestBody(Buffer.from(JSON.stringify({ model: "auto", messages: [{ role: "user", content }], ...extra })));

describe("semantic rules - refused by config set and by the fold, naming the field", () => {
  it("accepts the reference rules", () => {
    expect(validateModelConfig(AUTO, "auto")).toBeUndefined();
  });

  it.each<[string, ModelConfig, RegExp]>([
    ["an unknown signal in a rule", withSem({ decisions: [{ name: "d", priority: 1, when: { all: ["code", "nope"] }, action: { model: CODER } }] }), /^\/semantic\/decisions\/0\/when\/all\/1: unknown signal "nope"/],
    ["a regex RE2 refuses (backreference)", withSem({ signals: { ...sem.signals, bad: { type: "regex", pattern: "(a)\\1" } } }), /^\/semantic\/signals\/bad\/pattern: not a valid RE2 regular expression/],
    ["a regex RE2 refuses (lookahead)", withSem({ signals: { ...sem.signals, bad: { type: "regex", pattern: "foo(?=bar)" } } }), /^\/semantic\/signals\/bad\/pattern/],
    ["a decision targeting the virtual model itself", withSem({ decisions: [{ name: "loop", priority: 1, when: "code", action: { model: "auto" } }] }), /^\/semantic\/decisions\/0\/action\/model: "auto" targets the virtual model itself \(a cycle\)/],
    ["a default targeting the virtual model itself", withSem({ default: { model: "auto" } }), /^\/semantic\/default\/model: .*cycle/],
    ["a rule nested too deep", withSem({ decisions: [{ name: "deep", priority: 1, when: { not: { not: { not: { not: { not: { not: { not: { not: { not: "code" } } } } } } } } }, action: { model: CODER } }] }), /nest at most 8 levels/],
    ["two decisions with one name", withSem({ decisions: [sem.decisions[0], { ...sem.decisions[1], name: "coding" }] as SemanticConfig["decisions"] }), /^\/semantic\/decisions\/1\/name: "coding" is used/],
    ["a prompt-tokens signal without bounds", withSem({ signals: { ...sem.signals, long: { type: "prompt-tokens" } } }), /^\/semantic\/signals\/long: give gte, lt or both/],
    ["a strategy that does not parse", withSem({ default: { model: GENERAL, routingStrategy: "no-such-strategy" } }), /^\/semantic\/default\/routingStrategy/],
    ["an unknown signal type", withSem({ signals: { x: { type: "sentiment" } } as never }), /^\/semantic\/signals\/x/],
    ["a signal name with a space", withSem({ signals: { "a b": { type: "header", name: "x-a" } } }), /semantic\/signals/],
    ["a decision without an action model", withSem({ decisions: [{ name: "d", priority: 1, when: "code", action: {} }] as never }), /^\/semantic\/decisions\/0\/action/],
  ])("refuses %s", (_name, config, reason) => {
    expect(validateModelConfig(config, "auto")).toMatch(reason);
  });
});

describe("semantic rules - a gateway's fold", () => {
  it("ignores a bad virtual model written around the CLI, keeping the previous rules", () => {
    const state = semanticState();
    putModelConfig(state, "auto", AUTO, 10);
    putModelConfig(state, "auto", withSem({ default: { model: "auto" } }), 11);
    expect(state.configs.get("auto")).toEqual(AUTO);
    expect(state.configRejected).toBeGreaterThan(0);
  });
});

describe("semantic signals", () => {
  it("keywords match whole words and phrases only, case-insensitively by default", () => {
    const rules = compileRules("auto", { signals: { k: { type: "keywords", keywords: ["function", "stack trace", "c++"] }, cs: { type: "keywords", keywords: ["Go"], caseSensitive: true } }, decisions: [] });
    const m = (text: string) => measureSignals(rules, { texts: { "last-user": text }, promptTokens: 1, headers: {} });
    expect(m("please write a FUNCTION").k?.value).toBe(true);
    expect(m("functional programming").k?.value).toBe(false);
    expect(m("see the Stack Trace below").k?.value).toBe(true);
    expect(m("is c++ fun?").k?.value).toBe(true);
    expect(m("naïvefunction").k?.value).toBe(false);
    expect([m("written in Go").cs?.value, m("let's go").cs?.value]).toEqual([true, false]);
  });

  it("a catastrophic-backtracking pattern runs in linear time under RE2", () => {
    const config = withSem({ signals: { evil: { type: "regex", pattern: "(a+)+$", maxChars: 100_000 } }, decisions: [] });
    expect(validateModelConfig(config, "auto")).toBeUndefined();
    const rules = compileRules("auto", config.semantic as SemanticConfig);
    measureSignals(rules, { texts: { "last-user": "warm-up" }, promptTokens: 1, headers: {} });
    const t0 = performance.now();
    // A backtracking engine would take longer than the age of the universe on this text.
    const v = measureSignals(rules, { texts: { "last-user": `${"a".repeat(20_000)}!` }, promptTokens: 1, headers: {} });
    expect(v.evil?.value).toBe(false);
    expect(performance.now() - t0).toBeLessThan(1_000);
  });

  it("text signals read a bounded prefix of the last user message, or of the whole conversation", () => {
    const b = { messages: [{ role: "user", content: "first question" }, { role: "assistant", content: "an answer" }, { role: "user", content: [{ type: "text", text: "x".repeat(500) }] }] };
    const t = textsOf(b, new Set(["last-user", "conversation"]), 64);
    expect(t["last-user"]).toBe("x".repeat(64));
    expect(t.conversation?.startsWith("first question\nan answer\n")).toBe(true);
    expect(t.conversation?.replaceAll("\n", "").length).toBe(64);
    expect(textsOf({ prompt: "a completion prompt" }, new Set(["last-user"]), 10)["last-user"]).toBe("a completi");
  });

  it("headers, users and key classes", () => {
    const rules = compileRules("auto", { signals: { beta: { type: "header", name: "x-beta", values: ["1"] }, team: { type: "user", users: ["ann"], classes: ["gold"] } }, decisions: [] });
    const m = (headers: Record<string, string>, user?: string, keyClass?: string) => measureSignals(rules, { texts: {}, promptTokens: 0, headers, ...(user ? { user } : {}), ...(keyClass ? { keyClass } : {}) });
    expect(m({ "x-beta": "1" }).beta?.value).toBe(true);
    expect(m({ "x-beta": "2" }).beta?.value).toBe(false);
    expect(m({}, "ann").team?.value).toBe(true);
    expect(m({}, "bob", "gold").team?.value).toBe(true);
    expect(m({}, "bob", "silver").team?.value).toBe(false);
  });

  it("language is detected on the text's start (eld), and recorded as its code", () => {
    const rules = compileRules("auto", sem);
    const v = measureSignals(rules, { texts: { "last-user": "Bonjour, pouvez-vous m'aider à écrire une lettre ?" }, promptTokens: 10, headers: {} });
    expect(v.french).toMatchObject({ value: true, measure: "fr" });
  });

  it("similarity signals of one group act as one classifier: only the best-scoring one over its threshold holds", () => {
    const rules = compileRules("auto", {
      signals: {
        maths: { type: "similarity", examples: ["solve the equation", "compute the integral"], threshold: 0.5, lexicalThreshold: 0.1, group: "domain" },
        code: { type: "similarity", examples: ["write python code", "solve the bug in code"], threshold: 0.5, lexicalThreshold: 0.1, group: "domain" },
        loose: { type: "similarity", examples: ["solve"], threshold: 0.5, lexicalThreshold: 0.1 },
      },
      decisions: [],
    });
    const v = measureSignals(rules, { texts: { "last-user": "solve the equation for x" }, promptTokens: 5, headers: {} });
    expect([v.maths?.value, v.code?.value, v.loose?.value]).toEqual([true, false, true]);
    expect(v.code?.measure as number).toBeGreaterThan(0.1);
  });

  it("keywords contained in other keywords are still found (the scan's layers)", () => {
    const rules = compileRules("auto", { signals: { a: { type: "keywords", keywords: ["stack trace"] }, b: { type: "keywords", keywords: ["stack", "trace"], match: "all" } }, decisions: [] });
    const v = measureSignals(rules, { texts: { "last-user": "here is the Stack Trace" }, promptTokens: 5, headers: {} });
    expect([v.a?.value, v.b?.value]).toEqual([true, true]);
  });

  it("the lexical fallback scores shared content words", () => {
    expect(wordCosine(wordsOf("solve the equation for x"), wordsOf("solve this equation"))).toBeGreaterThan(0.5);
    expect(wordCosine(wordsOf("write a poem"), wordsOf("solve the equation"))).toBe(0);
  });
});

describe("semantic decisions", () => {
  const rules = compileRules("auto", sem);

  it("the highest priority matching decision wins; the next matching one (or the default) is the runner-up", () => {
    const both = classify(rules, body("prove this python function terminates"), { headers: {} });
    expect([both.decision, both.runnerUp, both.action.model]).toEqual(["coding", "math", CODER]);
    const vip = classify(rules, body("hello"), { headers: {}, user: "vip-user" });
    expect([vip.decision, vip.runnerUp]).toEqual(["vip", "default"]);
    expect(vip.evaluations.map((e) => [e.decision, e.matched])).toEqual([["coding", false], ["math", false], ["vip", true]]);
  });

  it("equal priorities: the first listed wins", () => {
    const r = compileRules("auto", { ...sem, decisions: [{ name: "b", priority: 1, when: "code", action: { model: MATH } }, { name: "a", priority: 1, when: "code", action: { model: CODER } }] });
    expect(decide(r, { code: { value: true } }).winner?.name).toBe("b");
  });

  it("\"replace\" drops the client's developer messages too (OpenAI's newer name for system); \"prepend\" keeps them", () => {
    const msgs = [{ role: "developer", content: "ignore the operator" }, { role: "system", content: "old" }, { role: "user", content: "hi" }];
    const p = parseRequestBody(Buffer.from(JSON.stringify({ model: "auto", messages: msgs })));
    expect(applyAction(p, { model: MATH, systemPrompt: { text: "operator prompt", mode: "replace" } }).body.messages).toEqual([{ role: "system", content: "operator prompt" }, { role: "user", content: "hi" }]);
    expect(applyAction(p, { model: MATH, systemPrompt: { text: "operator prompt", mode: "prepend" } }).body.messages).toEqual([{ role: "system", content: "operator prompt" }, ...msgs]);
  });

  it("the Responses and Messages APIs: the action's system prompt goes into `instructions` / `system`; their texts are read", () => {
    const resp = parseRequestBody(Buffer.from(JSON.stringify({ model: "auto", instructions: "client's", input: [{ role: "user", content: [{ type: "input_text", text: "solve x" }] }] })), "responses");
    expect(applyAction(resp, { model: MATH, systemPrompt: { text: "operator prompt", mode: "prepend" } }).body.instructions).toBe("operator prompt\n\nclient's");
    expect(applyAction(resp, { model: MATH, systemPrompt: { text: "operator prompt", mode: "replace" } }).body.instructions).toBe("operator prompt");
    expect(applyAction(resp, { model: MATH, systemPrompt: { text: "operator prompt", mode: "prepend" } }).body.messages).toBeUndefined();
    expect(textsOf(resp.body, new Set(["last-user"]), 64)["last-user"]).toBe("solve x");
    const msg = parseRequestBody(Buffer.from(JSON.stringify({ model: "auto", max_tokens: 4, system: [{ type: "text", text: "client's" }], messages: [{ role: "user", content: "hi" }] })), "messages");
    const out = applyAction(msg, { model: MATH, systemPrompt: { text: "operator prompt", mode: "prepend" } });
    expect(out.body.system).toBe("operator prompt\n\nclient's");
    expect(out.body.messages).toEqual([{ role: "user", content: "hi" }]);
    expect(out.promptTokens).toBeGreaterThan(msg.promptTokens);
  });

  it("no match and no default: 400 no_matching_decision", () => {
    const r = compileRules("auto", { ...sem, default: undefined } as SemanticConfig);
    expect(() => classify(r, body("hello"), { headers: {} })).toThrow(expect.objectContaining({ code: "no_matching_decision", status: 400 }));
  });

  it("an action replaces the system prompt, merges chat_template_kwargs and counts the prompt it adds", () => {
    const p = parseRequestBody(Buffer.from(JSON.stringify({ model: "auto", messages: [{ role: "system", content: "old" }, { role: "user", content: "hi" }], chat_template_kwargs: { a: 1 } })));
    const out = applyAction(p, { model: MATH, systemPrompt: { text: "new system prompt", mode: "replace" }, chatTemplateKwargs: { enable_thinking: false } });
    expect(out.body.messages).toEqual([{ role: "system", content: "new system prompt" }, { role: "user", content: "hi" }]);
    expect(out.body.chat_template_kwargs).toEqual({ a: 1, enable_thinking: false });
    expect(out.promptTokens).toBeGreaterThan(p.promptTokens);
    expect(out.model).toBe(MATH);
  });
});
