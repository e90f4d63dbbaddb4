/**
 * The error catalogue's own shape: one code per key, one status per code, OpenAI-shaped bodies.
 * Whether every code is asserted by a behavioural test and documented in docs/errors.md is checked
 * against the repository in test/error-catalogue.test.ts (the routing core's tests read no files).
 */
import { describe, expect, it } from "vitest";
import { anthropicError, anthropicErrorType, type ErrorCode, ErrorCodes, errorBodyFor, errorType, openAIError, RouteError, reshapeError, routeErrorBody } from "./errors.js";

type Catalogue = Readonly<Record<string, { readonly status: number; readonly code: string }>>;

/** Wire codes named by more than one key, with the keys that name them. */
function duplicateCodes(c: Catalogue): string[] {
  const keysByCode = new Map<string, string[]>();
  for (const [key, e] of Object.entries(c)) keysByCode.set(e.code, [...(keysByCode.get(e.code) ?? []), key]);
  return [...keysByCode].filter(([, keys]) => keys.length > 1).map(([code, keys]) => `${code}: ${keys.join(", ")}`);
}

/** Codes that map to no single 4xx/5xx status, or that are not lower snake case like OpenAI's. */
function statusProblems(c: Catalogue): string[] {
  const statuses = new Map<string, Set<number>>();
  for (const e of Object.values(c)) statuses.set(e.code, (statuses.get(e.code) ?? new Set()).add(e.status));
  const problems: string[] = [];
  for (const [code, set] of statuses) {
    if (set.size !== 1) problems.push(`${code}: ${set.size} statuses (${[...set].join(", ")})`);
    for (const s of set) if (!Number.isInteger(s) || s < 400 || s > 599) problems.push(`${code}: status ${s} is not a 4xx/5xx`);
    if (!/^[a-z][a-z0-9]*(_[a-z0-9]+)*$/.test(code)) problems.push(`${code}: not lower snake case`);
  }
  return problems;
}

/**
 * The OpenAI `type` of every status the catalogue uses. A new status must be added here on
 * purpose, so that its `type` is a decision rather than the `api_error` fallback by accident.
 */
const TYPE_BY_STATUS: Readonly<Record<number, string>> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "invalid_request_error",
  413: "invalid_request_error",
  421: "api_error",
  429: "rate_limit_error",
  499: "api_error",
  500: "api_error",
  502: "api_error",
  503: "overloaded_error",
  504: "api_error",
};

const keys = Object.keys(ErrorCodes) as ErrorCode[];

describe("error catalogue - codes and statuses", () => {
  it("the checkers find a code named twice, a code with two statuses, a status outside 4xx/5xx and a badly written code", () => {
    const fake: Catalogue = { a: { status: 400, code: "same" }, b: { status: 503, code: "same" }, c: { status: 302, code: "moved" }, d: { status: 404, code: "Not-Found" } };
    expect(duplicateCodes(fake)).toEqual(["same: a, b"]);
    expect(statusProblems(fake)).toEqual(["same: 2 statuses (400, 503)", "moved: status 302 is not a 4xx/5xx", "Not-Found: not lower snake case"]);
    expect(duplicateCodes({ a: { status: 400, code: "x" }, b: { status: 400, code: "y" } })).toEqual([]);
    expect(statusProblems({ a: { status: 499, code: "client_gone" } })).toEqual([]);
  });

  it("no two keys share a code", () => {
    expect(keys.length).toBeGreaterThan(0);
    expect(duplicateCodes(ErrorCodes)).toEqual([]);
  });

  it("each code maps to exactly one 4xx/5xx status", () => {
    expect(statusProblems(ErrorCodes)).toEqual([]);
  });

  it("every status in the catalogue has a decided OpenAI `type`, and errorType gives it", () => {
    const undecided = [...new Set(keys.map((k) => ErrorCodes[k].status))].filter((s) => TYPE_BY_STATUS[s] === undefined);
    expect(undecided).toEqual([]);
    for (const [status, type] of Object.entries(TYPE_BY_STATUS)) expect([status, errorType(Number(status))]).toEqual([status, type]);
  });
});

