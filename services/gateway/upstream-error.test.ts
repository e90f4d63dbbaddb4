import { describe, expect, it } from "vitest";
import { normaliseUpstreamError } from "./upstream-error.js";

describe("upstream errors - normalised to OpenAI's shape", () => {
  it.each([
    ["vLLM", 404, { error: { message: "The model `x` does not exist.", type: "NotFoundError", param: "model", code: 404 } }, "The model `x` does not exist.", "model", "invalid_request_error"],
    ["FastAPI detail", 422, { detail: "field required" }, "field required", null, "api_error"],
    ["plain text", 503, "upstream connect error or disconnect/reset before headers", "upstream connect error or disconnect/reset before headers", null, "overloaded_error"],
    ["empty", 502, "", "upstream returned 502", null, "api_error"],
  ])("%s", (_name, status, body, message, param, type) => {
    const raw = Buffer.from(typeof body === "string" ? body : JSON.stringify(body));
    expect(normaliseUpstreamError(status, raw)).toEqual({ error: { message, type, code: `upstream_${status}`, param } });
  });
});
