/**
 * LoRA adapters as a managed resource (docs/adapters.md).
 *
 * The declaration has AIBrix's ModelAdapter shape (`model.aibrix.ai/v1alpha1`, kind ModelAdapter):
 * `spec.baseModel`, `spec.artifactURL`, `spec.podSelector`, `spec.replicas`, `spec.additionalConfig`.
 * It is read from the Kubernetes API (the ModelAdapter's spec) or from the config bucket
 * (`adapter.<escaped name>`, `jetroute config set-adapter`), and validated here, field by field.
 * jetroute adds `minReplicas` / `maxReplicas` / `targetRps` (replicas following demand),
 * `pinned` (SGLang's pinned adapters) and `maxAttempts`.
 *
 * The placement record is what `jetroute adapter-controller` publishes on the ADAPTERS stream
 * (`<prefix>.adapters.<adapter>`), one per decision: the adapter's placement after it (the last
 * per subject is the current placement every gateway routes by) and the moves with their reasons.
 */
import { type Static, Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";

export const ADAPTER_KEY_PREFIX = "adapter.";
export const MODEL_ADAPTER_GROUP = "model.aibrix.ai";
export const MODEL_ADAPTER_VERSION = "v1alpha1";
export const MODEL_ADAPTER_API_VERSION = `${MODEL_ADAPTER_GROUP}/${MODEL_ADAPTER_VERSION}`;
/** Most adapters one controller manages (its views and the gateways' overlay are bounded by it). */
export const MAX_ADAPTERS = 10_000;
/** Most replicas of one adapter. */
export const MAX_ADAPTER_REPLICAS = 1024;

/** An adapter's name: what clients put in `model`, a DNS-1123 subdomain as Kubernetes object names are. */
export const ADAPTER_NAME = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
/** Artifact URL schemes AIBrix's webhook accepts (`/` is a path on the engine's disk). */
export const ARTIFACT_PREFIXES = ["s3://", "gcs://", "tos://", "huggingface://", "hf://", "/"] as const;

const LabelKey = Type.String({ minLength: 1, maxLength: 317 });
const LabelValue = Type.String({ maxLength: 63 });

export const LabelSelector = Type.Object(
  {
    matchLabels: Type.Optional(Type.Record(LabelKey, LabelValue, { maxProperties: 64 })),
    matchExpressions: Type.Optional(
      Type.Array(
        Type.Object(
          {
            key: LabelKey,
            operator: Type.Union([Type.Literal("In"), Type.Literal("NotIn"), Type.Literal("Exists"), Type.Literal("DoesNotExist")]),
            values: Type.Optional(Type.Array(LabelValue, { maxItems: 64 })),
          },
          { additionalProperties: false },
        ),
        { maxItems: 32 },
      ),
    ),
  },
  { additionalProperties: false },
);
export type LabelSelector = Static<typeof LabelSelector>;

const Count = Type.Integer({ minimum: 0, maximum: MAX_ADAPTER_REPLICAS });

export const AdapterSpec = Type.Object(
  {
    /** The base model the adapter runs on (the pods' model). Optional as in AIBrix: then the selected pods' model. */
    baseModel: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
    /** Where the engine loads it from: `hf://org/name`, `huggingface://…`, `s3://…`, `gcs://…`, `tos://…`, or a path. */
    artifactURL: Type.String({ minLength: 1, maxLength: 2048 }),
    /** Which pods may host it (AIBrix: required; here optional: absent = every pod of `baseModel`). */
    podSelector: Type.Optional(LabelSelector),
    /** A fixed replica count (absent: between minReplicas and maxReplicas by demand; neither: every selected pod, as AIBrix). */
    replicas: Type.Optional(Count),
    minReplicas: Type.Optional(Count),
    maxReplicas: Type.Optional(Count),
    /** Requests per second one replica is sized for when replicas follow demand (default 5). */
    targetRps: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1e6 })),
    /** SGLang: load it `pinned` (never evicted by the engine's own LRU). */
    pinned: Type.Optional(Type.Boolean()),
    /** Load attempts on one pod before the adapter is Failed there (default 3). */
    maxAttempts: Type.Optional(Type.Integer({ minimum: 1, maximum: 20 })),
    /** AIBrix's: `api-key` is sent as `Authorization: Bearer` on the engine's load/unload calls. */
    additionalConfig: Type.Optional(Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 4096 }), { maxProperties: 32 })),
    /** AIBrix fields jetroute reads but does not use (accepted so AIBrix manifests apply unchanged). */
    schedulerName: Type.Optional(Type.String({ maxLength: 64 })),
    credentialsSecretRef: Type.Optional(Type.Object({ name: Type.String({ maxLength: 253 }) }, { additionalProperties: false })),
  },
  { additionalProperties: false },
);
export type AdapterSpec = Static<typeof AdapterSpec>;

export const ADAPTER_DEFAULTS = { targetRps: 5, maxAttempts: 3 } as const;

const checkSpec = TypeCompiler.Compile(AdapterSpec);

