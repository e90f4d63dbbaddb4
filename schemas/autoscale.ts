/**
 * Autoscaling policies, kept in the config bucket under `autoscale.<escaped policy name>` and set
 * with `jetroute config set-autoscale` (docs/autoscaling.md). One policy scales the pods of one
 * model (or one P/D role of it). Algorithms and defaults follow AIBrix's PodAutoscaler (KPA, APA);
 * `pd` sizes prefill and decode together.
 */
import { type Static, Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { RecordSignature } from "./signature.js";

/** LOAD fields a policy can scale on, summed over the model's ready pods (`load.<field>`). */
export const LOAD_METRICS = ["running", "waiting", "kvCacheUsage", "cacheHitRate", "genThroughput", "preemptions", "pdPrefillQueue", "pdDecodeQueue"] as const;
/** Fleet-wide signals that are not per-pod sums (percentiles and waits): the policy's target is per pod as is. */
export const FLEET_METRICS = ["ttft.p50", "ttft.p90", "ttft.p99", "tpot.p50", "tpot.p90", "tpot.p99", "flow.waitMs"] as const;
/** Sums over the model's pods from the shared ledger (every gateway's in-flight charges) and flow control's queues. */
export const SUM_METRICS = ["ledger.inFlight", "ledger.promptTokens", "flow.queued"] as const;

export type AutoscaleMetric = `load.${(typeof LOAD_METRICS)[number]}` | (typeof FLEET_METRICS)[number] | (typeof SUM_METRICS)[number];

export const AUTOSCALE_METRICS: readonly AutoscaleMetric[] = [...LOAD_METRICS.map((f) => `load.${f}` as const), ...SUM_METRICS, ...FLEET_METRICS];

/** Whether a metric is a sum over pods (KPA divides the total by the target) or a fleet-wide figure. */
export const isSumMetric = (m: AutoscaleMetric): boolean => !(FLEET_METRICS as readonly string[]).includes(m);

const Ms = (min: number) => Type.Integer({ minimum: min, maximum: 86_400_000 });
const Name = Type.String({ minLength: 1, maxLength: 253, pattern: "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" });

/** The workload whose `scale` subresource `--apply` writes. */
export const ScaleTarget = Type.Object(
  {
    kind: Type.Union([Type.Literal("Deployment"), Type.Literal("StatefulSet")]),
    namespace: Type.String({ minLength: 1, maxLength: 63, pattern: "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" }),
    name: Name,
  },
  { additionalProperties: false },
);

export const PdPlannerSettings = Type.Object(
  {
    /** TTFT and TPOT targets the counts are sized for. */
    ttftMs: Type.Number({ exclusiveMinimum: 0 }),
    tpotMs: Type.Number({ exclusiveMinimum: 0 }),
    /** Most prefill + decode pods together (the GPU budget). */
    maxPods: Type.Integer({ minimum: 1, maximum: 10_000 }),
    /** The decode role's workload (`scaleTarget` is the prefill role's). */
    decodeScaleTarget: Type.Optional(ScaleTarget),
    /** Per-pod throughput before the fleet has taught any: prefill tokens/s and decode tokens/s. */
    priorPrefillTokensPerS: Type.Optional(Type.Number({ exclusiveMinimum: 0 })),
    priorDecodeTokensPerS: Type.Optional(Type.Number({ exclusiveMinimum: 0 })),
  },
  { additionalProperties: false },
);

export const AutoscalePolicy = Type.Object(
  {
    model: Type.String({ minLength: 1, maxLength: 256 }),
    /** Which of the model's pods: all of them (default) or one P/D role. */
    role: Type.Optional(Type.Union([Type.Literal("combined"), Type.Literal("prefill"), Type.Literal("decode")])),
    algorithm: Type.Union([Type.Literal("kpa"), Type.Literal("apa"), Type.Literal("pd")]),
    /** kpa/apa: the signal and its per-pod target. */
    metric: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
    target: Type.Optional(Type.Number()),
    minReplicas: Type.Integer({ minimum: 0, maximum: 10_000 }),
    maxReplicas: Type.Integer({ minimum: 1, maximum: 10_000 }),
    /** How often the policy is evaluated; also the sampling interval of its windows. Default 1 s. */
    intervalMs: Type.Optional(Ms(100)),
    /** The LOAD scrape interval the metric arrives at (windows shorter than it are refused). Default 1 s. */
    scrapeIntervalMs: Type.Optional(Ms(100)),
    stableWindowMs: Type.Optional(Ms(1)),
    panicWindowMs: Type.Optional(Ms(1)),
    /** KPA: panic when desired pods over the panic window / ready pods reaches this. Default 2. */
    panicThreshold: Type.Optional(Type.Number()),
    maxScaleUpRate: Type.Optional(Type.Number()),
    maxScaleDownRate: Type.Optional(Type.Number()),
    upTolerance: Type.Optional(Type.Number({ minimum: 0, maximum: 10 })),
    downTolerance: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
    /** A scale-down applies only once the desired count stayed lower this long (the highest desired count in it wins). Default 300 s. */
    scaleDownDelayMs: Type.Optional(Ms(0)),
    /** Scaling from zero goes to at least this many pods. Default 1. */
    activationScale: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000 })),
    /** `--apply` writes this workload's replicas. */
    scaleTarget: Type.Optional(ScaleTarget),
    /** The drain handshake: how long a pod chosen to leave may finish its in-flight requests. Default 30 s. */
    drainGraceMs: Type.Optional(Ms(0)),
    pd: Type.Optional(PdPlannerSettings),
    /** Set by `config set-autoscale --signing-key` (docs/security.md, "Signed records"). */
    sig: Type.Optional(RecordSignature),
  },
  { additionalProperties: false },
);
export type AutoscalePolicy = Static<typeof AutoscalePolicy>;
export type ScaleTarget = Static<typeof ScaleTarget>;

