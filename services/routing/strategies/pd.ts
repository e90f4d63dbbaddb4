/**
 * `pd`: prefill/decode disaggregation. Picks a roleset, then a prefill pod and a decode pod in it
 * (AIBrix's pd plugin, with every load term read from the shared ledger, so both legs' load is the
 * fleet's and not this replica's alone). Pure: the director charges the plan and the legs stage
 * (stages/pd-legs.ts) runs it.
 *
 * - Rolesets: pods grouped by `roleset` (no label: roleset "default"). Usable only with at least
 *   one ready prefill and one ready decode pod of one engine; anything else is reported unusable
 *   (counted by the gateway), never an error.
 * - Prompt-length buckets: a pod label `prompt-len-bucket-min-length` / `-max-length` (tokens,
 *   min inclusive, max exclusive) restricts its roleset to prompts in the range.
 * - Combined fallback: no usable roleset fits, or the prompt is shorter than `minPromptTokens`
 *   while combined pods exist.
 * - Fast paths (AIBrix): when the prefill requests in flight across usable prefill pods differ by
 *   more than `prefillImbalance`, the least loaded prefill pod wins outright (and its roleset);
 *   likewise decode with `decodeImbalance`.
 * - Scores (lower is better, each in [0, 2]): prefill = (1 - matched prefix fraction) + prefill
 *   requests / the most loaded prefill pod's; decode = pending decode requests / the most loaded
 *   decode pod's + KV cache usage (+ the engine's SGLang prealloc queue / 1000, a tie-break). A roleset's score is its best prefill plus its best decode;
 *   the lowest roleset wins, ties at random.
 * - Decider (vLLM only): when the chosen decode pod already holds all but fewer than
 *   `skipPrefillBelowTokens` of the prompt, the prefill leg is skipped: decode computes the rest.
 */
import type { EngineKind } from "../../../schemas/events.js";
import type { PodInfo } from "../../views/pod-set.js";
import { leastRequestStrategy } from "./least-request.js";
import { checkParams, type StrategyPlugin } from "./plugin.js";
import { NoCandidateError, type Pick, type RoutingContext, type Scored, type Strategy, type StrategyTraits } from "./types.js";

export interface PdConfig {
  /** Prefill requests in flight, max - min over usable prefill pods, above which the least loaded wins. */
  prefillImbalance: number;
  /** The same for pending decode requests over decode pods. */
  decodeImbalance: number;
  /** Prompts shorter than this go to combined pods when there are any. */
  minPromptTokens: number;
  /** vLLM: skip the prefill leg when the decode pod misses fewer than this many prompt tokens (0: never). */
  skipPrefillBelowTokens: number;
}

export type UnusableReason = "no-prefill" | "no-decode" | "mixed-engines";

export interface Roleset {
  readonly name: string;
  readonly engine: EngineKind;
  readonly prefill: readonly PodInfo[];
  readonly decode: readonly PodInfo[];
}

export interface Rolesets {
  readonly usable: readonly Roleset[];
  readonly unusable: readonly { name: string; reason: UnusableReason }[];
  /** Pods with role `combined` (the fallback). */
  readonly combined: readonly PodInfo[];
}

export type CombinedReason = "no-usable-roleset" | "no-bucket" | "short-prompt";

export type PdPlan =
  | {
      readonly kind: "pd";
      readonly roleset: string;
      readonly engine: EngineKind;
      readonly prefill: PodInfo;
      readonly decode: PodInfo;
      /** The decider: decode computes the (small) uncached rest itself, no prefill leg. */
      readonly skipPrefill: boolean;
      /** Every usable roleset's score (its best prefill pod stands for it), for records and explain. */
      readonly candidates: readonly Scored[];
      readonly prefillCandidates: readonly Scored[];
      readonly decodeCandidates: readonly Scored[];
      readonly fastPath?: "prefill-imbalance" | "decode-imbalance";
      readonly unusable: Rolesets["unusable"];
    }
  | { readonly kind: "combined"; readonly reason: CombinedReason; readonly combined: readonly PodInfo[]; readonly unusable: Rolesets["unusable"] };

