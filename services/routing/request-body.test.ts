import { describe, expect, it } from "vitest";
import { RouteError } from "./errors.js";
import { apiOfPath, MAX_BODY_DEPTH, MAX_CACHE_SALT_LENGTH, MAX_RESPONSE_ID_LENGTH, parseRequestBody, type RequestApi } from "./request-body.js";

const parse = (body: unknown) => parseRequestBody(Buffer.from(typeof body === "string" ? body : JSON.stringify(body)));
const refusal = (body: unknown): { status: number; code: string; param: string | null } => {
  try {
    parse(body);
  } catch (err) {
    if (err instanceof RouteError) return { status: err.status, code: err.code, param: err.param };
    throw err;
  }
  throw new Error("expected a RouteError");
};
const chat = (extra: Record<string, unknown> = {}, content: unknown = "hi") => ({ model: "m", messages: [{ role: "user", content }], ...extra });

describe("request body - client input refused with a 400 naming the field", () => {
  it("a body nested 5,000 arrays deep is a 400, not a stack overflow", () => {
    const deep = `{"model":"m","messages":[{"role":"user","content":"x"}],"x":${"[".repeat(5_000)}${"]".repeat(5_000)}}`;
    expect(refusal(deep)).toMatchObject({ status: 400, code: "invalid_request_body" });
    const ok = `{"model":"m","x":${"[".repeat(MAX_BODY_DEPTH - 2)}${"]".repeat(MAX_BODY_DEPTH - 2)}}`;
    expect(parse(ok).model).toBe("m");
  });

  it.each([
    ["a null content part", chat({}, [null]), "messages[0].content[0]"],
    ["a part of unknown type", chat({}, [{ type: "bogus" }]), "messages[0].content[0].type"],
    ["a text part without text", chat({}, [{ type: "text" }]), "messages[0].content[0].text"],
    ["a message without role", { model: "m", messages: [{ content: "x" }] }, "messages[0].role"],
    ["content that is a number", chat({}, 5), "messages[0].content"],
    ["max_tokens 1.5", chat({ max_tokens: 1.5 }), "max_tokens"],
    ["max_tokens -5", chat({ max_tokens: -5 }), "max_tokens"],
    ["max_completion_tokens 0", chat({ max_completion_tokens: 0 }), "max_completion_tokens"],
    ["n as a string", chat({ n: "2" }), "n"],
    ["a prompt mixing ids and text", { model: "m", prompt: [1, "a"] }, "prompt"],
    ["negative token ids", { model: "m", prompt: [1, -2] }, "prompt"],
    ["a token id past 2^32 - 1 (it would wrap and match another prompt's blocks)", { model: "m", prompt: [4_294_967_301, 101] }, "prompt"],
    ["a token id past 2^32 - 1 in a batch's list", { model: "m", prompt: [[1], [2, 4_294_967_296]] }, "prompt"],
    ["a fractional token id", { model: "m", prompt: [1, 2.5] }, "prompt"],
    ["a model of 300 characters", { model: "m".repeat(300), prompt: "x" }, "model"],
    ["a model with a newline", { model: "a\nb", prompt: "x" }, "model"],
    ["cache_salt as a number", chat({ cache_salt: 7 }), "cache_salt"],
    ["cache_salt as an object", chat({ cache_salt: { tenant: "a" } }), "cache_salt"],
    ["an empty cache_salt (vLLM refuses it too)", chat({ cache_salt: "" }), "cache_salt"],
    ["a cache_salt over the bound", chat({ cache_salt: "s".repeat(MAX_CACHE_SALT_LENGTH + 1) }), "cache_salt"],
    ["a cache_salt with a lone surrogate", chat({ cache_salt: "a\ud800b" }), "cache_salt"],
  ])("%s", (_name, body, param) => {
    expect(refusal(body)).toMatchObject({ status: 400, param });
  });

  it("cache_salt: a string up to the bound is kept for prefix matching; null or absent is no salt", () => {
    expect(parse(chat({ cache_salt: "tenant-a" })).cacheSalt).toBe("tenant-a");
    expect(parse(chat({ cache_salt: "s".repeat(MAX_CACHE_SALT_LENGTH) })).cacheSalt).toHaveLength(MAX_CACHE_SALT_LENGTH);
    expect(parse(chat({ cache_salt: "t\u00e9nant \ud83d\ude00" })).cacheSalt).toBe("t\u00e9nant \ud83d\ude00");
    expect(parse(chat({ cache_salt: null }))).not.toHaveProperty("cacheSalt");
    expect(parse(chat())).not.toHaveProperty("cacheSalt");
  });

  it("image and audio parts are accepted (no text to count)", () => {
    expect(parse(chat({}, [{ type: "text", text: "abcd" }, { type: "image_url", image_url: { url: "data:," } }])).promptTokens).toBe(1);
  });
});

