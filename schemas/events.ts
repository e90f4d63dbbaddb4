/**
 * Event schemas: the single source of truth for every payload on a jetroute subject.
 * TypeBox values are JSON Schema documents; the TypeScript types are derived from them, and
 * `npm run schemas` writes them to `schemas/json/*.schema.json` for non-TypeScript consumers.
 *
 * Conventions: `type` names the event; times are epoch milliseconds (`ts`); model and pod names
 * travel unescaped in the payload (subjects carry the escaped token); 64-bit hashes are strings.
 */
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import { AdapterPlacement } from "./adapters.js";
import { AutoscaleRecommendation } from "./autoscale.js";
import { ResponseLocation, StoredResponse } from "./responses.js";
import { RecordSignature } from "./signature.js";

const Name = Type.String({ minLength: 1, maxLength: 253 });
const Address = Type.String({ pattern: "^[^\\s:]+:[0-9]{1,5}$", description: "host:port" });
const Millis = Type.Number({ minimum: 0, description: "epoch milliseconds" });
/**
 * Token and request counts. Bounded so that a ledger's running per-pod sums (float64) stay exact:
 * without a maximum, one schema-valid charge of 1e300 tokens rounded every other charge on its pod
 * away (found by test/properties/ledger-precision.test.ts).
 */
export const MAX_COUNT = 2 ** 31 - 1;
const Count = Type.Integer({ minimum: 0, maximum: MAX_COUNT });
const Hash = Type.String({ pattern: "^[0-9a-f]{1,64}$", description: "hash as lower-case hex (engine hashes: uint64 or digest bytes)" });
const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

/**
 * A pod's class for the latency model ("GPU type": a pod list's `podClass`, or the Kubernetes label
 * `jetroute.io/pod-class`, else `nvidia.com/gpu.product`): a bounded name, so metric labels and
 * the model's per-class entries stay bounded.
 */
export const PodClass = Type.String({ pattern: "^[A-Za-z0-9._-]{1,63}$" });

export const PodRole = Type.Union([Type.Literal("combined"), Type.Literal("prefill"), Type.Literal("decode")]);
export const EngineKind = Type.Union([Type.Literal("vllm"), Type.Literal("sglang")]);
/**
 * A pod whose engine schedules by the request body's `priority` (docs/engine-priority.md):
 * `priority` in the engine's own sign (vLLM `--scheduling-policy priority`: lower = more urgent;
 * SGLang `--enable-priority-scheduling`: higher = more urgent), or `priority-low-values-first`
 * (SGLang with `--schedule-low-priority-values-first`; on vLLM the same as `priority`). Absent:
 * first come first served, and the gateway writes no `priority` into its requests.
 */
export const SchedulingPolicy = Type.Union([Type.Literal("priority"), Type.Literal("priority-low-values-first")]);
export type SchedulingPolicy = Static<typeof SchedulingPolicy>;

export const KvEventsEndpoint = Type.Object(
  {
    endpoint: Type.String({ description: "ZMQ PUB endpoint, e.g. tcp://10.0.0.5:5557" }),
    replayEndpoint: Type.Optional(Type.String({ description: "ZMQ ROUTER replay endpoint" })),
    topic: Type.Optional(Type.String()),
  },
  { additionalProperties: false },
);

