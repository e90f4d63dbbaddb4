/**
 * An InferencePool's InferenceObjectives and InferenceModelRewrites -> the policy record the
 * gateways read (schemas/config.ts InferencePoolPolicy). Pure.
 *
 * API versions implemented: `llm-d.ai/v1alpha2` (the llm-d router, where these APIs moved in
 * 2026) and `inference.networking.x-k8s.io/v1alpha2` (the Inference Extension before the split);
 * the objects have the same shape in both:
 * - InferenceObjective: `spec.poolRef` (`name`, optional `group`/`kind`), `spec.priority`
 *   (int32, unset = 0). Its name is the objective name requests carry
 *   (`x-gateway-inference-objective` / `x-llm-d-inference-objective`). Priorities are clamped to
 *   flow control's bands, -16..16.
 * - InferenceModelRewrite: `spec.poolRef`, `spec.rules[]` with `matches[].model` (`type: Exact`,
 *   `value`; no matches = every request to the pool) and `targets[]` (`modelRewrite`, `weight`:
 *   set on all targets or on none, none = equal). Precedence as the API defines it: rules with an
 *   exact match before generic ones, then the oldest object, then list order.
 * Objects that reference another pool are ignored; bad ones are skipped and reported.
 */
import type { InferencePoolPolicy } from "../../schemas/config.js";

export const OBJECTIVES_API_VERSIONS = ["llm-d.ai/v1alpha2", "inference.networking.x-k8s.io/v1alpha2"] as const;
export const DEFAULT_OBJECTIVES_API_VERSION = OBJECTIVES_API_VERSIONS[0];
const POOL_GROUP = "inference.networking.k8s.io";
const MIN_BAND = -16;
const MAX_BAND = 16;
const MAX_RULES = 256;
const NAME = /^\S{1,256}$/;

export interface KubeObjectLike {
  metadata?: { name?: string; creationTimestamp?: string | Date };
  spec?: Record<string, unknown>;
}

export interface PolicyProblem {
  object: string;
  reason: string;
}

export interface ParsedPolicy {
  policy: InferencePoolPolicy;
  problems: PolicyProblem[];
  /** Objectives whose priority was outside -16..16 and was clamped. */
  clamped: number;
}

/** Whether the object's `spec.poolRef` (or an llm-d v1 `spec.poolRefs` entry) names this pool. */
export function referencesPool(o: KubeObjectLike, pool: string): boolean {
  const many = o.spec?.poolRefs;
  const refs = [o.spec?.poolRef, ...(Array.isArray(many) ? (many as unknown[]) : [])];
  return refs.some((r) => {
    const ref = r as { name?: unknown; group?: unknown; kind?: unknown } | undefined;
    return ref?.name === pool && (ref.group === undefined || ref.group === "" || ref.group === POOL_GROUP) && (ref.kind === undefined || ref.kind === "InferencePool");
  });
}

const created = (o: KubeObjectLike) => {
  const t = o.metadata?.creationTimestamp;
  return t instanceof Date ? t.toISOString() : (t ?? "");
};

type Rule = InferencePoolPolicy["rewrites"][number];

