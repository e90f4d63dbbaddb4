/**
 * Per-model routing configuration, kept in the config KV bucket under `model.<escaped model>` and
 * edited with `jetroute config set`. The shape follows AIBrix's `model.aibrix.ai/config`
 * annotation (locked strategy, default profile, named profiles with routing hints), plus the
 * settings jetroute adds (consistency, tokenizer, SLO targets).
 */
import { type Static, Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { AdapterSpec } from "./adapters.js";
import { AutoscalePolicy } from "./autoscale.js";
import { RecordSignature } from "./signature.js";
import { SemanticConfig } from "./semantic.js";

const Tokens = Type.Integer({ minimum: 0 });

export const RoutingHints = Type.Object(
  {
    promptTokensGte: Type.Optional(Tokens),
    promptTokensLt: Type.Optional(Tokens),
    maxTokensGte: Type.Optional(Tokens),
    maxTokensLt: Type.Optional(Tokens),
  },
  { additionalProperties: false },
);

export const Profile = Type.Object(
  {
    routingStrategy: Type.Optional(Type.String({ minLength: 1 })),
    /** Hints `config-profile: auto` matches against the request. */
    routingConfig: Type.Optional(RoutingHints),
    requestsPerSecond: Type.Optional(Type.Number({ exclusiveMinimum: 0 })),
    slo: Type.Optional(Type.Object({ ttftMs: Type.Optional(Type.Number({ exclusiveMinimum: 0 })), tpotMs: Type.Optional(Type.Number({ exclusiveMinimum: 0 })) }, { additionalProperties: false })),
    /** Parameters per strategy plugin type, e.g. `{"prefix-cache": {"imbalanceThreshold": 4}}` (each plugin validates its own). */
    strategyParams: Type.Optional(Type.Record(Type.String({ minLength: 1, maxLength: 64 }), Type.Record(Type.String({ maxLength: 64 }), Type.Union([Type.Number(), Type.String({ maxLength: 256 }), Type.Boolean()])))),
  },
  { additionalProperties: false },
);

/** Flow-control priorities: a band per integer; below 0 = sheddable. */
export const FLOW_PRIORITY_MIN = -16;
export const FLOW_PRIORITY_MAX = 16;
const Ms = Type.Integer({ minimum: 0, maximum: 86_400_000 });
const OBJECTIVE_NAME = /^[A-Za-z0-9._-]{1,64}$/;

/**
 * Flow control for a model (docs/flow-control.md): while its pods are saturated, gateways hold its
 * requests in priority bands, fair between flows, and dispatch them as pods get room.
 */
export const FlowControl = Type.Object(
  {
    /** Default true: false keeps the settings and routes as if there were none. */
    enabled: Type.Optional(Type.Boolean()),
    /** Named objectives (header `x-jetroute-objective`, or an API key's `objective`): a priority and a queue TTL each. */
    objectives: Type.Optional(
      Type.Record(
        Type.String({ minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9._-]+$" }),
        Type.Object({ priority: Type.Integer({ minimum: FLOW_PRIORITY_MIN, maximum: FLOW_PRIORITY_MAX }), ttlMs: Type.Optional(Ms) }, { additionalProperties: false }),
        { maxProperties: 64 },
      ),
    ),
    /** The objective of a request that names none (absent: priority 0 and `ttlMs`). */
    defaultObjective: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
    fairness: Type.Optional(Type.Union([Type.Literal("round-robin"), Type.Literal("least-attained")])),
    order: Type.Optional(Type.Union([Type.Literal("fcfs"), Type.Literal("edf")])),
    /** How long a request may be held (default 60 s); expiry answers 429 `queue_timeout`. */
    ttlMs: Type.Optional(Ms),
    /** A model with no ready pod: hold its requests this long for a pod to appear (default 0: 503 at once). */
    waitingRoomTtlMs: Type.Optional(Ms),
    maxRequestsPerBand: Type.Optional(Type.Integer({ minimum: 1, maximum: 1_000_000 })),
    maxBytesPerBand: Type.Optional(Type.Integer({ minimum: 1, maximum: 64 * 1024 ** 3 })),
    /**
     * The band written into the body as the engine's own `priority`, for pods whose engine
     * schedules by priority (PODS `schedulingPolicy`; docs/engine-priority.md): `"off"`, or the
     * mapping from band to urgency (higher = more urgent, as bands are): `bands` names a band's
     * urgency, any other band gets `band × scale` (default scale 1: the band itself). Written
     * as is to SGLang pods, negated to vLLM pods and to SGLang pods that run low values first.
     * Absent: the default mapping. Over the bands in play (named, the objectives', 0) urgency must not
     * decrease from one band to a higher one (services/routing/engine-priority.ts checks it).
     */
    enginePriority: Type.Optional(
      Type.Union([
        Type.Literal("off"),
        Type.Object(
          {
            scale: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
            bands: Type.Optional(
              Type.Record(Type.String({ pattern: "^(0|-?[1-9][0-9]?)$" }), Type.Integer({ minimum: -1_000_000, maximum: 1_000_000 }), { maxProperties: FLOW_PRIORITY_MAX - FLOW_PRIORITY_MIN + 1 }),
            ),
          },
          { additionalProperties: false },
        ),
      ]),
    ),
    /** Held requests of one user in one band, per replica (default 1,000): one user cannot fill a band others share. */
    maxRequestsPerUser: Type.Optional(Type.Integer({ minimum: 1, maximum: 1_000_000 })),
    /** Held bytes (as counted: what a held request retains) of one user in one band, per replica (default 64 MiB). */
    maxBytesPerUser: Type.Optional(Type.Integer({ minimum: 1, maximum: 64 * 1024 ** 3 })),
    /** When a pod has no room; every limit set must hold for the pod to take one more request. */
    saturation: Type.Optional(
      Type.Object(
        {
          /** Engine queue depth (waiting requests) at which a pod is full (default 5). */
          queueDepth: Type.Optional(Type.Number({ exclusiveMinimum: 0 })),
          /** KV cache usage (0-1) at which a pod is full (default 0.8). */
          kvCacheUsage: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1 })),
          /** In-flight requests per pod, every replica's charges (no default). */
          maxInFlightPerPod: Type.Optional(Type.Integer({ minimum: 1 })),
          /** In-flight prompt tokens per pod, every replica's charges (no default). */
          maxTokensPerPod: Type.Optional(Type.Integer({ minimum: 1 })),
          /**
           * Per band (issue 36): on a pod whose engine schedules by priority, a request's queue limit
           * is `queueDepth` plus this many waiting requests for every band in play below its own
           * (default `queueDepth`; 0 turns per-band admission off). Ignored when `enginePriority` is "off".
           */
          queueDepthPerBand: Type.Optional(Type.Number({ minimum: 0 })),
        },
        { additionalProperties: false },
      ),
    ),
  },
  { additionalProperties: false },
);
export type FlowControl = Static<typeof FlowControl>;