/** The two-leg plan of a pick by the `pd` strategy, or undefined for any other pick. */
export function pdPlanOf(pick: Pick): PdPlan | undefined {
  const plan = pick.plan as PdPlan | undefined;
  return plan && (plan.kind === "pd" || plan.kind === "combined") ? plan : undefined;
}

export const PD_STRATEGY = "pd";
export const DEFAULT_ROLESET = "default";
export const BUCKET_MIN_LABEL = "prompt-len-bucket-min-length";
export const BUCKET_MAX_LABEL = "prompt-len-bucket-max-length";

export const DEFAULT_PD_CONFIG: Readonly<PdConfig> = { prefillImbalance: 16, decodeImbalance: 16, minPromptTokens: 0, skipPrefillBelowTokens: 0 };

/** Groups ready pods into rolesets (sorted by name, the same on every replica). */
export function rolesetsOf(pods: readonly PodInfo[]): Rolesets {
  const groups = new Map<string, { prefill: PodInfo[]; decode: PodInfo[] }>();
  const combined: PodInfo[] = [];
  for (const p of pods) {
    if (p.role === "combined") {
      combined.push(p);
      continue;
    }
    const name = p.roleset ?? DEFAULT_ROLESET;
    let g = groups.get(name);
    if (!g) groups.set(name, (g = { prefill: [], decode: [] }));
    (p.role === "prefill" ? g.prefill : g.decode).push(p);
  }
  const usable: Roleset[] = [];
  const unusable: { name: string; reason: UnusableReason }[] = [];
  for (const name of [...groups.keys()].sort()) {
    const g = groups.get(name) as { prefill: PodInfo[]; decode: PodInfo[] };
    if (g.prefill.length === 0) unusable.push({ name, reason: "no-prefill" });
    else if (g.decode.length === 0) unusable.push({ name, reason: "no-decode" });
    else {
      const engine = (g.prefill[0] as PodInfo).engine;
      if (![...g.prefill, ...g.decode].every((p) => p.engine === engine)) unusable.push({ name, reason: "mixed-engines" });
      else usable.push({ name, engine, prefill: byName(g.prefill), decode: byName(g.decode) });
    }
  }
  return { usable, unusable, combined };
}

const byName = (pods: PodInfo[]) => pods.sort((a, b) => (a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : 0));

/** The bucket a roleset's labels declare: [min, max) in prompt tokens. Malformed labels declare nothing. */
export function bucketOf(rs: Roleset): { min: number; max: number } {
  let min = 0;
  let max = Number.POSITIVE_INFINITY;
  for (const p of [...rs.prefill, ...rs.decode]) {
    const lo = intLabel(p.labels[BUCKET_MIN_LABEL]);
    const hi = intLabel(p.labels[BUCKET_MAX_LABEL]);
    if (lo !== undefined) min = Math.max(min, lo);
    if (hi !== undefined) max = Math.min(max, hi);
  }
  return { min, max };
}

function intLabel(v: string | undefined): number | undefined {
  if (v === undefined || !/^\d{1,9}$/.test(v)) return undefined;
  return Number(v);
}

/** What the planner reads: a strategy's context (prefix match over every candidate, any role) and its parameters. */
export type PdContext = Omit<RoutingContext, "tieOrder" | "usage" | "slo"> & { readonly config?: Readonly<PdConfig> };

