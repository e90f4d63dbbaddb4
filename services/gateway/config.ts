/**
 * A gateway's configuration: one schema with every default, validated once and frozen. The CLI
 * (command.ts) fills it from flags and shows these defaults in its help; an embedded gateway
 * (tests, benchmarks) passes only what it changes. A bad value fails at start, naming the field.
 */
import { randomBytes } from "node:crypto";
import os from "node:os";
import { type Static, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { DEFAULT_PD_LEG_OPTIONS, DEFAULT_TURN_BUDGET_MS, FLOW_LIMIT_DEFAULTS } from "../routing/mod.js";
import { DEFAULT_PREFIX } from "../../streams/subjects.js";
import { DEFAULT_RELEASE_BATCH_MS } from "../shared/publish.js";
import { DEFAULT_CHARGE_TTL_MS, DEFAULT_MAX_CHARGES } from "../views/charge-ledger.js";
import { DEFAULT_LOAD_STALE_MS } from "../views/load-view.js";
import { DEFAULT_POD_SOURCE_TIMEOUT_MS } from "../views/pod-set.js";
import { DEFAULT_PREFIX_CACHE_BYTES } from "../tokenizer/hf-tokenizer.js";
import { DEFAULT_RENDER_CACHE_BYTES } from "../tokenizer/incremental-render.js";
import { DEFAULT_PREFIX_MAX_ENTRIES } from "../views/prefix-index.js";
import { DEFAULT_RESPONSE_LOCATIONS } from "../views/response-locations.js";
import { DEFAULT_RATE_CONFIRM_MS } from "../views/rate-view.js";
import { DEFAULT_PD_WATCHDOG } from "./extproc-server.js";
import { DEFAULT_SNAPSHOT_INTERVAL_MS, DEFAULT_SNAPSHOT_LEASE_MS } from "./snapshots.js";
import { otlpEndpointError } from "./trace-spans.js";

const Ms = (def: number, min = 0, description = "") => Type.Integer({ minimum: min, default: def, ...(description ? { description } : {}) });

/** The ext_proc and admin ports the CLI uses unless told otherwise. */
/** Default of `--rejection-records-per-s`. */
export const DEFAULT_REJECTION_RECORDS_PER_S = 50;
export const DEFAULT_EXTPROC_PORT = 9002;
export const DEFAULT_ADMIN_PORT = 9090;
/** Releases are batched over at most this window: replay holds decisions 50 ms for a delayed own release. */
export const MAX_RELEASE_BATCH_MS = 20;
/**
 * `--fold-pace-ms`: how far apart the CHARGES follower reads its batches while charges flow (0 =
 * one delivery per message, the default). A charge reaches the other replicas up to this much
 * later (the first after a quiet spell at once), so eventual mode's herding protection then holds
 * only for requests further apart than the pace (docs/benchmarks.md, "scale": the CPU it saves and
 * the propagation delay it costs); kept below `--rate-confirm-ms` (checked).
 */
export const DEFAULT_FOLD_PACE_MS = 0;
export const MAX_FOLD_PACE_MS = 100;

export const GatewayConfigSchema = Type.Object(
  {
    nats: Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.String({ minLength: 1 }), { minItems: 1 })]),
    /** The base subject prefix; with `pool`, the pool's namespace is under it (streams/pools.ts). */
    prefix: Type.String({ minLength: 1, default: DEFAULT_PREFIX }),
    /** Gateway pools: fold and route only this pool's namespace; the config bucket stays the base prefix's. */
    pool: Type.Optional(Type.String({ minLength: 1 })),
    /** The pool's models, instead of the config bucket's `pool.<name>` list. */
    poolModels: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
    /** ext_proc gRPC port (0 = any free port). */
    port: Type.Integer({ minimum: 0, maximum: 65535, default: DEFAULT_EXTPROC_PORT }),
    host: Type.String({ default: "0.0.0.0" }),
    /**
     * Admin HTTP port (0 = any; -1 = off). Off unless asked for: an embedded gateway (tests,
     * benchmarks) opens no port it was not given; the CLI asks for DEFAULT_ADMIN_PORT.
     */
    adminPort: Type.Integer({ minimum: -1, maximum: 65535, default: -1 }),
    /** Admin HTTP listen address (loopback: /debug/* dumps the views). */
    adminHost: Type.String({ default: "127.0.0.1" }),
    /** Replica id; absent: hostname-pid-random. */
    id: Type.Optional(Type.String({ minLength: 1 })),
    defaultStrategy: Type.String({ minLength: 1, default: "least-request" }),
    chargeTtlMs: Ms(DEFAULT_CHARGE_TTL_MS, 1),
    heartbeatIntervalMs: Ms(1_000, 10),
    /** A gateway silent this long loses its charges; absent: 3 x the heartbeat interval. */
    heartbeatTimeoutMs: Type.Optional(Type.Integer({ minimum: 10 })),
    podSourceTimeoutMs: Ms(DEFAULT_POD_SOURCE_TIMEOUT_MS),
    loadStaleAfterMs: Ms(DEFAULT_LOAD_STALE_MS, 1),
    maxCharges: Type.Integer({ minimum: 1, default: DEFAULT_MAX_CHARGES }),
    rateConfirmMs: Ms(DEFAULT_RATE_CONFIRM_MS),
    usageSummaryMs: Ms(1_000),
    tokenizerMode: Type.String({ minLength: 1, default: "approximate" }),
    tokenizerModes: Type.Record(Type.String(), Type.String({ minLength: 1 }), { default: {} }),
    tokenizerPrefixCacheBytes: Type.Integer({ minimum: 0, default: DEFAULT_PREFIX_CACHE_BYTES }),
    tokenizerRenderCacheBytes: Type.Integer({ minimum: 0, default: DEFAULT_RENDER_CACHE_BYTES }),
    prefixMaxEntries: Type.Integer({ minimum: 1, default: DEFAULT_PREFIX_MAX_ENTRIES }),
    /** Most Responses API locations held (services/views/response-locations.ts, ~200 bytes each). */
    responseLocations: Type.Integer({ minimum: 1, default: DEFAULT_RESPONSE_LOCATIONS }),
    snapshots: Type.Boolean({ default: true }),
    snapshotIntervalMs: Ms(DEFAULT_SNAPSHOT_INTERVAL_MS, 1_000),
    snapshotLeaseMs: Ms(DEFAULT_SNAPSHOT_LEASE_MS, 30),
    consistency: Type.Union([Type.Literal("eventual"), Type.Literal("strict"), Type.Literal("off")], { default: "eventual" }),
    maxHeartbeatCharges: Type.Integer({ minimum: 1, default: 20_000 }),
    /** Decision records of rejected requests published per second by this replica (bursts of twice that); the rest are only counted. */
    rejectionRecordsPerS: Type.Integer({ minimum: 0, default: DEFAULT_REJECTION_RECORDS_PER_S }),
    releaseBatchMs: Type.Integer({ minimum: 0, maximum: MAX_RELEASE_BATCH_MS, default: DEFAULT_RELEASE_BATCH_MS }),
    /** The CHARGES follower reads in batches this far apart while charges flow (0 = a delivery per message). */
    foldPaceMs: Type.Integer({ minimum: 0, maximum: MAX_FOLD_PACE_MS, default: DEFAULT_FOLD_PACE_MS }),
    shutdownGraceMs: Ms(10_000),
    /** Flow control: bytes this replica may hold across models, as counted (services/routing/flow/held-bytes.ts). */
    flowMaxHeldBytes: Type.Integer({ minimum: 0, default: FLOW_LIMIT_DEFAULTS.maxHeldBytes }),
    /** Flow control: requests this replica may hold across models. */
    flowMaxHeld: Type.Integer({ minimum: 0, default: FLOW_LIMIT_DEFAULTS.maxHeldRequests }),
    tls: Type.Optional(Type.Object({ certFile: Type.String({ minLength: 1 }), keyFile: Type.String({ minLength: 1 }), clientCaFile: Type.Optional(Type.String({ minLength: 1 })) }, { additionalProperties: false })),
    sessionSecret: Type.Optional(Type.String()),
    engineApiKey: Type.Optional(Type.String()),
    recordPromptBlocks: Type.Boolean({ default: true }),
    /** A large request's prepare work hands the loop back after this much synchronous work (services/routing/turn-budget.ts); 0 = stages run back to back. */
    turnBudgetMs: Ms(DEFAULT_TURN_BUDGET_MS),
    /** OpenTelemetry traces (docs/tracing.md): the OTLP/HTTP receiver's base URL; absent: no traces. */
    otlpEndpoint: Type.Optional(Type.String({ minLength: 1 })),
    otlpServiceName: Type.String({ minLength: 1, maxLength: 256, default: "jetroute-gateway" }),
    /** Echo pod addresses to clients (`target-pod`, `prefill-target-pod-ip`), as AIBrix does; off: they stay inside. */
    exposePodAddresses: Type.Boolean({ default: false }),
    /** Endpoint picker protocol: fallback endpoints listed after the chosen one in x-gateway-destination-endpoint (0-8). */
    destinationFallbacks: Type.Integer({ minimum: 0, maximum: 8, default: 0 }),
    /** Pod networks allowed (CIDR ranges); a pod published outside them is never routed to. Absent: any. */
    podCidrs: Type.Optional(Type.Array(Type.String({ minLength: 1 }), { minItems: 1 })),
    /** Signed records (docs/security.md): PEM Ed25519 public key(s) config bucket entries must be signed with; absent: unchecked. */
    configPublicKeyFile: Type.Optional(Type.String({ minLength: 1 })),
    /** Signed records: PEM Ed25519 public key(s) PODS events must be signed with (the pod-watchers'); absent: unchecked. */
    podPublicKeyFile: Type.Optional(Type.String({ minLength: 1 })),
    auth: Type.Union([Type.Literal("off"), Type.Literal("required")], { default: "off" }),
    pd: Type.Object(
      {
        prefillTimeoutMs: Ms(DEFAULT_PD_LEG_OPTIONS.prefillTimeoutMs, 1),
        prefillBudgetMs: Ms(DEFAULT_PD_LEG_OPTIONS.prefillBudgetMs, 1),
        sglangPrefillTimeoutMs: Ms(DEFAULT_PD_LEG_OPTIONS.sglangPrefillTimeoutMs, 1),
        maxRetries: Type.Integer({ minimum: 0, maximum: 16, default: DEFAULT_PD_LEG_OPTIONS.maxRetries }),
        firstChunkTimeoutMs: Ms(DEFAULT_PD_WATCHDOG.firstChunkMs, 1),
        idleTimeoutMs: Ms(DEFAULT_PD_WATCHDOG.idleMs, 1),
      },
      { default: {}, additionalProperties: false },
    ),
  },
  { additionalProperties: false },
);