export const ModelConfig = Type.Object(
  {
    /** Wins over everything, including the request's `routing-strategy` header. */
    lockedRoutingStrategy: Type.Optional(Type.String({ minLength: 1 })),
    defaultProfile: Type.Optional(Type.String({ minLength: 1 })),
    profiles: Type.Optional(Type.Record(Type.String({ minLength: 1 }), Profile)),
    /**
     * How this model's charges are shared (overrides the gateway's `--consistency`): `eventual`
     * (published without waiting) or `strict` (per-pod compare-and-set). Ignored by a gateway
     * started with `--consistency off`, which follows no other replica.
     */
    consistency: Type.Optional(Type.Union([Type.Literal("eventual"), Type.Literal("strict")])),
    flowControl: Type.Optional(FlowControl),
    /** Makes this name a virtual model: each request is classified and sent to the model its winning decision names (docs/semantic.md). */
    semantic: Type.Optional(SemanticConfig),
    /** Signed records (docs/security.md): set by `jetroute config --signing-key`. */
    sig: Type.Optional(RecordSignature),
  },
  { $id: "model-config", additionalProperties: false },
);

export type RoutingHints = Static<typeof RoutingHints>;
export type Profile = Static<typeof Profile>;
export type ModelConfig = Static<typeof ModelConfig>;

const check = TypeCompiler.Compile(ModelConfig);

/** Validates a parsed config; returns an error message naming the field, or undefined. */
export function modelConfigError(value: unknown): string | undefined {
  if (check.Check(value)) {
    const c = value as ModelConfig;
    if (c.defaultProfile && !(c.profiles && Object.hasOwn(c.profiles, c.defaultProfile))) return `/defaultProfile: profile ${JSON.stringify(c.defaultProfile)} is not defined in /profiles`;
    const f = c.flowControl;
    for (const name of Object.keys(f?.objectives ?? {})) {
      if (!OBJECTIVE_NAME.test(name)) return `/flowControl/objectives/${name.slice(0, 64)}: objective names are 1-64 characters of A-Z a-z 0-9 . _ -`;
    }
    if (f?.defaultObjective !== undefined && !(f.objectives && Object.hasOwn(f.objectives, f.defaultObjective))) {
      return `/flowControl/defaultObjective: objective ${JSON.stringify(f.defaultObjective)} is not defined in /flowControl/objectives`;
    }
    return undefined;
  }
  const e = check.Errors(value).First();
  return e ? `${e.path || "/"}: ${e.message}` : "invalid model config";
}