export function planPd(ctx: PdContext): PdPlan {
  const cfg = ctx.config ?? DEFAULT_PD_CONFIG;
  const sets = rolesetsOf(ctx.pods);
  const tokens = ctx.request.promptTokens;
  const combined = (reason: CombinedReason): PdPlan => ({ kind: "combined", reason, combined: sets.combined, unusable: sets.unusable });
  if (sets.usable.length === 0) return combined("no-usable-roleset");
  if (tokens < cfg.minPromptTokens && sets.combined.length > 0) return combined("short-prompt");
  const fitting = sets.usable.filter((rs) => {
    const b = bucketOf(rs);
    return tokens >= b.min && tokens < b.max;
  });
  if (fitting.length === 0) return combined("no-bucket");

  const prefillPods = fitting.flatMap((rs) => rs.prefill);
  const decodePods = fitting.flatMap((rs) => rs.decode);
  const info = ctx.prefix;
  const out = (p: PodInfo) => ctx.ledger.outstanding(p.model, p.pod).requests;
  const prefillLoad = prefillPods.map(out);
  const decodeLoad = decodePods.map(out);
  const maxPrefill = Math.max(1, ...prefillLoad);
  const maxDecode = Math.max(1, ...decodeLoad);
  const queried = info?.queried ?? 0;
  const prefillScore = new Map<PodInfo, number>();
  prefillPods.forEach((p, i) => {
    const matched = queried > 0 && info ? Math.min(1, info.matched(p.pod) / queried) : 0;
    prefillScore.set(p, 1 - matched + (prefillLoad[i] as number) / maxPrefill);
  });
  const decodeScore = new Map<PodInfo, number>();
  decodePods.forEach((p, i) => {
    const sample = ctx.load.fresh(p.model, p.pod, ctx.now);
    const kv = sample?.kvCacheUsage ?? 0;
    // The engine's own count of decodes waiting for their KV (SGLang) breaks ties the ledger leaves.
    const queued = Math.min(Math.max(sample?.pdDecodeQueue ?? 0, 0), 999) / 1000;
    decodeScore.set(p, (decodeLoad[i] as number) / maxDecode + Math.min(1, Math.max(0, kv)) + queued);
  });
  const rolesetOf = new Map<PodInfo, Roleset>();
  for (const rs of fitting) for (const p of [...rs.prefill, ...rs.decode]) rolesetOf.set(p, rs);

  let roleset: Roleset;
  let prefill: PodInfo;
  let decode: PodInfo;
  let fastPath: "prefill-imbalance" | "decode-imbalance" | undefined;
  const spread = (loads: number[]) => Math.max(...loads) - Math.min(...loads);
  if (prefillPods.length > 1 && spread(prefillLoad) > cfg.prefillImbalance) {
    fastPath = "prefill-imbalance";
    prefill = lowest(prefillPods, (p) => out(p), ctx.random);
    roleset = rolesetOf.get(prefill) as Roleset;
    decode = lowest(roleset.decode, (p) => decodeScore.get(p) as number, ctx.random);
  } else if (decodePods.length > 1 && spread(decodeLoad) > cfg.decodeImbalance) {
    fastPath = "decode-imbalance";
    decode = lowest(decodePods, (p) => out(p), ctx.random);
    roleset = rolesetOf.get(decode) as Roleset;
    prefill = lowest(roleset.prefill, (p) => prefillScore.get(p) as number, ctx.random);
  } else {
    const best = fitting.map((rs) => {
      const bp = lowest(rs.prefill, (p) => prefillScore.get(p) as number, ctx.random);
      const bd = lowest(rs.decode, (p) => decodeScore.get(p) as number, ctx.random);
      return { rs, bp, bd, score: (prefillScore.get(bp) as number) + (decodeScore.get(bd) as number) };
    });
    const win = lowest(best, (b) => b.score, ctx.random);
    roleset = win.rs;
    prefill = win.bp;
    decode = win.bd;
  }
  const matchedOnDecode = info ? info.matched(decode.pod) * info.blockSize : 0;
  const skipPrefill = roleset.engine === "vllm" && cfg.skipPrefillBelowTokens > 0 && tokens - matchedOnDecode < cfg.skipPrefillBelowTokens;
  return {
    kind: "pd",
    roleset: roleset.name,
    engine: roleset.engine,
    prefill,
    decode,
    skipPrefill,
    candidates: fitting.map((rs) => {
      const bp = lowest(rs.prefill, (p) => prefillScore.get(p) as number, () => 0);
      const bd = lowest(rs.decode, (p) => decodeScore.get(p) as number, () => 0);
      return { pod: bp, score: round((prefillScore.get(bp) as number) + (decodeScore.get(bd) as number)) };
    }),
    prefillCandidates: prefillPods.map((p) => ({ pod: p, score: round(prefillScore.get(p) as number) })),
    decodeCandidates: decodePods.map((p) => ({ pod: p, score: round(decodeScore.get(p) as number) })),
    ...(fastPath ? { fastPath } : {}),
    unusable: sets.unusable,
  };
}