function parseRule(r: unknown, from: string): Rule | string {
  const rule = r as { matches?: unknown; targets?: unknown } | null;
  if (typeof rule !== "object" || rule === null) return "a rule is not an object";
  const models: string[] = [];
  if (rule.matches !== undefined) {
    if (!Array.isArray(rule.matches)) return "matches must be a list";
    for (const m of rule.matches) {
      const mm = (m as { model?: { type?: unknown; value?: unknown } } | null)?.model;
      if (!mm || (mm.type !== undefined && mm.type !== "Exact")) return "only model matches of type Exact are implemented";
      if (typeof mm.value !== "string" || !NAME.test(mm.value)) return "matches[].model.value must be a model name";
      models.push(mm.value);
    }
  }
  if (!Array.isArray(rule.targets) || rule.targets.length === 0 || rule.targets.length > 64) return "targets must list 1 to 64 models";
  const weighted = rule.targets.filter((t) => (t as { weight?: unknown })?.weight !== undefined).length;
  if (weighted !== 0 && weighted !== rule.targets.length) return "weight must be set on every target or on none";
  const targets: Rule["targets"] = [];
  for (const t of rule.targets as Array<{ modelRewrite?: unknown; weight?: unknown }>) {
    if (typeof t?.modelRewrite !== "string" || !NAME.test(t.modelRewrite)) return "targets[].modelRewrite must be a model name";
    const w = t.weight ?? 1;
    if (typeof w !== "number" || !Number.isInteger(w) || w < 1 || w > 1_000_000) return "targets[].weight must be an integer from 1 to 1000000";
    targets.push({ model: t.modelRewrite, weight: w });
  }
  return { from, ...(models.length > 0 ? { models: [...new Set(models)].slice(0, 64) } : {}), targets };
}

/** The policy record of `namespace/pool` from the objects listed in its namespace. */
export function poolPolicyOf(i: { namespace: string; pool: string; apiVersion: string; models: readonly string[]; objectives: Iterable<KubeObjectLike>; rewrites: Iterable<KubeObjectLike> }): ParsedPolicy {
  const problems: PolicyProblem[] = [];
  let clamped = 0;
  const objectives: InferencePoolPolicy["objectives"] = {};
  const objs = [...i.objectives].filter((o) => referencesPool(o, i.pool)).sort((a, b) => ((a.metadata?.name ?? "") < (b.metadata?.name ?? "") ? -1 : 1));
  for (const o of objs) {
    const name = o.metadata?.name ?? "";
    const p = o.spec?.priority ?? 0;
    if (typeof p !== "number" || !Number.isInteger(p)) {
      problems.push({ object: `InferenceObjective ${name}`, reason: "spec.priority must be an integer" });
      continue;
    }
    const band = Math.min(MAX_BAND, Math.max(MIN_BAND, p));
    if (band !== p) clamped++;
    objectives[name] = { priority: band };
  }
  const exact: Rule[] = [];
  const generic: Rule[] = [];
  const rws = [...i.rewrites].filter((o) => referencesPool(o, i.pool)).sort((a, b) => (created(a) + (a.metadata?.name ?? "") < created(b) + (b.metadata?.name ?? "") ? -1 : 1));
  for (const o of rws) {
    const name = o.metadata?.name ?? "";
    const rules = o.spec?.rules;
    if (!Array.isArray(rules)) {
      problems.push({ object: `InferenceModelRewrite ${name}`, reason: "spec.rules must be a list" });
      continue;
    }
    rules.forEach((r, idx) => {
      const parsed = parseRule(r, `${name}#${idx}`);
      if (typeof parsed === "string") problems.push({ object: `InferenceModelRewrite ${name} rule ${idx}`, reason: parsed });
      else (parsed.models ? exact : generic).push(parsed);
    });
  }
  const rewrites = [...exact, ...generic].slice(0, MAX_RULES);
  return {
    policy: { pool: `${i.namespace}/${i.pool}`, apiVersion: i.apiVersion, models: [...new Set(i.models)].sort().slice(0, 2_000), objectives, rewrites },
    problems,
    clamped,
  };
}

/** The config bucket key of a pool's policy. */
export const poolPolicyKey = (namespace: string, pool: string): string => `inferencepool.${namespace}.${pool}`;

/** The objectives API version must be one implemented: a clear error at start. */
export function checkObjectivesApiVersion(v: string | undefined): string {
  const version = v ?? DEFAULT_OBJECTIVES_API_VERSION;
  if (!(OBJECTIVES_API_VERSIONS as readonly string[]).includes(version)) {
    throw new RangeError(`unknown InferenceObjective / InferenceModelRewrite API version ${JSON.stringify(version.slice(0, 80))}: this pod-watcher implements ${OBJECTIVES_API_VERSIONS.join(" and ")} (or none)`);
  }
  return version;
}