/** PODS stream: the pod-watcher's view of one inference pod. Last message per subject = current state. */
export const PodEvent = Type.Object(
  {
    type: Type.Literal("pod"),
    action: Type.Union([Type.Literal("upsert"), Type.Literal("remove")]),
    model: Name,
    pod: Name,
    address: Address,
    ready: Type.Boolean(),
    engine: EngineKind,
    role: Type.Optional(PodRole),
    roleset: Type.Optional(Name),
    /** The pod's class for the latency model (docs/latency-model.md). */
    podClass: Type.Optional(PodClass),
    /** The engine schedules by request priority (absent: FCFS). */
    schedulingPolicy: Type.Optional(SchedulingPolicy),
    /** SGLang P/D: the prefill pod's bootstrap port (annotation `model.aibrix.ai/sglang-bootstrap-port`; SGLang's default 8998). */
    bootstrapPort: Type.Optional(Type.Integer({ minimum: 1, maximum: 65535 })),
    metricsAddress: Type.Optional(Address),
    kvEvents: Type.Optional(KvEventsEndpoint),
    adapters: Type.Optional(Type.Array(Name)),
    labels: Type.Optional(Type.Record(Type.String(), Type.String())),
    /**
     * The watcher source that vouches for this pod (a cluster or pod-list name): a watcher removes
     * only its own source's pods, and a source silent beyond the gateways' `--pod-source-timeout`
     * stops being routable. Absent on events from before sources existed (never timed out).
     */
    source: Type.Optional(Name),
    /**
     * The drain handshake (docs/autoscaling.md): the autoscaler chose this pod to leave. Gateways
     * send it nothing new; its in-flight requests finish until `deadline` (epoch ms), when it is removed.
     */
    draining: Type.Optional(Type.Object({ deadline: Millis }, { additionalProperties: false })),
    ts: Millis,
    /** Set by a pod-watcher started with a signing key (docs/security.md, "Signed records"). */
    sig: Type.Optional(RecordSignature),
  },
  { $id: "pod", additionalProperties: false },
);

/**
 * PODS stream (`<prefix>.podsrc.<source>`): a pod-watcher's heartbeat for its source, published by
 * the source's leader every `intervalMs`. Gateways judge a source's liveness on the broker time
 * of the last heartbeat (or pod event) it published.
 */
export const PodSourceHeartbeat = Type.Object(
  {
    type: Type.Literal("pod-source"),
    source: Name,
    /** The watcher instance holding the source's lease. */
    watcher: Name,
    /** Pods this source currently publishes. */
    pods: Count,
    intervalMs: Type.Integer({ minimum: 1, maximum: MAX_COUNT }),
    ts: Millis,
    sig: Type.Optional(RecordSignature),
  },
  { $id: "pod-source", additionalProperties: false },
);

const HistogramSummary = Type.Object({ sum: Type.Number(), count: Type.Number({ minimum: 0 }) }, { additionalProperties: false });
const NullableNumber = Nullable(Type.Number());

/** Load fields extracted from an engine's /metrics (names follow `EngineLoad` in the scraper). */
export const EngineLoadSchema = Type.Object(
  {
    running: NullableNumber,
    waiting: NullableNumber,
    kvCacheUsage: NullableNumber,
    prefixCacheQueries: NullableNumber,
    prefixCacheHits: NullableNumber,
    cacheHitRate: NullableNumber,
    promptTokens: NullableNumber,
    generationTokens: NullableNumber,
    genThroughput: NullableNumber,
    preemptions: NullableNumber,
    blockSize: NullableNumber,
    numGpuBlocks: NullableNumber,
    runningLoras: Type.Array(Type.String()),
    waitingLoras: Type.Array(Type.String()),
    maxLora: NullableNumber,
    histograms: Type.Record(Type.String(), HistogramSummary),
    /** SGLang P/D queues: prefills waiting for their decode, decodes waiting for their KV. */
    pdPrefillQueue: Type.Optional(NullableNumber),
    pdDecodeQueue: Type.Optional(NullableNumber),
  },
  { additionalProperties: false },
);

/** LOAD stream: one scrape of one pod. `stale: true` when scrapes have been failing; `load` is then null. */
export const LoadSample = Type.Object(
  {
    type: Type.Literal("load"),
    model: Name,
    pod: Name,
    ts: Millis,
    stale: Type.Boolean(),
    scrapeMs: Type.Optional(Type.Number({ minimum: 0 })),
    error: Type.Optional(Type.String()),
    load: Nullable(EngineLoadSchema),
    /**
     * LoRA adapters the engine itself reports (vLLM `/v1/models` entries with a `parent`, and the
     * running/waiting adapters of `vllm:lora_requests_info`); absent when it could not tell.
     * Gateways route an adapter's requests to pods that publish it here or in PODS.
     */
    adapters: Type.Optional(Type.Array(Name, { maxItems: 256 })),
    /** The engine's context length (`max_model_len` of its base model on `/v1/models`); absent when it could not tell. */
    maxModelLen: Type.Optional(Type.Integer({ minimum: 1, maximum: 2 ** 31 })),
  },
  { $id: "load", additionalProperties: false },
);

