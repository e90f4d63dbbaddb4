/**
 * A model config checked beyond its schema: every strategy it names must parse, with its profile's
 * plugin parameters, a virtual model's rules must be sound (semantic/rules.ts), and flow control's
 * engine priority mapping must keep the bands' order (engine-priority.ts). `jetroute config set` refuses such a config, and a gateway's fold ignores one
 * written around the CLI (keeping the previous config): a bad entry must never turn every request
 * for the model into an error.
 */
import { type ModelConfig, modelConfigError, type Profile } from "../../schemas/config.js";
import { enginePriorityConfigError } from "./engine-priority.js";
import { semanticConfigError } from "./semantic/rules.js";
import { parseStrategy, strategyParamsError } from "./strategies/registry.js";

export function validateModelConfig(value: unknown, model = ""): string | undefined {
  // Before the schema, whose error for this union ("Expected union value") names no culprit.
  const flow = (value as { flowControl?: unknown } | null)?.flowControl;
  if (typeof flow === "object" && flow !== null) {
    const f = flow as { enginePriority?: unknown; objectives?: unknown };
    const objectives = typeof f.objectives === "object" && f.objectives !== null ? Object.values(f.objectives) : [];
    const bands = objectives.map((o) => (o as { priority?: unknown } | null)?.priority).filter((p): p is number => typeof p === "number");
    const e = enginePriorityConfigError(f.enginePriority, bands);
    if (e) return e;
  }
  const err = modelConfigError(value);
  if (err) return err;
  const c = value as ModelConfig;
  if (c.semantic) {
    const e = semanticConfigError(model, c.semantic);
    if (e) return e;
  }
  for (const [n, p] of Object.entries(c.profiles ?? {})) {
    const e = strategyParamsError(p.strategyParams);
    if (e) return `/profiles/${n}/strategyParams: ${e}`;
  }
  const specs: Array<[string, string | undefined, Profile["strategyParams"]]> = [
    ["/lockedRoutingStrategy", c.lockedRoutingStrategy, undefined],
    ...Object.entries(c.profiles ?? {}).map(([n, p]) => [`/profiles/${n}/routingStrategy`, p.routingStrategy, p.strategyParams] as [string, string | undefined, Profile["strategyParams"]]),
  ];
  for (const [where, spec, params] of specs) {
    if (!spec) continue;
    try {
      parseStrategy(spec, params);
    } catch (e) {
      return `${where}: ${(e as Error).message}`;
    }
  }
  return undefined;
}