export const AUTOSCALE_KEY_PREFIX = "autoscale.";

/** AIBrix's PodAutoscaler defaults (../docs/autoscaling.md lists them). */
export const AUTOSCALE_DEFAULTS = {
  intervalMs: 1000,
  scrapeIntervalMs: 1000,
  stableWindowMs: 180_000,
  panicWindowMs: 60_000,
  panicThreshold: 2,
  maxScaleUpRate: 2,
  maxScaleDownRate: 2,
  upTolerance: 0.1,
  downTolerance: 0.1,
  scaleDownDelayMs: 300_000,
  activationScale: 1,
  drainGraceMs: 30_000,
} as const;

export type ResolvedPolicy = AutoscalePolicy & { [K in keyof typeof AUTOSCALE_DEFAULTS]: number };

export function resolvePolicy(p: AutoscalePolicy): ResolvedPolicy {
  const out = { ...p } as Record<string, unknown>;
  for (const [k, v] of Object.entries(AUTOSCALE_DEFAULTS)) if (out[k] === undefined) out[k] = v;
  return out as ResolvedPolicy;
}

const check = TypeCompiler.Compile(AutoscalePolicy);

/** Validates a parsed policy; returns an error naming the field, or undefined. */
export function autoscalePolicyError(value: unknown): string | undefined {
  if (!check.Check(value)) {
    const e = check.Errors(value).First();
    return e ? `${e.path || "/"}: ${e.message}` : "invalid autoscale policy";
  }
  const p = resolvePolicy(value as AutoscalePolicy);
  if (p.minReplicas > p.maxReplicas) return `/minReplicas: ${p.minReplicas} is above /maxReplicas ${p.maxReplicas}`;
  if (p.algorithm === "pd") {
    if (!p.pd) return "/pd: the pd planner needs its settings (ttftMs, tpotMs, maxPods)";
    if (p.role !== undefined && p.role !== "prefill") return "/role: a pd policy sizes both roles; leave role out (or prefill)";
  } else {
    if (p.metric === undefined) return `/metric: required for ${p.algorithm}; one of ${AUTOSCALE_METRICS.join(", ")}`;
    if (!(AUTOSCALE_METRICS as readonly string[]).includes(p.metric)) return `/metric: unknown metric ${JSON.stringify(p.metric.slice(0, 64))}; one of ${AUTOSCALE_METRICS.join(", ")}`;
    if (p.target === undefined) return `/target: required for ${p.algorithm}`;
    if (!(p.target > 0)) return "/target: must be > 0";
  }
  if (!(p.maxScaleUpRate > 1)) return "/maxScaleUpRate: must be > 1";
  if (!(p.maxScaleDownRate > 1)) return "/maxScaleDownRate: must be > 1";
  if (!(p.panicThreshold > 1)) return "/panicThreshold: must be > 1";
  for (const f of ["stableWindowMs", "panicWindowMs"] as const) {
    if (p[f] < p.scrapeIntervalMs) return `/${f}: ${p[f]} ms is shorter than the scrape interval (${p.scrapeIntervalMs} ms): the window would hold at most one sample`;
    if (p[f] < p.intervalMs) return `/${f}: ${p[f]} ms is shorter than the evaluation interval /intervalMs (${p.intervalMs} ms)`;
  }
  if (p.panicWindowMs > p.stableWindowMs) return `/panicWindowMs: ${p.panicWindowMs} ms is longer than /stableWindowMs (${p.stableWindowMs} ms)`;
  if (p.pd?.decodeScaleTarget && !p.scaleTarget) return "/scaleTarget: the prefill role's workload is required when /pd/decodeScaleTarget is set";
  return undefined;
}

