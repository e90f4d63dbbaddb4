/**
 * The plugin contract: a strategy type declares its name, the parameters it takes (a schema the
 * registry and `jetroute config set` check against), what it needs computed before it can pick,
 * and its traits. The registry only lists plugins; replay, metrics and the director read traits,
 * never names.
 */
import type { Strategy, StrategyNeeds, StrategyTraits } from "./types.js";

/** Parameters of one plugin, as a profile gives them. */
export type StrategyParams = Readonly<Record<string, number | string | boolean>>;

/** One parameter a plugin takes. Numbers only so far: every built-in parameter is a threshold. */
export interface ParamSpec {
  readonly type: "number";
  /** Smallest allowed value (inclusive). */
  readonly min: number;
  readonly default: number;
  readonly description: string;
}

export interface StrategyPlugin {
  readonly type: string;
  readonly needs?: StrategyNeeds;
  readonly traits?: StrategyTraits;
  /** The parameters it takes (profiles' `strategyParams[type]`); absent: none. */
  readonly params?: Readonly<Record<string, ParamSpec>>;
  /** Builds the strategy from checked parameters (`checkParams` has run). */
  create(params?: StrategyParams): Strategy;
}

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

/**
 * The plugin's parameters with its defaults filled in, or a StrategySpecError naming the first
 * parameter it does not take or whose value is out of range.
 */
export function checkParams(plugin: Pick<StrategyPlugin, "type" | "params">, params: StrategyParams | undefined): Record<string, number> {
  const schema = plugin.params ?? {};
  const names = Object.keys(schema);
  const out: Record<string, number> = Object.fromEntries(names.map((k) => [k, (schema[k] as ParamSpec).default]));
  for (const [k, v] of Object.entries(params ?? {})) {
    const spec = Object.hasOwn(schema, k) ? schema[k] : undefined;
    if (!spec) {
      const takes = names.length > 0 ? ` (it takes ${names.join(", ")})` : "";
      throw new StrategySpecError(
        names.length > 0 ? `${plugin.type} has no parameter ${JSON.stringify(k)}${takes}` : `routing strategy ${JSON.stringify(plugin.type)} takes no parameters (got ${Object.keys(params ?? {}).map((x) => JSON.stringify(x)).join(", ")})`,
        plugin.type,
      );
    }
    if (typeof v !== "number" || !Number.isFinite(v) || !(v >= spec.min)) throw new StrategySpecError(`${plugin.type} parameter ${k} must be a number >= ${spec.min}, got ${JSON.stringify(v)}`, plugin.type);
    out[k] = v;
  }
  return out;
}

/** The plugin of one fixed strategy: it takes no parameters. */
export function fixedPlugin(s: Strategy): StrategyPlugin {
  return {
    type: s.name,
    ...(s.needs ? { needs: s.needs } : {}),
    ...(s.traits ? { traits: s.traits } : {}),
    create(params) {
      checkParams({ type: s.name }, params);
      return s;
    },
  };
}