/**
 * CHARGES stream: a gateway's provisional charge against a pod, made at selection time.
 * Counted by every replica until released, until `ttlMs` after `ts`, or until the charging
 * gateway's heartbeat lapses — whichever comes first.
 */
export const ChargeEvent = Type.Object(
  {
    type: Type.Literal("charge"),
    id: Name,
    gateway: Name,
    model: Name,
    pod: Name,
    ts: Millis,
    ttlMs: Type.Integer({ minimum: 1 }),
    promptTokens: Count,
    maxTokens: Type.Optional(Count),
    /** The requesting user (header `user`), for shared per-user accounting (vtc-basic, rate limits). */
    user: Type.Optional(Type.String({ maxLength: 256 })),
    phase: Type.Optional(Type.Union([Type.Literal("combined"), Type.Literal("prefill"), Type.Literal("decode")])),
  },
  { $id: "charge", additionalProperties: false },
);

export const ReleaseOutcome = Type.Union([
  Type.Literal("completed"),
  Type.Literal("error"),
  Type.Literal("cancelled"),
  Type.Literal("shutdown"),
]);

/**
 * One latency model sample (docs/latency-model.md): the routed pod's features when the request was
 * routed and what the request saw. `x` = [prompt tokens, tokens cached on the pod, prompt tokens
 * of the pod's other requests still in prefill, its other requests decoding, engine waiting, KV
 * usage in permille]. Outcomes are absent when the request never produced them; a reader bounds
 * them before learning (a missing, negative or absurd TTFT is counted, never learned).
 */
export const LatencySample = Type.Object(
  {
    x: Type.Array(Count, { minItems: 6, maxItems: 6 }),
    cls: Type.Optional(PodClass),
    ttftMs: Type.Optional(Type.Number()),
    tpotMs: Type.Optional(Type.Number()),
  },
  { additionalProperties: false },
);

/** What a release says about its request: shared by `release` and each item of a `releases` batch. */
const ReleaseFields = {
  id: Name,
  ts: Millis,
  outcome: ReleaseOutcome,
  /** The engine's counts, from the response's `usage`, when it reported them. */
  promptTokens: Type.Optional(Count),
  completionTokens: Type.Optional(Count),
  /** With `promptTokens`: what the charge counted (the estimate) and when, so readers can correct rate windows. */
  chargedPromptTokens: Type.Optional(Count),
  chargedAt: Type.Optional(Millis),
  user: Type.Optional(Type.String({ maxLength: 256 })),
  /**
   * The gateway's count of charges made when it made this release (the number in charge ids, as an
   * integer). Set when releases are batched: the release may then be published after later
   * charges, and replay orders it before them by this.
   */
  afterCharge: Type.Optional(Count),
  /** The latency model's training sample, from the gateway that routed the request. */
  latency: Type.Optional(LatencySample),
};

/** CHARGES stream: the end of a charged request; published exactly once per charge. */
export const ReleaseEvent = Type.Object(
  { type: Type.Literal("release"), gateway: Name, model: Name, pod: Name, ...ReleaseFields },
  { $id: "release", additionalProperties: false },
);

/** Most releases one `releases` batch carries (a gateway flushes earlier, by time). */
export const MAX_RELEASE_BATCH = 1024;

/** One release inside a `releases` batch: a `release` event without what the batch states once. */
export const ReleaseItem = Type.Object(ReleaseFields, { additionalProperties: false });

/**
 * CHARGES stream (subject `<prefix>.releases.<model>.<pod>`, like `release`): several releases of
 * one gateway on one pod, in the order the gateway made them. Exactly the same as that many
 * `release` events published back to back; a gateway batches the releases it makes within a few
 * milliseconds (one message instead of one per request, so every other replica folds fewer
 * messages) and sends a lone release as a plain `release`.
 */
export const ReleaseBatch = Type.Object(
  {
    type: Type.Literal("releases"),
    gateway: Name,
    model: Name,
    pod: Name,
    releases: Type.Array(ReleaseItem, { minItems: 1, maxItems: MAX_RELEASE_BATCH }),
  },
  { $id: "releases", additionalProperties: false },
);