/**
 * A gateway's whole configuration, every default filled in (the replica id and heartbeat timeout
 * too, so what a handle reports is what runs); frozen.
 */
export type GatewayConfig = Readonly<Static<typeof GatewayConfigSchema>> & {
  readonly pd: Readonly<Static<typeof GatewayConfigSchema>["pd"]>;
  readonly id: string;
  readonly heartbeatTimeoutMs: number;
};

/** What a caller may set: everything but `nats` may be left out (the schema's default applies). */
export type GatewayConfigInput = { nats: string | string[] } & Partial<Omit<Static<typeof GatewayConfigSchema>, "nats" | "pd">> & { pd?: Partial<Static<typeof GatewayConfigSchema>["pd"]> };

/** The schema's defaults, for the CLI's help and anyone who must show them. */
export const GATEWAY_DEFAULTS = Value.Default(GatewayConfigSchema, { nats: "nats://127.0.0.1:4222" }) as Readonly<Static<typeof GatewayConfigSchema>>;

/** A replica id unique enough for one fleet: host, pid and a random suffix (a restarted pid differs). */
export function defaultGatewayId(): string {
  return `${os.hostname()}-${process.pid}-${randomBytes(2).toString("hex")}`;
}

export class GatewayConfigError extends Error {
  override name = "GatewayConfigError";
}