/** Config bucket key of a model's config (the model name escaped as a subject token). */
export const MODEL_CONFIG_KEY_PREFIX = "model.";

/** Per-user limits, under the config bucket key `limits`; `users.default` applies to anyone not listed. */
export const RateLimits = Type.Object(
  {
    users: Type.Optional(
      Type.Record(
        Type.String({ minLength: 1 }),
        Type.Object({ rpm: Type.Optional(Type.Integer({ minimum: 1 })), tpm: Type.Optional(Type.Integer({ minimum: 1 })) }, { additionalProperties: false }),
      ),
    ),
    sig: Type.Optional(RecordSignature),
  },
  { $id: "rate-limits", additionalProperties: false },
);
export type RateLimits = Static<typeof RateLimits>;

export const RATE_LIMITS_KEY = "limits";

const checkLimits = TypeCompiler.Compile(RateLimits);

export function rateLimitsError(value: unknown): string | undefined {
  if (checkLimits.Check(value)) return undefined;
  const e = checkLimits.Errors(value).First();
  return e ? `${e.path || "/"}: ${e.message}` : "invalid rate limits";
}

/**
 * API keys for `gateway --auth required`, one config bucket entry per key under
 * `apikey.<sha256 hex of the key>`. The key itself is never stored: a gateway hashes the bearer
 * token it receives and looks the hash up. `user` becomes the request's identity (rate limits,
 * vtc-basic, decision records), whatever `user` header the client sent.
 */
export const ApiKeyRecord = Type.Object(
  {
    /** Printable, no control characters: it is sent upstream as the `user` header. */
    user: Type.String({ minLength: 1, maxLength: 256, pattern: "^[^\\u0000-\\u001f\\u007f]+$" }),
    name: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
    /** Milliseconds since the epoch. */
    createdAt: Type.Integer({ minimum: 0 }),
    /** A revoked key: kept for `config list-keys`, refused by every gateway. */
    disabled: Type.Optional(Type.Boolean()),
    revokedAt: Type.Optional(Type.Integer({ minimum: 0 })),
    /**
     * An operator key (`config add-key --admin`): besides routing requests it opens the gateway's
     * `/debug/*` endpoints under `--auth required`. Absent = false, so records written before the
     * field existed stay plain client keys.
     */
    admin: Type.Optional(Type.Boolean()),
    /**
     * Flow control: the highest objective this key's requests may run under (a name in the
     * model's `flowControl.objectives`), and their default; on a model that does not define it the
     * model's default objective is the cap (services/routing/flow/settings.ts `classify`).
     */
    objective: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9._-]+$" })),
    /**
     * The tenant's `cache_salt` (docs/security.md, tenant isolation): every request with this key
     * runs under it, at the engine and in the router's prefix matching, so it shares cached
     * blocks only with keys of the same salt. Random and unguessable (16+ characters; no `.`,
     * which separates it from a client's own salt); give a tenant's keys the same one.
     */
    cacheSalt: Type.Optional(Type.String({ minLength: 16, maxLength: 128, pattern: "^[A-Za-z0-9_-]+$" })),
    /** The key's class: a `user` signal of a virtual model's rules may test it (docs/semantic.md). */
    class: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9._-]+$" })),
    /**
     * The models this key may use (absent: every model). A virtual model's decision that names a
     * model outside the list is refused (403 `model_not_allowed`), as a direct request for it is.
     */
    models: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { minItems: 1, maxItems: 1024, uniqueItems: true })),
    /**
     * A service key that may send requests on behalf of another key (`config add-key --delegate`;
     * the batch-worker's): its `x-jetroute-on-behalf-of: <sha256 of the other key>` header makes
     * the gateway apply that key's settings (user, models, objective, cache salt, class) instead of
     * its own. Absent = false: any other key sending the header is refused (403).
     */
    delegate: Type.Optional(Type.Boolean()),
    sig: Type.Optional(RecordSignature),
  },
  { $id: "api-key", additionalProperties: false },
);
export type ApiKeyRecord = Static<typeof ApiKeyRecord>;

/** Config bucket key prefix of API key records; the rest of the key is the key's SHA-256 in lower-case hex. */
export const API_KEY_KEY_PREFIX = "apikey.";

const checkApiKey = TypeCompiler.Compile(ApiKeyRecord);

export function apiKeyRecordError(value: unknown): string | undefined {
  if (checkApiKey.Check(value)) return undefined;
  const e = checkApiKey.Errors(value).First();
  return e ? `${e.path || "/"}: ${e.message}` : "invalid API key record";
}