/** One charge a gateway still holds, as listed in its heartbeat. */
export const OutstandingCharge = Type.Object(
  { id: Name, model: Name, pod: Name, promptTokens: Count, ts: Millis, decoding: Type.Optional(Type.Boolean({ description: "past its first token" })) },
  { additionalProperties: false },
);

/**
 * CHARGES stream (subject `<prefix>.hb.<gateway>`): a gateway is alive; `state: "down"` on clean exit.
 * `outstanding` lists every charge the gateway holds at that point of its publish order: the
 * authoritative state that charges and releases are deltas on. A receiver drops that gateway's
 * charges missing from the list (a lost release) and adds listed ones it never saw (a lost
 * charge), so any loss heals within one heartbeat. `truncated` = the list hit its bound (then
 * only additions are made).
 *
 * A list too large for one message (the server's `max_payload`) is sent as `parts` messages of one
 * `beat`, each with the liveness fields and a slice of `outstanding`: receivers add what each part
 * lists at once, but remove unlisted charges only once every part of that beat has arrived (a lost
 * part must never look like released charges). Without `parts`, the message is the whole list.
 */
export const GatewayHeartbeat = Type.Object(
  {
    type: Type.Literal("heartbeat"),
    gateway: Name,
    ts: Millis,
    intervalMs: Type.Integer({ minimum: 1 }),
    startedAt: Millis,
    state: Type.Union([Type.Literal("up"), Type.Literal("down")]),
    chargeTtlMs: Type.Optional(Type.Integer({ minimum: 1 })),
    outstanding: Type.Optional(Type.Array(OutstandingCharge)),
    truncated: Type.Optional(Type.Boolean()),
    beat: Type.Optional(Type.Integer({ minimum: 0, description: "heartbeat number, increasing within one gateway process (startedAt)" })),
    part: Type.Optional(Type.Integer({ minimum: 0, description: "0-based index of this part of the beat" })),
    parts: Type.Optional(Type.Integer({ minimum: 1, description: "how many messages the beat's outstanding list was split into" })),
    /**
     * The PODS stream sequence the gateway had applied when it built this beat: every charge it made
     * after folding a pod's `draining` event avoids that pod, so once a beat says `podsSeq` >= that
     * event's sequence, its `outstanding` list holds all it will ever charge there (the drain
     * handshake's acknowledgement, docs/autoscaling.md).
     */
    podsSeq: Type.Optional(Type.Integer({ minimum: 0 })),
  },
  { $id: "heartbeat", additionalProperties: false },
);

/** Most users one usage summary lists (the most active first; the others are counted in `truncated`). */
export const MAX_USAGE_USERS = 10_000;

/**
 * USAGE stream (subject `<base>.usage.<pool or _>.<gateway>.<startedAt>`, under the base prefix whatever the
 * gateway's pool): one gateway's OWN admissions per user in the current rate-limit minute, sent
 * every `--usage-summary-ms` while it has any (docs/architecture.md, "Model configs and rate
 * limits"). Gateways of other namespaces add them to the counts they fold from their own CHARGES
 * stream, so a per-user limit holds across gateway pools. Each summary is the whole window so far
 * (not a delta): the latest one per gateway process and window replaces the one before.
 */
export const UsageSummary = Type.Object(
  {
    type: Type.Literal("usage"),
    gateway: Name,
    /** The gateway's pool (streams/pools.ts); absent for the unpooled namespace. */
    pool: Type.Optional(Type.String({ pattern: "^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$" })),
    /** The gateway process's start: a restarted gateway with the same id is another publisher. */
    startedAt: Millis,
    /** Start of the rate-limit minute the counts belong to (epoch ms, a whole minute). */
    window: Type.Integer({ minimum: 0, multipleOf: 60_000 }),
    ts: Millis,
    /** `[user, requests, tokens]` admitted by this gateway in the window; tokens as the rate view counts them (prompt, corrected by the engine's count, plus completion). */
    users: Type.Array(Type.Tuple([Type.String({ minLength: 1, maxLength: 256 }), Count, Count]), { maxItems: MAX_USAGE_USERS }),
    /** Users left out (beyond `MAX_USAGE_USERS` or the message size bound). */
    truncated: Type.Optional(Count),
  },
  { $id: "usage", additionalProperties: false },
);

