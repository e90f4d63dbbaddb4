/**
 * Strategies by name, and weighted combinations of them. A strategy is a small plugin: add it to
 * this list and it becomes selectable by the `routing-strategy` header, profiles and `--strategy`.
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
import { prefixCachePrebleStrategy, prefixCacheStrategy } from "./prefix-cache.js";
import { randomStrategy } from "./random.js";
import { sessionAffinityStrategy } from "./session-affinity.js";
import { sloLeastLoadStrategy, sloPackLoadStrategy, sloStrategy } from "./slo.js";
import { throughputStrategy } from "./throughput.js";
import type { Strategy } from "./types.js";
import { vtcBasicStrategy } from "./vtc-basic.js";

const STRATEGIES: readonly Strategy[] = [
  randomStrategy,
  leastRequestStrategy,
  powerOfTwoStrategy,
  leastLatencyStrategy,
  leastKvCacheStrategy,
  leastGpuCacheStrategy,
  leastBusyTimeStrategy,
  leastTokenLoadStrategy,
  throughputStrategy,
  sessionAffinityStrategy,
  vtcBasicStrategy,
  sloStrategy,
  sloLeastLoadStrategy,
  sloPackLoadStrategy,
  prefixCacheStrategy(),
  prefixCachePrebleStrategy,
];

const byName = new Map(STRATEGIES.map((s) => [s.name, s]));

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
export function parseStrategy(spec: string): Strategy {
  const known = byName.get(spec) ?? parsed.get(spec);
  if (known) return known;
  const s = parseSpec(spec);
  // Bounded: the oldest parsed spec goes first (Map iteration = insertion order).
  if (parsed.size >= MAX_CACHED) parsed.delete(parsed.keys().next().value as string);
  parsed.set(spec, s);
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

function parseSpec(spec: string): Strategy {
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
    const strategy = byName.get(name);
    if (!strategy) fail(`unknown routing strategy ${JSON.stringify(name)}; known: ${strategyNames().join(", ")}`, part);
    const weight = weightText === undefined ? 1 : WEIGHT.test(weightText) ? Number(weightText) : Number.NaN;
    if (!(weight > 0) || !Number.isFinite(weight)) fail(`weight of ${JSON.stringify(name)} must be a positive number, got ${JSON.stringify(weightText)}`, part);
    if (parts.some((p) => p.strategy.name === name)) fail(`routing strategy ${JSON.stringify(name)} appears twice`, part);
    parts.push({ strategy: strategy as Strategy, weight });
  }
  if (parts.length === 1) return (parts[0] as { strategy: Strategy }).strategy;
  for (const { strategy } of parts) {
    if (strategy.exclusive) fail(`routing strategy ${JSON.stringify(strategy.name)} is exclusive and cannot be combined with others`, strategy.name);
    if (!strategy.scorer) fail(`routing strategy ${JSON.stringify(strategy.name)} has no scorer and cannot be combined`, strategy.name);
  }
  const scorers: WeightedScorer[] = parts.map((p) => ({ scorer: p.strategy.scorer as WeightedScorer["scorer"], weight: p.weight }));
  // The canonical spec: what the `routing-strategy` response header and decision records show.
  return combinationStrategy(parts.map((p) => `${p.strategy.name}:${p.weight}`).join(","), scorers);
}
