/**
 * InferencePool policies folded from the config bucket (`inferencepool.<ns>.<name>`, schemas
 * config.ts InferencePoolPolicy): the pools' InferenceObjectives as flow-control objectives of the
 * models they serve, and their InferenceModelRewrites as weighted model-name rewrites. Pure.
 *
 * - Objectives: per model, the union of the objectives of every pool serving it (on a name
 *   clash, the pool whose key sorts first wins; a model's own config wins over all of them, in
 *   model-config.ts).
 * - Rewrites: a request's model is looked up in the rules naming it exactly (every pool's, pools
 *   in key order, rules in their recorded precedence), then in the rules for all models of a pool
 *   that serves it. The rule's target is chosen by weight with a hash of the request id, so one
 *   request always gets the same target (a retry too) and the split holds over many requests.
 *   Scoped to the pool: a pool's rule applies only to requests for the pool's models (those it
 *   lists, and adapters its pods serve) or for an alias no pod serves and no other pool lists, and
 *   sends them only to the pool's models (other targets are skipped; counted in `outOfScope`), so
 *   a rewrite in one namespace cannot capture another tenant's model nor send its own traffic to
 *   another pool's pods. Checked per request, against the pods as they are then.
 *
 * Bounded: at most MAX_POOLS policies (each at most 256 rules by its schema). Measured about
 * 3 KB per pool with 4 models, 4 objectives and 4 two-target rules (1,000 pools, heap after GC,
 * the derived indexes included): 1,000 such pools are about 3 MB.
 */
import type { InferencePoolPolicy } from "../../schemas/config.js";

export const MAX_POOLS = 1_000;

type Rule = InferencePoolPolicy["rewrites"][number];

export interface RewriteChoice {
  /** The model the request is sent for instead. */
  model: string;
  /** The rule that applied (`<InferenceModelRewrite name>#<index>`) and its pool. */
  rule: string;
  pool: string;
}

/** FNV-1a, 32 bits, over a string's UTF-16 code units: a stable hash of the request id. */
export function fnv1a32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** The weighted pick of a rule's targets for this request id (deterministic). */
export function pickTarget(targets: Rule["targets"], requestId: string): string {
  const total = targets.reduce((n, t) => n + t.weight, 0);
  let at = fnv1a32(requestId) % total;
  for (const t of targets) {
    if (at < t.weight) return t.model;
    at -= t.weight;
  }
  return (targets[targets.length - 1] as Rule["targets"][number]).model;
}

/** The pods a gateway sees, as the rewrite scope reads them. */
export interface RewriteFleet {
  knows(model: string): boolean;
  readyPods(model: string): readonly { readonly model: string }[];
}

export class PoolPolicies {
  private readonly policies = new Map<string, InferencePoolPolicy>();
  /** Derived on change: model -> objectives; exact rules by model; generic rules by model. */
  private objectives = new Map<string, Record<string, { priority: number }>>();
  private exact = new Map<string, { rule: Rule; pool: string }[]>();
  private generic = new Map<string, { rule: Rule; pool: string }[]>();
  version = 0;
  /** Every pool's models, and the union of them (a rewrite's scope). */
  private poolModels = new Map<string, ReadonlySet<string>>();
  private listed = new Set<string>();
  /** Rewrites not applied because the request's model or a target is outside the rule's pool. */
  outOfScope = 0;

  get size(): number {
    return this.policies.size;
  }

  /** Whether any pool has a rewrite rule (the request path skips the body lookup otherwise). */
  get hasRewrites(): boolean {
    return this.exact.size > 0 || this.generic.size > 0;
  }

  /** Stores (or with `undefined` removes) the policy under its bucket key. False when full. */
  set(key: string, policy: InferencePoolPolicy | undefined): boolean {
    if (policy === undefined) this.policies.delete(key);
    else {
      if (!this.policies.has(key) && this.policies.size >= MAX_POOLS) return false;
      this.policies.set(key, policy);
    }
    this.derive();
    return true;
  }

  all(): Array<[string, InferencePoolPolicy]> {
    return [...this.policies].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  }

  /** Every model's pool objectives (a new map after each change). */
  objectivesByModel(): ReadonlyMap<string, Readonly<Record<string, { priority: number }>>> {
    return this.objectives;
  }

  /** The objectives the pools serving `model` define (undefined: none). */
  objectivesFor(model: string): Readonly<Record<string, { priority: number }>> | undefined {
    return this.objectives.get(model);
  }

  /**
   * The rewrite that applies to a request for `model` with this request id, if any. `fleet`: the
   * pods the gateway sees, for the scope (adapters a pool's pods serve are the pool's models too;
   * a model some pod serves is never an alias). Without it only the pools' model lists count.
   */
  rewrite(model: string, requestId: string, fleet?: RewriteFleet): RewriteChoice | undefined {
    for (const hit of [...(this.exact.get(model) ?? []), ...(this.generic.get(model) ?? [])]) {
      const own = this.poolModels.get(hit.pool);
      if (!own) continue;
      const ours = (m: string) => own.has(m) || (fleet?.readyPods(m).some((p) => own.has(p.model)) ?? false);
      // The request's model: the pool's, or an alias nobody serves and no other pool lists.
      if (!ours(model) && (this.listed.has(model) || fleet?.knows(model) === true)) {
        this.outOfScope++;
        continue;
      }
      const targets = hit.rule.targets.filter((t) => ours(t.model));
      if (targets.length < hit.rule.targets.length) this.outOfScope++;
      if (targets.length === 0) continue;
      return { model: pickTarget(targets, requestId), rule: hit.rule.from, pool: hit.pool };
    }
    return undefined;
  }

  private derive(): void {
    this.version++;
    const objectives = new Map<string, Record<string, { priority: number }>>();
    const exact = new Map<string, { rule: Rule; pool: string }[]>();
    const generic = new Map<string, { rule: Rule; pool: string }[]>();
    const push = (m: Map<string, { rule: Rule; pool: string }[]>, model: string, v: { rule: Rule; pool: string }) => {
      const list = m.get(model);
      if (list) list.push(v);
      else m.set(model, [v]);
    };
    const poolModels = new Map<string, ReadonlySet<string>>();
    const listed = new Set<string>();
    for (const [, p] of this.all()) {
      poolModels.set(p.pool, new Set(p.models));
      for (const model of p.models) {
        listed.add(model);
        if (Object.keys(p.objectives).length > 0) objectives.set(model, { ...p.objectives, ...(objectives.get(model) ?? {}) });
      }
      for (const rule of p.rewrites) {
        if (rule.models) for (const model of rule.models) push(exact, model, { rule, pool: p.pool });
        else for (const model of p.models) push(generic, model, { rule, pool: p.pool });
      }
    }
    this.poolModels = poolModels;
    this.listed = listed;
    this.objectives = objectives;
    this.exact = exact;
    this.generic = generic;
  }
}