/** Most prompt blocks a decision record lists (the first ones): 512 x 16 tokens = 8,192 tokens. */
export const DECISION_MAX_BLOCKS = 512;
/** The decision record version this code writes (`v`); records without `v` are version 1. */
export const DECISION_RECORD_VERSION = 2;

const Cursor = Type.Integer({ minimum: 0 });

/**
 * DECISIONS stream: one record per routed (or rejected) request, published when the request ends;
 * the input of offline replay. Version 2 records also carry what replay needs to re-decide the
 * request on the views the gateway had: the charge id (its place among the gateway's own events),
 * the cursor of every view, the replica's rank, the session hint and the prompt's block hashes.
 * No prompt text is ever recorded.
 */
export const DecisionRecord = Type.Object(
  {
    type: Type.Literal("decision"),
    /** Record version (absent = 1). */
    v: Type.Optional(Type.Integer({ minimum: 1 })),
    id: Name,
    gateway: Name,
    model: Type.String(),
    ts: Millis,
    strategy: Type.String(),
    candidates: Type.Array(
      Type.Object(
        { pod: Name, score: Type.Optional(Type.Number()), inFlight: Type.Optional(Type.Number()) },
        { additionalProperties: false },
      ),
    ),
    pick: Nullable(Name),
    /** How to read `score`: "lower" (default) or "higher" is better. */
    better: Type.Optional(Type.Union([Type.Literal("lower"), Type.Literal("higher")])),
    /** Set when the strategy's own rule could not decide and a fallback did (e.g. "least-request"). */
    fallback: Type.Optional(Type.String()),
    user: Type.Optional(Type.String({ maxLength: 256 })),
    status: Type.Integer({ minimum: 100, maximum: 599 }),
    outcome: Type.Union([ReleaseOutcome, Type.Literal("rejected")]),
    errorCode: Type.Optional(Type.String()),
    ttftMs: Type.Optional(Type.Number({ minimum: 0 })),
    /** Mean time per output token after the first (ms), from the streamed chunks. */
    tpotMs: Type.Optional(Type.Number({ minimum: 0 })),
    durationMs: Type.Optional(Type.Number({ minimum: 0 })),
    promptTokens: Type.Optional(Count),
    completionTokens: Type.Optional(Count),
    /** The charge this request made (id unique per gateway process, increasing in routing order). */
    charge: Type.Optional(Name),
    /**
     * The gateway's count of charges made when the request's first token arrived (the number in
     * charge ids). Its routing decisions up to that charge saw the request in prefill, later ones
     * saw it decoding: replay rebuilds that split by this, as a time cannot within a millisecond.
     */
    firstTokenAfterCharge: Type.Optional(Count),
    /** The model profile that applied. */
    profile: Type.Optional(Type.String({ maxLength: 256 })),
    /** The profile's strategy plugin parameters, when it set any. */
    strategyParams: Type.Optional(Type.Record(Type.String({ maxLength: 64 }), Type.Record(Type.String({ maxLength: 64 }), Type.Union([Type.Number(), Type.String({ maxLength: 256 }), Type.Boolean()])))),
    /** The profile's latency targets (slo* strategies). */
    slo: Type.Optional(Type.Object({ ttftMs: Type.Optional(Type.Number()), tpotMs: Type.Optional(Type.Number()) }, { additionalProperties: false })),
    maxTokens: Type.Optional(Count),
    /** Prompt tokens as the strategy saw them at routing time (estimate, or the tokenizer's count). */
    routedPromptTokens: Type.Optional(Count),
    /** Session hint: the pod an `x-session-id` named, and the hash of `x-aibrix-session-key`. */
    session: Type.Optional(Type.Object({ address: Type.Optional(Type.String({ maxLength: 128 })), keyHash: Type.Optional(Hash) }, { additionalProperties: false })),
    /** The proxy's endpoint subset, when it restricted the candidates. */
    subset: Type.Optional(Type.Array(Type.String({ maxLength: 300 }), { maxItems: 256 })),
    /** The latency model's prediction for the picked pod when it was picked (compare with `ttftMs`, `tpotMs`). */
    prediction: Type.Optional(
      Type.Object(
        {
          ttftMs: Type.Number({ minimum: 0 }),
          tpotMs: Type.Number({ minimum: 0 }),
          source: Type.Union([Type.Literal("class"), Type.Literal("pooled"), Type.Literal("prior")]),
          podClass: Type.Optional(PodClass),
        },
        { additionalProperties: false },
      ),
    ),
    /**
     * The prompt's router block hashes (prefix strategies): block size, tokenizer mode, the first
     * DECISION_MAX_BLOCKS hashes as big-endian uint64s packed and base64-encoded (8 bytes each;
     * `jetroute replay` and `decodeBlockHashes` read them), and how many blocks the prompt had.
     */
    blocks: Type.Optional(
      Type.Object(
        {
          size: Type.Integer({ minimum: 1 }),
          mode: Type.Union([Type.Literal("precise"), Type.Literal("approximate")]),
          hashes: Type.String({ maxLength: Math.ceil((DECISION_MAX_BLOCKS * 8) / 3) * 4, pattern: "^[A-Za-z0-9+/]*={0,2}$" }),
          total: Count,
        },
        { additionalProperties: false },
      ),
    ),
    /** How the charge was shared, when not `eventual`. */
    consistency: Type.Optional(Type.Union([Type.Literal("strict"), Type.Literal("off")])),
    /**
     * Flow control (docs/flow-control.md): the request's priority band, its objective, when it was
     * queued and how long it was held before `ts` (0: it went at once). Absent: flow control off.
     */
    flow: Type.Optional(
      Type.Object(
        { band: Type.Integer({ minimum: -16, maximum: 16 }), objective: Type.Optional(Type.String({ maxLength: 64 })), enqueuedAt: Millis, waitMs: Type.Number({ minimum: 0 }) },
        { additionalProperties: false },
      ),
    ),
    /**
     * Semantic model selection (docs/semantic.md): the virtual model the client asked for (`model`
     * is the one its decision chose), the winning decision (`default` for the default action), the
     * runner-up, and every signal's value with the measure it was judged on and its measurement's
     * hash, so `jetroute replay --rules` can re-decide it under changed rules. No prompt text.
     */
    semantic: Type.Optional(
      Type.Object(
        {
          virtualModel: Type.String({ maxLength: 256 }),
          decision: Type.String({ maxLength: 64 }),
          runnerUp: Type.Optional(Type.String({ maxLength: 64 })),
          signals: Type.Record(
            Type.String({ maxLength: 64 }),
            Type.Object(
              {
                value: Type.Boolean(),
                measure: Type.Optional(Type.Union([Type.Number(), Type.String({ maxLength: 8 })])),
                via: Type.Optional(Type.Union([Type.Literal("embedding"), Type.Literal("lexical")])),
                def: Type.String({ maxLength: 16 }),
              },
              { additionalProperties: false },
            ),
            { maxProperties: 64 },
          ),
        },
        { additionalProperties: false },
      ),
    ),
    /**
     * An InferenceModelRewrite that applied (docs/inference-pool.md): the model the client asked
     * for (`model` is the one the request was routed for), the rule and its pool. Replay checks
     * the rewrite again against the pool policies as they were at `cursors.config`.
     */
    rewrite: Type.Optional(
      Type.Object({ from: Type.String({ maxLength: 256 }), rule: Type.String({ maxLength: 320 }), pool: Type.String({ maxLength: 320 }) }, { additionalProperties: false }),
    ),
    /**
     * The engine's `priority` the gateway wrote into the body for the picked pod (issue 36,
     * docs/engine-priority.md), or why it wrote none (`fcfs-pod`: the pod does not schedule by
     * priority; `off`: the model's `flowControl.enginePriority`); only for a request with a band.
     * Replay derives it again from `flow.band`, the pod and the config at `cursors.config`.
     */
    enginePriority: Type.Optional(Type.Union([Type.Integer({ minimum: -1_000_000, maximum: 1_000_000 }), Type.Literal("fcfs-pod"), Type.Literal("off")])),
    /** The body's model as written for the picked pod: a managed LoRA adapter on SGLang as `base:adapter` (docs/adapters.md). */
    engineModel: Type.Optional(Type.String({ maxLength: 520 })),
    /**
     * Responses API (docs/stateful-apis.md): the affinity verdict for the request's
     * `previous_response_id`: pinned to the pod holding it (`subset` then names that pod alone, so
     * replay re-decides the same pick), or expanded from the response store; the reason, the
     * owner pod, and for an expansion the turns prepended and items dropped.
     */
    responseAffinity: Type.Optional(
      Type.Object(
        {
          action: Type.Union([Type.Literal("pin"), Type.Literal("expand")]),
          reason: Type.String({ maxLength: 32 }),
          owner: Type.Optional(Name),
          turns: Type.Optional(Count),
          dropped: Type.Optional(Count),
        },
        { additionalProperties: false },
      ),
    ),
    /** Last sequence the gateway had applied, per view, when it decided. */
    cursors: Type.Optional(Type.Object({ pods: Cursor, load: Cursor, charges: Cursor, kv: Cursor, config: Cursor }, { additionalProperties: false })),
    /** The replica's place among the live gateways, when ties followed its tie order. */
    rank: Type.Optional(Type.Object({ index: Count, count: Type.Integer({ minimum: 2 }) }, { additionalProperties: false })),
    /**
     * Prefill/decode disaggregation (`pd`): one record per leg, both with the request's id. The
     * decode record's `pick` is the decode pod and its `ttftMs` runs from routing to the decode's
     * first chunk; `prefillMs` is the prefill leg's share of it.
     */
    pd: Type.Optional(
      Type.Object(
        {
          leg: Type.Union([Type.Literal("prefill"), Type.Literal("decode")]),
          roleset: Type.String({ maxLength: 253 }),
          engine: EngineKind,
          prefillPod: Type.Optional(Name),
          decodePod: Type.Optional(Name),
          /** The decider skipped the prefill leg (the decode pod held nearly all of the prompt). */
          skipped: Type.Optional(Type.Boolean()),
          /** Prefill attempts made (retries on other prefill pods included). */
          attempts: Type.Optional(Count),
          prefillMs: Type.Optional(Type.Number({ minimum: 0 })),
          fastPath: Type.Optional(Type.String({ maxLength: 64 })),
          /** Why the prefill leg failed, when it did. */
          error: Type.Optional(Type.String({ maxLength: 64 })),
        },
        { additionalProperties: false },
      ),
    ),
  },
  { $id: "decision", additionalProperties: false },
);