/** Fills the defaults, validates and freezes; a bad field is a GatewayConfigError naming it. */
export function resolveGatewayConfig(input: GatewayConfigInput): GatewayConfig {
  // Absent and `undefined` mean the same thing to a caller: the default.
  const defined = (o: object) => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
  const raw = { ...defined(input), ...(input.pd ? { pd: defined(input.pd) } : {}) };
  const filled = Value.Default(GatewayConfigSchema, structuredClone(raw));
  if (!Value.Check(GatewayConfigSchema, filled)) {
    const e = Value.Errors(GatewayConfigSchema, filled).First();
    throw new GatewayConfigError(`invalid gateway configuration: ${e ? `${e.path || "/"}: ${e.message}` : "schema mismatch"}`);
  }
  const c = filled as Static<typeof GatewayConfigSchema> & { id: string; heartbeatTimeoutMs: number };
  c.id ??= defaultGatewayId();
  c.heartbeatTimeoutMs ??= 3 * c.heartbeatIntervalMs;
  // The rate-limit guard reserves room for the other replicas' unseen admissions for
  // rateConfirmMs: a charge read later than that would be unseen and unreserved.
  if (c.rateConfirmMs > 0 && c.foldPaceMs >= c.rateConfirmMs) {
    throw new GatewayConfigError(`invalid gateway configuration: /foldPaceMs (${c.foldPaceMs}) must be below /rateConfirmMs (${c.rateConfirmMs}): other replicas' charges would be read after the rate guard stopped reserving room for them`);
  }
  const otlpError = c.otlpEndpoint !== undefined ? otlpEndpointError(c.otlpEndpoint) : undefined;
  if (otlpError) throw new GatewayConfigError(`invalid gateway configuration: /otlpEndpoint: ${otlpError}`);
  Object.freeze(c.pd);
  Object.freeze(c.tokenizerModes);
  if (c.tls) Object.freeze(c.tls);
  if (c.poolModels) Object.freeze(c.poolModels);
  return Object.freeze(c) as GatewayConfig;
}