describe("request body - token-id prompts", () => {
  it("counts token ids exactly and keeps them for prefix matching (ids, list of ids, lists of ids)", () => {
    expect(parse({ model: "m", prompt: [5, 6, 7] })).toMatchObject({ promptTokens: 3, promptTokenIds: Uint32Array.of(5, 6, 7) });
    expect(parse({ model: "m", prompt: [[1, 2], [3, 4, 5]] })).toMatchObject({ promptTokens: 5, promptTokenIds: Uint32Array.of(1, 2) });
    expect(parse({ model: "m", prompt: "abcdefgh" })).toMatchObject({ promptTokens: 2 });
    expect(parse({ model: "m", prompt: "abcd" }).promptTokenIds).toBeUndefined();
    expect(parse({ model: "m", prompt: [0, 4_294_967_295] }).promptTokenIds).toEqual(Uint32Array.of(0, 4_294_967_295));
  });

  it("counts every id the body holds in its arrays (each list of a batch, an embeddings input), for held bytes", () => {
    const long = Array.from({ length: 100_000 }, (_, i) => i);
    expect(parse({ model: "m", prompt: [[1], long] })).toMatchObject({ bodyTokenIds: 100_001, promptTokenIds: Uint32Array.of(1) });
    expect(parse({ model: "m", input: [[1, 2], [3]] }).bodyTokenIds).toBe(3);
    expect(parse({ model: "m", prompt: "text" })).not.toHaveProperty("bodyTokenIds");
  });
});

describe("request body - the Responses and Messages APIs (by path)", () => {
  const parseAs = (api: RequestApi, body: unknown) => parseRequestBody(Buffer.from(JSON.stringify(body)), api);
  const refusalAs = (api: RequestApi, body: unknown) => {
    try {
      parseAs(api, body);
    } catch (err) {
      if (err instanceof RouteError) return { status: err.status, code: err.code, param: err.param };
      throw err;
    }
    throw new Error("expected a RouteError");
  };

  it("apiOfPath: by path, query ignored; anything else parses as chat", () => {
    expect(["/v1/responses", "/v1/responses?x=1", "/v1/messages", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", undefined].map(apiOfPath)).toEqual(["responses", "responses", "messages", "chat", "completions", "embeddings", "chat"]);
    expect(["/v1/messages/count_tokens", "/v1/responses/resp_1/cancel", "/v1/messagesx"].map(apiOfPath)).toEqual(["messages", "responses", "chat"]);
  });

  it("a Responses body: size from instructions and input items, max_output_tokens, previous_response_id, store", () => {
    const p = parseAs("responses", { model: "m", instructions: "abcd", input: [{ role: "user", content: [{ type: "input_text", text: "efgh" }] }], max_output_tokens: 9, previous_response_id: "resp_1", store: false, stream: true });
    expect(p).toMatchObject({ api: "responses", model: "m", promptTokens: 2, maxTokens: 9, previousResponseId: "resp_1", store: false, stream: true });
    expect(parseAs("responses", { model: "m", input: "abcd" })).not.toHaveProperty("previousResponseId");
  });

  it("a Messages body: size from system and messages (blocks included), max_tokens required", () => {
    const p = parseAs("messages", { model: "m", system: [{ type: "text", text: "abcd" }], messages: [{ role: "user", content: [{ type: "text", text: "efgh" }] }], max_tokens: 7 });
    expect(p).toMatchObject({ api: "messages", promptTokens: 2, maxTokens: 7 });
    expect(refusalAs("messages", { model: "m", messages: [{ role: "user", content: "x" }] })).toEqual({ status: 400, code: "invalid_request_body", param: "max_tokens" });
  });

  it("shape mistakes are 400s naming the field; a Messages body with OpenAI-only content is not a chat body", () => {
    expect(refusalAs("responses", { model: "m" })).toMatchObject({ status: 400, param: "input" });
    expect(refusalAs("responses", { model: "m", input: [{ type: "item_reference", id: "x" }] })).toMatchObject({ param: "input[0].type" });
    expect(refusalAs("responses", { model: "m", input: "x", previous_response_id: 7 })).toMatchObject({ param: "previous_response_id" });
    expect(refusalAs("responses", { model: "m", input: "x", previous_response_id: "r".repeat(MAX_RESPONSE_ID_LENGTH + 1) })).toMatchObject({ param: "previous_response_id" });
    expect(refusalAs("responses", { model: "m", input: "x", previous_response_id: "resp\n1" })).toMatchObject({ param: "previous_response_id" });
    expect(refusalAs("responses", { model: "m", input: "x", store: "yes" })).toMatchObject({ param: "store" });
    expect(refusalAs("responses", { model: "m", input: "x", max_output_tokens: 0 })).toMatchObject({ param: "max_output_tokens" });
    expect(refusalAs("messages", { model: "m", max_tokens: 4, messages: [{ role: "user", content: [{ type: "image_url" }] }] })).toMatchObject({ param: "messages[0].content[0].type" });
    // Anthropic tool blocks, which a chat parse refuses, are fine on /v1/messages.
    expect(parseAs("messages", { model: "m", max_tokens: 4, messages: [{ role: "assistant", content: [{ type: "tool_use", id: "t", name: "ls", input: {} }] }] }).api).toBe("messages");
    expect(refusalAs("responses", { input: "x" })).toMatchObject({ code: "model_required" });
  });
});