const Medium = Type.Union([Type.String(), Type.Null()], { description: "GPU, CPU, STORAGE (older FS/OBJ), SGLang CPU_PINNED/DISK/EXTERNAL; null = GPU" });

/** One BlockStored, with the router's own chained hash of each block already computed by the bridge. */
export const KvStored = Type.Object(
  {
    kind: Type.Literal("stored"),
    /** Engine hashes, in block order (only used to apply later removals). */
    engineHashes: Type.Array(Hash, { minItems: 1 }),
    /** Router hashes (see services/views/block-hash.ts), one per block; what the prefix index keys on. */
    routerHashes: Type.Array(Hash, { minItems: 1 }),
    /** Engine hash of the block before the first one here, or null. */
    parentEngineHash: Nullable(Hash),
    blockSize: Type.Integer({ minimum: 1 }),
    medium: Medium,
    lora: Nullable(Type.String()),
  },
  { additionalProperties: false },
);

export const KvRemoved = Type.Object(
  { kind: Type.Literal("removed"), engineHashes: Type.Array(Hash, { minItems: 1 }), medium: Medium },
  { additionalProperties: false },
);

export const KvAllCleared = Type.Object({ kind: Type.Literal("all-cleared") }, { additionalProperties: false });

/**
 * KV stream (`<prefix>.kv.<model>.<pod>`): one engine event batch, as decoded and enriched by the
 * kv-bridge. `Nats-Msg-Id` = `<pod>:<epoch>:<seq>` so restarts and duplicate bridges dedupe.
 */