/** Validates a declaration's spec; returns an error naming the field, or undefined. */
export function adapterSpecError(value: unknown): string | undefined {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return "/: the adapter must be a JSON object";
  const v = value as Record<string, unknown>;
  if (v.artifactURL === undefined) return "/artifactURL: required (hf://org/name, s3://bucket/path, a path on the pod, …)";
  if (!checkSpec.Check(value)) {
    const e = checkSpec.Errors(value).First();
    return e ? `${e.path || "/"}: ${e.message}` : "invalid adapter";
  }
  const s = value as AdapterSpec;
  if (!ARTIFACT_PREFIXES.some((p) => s.artifactURL.startsWith(p))) return `/artifactURL: must start with one of ${ARTIFACT_PREFIXES.join(", ")} (got ${JSON.stringify(s.artifactURL.slice(0, 64))})`;
  if (s.baseModel === undefined && selectorIsEmpty(s.podSelector)) return "/baseModel: give the base model, or a podSelector naming the pods that may host the adapter";
  if (s.replicas !== undefined && (s.minReplicas !== undefined || s.maxReplicas !== undefined)) return "/replicas: a fixed count excludes minReplicas/maxReplicas (give one or the other)";
  if (s.minReplicas !== undefined && s.maxReplicas !== undefined && s.minReplicas > s.maxReplicas) return `/minReplicas: ${s.minReplicas} is above /maxReplicas ${s.maxReplicas}`;
  for (const [i, e] of (s.podSelector?.matchExpressions ?? []).entries()) {
    const n = e.values?.length ?? 0;
    if ((e.operator === "In" || e.operator === "NotIn") && n === 0) return `/podSelector/matchExpressions/${i}/values: ${e.operator} needs at least one value`;
    if ((e.operator === "Exists" || e.operator === "DoesNotExist") && n > 0) return `/podSelector/matchExpressions/${i}/values: ${e.operator} takes no values`;
  }
  return undefined;
}

/** Validates an adapter's name (what clients send as `model`). */
export function adapterNameError(name: string): string | undefined {
  if (!ADAPTER_NAME.test(name)) return `invalid adapter name ${JSON.stringify(name.slice(0, 64))}: a DNS subdomain (lower-case a-z 0-9 - ., 1-253 characters, alphanumeric at both ends)`;
  return undefined;
}

const selectorIsEmpty = (s: LabelSelector | undefined) => !s || (Object.keys(s.matchLabels ?? {}).length === 0 && (s.matchExpressions ?? []).length === 0);

/** Whether a label selector selects a pod's labels (an absent or empty selector selects every pod). */
export function selectorMatches(s: LabelSelector | undefined, labels: Readonly<Record<string, string>>): boolean {
  if (!s) return true;
  for (const [k, v] of Object.entries(s.matchLabels ?? {})) if (labels[k] !== v) return false;
  for (const e of s.matchExpressions ?? []) {
    const has = Object.hasOwn(labels, e.key);
    const v = labels[e.key];
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
    if (e.operator === "In" && !(has && (e.values ?? []).includes(v as string))) return false;
    if (e.operator === "NotIn" && has && (e.values ?? []).includes(v as string)) return false;
  }
  return true;
}

/** The path or repository id the engine's load call gets for an artifact URL (`hf://org/x` -> `org/x`). */
export function loraPathOf(artifactURL: string): string {
  for (const p of ["huggingface://", "hf://"]) if (artifactURL.startsWith(p)) return artifactURL.slice(p.length);
  return artifactURL;
}

const PodName = Type.String({ minLength: 1, maxLength: 253 });
const Reason = Type.String({ maxLength: 512 });

export const AdapterPodState = Type.Union([Type.Literal("loading"), Type.Literal("loaded"), Type.Literal("unloading")]);
export type AdapterPodState = Static<typeof AdapterPodState>;

export const AdapterMove = Type.Object(
  {
    action: Type.Union([Type.Literal("load"), Type.Literal("unload")]),
    pod: PodName,
    reason: Reason,
    /** Absent: decided (the record published before the engine call); else what the engine call gave. */
    outcome: Type.Optional(Type.Union([Type.Literal("ok"), Type.Literal("retrying"), Type.Literal("failed")])),
    attempt: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
    error: Type.Optional(Type.String({ maxLength: 512 })),
    /** How long the engine call took (load: the adapter's cold start on that pod). */
    ms: Type.Optional(Type.Number({ minimum: 0 })),
  },
  { additionalProperties: false },
);
export type AdapterMove = Static<typeof AdapterMove>;

/**
 * ADAPTERS stream (`<prefix>.adapters.<adapter>`): one placement decision of one adapter, and its
 * placement after it. Gateways route an adapter's requests only to `pods` in state `loaded`.
 */
export const AdapterPlacement = Type.Object(
  {
    type: Type.Literal("adapter"),
    adapter: Type.String({ minLength: 1, maxLength: 253 }),
    /** The base model its pods serve (absent: no pod selected yet and no baseModel declared). */
    baseModel: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
    controller: Type.String({ minLength: 1, maxLength: 253 }),
    ts: Type.Number({ minimum: 0 }),
    /** The declaration was deleted: the adapter is unloaded everywhere; gateways forget it. */
    deleted: Type.Optional(Type.Boolean()),
    phase: Type.Union([Type.Literal("Pending"), Type.Literal("Running"), Type.Literal("Failed"), Type.Literal("Deleted")]),
    pods: Type.Array(Type.Object({ pod: PodName, state: AdapterPodState }, { additionalProperties: false }), { maxItems: MAX_ADAPTER_REPLICAS }),
    desired: Type.Integer({ minimum: 0 }),
    candidates: Type.Integer({ minimum: 0 }),
    demand: Type.Object({ rps: Type.Number({ minimum: 0 }), queued: Type.Integer({ minimum: 0 }) }, { additionalProperties: false }),
    moves: Type.Array(AdapterMove, { maxItems: 256 }),
    /** Pods where loading failed `maxAttempts` times, with the last error (not retried there until the back-off ends). */
    failed: Type.Optional(Type.Array(Type.Object({ pod: PodName, error: Type.String({ maxLength: 512 }), attempts: Type.Integer({ minimum: 1 }) }, { additionalProperties: false }), { maxItems: 256 })),
    reason: Reason,
  },
  { $id: "adapter", additionalProperties: false },
);
export type AdapterPlacement = Static<typeof AdapterPlacement>;