/**
 * A gateway pool's models, under the config bucket key `pool.<name>` (streams/pools.ts). A model
 * belongs to at most one pool; a gateway of another pool, or an unpooled one, answers a request for
 * it with 421 naming this pool. List base models: pods are assigned by the model they run, and
 * their LoRA adapters go with them (list an adapter too only so that other pools' gateways answer
 * 421 for it instead of 404).
 */
export const PoolConfig = Type.Object(
  {
    models: Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { minItems: 1, maxItems: 2_000, uniqueItems: true }),
    description: Type.Optional(Type.String({ maxLength: 1024 })),
    sig: Type.Optional(RecordSignature),
  },
  { $id: "pool", additionalProperties: false },
);
export type PoolConfig = Static<typeof PoolConfig>;

/** Config bucket key prefix of pool assignments; the rest of the key is the pool's name. */
export const POOL_KEY_PREFIX = "pool.";

const checkPool = TypeCompiler.Compile(PoolConfig);

export function poolConfigError(value: unknown): string | undefined {
  if (checkPool.Check(value)) return undefined;
  const e = checkPool.Errors(value).First();
  return e ? `${e.path || "/"}: ${e.message}` : "invalid pool config";
}

/** A stored pool entry, from a reader of its JSON (a KV entry's `json()`): its config, or why it is not one. */
export function readPoolConfig(json: () => unknown): { ok: true; value: PoolConfig } | { ok: false; error: string } {
  let value: unknown;
  try {
    value = json();
  } catch {
    return { ok: false, error: "not JSON" };
  }
  const error = poolConfigError(value);
  return error ? { ok: false, error } : { ok: true, value: value as PoolConfig };
}

/**
 * An InferencePool's objectives and model rewrites (docs/inference-pool.md), under the config
 * bucket key `inferencepool.<namespace>.<name>`, written by the pool's pod-watcher from the
 * InferenceObjective and InferenceModelRewrite objects that reference the pool. Gateways merge the
 * objectives into the flow-control objectives of the pool's models (a model's own config wins on a
 * name clash) and apply the rewrites to requests before routing.
 */
export const InferencePoolPolicy = Type.Object(
  {
    /** `<namespace>/<name>` of the InferencePool. */
    pool: Type.String({ minLength: 3, maxLength: 317 }),
    /** API version of the objects read (e.g. `llm-d.ai/v1alpha2`). */
    apiVersion: Type.String({ minLength: 1, maxLength: 100 }),
    /** Base models the pool's endpoints serve. */
    models: Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { maxItems: 2_000, uniqueItems: true }),
    /** InferenceObjective name -> its priority, clamped to flow control's bands (-16..16). */
    objectives: Type.Record(Type.String({ minLength: 1, maxLength: 253 }), Type.Object({ priority: Type.Integer({ minimum: -16, maximum: 16 }) }, { additionalProperties: false })),
    /**
     * Rewrite rules in precedence order: rules naming models exactly first, then rules for every
     * model of the pool (`models` absent); within each, the oldest InferenceModelRewrite first and
     * its rules in list order. The first rule that applies picks a target by weight.
     */
    rewrites: Type.Array(
      Type.Object(
        {
          /** `<InferenceModelRewrite name>#<rule index>`, for logs and explain. */
          from: Type.String({ minLength: 1, maxLength: 300 }),
          models: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { minItems: 1, maxItems: 64 })),
          targets: Type.Array(Type.Object({ model: Type.String({ minLength: 1, maxLength: 256 }), weight: Type.Integer({ minimum: 1, maximum: 1_000_000 }) }, { additionalProperties: false }), { minItems: 1, maxItems: 64 }),
        },
        { additionalProperties: false },
      ),
      { maxItems: 256 },
    ),
    sig: Type.Optional(RecordSignature),
  },
  { $id: "inference-pool", additionalProperties: false },
);
export type InferencePoolPolicy = Static<typeof InferencePoolPolicy>;

/** Config bucket key prefix of InferencePool policies; the rest is `<namespace>.<name>`. */
export const INFERENCE_POOL_KEY_PREFIX = "inferencepool.";

const checkInferencePool = TypeCompiler.Compile(InferencePoolPolicy);

export function inferencePoolPolicyError(value: unknown): string | undefined {
  if (checkInferencePool.Check(value)) return undefined;
  const e = checkInferencePool.Errors(value).First();
  return e ? `${e.path || "/"}: ${e.message}` : "invalid InferencePool policy";
}

/** The config bucket's documents, exported to `schemas/json/` with the event schemas. */
export const CONFIG_SCHEMAS = {
  "model-config": ModelConfig,
  "rate-limits": RateLimits,
  "api-key": ApiKeyRecord,
  pool: PoolConfig,
  "autoscale-policy": AutoscalePolicy,
  "inference-pool": InferencePoolPolicy,
  "adapter-spec": AdapterSpec,
} as const;