export const KvBatch = Type.Object(
  {
    type: Type.Literal("kv"),
    model: Name,
    pod: Name,
    /** Identifies one engine incarnation (the bridge starts a new epoch when the engine restarts). */
    epoch: Name,
    /** The engine's batch sequence number. */
    seq: Type.Integer({ minimum: 0 }),
    /** Engine timestamp of the batch (ms). */
    ts: Millis,
    dpRank: Type.Optional(Nullable(Type.Integer({ minimum: 0 }))),
    events: Type.Array(Type.Union([KvStored, KvRemoved, KvAllCleared])),
  },
  { $id: "kv", additionalProperties: false },
);

/** KV stream: the bridge lost track of a pod's cache (unrepairable gap, engine restart): forget all its blocks. */
export const KvPodCleared = Type.Object(
  {
    type: Type.Literal("kv-cleared"),
    model: Name,
    pod: Name,
    epoch: Name,
    reason: Type.Union([Type.Literal("engine-restart"), Type.Literal("gap-unrepairable"), Type.Literal("replay-unavailable"), Type.Literal("bridge-start")]),
    ts: Millis,
  },
  { $id: "kv-cleared", additionalProperties: false },
);

/**
 * KV stream: a gateway routed a prompt with these block hashes to this pod. Engines that publish
 * no KV events are matched on these alone (approximate mode); with engine events they cover the
 * moment between routing and the engine's BlockStored. Readers expire them at `ts + ttlMs`.
 */
