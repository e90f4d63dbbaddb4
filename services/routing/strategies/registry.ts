/**
 * Strategy plugins by type, and weighted combinations of them. A plugin is a type name, what it
 * needs computed before it can pick (e.g. prompt token ids), and a factory taking parameters (a
 * profile's `strategyParams[type]`); register it here and it becomes selectable by the
 * `routing-strategy` header, profiles and `--strategy`.
 *
 * A spec is one name (`least-request`) or a weighted combination (`least-kv-cache:2,least-request:1`;
 * a missing weight is 1). See combine.ts for how a combination picks. Exclusive strategies (slo*)
 * decide alone and cannot be combined.
 */
import { combinationStrategy, type WeightedScorer } from "./combine.js";
import { leastBusyTimeStrategy } from "./least-busy-time.js";
import { leastGpuCacheStrategy, leastKvCacheStrategy } from "./least-kv-cache.js";
import { leastLatencyStrategy } from "./least-latency.js";
import { leastRequestStrategy } from "./least-request.js";
import { leastTokenLoadStrategy } from "./least-token-load.js";
import { powerOfTwoStrategy } from "./power-of-two.js";
import { DEFAULT_PREFIX_CACHE_CONFIG, prefixCachePrebleStrategy, prefixCacheStrategy } from "./prefix-cache.js";
import { PD_STRATEGY, pdConfigOf, pdStrategy } from "./pd.js";
import { randomStrategy } from "./random.js";
import { sessionAffinityStrategy } from "./session-affinity.js";
import { sloLeastLoadStrategy, sloPackLoadStrategy, sloStrategy } from "./slo.js";
import { throughputStrategy } from "./throughput.js";
import type { Strategy, StrategyNeeds } from "./types.js";
import { vtcBasicStrategy } from "./vtc-basic.js";

/** Parameters of one plugin, as a profile gives them. */
export type StrategyParams = Readonly<Record<string, number | string | boolean>>;

export interface StrategyPlugin {
  readonly type: string;
  readonly needs?: StrategyNeeds;
  /** Builds the strategy. Throws StrategySpecError for parameters it does not take or that are out of range. */
  create(params?: StrategyParams): Strategy;
}

/** A plugin of one fixed strategy: it takes no parameters. */
function fixed(s: Strategy): StrategyPlugin {
  return {
    type: s.name,
    ...(s.needs ? { needs: s.needs } : {}),
    create(params) {
      const extra = Object.keys(params ?? {});
      if (extra.length > 0) throw new StrategySpecError(`routing strategy ${JSON.stringify(s.name)} takes no parameters (got ${extra.map((k) => JSON.stringify(k)).join(", ")})`, s.name);
      return s;
    },
  };
}

const prefixCachePlugin: StrategyPlugin = {
  type: "prefix-cache",
  needs: { promptTokenIds: true },
  create(params) {
    const out = { ...DEFAULT_PREFIX_CACHE_CONFIG };
    for (const [k, v] of Object.entries(params ?? {})) {
      if (k !== "imbalanceThreshold" && k !== "stddevFactor") throw new StrategySpecError(`prefix-cache has no parameter ${JSON.stringify(k)} (it takes imbalanceThreshold, stddevFactor)`, "prefix-cache");
      if (typeof v !== "number" || !(v >= 0) || !Number.isFinite(v)) throw new StrategySpecError(`prefix-cache parameter ${k} must be a number >= 0, got ${JSON.stringify(v)}`, "prefix-cache");
      out[k] = v;
    }
    return params && Object.keys(params).length > 0 ? prefixCacheStrategy(out) : defaultPrefixCache;
  },
};
const defaultPrefixCache = prefixCacheStrategy();

const pdPlugin: StrategyPlugin = {
  type: PD_STRATEGY,
  needs: { promptTokenIds: true },
  create(params) {
    if (!params || Object.keys(params).length === 0) return defaultPd;
    try {
      return pdStrategy(pdConfigOf(params));
    } catch (err) {
      throw new StrategySpecError((err as Error).message, PD_STRATEGY);
    }
  },
};
const defaultPd = pdStrategy();

const PLUGINS: StrategyPlugin[] = [
  fixed(randomStrategy),
  fixed(leastRequestStrategy),
  fixed(powerOfTwoStrategy),
  fixed(leastLatencyStrategy),
  fixed(leastKvCacheStrategy),
  fixed(leastGpuCacheStrategy),
  fixed(leastBusyTimeStrategy),
  fixed(leastTokenLoadStrategy),
  fixed(throughputStrategy),
  fixed(sessionAffinityStrategy),
  fixed(vtcBasicStrategy),
  fixed(sloStrategy),
  fixed(sloLeastLoadStrategy),
  fixed(sloPackLoadStrategy),
  prefixCachePlugin,
  fixed(prefixCachePrebleStrategy),
  pdPlugin,
];

const plugins = new Map(PLUGINS.map((p) => [p.type, p]));
/** The parameterless instance of every plugin (what a bare name selects). */
const byName = new Map(PLUGINS.map((p) => [p.type, p.create()]));

/** Why a profile's `strategyParams` would be refused (an unknown plugin, a parameter it does not take), or undefined. */
export function strategyParamsError(params: Readonly<Record<string, StrategyParams>> | undefined): string | undefined {
  for (const [type, p] of Object.entries(params ?? {})) {
    const plugin = plugins.get(type);
    if (!plugin) return `unknown strategy ${JSON.stringify(type)}; known: ${strategyNames().join(", ")}`;
    try {
      plugin.create(p);
    } catch (err) {
      if (isStrategySpecError(err)) return err.message;
      throw err;
    }
  }
  return undefined;
}