const round = (x: number) => Math.round(x * 1e6) / 1e6;

/** The lowest-scoring item; ties broken by one draw of `random` (so a replica's picks reproduce in replay). */
function lowest<T>(items: readonly T[], score: (x: T) => number, random: () => number): T {
  let best = Number.POSITIVE_INFINITY;
  const tied: T[] = [];
  for (const it of items) {
    const s = score(it);
    if (s < best - 1e-12) {
      best = s;
      tied.length = 0;
      tied.push(it);
    } else if (Math.abs(s - best) <= 1e-12) tied.push(it);
  }
  if (tied.length === 1) return tied[0] as T;
  return tied[Math.min(tied.length - 1, Math.floor(random() * tied.length))] as T;
}

const PD_TRAITS: StrategyTraits = { prefixMatch: true, disaggregated: true };

/** A `pd` strategy, with the configuration it was made with. */
export interface PdStrategy extends Strategy {
  readonly config: Readonly<PdConfig>;
}

/**
 * The strategy the registry holds: its pick is the decode pod (what Envoy is sent to), with the
 * whole plan attached for the director; a combined plan picks least-request among combined pods.
 */
export function pdStrategy(config: Readonly<PdConfig> = DEFAULT_PD_CONFIG): PdStrategy {
  return {
    name: PD_STRATEGY,
    needs: { promptTokenIds: true },
    traits: PD_TRAITS,
    exclusive: true,
    config,
    pick(ctx: RoutingContext): Pick {
      const plan = planPd({ ...ctx, config });
      if (plan.kind === "pd") return { pod: plan.decode, candidates: plan.decodeCandidates, plan };
      if (plan.combined.length === 0) {
        const why = plan.unusable.length > 0 ? `; unusable rolesets: ${plan.unusable.slice(0, 8).map((u) => `${u.name} (${u.reason})`).join(", ")}` : "";
        throw new NoCandidateError(`no usable prefill/decode roleset and no combined pod serves model \`${ctx.request.model}\`${why}`);
      }
      const pick = leastRequestStrategy.pick({ ...ctx, pods: plan.combined });
      return { ...pick, fallback: `combined:${plan.reason}`, plan };
    },
  };
}

const PD_PARAMS = {
  prefillImbalance: { type: "number", min: 0, default: DEFAULT_PD_CONFIG.prefillImbalance, description: "prefill requests in flight, max - min over usable prefill pods, above which the least loaded wins outright" },
  decodeImbalance: { type: "number", min: 0, default: DEFAULT_PD_CONFIG.decodeImbalance, description: "the same for pending decode requests over decode pods" },
  minPromptTokens: { type: "number", min: 0, default: DEFAULT_PD_CONFIG.minPromptTokens, description: "prompts shorter than this go to combined pods when there are any" },
  skipPrefillBelowTokens: { type: "number", min: 0, default: DEFAULT_PD_CONFIG.skipPrefillBelowTokens, description: "vLLM: skip the prefill leg when the decode pod misses fewer prompt tokens than this (0: never)" },
} as const;

const defaultPd = pdStrategy();

export const pdPlugin: StrategyPlugin = {
  type: PD_STRATEGY,
  needs: { promptTokenIds: true },
  traits: PD_TRAITS,
  params: PD_PARAMS,
  create(params) {
    if (!params || Object.keys(params).length === 0) return defaultPd;
    return pdStrategy(checkParams(pdPlugin, params) as unknown as PdConfig);
  },
};

/** Parses a profile's `strategyParams.pd`; throws a StrategySpecError naming the bad parameter. */
export function pdConfigOf(params: Readonly<Record<string, number | string | boolean>> | undefined): PdConfig {
  return checkParams(pdPlugin, params) as unknown as PdConfig;
}
