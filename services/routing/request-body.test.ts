import { describe, expect, it } from "vitest";
import { RouteError } from "./errors.js";
import { MAX_BODY_DEPTH, MAX_CACHE_SALT_LENGTH, parseRequestBody } from "./request-body.js";

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
    expect(parse({ model: "m", prompt: [5, 6, 7] })).toMatchObject({ promptTokens: 3, promptTokenIds: [5, 6, 7] });
    expect(parse({ model: "m", prompt: [[1, 2], [3, 4, 5]] })).toMatchObject({ promptTokens: 5, promptTokenIds: [1, 2] });
    expect(parse({ model: "m", prompt: "abcdefgh" })).toMatchObject({ promptTokens: 2 });
    expect(parse({ model: "m", prompt: "abcd" }).promptTokenIds).toBeUndefined();
  });
});