export const KvRouted = Type.Object(
  {
    type: Type.Literal("kv-routed"),
    model: Name,
    pod: Name,
    gateway: Name,
    /** Router hashes of the prompt's blocks, in order (hex). */
    hashes: Type.Array(Hash, { minItems: 1, maxItems: 65536 }),
    ts: Millis,
    ttlMs: Type.Integer({ minimum: 1 }),
    /** The routing gateway's charge id for this request (orders it among that gateway's own events). */
    charge: Type.Optional(Name),
  },
  { $id: "kv-routed", additionalProperties: false },
);

export type PodEvent = Static<typeof PodEvent>;
export type PodSourceHeartbeat = Static<typeof PodSourceHeartbeat>;
export type LoadSample = Static<typeof LoadSample>;
export type EngineLoadFields = Static<typeof EngineLoadSchema>;
export type ChargeEvent = Static<typeof ChargeEvent>;
export type ReleaseEvent = Static<typeof ReleaseEvent>;
export type ReleaseItem = Static<typeof ReleaseItem>;
export type ReleaseBatch = Static<typeof ReleaseBatch>;
export type GatewayHeartbeat = Static<typeof GatewayHeartbeat>;
export type UsageSummary = Static<typeof UsageSummary>;
export type OutstandingCharge = Static<typeof OutstandingCharge>;
export type DecisionRecord = Static<typeof DecisionRecord>;
export type KvBatch = Static<typeof KvBatch>;
export type KvPodCleared = Static<typeof KvPodCleared>;
export type KvStored = Static<typeof KvStored>;
export type KvRouted = Static<typeof KvRouted>;
export type KvRemoved = Static<typeof KvRemoved>;
export type PodRole = Static<typeof PodRole>;
export type EngineKind = Static<typeof EngineKind>;
export type ReleaseOutcome = Static<typeof ReleaseOutcome>;
export type LatencySample = Static<typeof LatencySample>;

/** Every event schema, by its `type`. */
export const EVENT_SCHEMAS = {
  pod: PodEvent,
  "pod-source": PodSourceHeartbeat,
  load: LoadSample,
  charge: ChargeEvent,
  release: ReleaseEvent,
  releases: ReleaseBatch,
  heartbeat: GatewayHeartbeat,
  decision: DecisionRecord,
  kv: KvBatch,
  "kv-cleared": KvPodCleared,
  "kv-routed": KvRouted,
  usage: UsageSummary,
  autoscale: AutoscaleRecommendation,
  adapter: AdapterPlacement,
  "response-location": ResponseLocation,
  "stored-response": StoredResponse,
} as const;

export type EventType = keyof typeof EVENT_SCHEMAS;
export type EventOf<T extends EventType> = Static<(typeof EVENT_SCHEMAS)[T]>;
export type AnyEvent = EventOf<EventType>;

/** Version carried in the `Jr-Schema` header as `<type>/<version>`. */
export const SCHEMA_VERSION = 1;
