/**
 * The parse stage: headers + body -> what the request is (model, prompt size, user), the body's
 * one parse. And the plan stage: how it is to be routed (profile -> strategy, latency targets,
 * rate limit). Pure: no views, no I/O; every client mistake becomes a RouteError that names it
 * (400), before anything is counted or charged.
 */
import type { ConfigReader } from "../../views/model-config.js";
import { RouteError } from "../errors.js";
import { apiOfPath, MAX_REQUEST_ID_LENGTH, MAX_USER_LENGTH, type ParsedRequest, parseRequestBody } from "../request-body.js";
import { isStrategySpecError, parseStrategy, type StrategyParams, strategyNames } from "../strategies/registry.js";
import type { SloTargets, Strategy } from "../strategies/types.js";
import { markRewritten, type RequestContext } from "../context.js";
import type { PrepareStage } from "../pipeline.js";
import { refuseControlledFields } from "./pd-bodies.js";

export { MAX_REQUEST_ID_LENGTH, MAX_USER_LENGTH } from "../request-body.js";
const HEADER_BOUNDS: ReadonlyArray<readonly [string, number]> = [
  ["user", MAX_USER_LENGTH],
  ["x-request-id", MAX_REQUEST_ID_LENGTH],
];

/** What the plan stage decides. */
export interface RoutePlan {
  strategy: Strategy;
  /** The model profile that applied, and its latency targets (slo* strategies). */
  profile?: string;
  slo?: SloTargets;
  /** The profile's per-model request rate limit. */
  rps?: number;
  /** The profile's strategy plugin parameters (recorded for replay). */
  strategyParams?: Readonly<Record<string, StrategyParams>>;
}

/**
 * The `cache_salt` a tenant's request runs under: the tenant's salt (its API key's `cacheSalt`),
 * followed by the client's own after a `.` (a tenant salt has no `.`), so a client can still
 * partition its own traffic but never leave its tenant's space nor enter another's.
 */
export function tenantCacheSalt(tenantSalt: string, clientSalt: string | undefined): string {
  return clientSalt === undefined ? tenantSalt : `${tenantSalt}.${clientSalt}`;
}

/**
 * Parses a request's body and checks its headers; throws RouteError for anything the client must
 * be told. `tenantSalt`: the authenticated tenant's cache salt (tenantCacheSalt), written into the
 * body (`salted`: the engine gets the body re-serialised).
 */
export function parseInput(headers: Readonly<Record<string, string>>, body: Uint8Array, tenantSalt?: string): { parsed: ParsedRequest; salted: boolean } {
  return checkParsed(headers, parseRequestBody(body, apiOfPath(headers[":path"])), tenantSalt);
}

/** The checks after the body's parse: its tenant's salt written in, controlled fields refused, header bounds. */
function checkParsed(headers: Readonly<Record<string, string>>, body: ParsedRequest, tenantSalt: string | undefined): { parsed: ParsedRequest; salted: boolean } {
  let parsed = body;
  if (tenantSalt !== undefined && parsed.api === "messages") {
    throw new RouteError("cacheIsolationUnavailable", "this API key's tenant has its own prefix cache (a cache salt), and the engines' Messages API (`/v1/messages`) takes no `cache_salt`: send this tenant's requests to /v1/chat/completions or /v1/responses");
  }
  if (tenantSalt !== undefined) {
    const cacheSalt = tenantCacheSalt(tenantSalt, parsed.cacheSalt);
    parsed = { ...parsed, cacheSalt, body: { ...parsed.body, cache_salt: cacheSalt } };
  }
  refuseControlledFields(parsed.body);
  // The user and the request id travel in every charge and decision record; the event schemas bound them.
  for (const [name, max] of HEADER_BOUNDS) {
    const value = headers[name];
    if (value !== undefined && value.length > max) {
      throw new RouteError("invalidHeader", `the \`${name}\` header is ${value.length} characters long; at most ${max} are allowed`, name);
    }
  }
  return { parsed, salted: tenantSalt !== undefined };
}

/** The parse stage: the body's one parse, the headers' bounds, the tenant's salt. */
export const parseStage: PrepareStage = {
  name: "parse",
  phase: "prepare",
  run(ctx: RequestContext): void {
    // Set before the checks: a refusal's record names the model.
    ctx.parsed = parseRequestBody(ctx.input.body, apiOfPath(ctx.input.headers[":path"]));
    const { parsed, salted } = checkParsed(ctx.input.headers, ctx.parsed, ctx.input.tenantSalt);
    ctx.parsed = parsed;
    if (salted) markRewritten(ctx);
  },
};

/** Plans a parsed request's routing: the model's profile -> strategy, latency targets, rate limit. */
export function planRoute(parsed: ParsedRequest, headers: Readonly<Record<string, string>>, config: ConfigReader | undefined, defaultStrategy: string): RoutePlan {
  const choice = config
    ? config.choose(parsed.model, headers, { promptTokens: parsed.promptTokens, maxTokens: parsed.maxTokens }, defaultStrategy)
    : { spec: headers["routing-strategy"] || defaultStrategy, source: "default" as const };
  const strategyParams = "profileConfig" in choice ? choice.profileConfig?.strategyParams : undefined;
  let strategy: Strategy;
  try {
    strategy = parseStrategy(choice.spec, strategyParams);
  } catch (err) {
    if (isStrategySpecError(err)) throw new RouteError("invalidStrategy", `${err.message}; known: ${strategyNames().join(", ")}`, "routing-strategy");
    throw err;
  }
  const rps = "requestsPerSecond" in choice ? choice.requestsPerSecond : undefined;
  const slo = "profileConfig" in choice ? choice.profileConfig?.slo : undefined;
  return { strategy, ...(strategyParams ? { strategyParams } : {}), ...(slo ? { slo } : {}), ...(rps !== undefined ? { rps } : {}), ...("profile" in choice && choice.profile ? { profile: choice.profile } : {}) };
}

/**
 * Parses a request and plans its routing (parseInput, then planRoute); throws RouteError for
 * anything the client must be told.
 */
export function parseRoute(headers: Readonly<Record<string, string>>, body: Uint8Array, config: ConfigReader | undefined, defaultStrategy: string, tenantSalt?: string): RoutePlan & { parsed: ParsedRequest; upstreamBody?: Buffer } {
  const { parsed, salted } = parseInput(headers, body, tenantSalt);
  return { parsed, ...planRoute(parsed, headers, config, defaultStrategy), ...(salted ? { upstreamBody: Buffer.from(JSON.stringify(parsed.body)) } : {}) };
}
