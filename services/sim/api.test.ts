import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detokenize, tokenizeChat, tokenizePrompt } from "../tokenizer/sim-tokenizer.js";
import { type SimFleet, startSimFleet } from "./fleet.js";
import { json, postJson, sseData } from "./testing.js";

const MODEL = "demo/llama-3.1-8b";
const messages = [
  { role: "system", content: "You answer briefly." },
  { role: "user", content: "Which pod should serve this request?" },
];

let fleet: SimFleet;
let address: string;

beforeAll(async () => {
  fleet = await startSimFleet({ pods: 1, model: MODEL, timeScale: 1_000, maxModelLen: 256 });
  address = fleet.pods[0]?.address ?? "";
});
afterAll(() => fleet.close());

describe("OpenAI endpoints", () => {
  it("streams N content chunks, a usage chunk and [DONE]", async () => {
    const res = await postJson(address, "/v1/chat/completions", {
      model: MODEL,
      messages,
      max_tokens: 7,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const events = sseData(await res.text());
    expect(events.at(-1)).toBe("[DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    const content = chunks.filter((c) => c.choices[0]?.delta?.content);
    expect(content).toHaveLength(7);
    expect(chunks[0].choices[0].delta).toEqual({ role: "assistant", content: "" });
    expect(content.at(-1).choices[0].finish_reason).toBe("length");
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0].id)).toBe(true);
    const last = chunks.at(-1);
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual({ prompt_tokens: tokenizeChat(messages).length, completion_tokens: 7, total_tokens: tokenizeChat(messages).length + 7 });
  });

  it("ends a stream without a usage chunk unless include_usage is set", async () => {
    const res = await postJson(address, "/v1/completions", { prompt: "route me", max_tokens: 3, stream: true });
    const events = sseData(await res.text());
    expect(events).toHaveLength(4);
    expect(events.slice(0, 3).map((e) => JSON.parse(e).choices[0].text.length > 0)).toEqual([true, true, true]);
    expect(events[3]).toBe("[DONE]");
  });

  it("returns usage that matches the prompt's tokens and max_tokens without streaming", async () => {
    const chat = await json(postJson(address, "/v1/chat/completions", { model: MODEL, messages, max_completion_tokens: 5 }));
    expect(chat.object).toBe("chat.completion");
    expect(chat.usage).toEqual({ prompt_tokens: tokenizeChat(messages).length, completion_tokens: 5, total_tokens: tokenizeChat(messages).length + 5 });
    expect(chat.choices[0].finish_reason).toBe("length");
    // Generated text re-tokenizes to exactly completion_tokens pieces.
    expect(tokenizePrompt(chat.choices[0].message.content, { addSpecialTokens: false })).toHaveLength(5);

    const prompt = "The gateway picks the least loaded pod.";
    const completion = await json(postJson(address, "/v1/completions", { model: MODEL, prompt }));
    expect(completion.object).toBe("text_completion");
    expect(completion.usage.prompt_tokens).toBe(tokenizePrompt(prompt).length);
    expect(completion.usage.completion_tokens).toBe(16);
  });

  it("generates the same text for the same prompt", async () => {
    const body = { model: MODEL, prompt: [5, 900, 901, 902], max_tokens: 6 };
    const a = await json(postJson(address, "/v1/completions", body));
    const b = await json(postJson(address, "/v1/completions", body));
    expect(a.choices[0].text).toBe(b.choices[0].text);
    expect(a.usage.prompt_tokens).toBe(4);
  });

  it("echoes X-Request-Id into the response id", async () => {
    const res = await postJson(address, "/v1/chat/completions", { messages, max_tokens: 1 }, { headers: { "content-type": "application/json", "x-request-id": "req-42" } });
    expect(res.headers.get("x-request-id")).toBe("req-42");
    expect((await json(res)).id).toBe("chatcmpl-req-42");
  });
});

describe("tokenizer endpoints", () => {
  it("tokenizes the chat form exactly like the shared tokenizer", async () => {
    const res = await postJson(address, "/tokenize", { model: MODEL, messages, add_generation_prompt: true });
    const body = await json(res);
    expect(body.tokens).toEqual(tokenizeChat(messages, { addGenerationPrompt: true }));
    expect(body.count).toBe(body.tokens.length);
    expect(body.max_model_len).toBe(256);
    const noGen = await json(postJson(address, "/tokenize", { messages, add_generation_prompt: false }));
    expect(noGen.tokens).toEqual(tokenizeChat(messages, { addGenerationPrompt: false }));
  });

  it("tokenizes the completion form with BOS by default", async () => {
    const withBos = await json(postJson(address, "/tokenize", { model: MODEL, prompt: "hello pods" }));
    const without = await json(postJson(address, "/tokenize", { model: MODEL, prompt: "hello pods", add_special_tokens: false }));
    expect(withBos.tokens).toEqual(tokenizePrompt("hello pods"));
    expect(without.tokens).toEqual(withBos.tokens.slice(1));
  });

  it("detokenizes deterministically", async () => {
    const ids = [1, ...tokenizePrompt(" the cache", { addSpecialTokens: false }), 31_000];
    const body = await json(postJson(address, "/detokenize", { model: MODEL, tokens: ids }));
    expect(body).toEqual({ prompt: detokenize(ids) });
    expect(body.prompt).toBe("<|begin_of_text|> the cache<#31000>");
  });
});

describe("errors in vLLM's shape", () => {
  it("404s an unknown model", async () => {
    const res = await postJson(address, "/v1/chat/completions", { model: "nope/model", messages });
    expect(res.status).toBe(404);
    expect(await json(res)).toEqual({
      error: { message: "The model `nope/model` does not exist.", type: "NotFoundError", param: "model", code: 404 },
    });
    expect((await postJson(address, "/tokenize", { model: "nope/model", prompt: "x" })).status).toBe(404);
  });

  it("400s malformed JSON, missing messages, malformed content parts and oversized requests (never a 500)", async () => {
    for (const [path, body, fragment] of [
      ["/v1/chat/completions", "{not json", "Invalid JSON"],
      ["/v1/chat/completions", { model: MODEL }, "messages"],
      ["/v1/completions", { model: MODEL, prompt: "x", max_tokens: 1_000 }, "maximum context length is 256 tokens"],
      ["/v1/completions", { prompt: "x", stream_options: { include_usage: true } }, "stream=True"],
      ["/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: [null] }] }, "messages.0.content.0"],
      ["/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: [{ type: "text", text: 5 }] }] }, "messages.0.content.0.text"],
    ] as const) {
      const res = await postJson(address, path, body);
      expect(res.status).toBe(400);
      const err = (await json(res)).error;
      expect(err).toMatchObject({ type: "BadRequestError", code: 400 });
      expect(err.message).toContain(fragment);
    }
  });

  it("answers unknown routes and methods like FastAPI", async () => {
    const res = await fetch(`http://${address}/v2/nothing`);
    expect(res.status).toBe(404);
    expect(await json(res)).toEqual({ detail: "Not Found" });
    expect((await fetch(`http://${address}/v1/chat/completions`)).status).toBe(405);
  });
});

describe("discovery endpoints", () => {
  it("serves /health empty and /v1/models with the served model", async () => {
    const health = await fetch(`http://${address}/health`);
    expect(health.status).toBe(200);
    expect(await health.text()).toBe("");
    const models = await json(fetch(`http://${address}/v1/models`));
    expect(models.object).toBe("list");
    expect(models.data).toMatchObject([{ id: MODEL, object: "model", root: MODEL, parent: null, max_model_len: 256 }]);
  });
});