const Num = Type.Number();
const NullableNum = Type.Union([Type.Number(), Type.Null()]);
const PolicyName = Type.String({ minLength: 1, maxLength: 128, pattern: "^[A-Za-z0-9._-]+$" });

/**
 * AUTOSCALE stream (`<prefix>.autoscale.<policy>`): one evaluation of one policy — its inputs, the
 * algorithm's arithmetic and the result — published by the autoscaler holding the policy's lease.
 * `jetroute replay --autoscale` and `nats sub` read these to show why the fleet was resized.
 */
export const AutoscaleRecommendation = Type.Object(
  {
    type: Type.Literal("autoscale"),
    policy: PolicyName,
    model: Type.String({ minLength: 1, maxLength: 256 }),
    role: Type.Optional(Type.Union([Type.Literal("combined"), Type.Literal("prefill"), Type.Literal("decode")])),
    algorithm: Type.Union([Type.Literal("kpa"), Type.Literal("apa"), Type.Literal("pd")]),
    autoscaler: Type.String({ minLength: 1, maxLength: 253 }),
    ts: Type.Number({ minimum: 0 }),
    /** Ready pods of the model (and role) in PODS, draining ones left out. */
    readyPods: Type.Integer({ minimum: 0 }),
    /** The workload's replicas as last read from Kubernetes (only with `--apply`). */
    specReplicas: Type.Optional(Type.Integer({ minimum: 0 })),
    metric: Type.Optional(Type.String({ maxLength: 64 })),
    value: Type.Optional(NullableNum),
    stableAverage: Type.Optional(NullableNum),
    panicAverage: Type.Optional(NullableNum),
    /** The algorithm's proposal; after the scale-down delay; after [minReplicas, maxReplicas]. */
    proposed: Type.Integer({ minimum: 0 }),
    delayed: Type.Integer({ minimum: 0 }),
    desired: Type.Integer({ minimum: 0 }),
    /** pd: the decode role's count (`desired` is the prefill role's). */
    desiredDecode: Type.Optional(Type.Integer({ minimum: 0 })),
    reason: Type.String({ maxLength: 1024 }),
    kpa: Type.Optional(
      Type.Object(
        { stableTotal: Num, panicTotal: Num, stablePods: Num, panicPods: Num, maxScaleUp: Num, maxScaleDown: Num, overPanicThreshold: Type.Boolean(), inPanic: Type.Boolean() },
        { additionalProperties: false },
      ),
    ),
    apa: Type.Optional(Type.Object({ perPod: Num, ratio: Num, band: Type.String({ maxLength: 16 }) }, { additionalProperties: false })),
    pd: Type.Optional(
      Type.Object(
        {
          requestsPerS: Num,
          meanPromptTokens: Num,
          meanOutputTokens: Num,
          prefixHitRate: Num,
          prefillTokensPerS: Num,
          decodeTokensPerS: Num,
          prefillCapacityPerPod: Num,
          decodeCapacityPerPod: Num,
          capacityFromHistory: Type.Boolean(),
          unbudgetedPrefill: Num,
          unbudgetedDecode: Num,
          overBudget: Type.Boolean(),
        },
        { additionalProperties: false },
      ),
    ),
    /** The drain handshake in progress: pods marked to leave and pods removed in this evaluation. */
    draining: Type.Optional(Type.Array(Type.Object({ pod: Type.String({ maxLength: 253 }), since: Num, deadline: Num }, { additionalProperties: false }), { maxItems: 1024 })),
    removed: Type.Optional(
      Type.Array(Type.Object({ pod: Type.String({ maxLength: 253 }), reason: Type.Union([Type.Literal("idle"), Type.Literal("grace")]), inFlight: Num, drainedMs: Num }, { additionalProperties: false }), { maxItems: 1024 }),
    ),
  },
  { $id: "autoscale", additionalProperties: false },
);
export type AutoscaleRecommendation = Static<typeof AutoscaleRecommendation>;
