/**
 * The parse stage: headers + body -> what the request is (model, prompt size, user) and how it is
 * to be routed (profile -> strategy, latency targets, rate limit). Pure: no views, no I/O; every
 * client mistake becomes a RouteError that names it (400), before anything is counted or charged.
 */
import type { ConfigReader } from "../../views/model-config.js";
import { RouteError } from "../errors.js";
import { type ParsedRequest, parseRequestBody } from "../request-body.js";
import { isStrategySpecError, parseStrategy, type StrategyParams, strategyNames } from "../strategies/registry.js";
import type { SloTargets, Strategy } from "../strategies/types.js";
import { refuseControlledFields } from "./pd-bodies.js";

/** Longest `user` header accepted (the charge and decision schemas' bound). */
export const MAX_USER_LENGTH = 256;
/** Longest `x-request-id` accepted (decision records carry it as their id). */
export const MAX_REQUEST_ID_LENGTH = 253;
const HEADER_BOUNDS: ReadonlyArray<readonly [string, number]> = [
  ["user", MAX_USER_LENGTH],
  ["x-request-id", MAX_REQUEST_ID_LENGTH],
];

export interface RoutePlan {
  parsed: ParsedRequest;
  strategy: Strategy;
  /** The model profile that applied, and its latency targets (slo* strategies). */
  profile?: string;
  slo?: SloTargets;
  /** The profile's per-model request rate limit. */
  rps?: number;
  /** The profile's strategy plugin parameters (recorded for replay). */
  strategyParams?: Readonly<Record<string, StrategyParams>>;
  /** The body the engine gets instead of the client's: the tenant's cache salt written into it. */
  upstreamBody?: Buffer;
}

/**
 * The `cache_salt` a tenant's request runs under: the tenant's salt (its API key's `cacheSalt`),
 * followed by the client's own after a `.` (a tenant salt has no `.`), so a client can still
 * partition its own traffic but never leave its tenant's space nor enter another's.
 */
export function tenantCacheSalt(tenantSalt: string, clientSalt: string | undefined): string {
  return clientSalt === undefined ? tenantSalt : `${tenantSalt}.${clientSalt}`;
}

/** A request's body parsed (once) and its headers checked: what the semantic stage and the plan read. */
export interface ParsedInput {
  parsed: ParsedRequest;
  /** The body the engine gets instead of the client's (a tenant's cache salt written in). */
  upstreamBody?: Buffer;
}

/**
 * Parses a request's body and checks its headers; throws RouteError for anything the client must
 * be told. `tenantSalt`: the authenticated tenant's cache salt (tenantCacheSalt), written into the body.
 */
export function parseInput(headers: Readonly<Record<string, string>>, body: Uint8Array, tenantSalt?: string): ParsedInput {
  let parsed = parseRequestBody(body);
  let upstreamBody: Buffer | undefined;
  if (tenantSalt !== undefined) {
    const cacheSalt = tenantCacheSalt(tenantSalt, parsed.cacheSalt);
    parsed = { ...parsed, cacheSalt, body: { ...parsed.body, cache_salt: cacheSalt } };
    upstreamBody = Buffer.from(JSON.stringify(parsed.body));
  }
  refuseControlledFields(parsed.body);
  // The user and the request id travel in every charge and decision record; the event schemas bound them.
  for (const [name, max] of HEADER_BOUNDS) {
    const value = headers[name];
    if (value !== undefined && value.length > max) {
      throw new RouteError("invalidHeader", `the \`${name}\` header is ${value.length} characters long; at most ${max} are allowed`, name);
    }
  }
  return { parsed, ...(upstreamBody ? { upstreamBody } : {}) };
}

/** Plans a parsed request's routing: the model's profile -> strategy, latency targets, rate limit. */
export function planRoute(input: ParsedInput, headers: Readonly<Record<string, string>>, config: ConfigReader | undefined, defaultStrategy: string): RoutePlan {
  const { parsed, upstreamBody } = input;
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
  return { parsed, strategy, ...(upstreamBody ? { upstreamBody } : {}), ...(strategyParams ? { strategyParams } : {}), ...(slo ? { slo } : {}), ...(rps !== undefined ? { rps } : {}), ...("profile" in choice && choice.profile ? { profile: choice.profile } : {}) };
}

/**
 * Parses a request and plans its routing (parseInput, then planRoute); throws RouteError for
 * anything the client must be told.
 */
export function parseRoute(headers: Readonly<Record<string, string>>, body: Uint8Array, config: ConfigReader | undefined, defaultStrategy: string, tenantSalt?: string): RoutePlan {
  return planRoute(parseInput(headers, body, tenantSalt), headers, config, defaultStrategy);
}