describe("error catalogue - OpenAI error bodies", () => {
  it.each(keys)("%s: status, code and an OpenAI body {error: {message, type, code, param}}", (key) => {
    const { status, code } = ErrorCodes[key];
    const withParam = new RouteError(key, "what went wrong", "model");
    expect([withParam.status, withParam.code]).toEqual([status, code]);
    expect(routeErrorBody(withParam)).toEqual({ error: { message: "what went wrong", type: TYPE_BY_STATUS[status], code, param: "model" } });
    expect(routeErrorBody(new RouteError(key, "m")).error.param).toBeNull();
  });

  it("a status override (an engine's own 4xx passed on) changes the status and the type, never the code", () => {
    const e = new RouteError("prefillRejected", "prefill leg on p1 answered 422", null, {}, 422);
    expect([e.status, e.code]).toEqual([422, ErrorCodes.prefillRejected.code]);
    expect(routeErrorBody(e).error).toMatchObject({ type: "api_error", code: ErrorCodes.prefillRejected.code });
    const tooLarge = new RouteError("prefillRejected", "prefill leg on p1 answered 413", null, {}, 413);
    expect(routeErrorBody(tooLarge).error.type).toBe("invalid_request_error");
  });

  it("extra headers travel with the error, and openAIError builds the same shape for codes outside the catalogue", () => {
    const e = new RouteError("wrongPool", "go elsewhere", "model", { "x-jetroute-pool": "chat" });
    expect(e.headers).toEqual({ "x-jetroute-pool": "chat" });
    expect(openAIError(502, "upstream_502", "bad gateway")).toEqual({ error: { message: "bad gateway", type: "api_error", code: "upstream_502", param: null } });
  });
});

/** Anthropic's error `type` of every status the catalogue uses (the Messages API's errors). */
const ANTHROPIC_TYPE_BY_STATUS: Readonly<Record<number, string>> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  413: "request_too_large",
  421: "api_error",
  429: "rate_limit_error",
  499: "api_error",
  500: "api_error",
  502: "api_error",
  503: "overloaded_error",
  504: "api_error",
};

describe("error catalogue - Anthropic error bodies on /v1/messages", () => {
  it("every status in the catalogue has a decided Anthropic `type`", () => {
    const undecided = [...new Set(keys.map((k) => ErrorCodes[k].status))].filter((s) => ANTHROPIC_TYPE_BY_STATUS[s] === undefined);
    expect(undecided).toEqual([]);
    for (const [status, type] of Object.entries(ANTHROPIC_TYPE_BY_STATUS)) expect([status, anthropicErrorType(Number(status))]).toEqual([status, type]);
  });

  it.each(keys)("%s: {type: error, error: {type, message}} on /v1/messages, the code leading the message; OpenAI's elsewhere", (key) => {
    const e = new RouteError(key, "what went wrong", "model");
    expect(errorBodyFor("messages", e)).toEqual({ type: "error", error: { type: ANTHROPIC_TYPE_BY_STATUS[e.status], message: `${e.code}: what went wrong` } });
    expect(errorBodyFor("responses", e)).toEqual(routeErrorBody(e));
    expect(errorBodyFor(undefined, e)).toEqual(routeErrorBody(e));
  });

  it("an upstream error normalised to OpenAI's shape is reshaped for /v1/messages only", () => {
    const upstream = openAIError(404, "upstream_404", "The model `x` does not exist.");
    expect(reshapeError("messages", 404, upstream)).toEqual({ type: "error", error: { type: "not_found_error", message: "The model `x` does not exist." } });
    expect(reshapeError("chat", 404, upstream)).toBe(upstream);
    expect(anthropicError(529, "busy")).toEqual({ type: "error", error: { type: "overloaded_error", message: "busy" } });
  });
});
