/**
 * The list of strategy plugins, and weighted combinations of them. Each plugin owns itself in its
 * strategy's file (plugin.ts: type name, parameter schema, needs, traits, factory); listed here it
 * becomes selectable by the `routing-strategy` header, profiles and `--strategy`.
 *
 * A spec is one name (`least-request`) or a weighted combination (`least-kv-cache:2,least-request:1`;
 * a missing weight is 1). See combine.ts for how a combination picks. Exclusive strategies (slo*)
 * decide alone and cannot be combined.
 */
import { combinationStrategy, type WeightedScorer } from "./combine.js";
import { leastBusyTimePlugin } from "./least-busy-time.js";
import { leastGpuCachePlugin, leastKvCachePlugin } from "./least-kv-cache.js";
import { leastLatencyPlugin } from "./least-latency.js";
import { leastRequestPlugin } from "./least-request.js";
import { leastTokenLoadPlugin } from "./least-token-load.js";
import { pdPlugin } from "./pd.js";
import { isStrategySpecError, type StrategyParams, type StrategyPlugin, StrategySpecError } from "./plugin.js";
import { powerOfTwoPlugin } from "./power-of-two.js";
import { predictedLatencyPlugin, predictedLatencyTargetsPlugin } from "./predicted-latency.js";
import { prefixCachePlugin, prefixCachePreblePlugin } from "./prefix-cache.js";
import { randomPlugin } from "./random.js";
import { sessionAffinityPlugin } from "./session-affinity.js";
import { sloLeastLoadPlugin, sloPackLoadPlugin, sloPlugin } from "./slo.js";
import { throughputPlugin } from "./throughput.js";
import type { Strategy, StrategyTraits } from "./types.js";
import { vtcBasicPlugin } from "./vtc-basic.js";

export { isStrategySpecError, type StrategyParams, type StrategyPlugin, StrategySpecError } from "./plugin.js";

/** Every built-in plugin, in the order `strategyNames()` lists them. */
const PLUGINS: StrategyPlugin[] = [
  randomPlugin,
  leastRequestPlugin,
  powerOfTwoPlugin,
  leastLatencyPlugin,
  leastKvCachePlugin,
  leastGpuCachePlugin,
  leastBusyTimePlugin,
  leastTokenLoadPlugin,
  throughputPlugin,
  sessionAffinityPlugin,
  vtcBasicPlugin,
  sloPlugin,
  sloLeastLoadPlugin,
  sloPackLoadPlugin,
  prefixCachePlugin,
  prefixCachePreblePlugin,
  predictedLatencyPlugin,
  predictedLatencyTargetsPlugin,
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
  const traits = unionOfTraits(parts.map((p) => p.strategy.traits));
  return { ...combined, ...(needsTokens ? { needs: { promptTokenIds: true } } : {}), ...(traits ? { traits } : {}) };
}

/** A combination's traits: any part's flag, and every part's replay residual. */
function unionOfTraits(all: ReadonlyArray<StrategyTraits | undefined>): StrategyTraits | undefined {
  const present = all.filter((t): t is StrategyTraits => t !== undefined);
  if (present.length === 0) return undefined;
  const residuals = [...new Set(present.flatMap((t) => (t.replayResidual ? [t.replayResidual] : [])))];
  return {
    ...(present.some((t) => t.prefixMatch) ? { prefixMatch: true } : {}),
    ...(present.some((t) => t.disaggregated) ? { disaggregated: true } : {}),
    ...(residuals.length > 0 ? { replayResidual: residuals.join("; ") } : {}),
  };
}

/**
 * The traits of the strategy a recorded spec names (decision records keep canonical specs), or
 * none when it names no strategy this build knows. Replay and metrics read these, never names.
 */
export function strategyTraits(spec: string): StrategyTraits {
  return findStrategy(spec)?.traits ?? {};
}

/**
 * A bounded label for a strategy spec (metric labels: a client can send arbitrarily many specs):
 * a plugin's type as it is; any valid combination of them `combination`; anything else `invalid`.
 */
export function strategyLabel(spec: string): string {
  if (plugins.has(spec)) return spec;
  return spec.includes(",") && findStrategy(spec) !== undefined ? "combination" : "invalid";
}