/** Adds a plugin (e.g. from an extension); its type must be new. */
export function registerStrategy(plugin: StrategyPlugin): void {
  if (plugins.has(plugin.type)) throw new Error(`strategy type ${JSON.stringify(plugin.type)} is already registered`);
  plugins.set(plugin.type, plugin);
  byName.set(plugin.type, plugin.create());
}

/** Header values are client input: bound what one spec may cost to parse and cache. */
const MAX_SPEC_LENGTH = 512;
const MAX_PARTS = 16;
const MAX_CACHED = 256;
const WEIGHT = /^(?:\d+(?:\.\d*)?|\.\d+)$/;

/** A routing strategy spec that names no strategy or combines strategies wrongly. Maps to HTTP 400. */
export class StrategySpecError extends Error {
  override name = "StrategySpecError";
  constructor(
    message: string,
    /** The whole spec as given. */
    readonly spec: string,
    /** The part of the spec at fault, when one is. */
    readonly part?: string,
  ) {
    super(message);
  }
}

export function isStrategySpecError(err: unknown): err is StrategySpecError {
  return err instanceof StrategySpecError;
}

/** Base strategy names, in registry order. */
export function strategyNames(): string[] {
  return [...byName.keys()];
}

const parsed = new Map<string, Strategy>();

/**
 * The strategy a spec names, parsing (and caching) combinations. Throws `StrategySpecError` with a
 * message naming the bad part; the director turns it into a 400 `invalid_routing_strategy`.
 */
export function parseStrategy(spec: string, params?: Readonly<Record<string, StrategyParams>>): Strategy {
  const withParams = params !== undefined && Object.keys(params).length > 0;
  const key = withParams ? `${spec}\u0000${JSON.stringify(params)}` : spec;
  const known = (withParams ? undefined : byName.get(spec)) ?? parsed.get(key);
  if (known) return known;
  const s = parseSpec(spec, withParams ? params : undefined);
  // Bounded: the oldest parsed spec goes first (Map iteration = insertion order).
  if (parsed.size >= MAX_CACHED) parsed.delete(parsed.keys().next().value as string);
  parsed.set(key, s);
  return s;
}

/** How many parsed specs are cached (for /debug and tests). */
export function cachedSpecCount(): number {
  return parsed.size;
}

/** Like `parseStrategy`, but `undefined` instead of an error (the director's original contract). */
export function findStrategy(spec: string): Strategy | undefined {
  try {
    return parseStrategy(spec);
  } catch (err) {
    if (isStrategySpecError(err)) return undefined;
    throw err;
  }
}

function parseSpec(spec: string, params: Readonly<Record<string, StrategyParams>> | undefined): Strategy {
  const fail = (message: string, part?: string): never => {
    throw new StrategySpecError(message, spec, part);
  };
  if (spec.trim() === "") fail("routing strategy is empty");
  if (spec.length > MAX_SPEC_LENGTH) fail(`routing strategy is longer than ${MAX_SPEC_LENGTH} characters`);
  const items = spec.split(",");
  if (items.length > MAX_PARTS) fail(`routing strategy combines more than ${MAX_PARTS} strategies`);
  const parts: { strategy: Strategy; weight: number }[] = [];
  for (const item of items) {
    const part = item.trim();
    if (part === "") fail(`empty part in routing strategy ${JSON.stringify(spec)}`, item);
    const colon = part.indexOf(":");
    const name = (colon < 0 ? part : part.slice(0, colon)).trim();
    const weightText = colon < 0 ? undefined : part.slice(colon + 1).trim();
    const plugin = plugins.get(name);
    if (!plugin) fail(`unknown routing strategy ${JSON.stringify(name)}; known: ${strategyNames().join(", ")}`, part);
    const strategy = params?.[name] ? (plugin as StrategyPlugin).create(params[name]) : byName.get(name);
    const weight = weightText === undefined ? 1 : WEIGHT.test(weightText) ? Number(weightText) : Number.NaN;
    if (!(weight > 0) || !Number.isFinite(weight)) fail(`weight of ${JSON.stringify(name)} must be a positive number, got ${JSON.stringify(weightText)}`, part);
    if (parts.some((p) => p.strategy.name === name)) fail(`routing strategy ${JSON.stringify(name)} appears twice`, part);
    parts.push({ strategy: strategy as Strategy, weight });
  }
  for (const type of Object.keys(params ?? {})) {
    if (!plugins.has(type)) fail(`strategy parameters for unknown strategy ${JSON.stringify(type)}`, type);
  }
  if (parts.length === 1) return (parts[0] as { strategy: Strategy }).strategy;
  for (const { strategy } of parts) {
    if (strategy.exclusive) fail(`routing strategy ${JSON.stringify(strategy.name)} is exclusive and cannot be combined with others`, strategy.name);
    if (!strategy.scorer) fail(`routing strategy ${JSON.stringify(strategy.name)} has no scorer and cannot be combined`, strategy.name);
  }
  const scorers: WeightedScorer[] = parts.map((p) => ({ scorer: p.strategy.scorer as WeightedScorer["scorer"], weight: p.weight }));
  // The canonical spec: what the `routing-strategy` response header and decision records show.
  const combined = combinationStrategy(parts.map((p) => `${p.strategy.name}:${p.weight}`).join(","), scorers);
  const needsTokens = parts.some((p) => p.strategy.needs?.promptTokenIds);
  return needsTokens ? { ...combined, needs: { promptTokenIds: true } } : combined;
}
