/**
 * The gateway's routing state as one pure event fold. Pure: no I/O, no clock of its own.
 *
 * Every view a gateway routes from — pod set, load view, charge ledger, usage and rate windows,
 * prefix index, routed prefixes, model configs, API keys — changes here and only here:
 * - `apply(event, meta)` folds a message read from a stream or the config bucket (followers,
 *   `jetroute replay`). Time inside the fold is the message's server timestamp, never a local
 *   clock, so two instances fed the same messages end in the same state wherever and whenever
 *   they run (the snapshot test holds them to it).
 * - `own*` apply this gateway's own events at the moment it makes them; their echoes from the
 *   stream are then ignored by `apply` (applying the echo of a charge already released locally
 *   would resurrect it). Replay feeds a recorded gateway's own events through the same methods.
 * - `sweep(now)` is the time-driven change of what the streams cannot time (pod-watcher silence,
 *   window and routed-prefix housekeeping), called by the shell's timer. The charge ledger's
 *   expiry and peer lapses are not swept: they follow the CHARGES stream's server time as the
 *   fold reads it (charge-ledger.ts), so the ledger at a cursor does not depend on when a timer ran.
 *
 * The cursor of each stream (the last sequence handled, applied or not) is part of the state:
 * decision records carry them, and replay rebuilds a view by folding a stream up to them.
 */
import { createHash } from "node:crypto";
import {
  API_KEY_KEY_PREFIX,
  apiKeyRecordError,
  type ApiKeyRecord,
  INFERENCE_POOL_KEY_PREFIX,
  type InferencePoolPolicy,
  inferencePoolPolicyError,
  MODEL_CONFIG_KEY_PREFIX,
  type ModelConfig,
  modelConfigError,
  POOL_KEY_PREFIX,
  type PoolConfig,
  poolConfigError,
  RATE_LIMITS_KEY,
  type RateLimits,
  rateLimitsError,
} from "../../schemas/config.js";
import type { ChargeEvent, GatewayHeartbeat, KvBatch, KvPodCleared, KvRouted, LoadSample, PodEvent, PodSourceHeartbeat, ReleaseBatch, ReleaseEvent, ReleaseItem, UsageSummary } from "../../schemas/events.js";
import type { ResponseLocationEvent } from "../../schemas/responses.js";
import { poolNameError } from "../../streams/pools.js";
import { configRecordRefusal, type RecordKeySets } from "../../streams/record-keys.js";
import { configRecordSubject, type RecordVerifier, SIGNATURE_REFUSALS, type SignatureRefusal } from "../../streams/signatures.js";
import { decodeToken } from "../../streams/tokens.js";
import { ApiKeyView, hashOfBucketKey, SHOWN_HASH_PREFIX } from "./api-keys.js";
import { ChargeLedger } from "./charge-ledger.js";
import { DEFAULT_LOAD_STALE_MS, LoadView } from "./load-view.js";
import { ModelConfigView } from "./model-config.js";
import { PoolPolicies } from "./pool-policies.js";
import { PodSet } from "./pod-set.js";
import { PoolMap } from "./pool-map.js";
import { DEFAULT_PREFIX_MAX_ENTRIES, PrefixIndex, type PrefixIndexOptions } from "./prefix-index.js";
import { DEFAULT_RATE_CONFIRM_MS, type ForeignUsageBounds, RateView } from "./rate-view.js";
import { DEFAULT_RESPONSE_LOCATIONS, ResponseLocations } from "./response-locations.js";
import { RoutedPrefixes } from "./routed-prefixes.js";
import { UsageView } from "./usage-view.js";
import { LatencyModel } from "./latency-model.js";

/** The sources a gateway folds; `config` is the config bucket's underlying stream. */
export type StateStream = "pods" | "load" | "charges" | "kv" | "config";
export const STATE_STREAMS: readonly StateStream[] = ["pods", "load", "charges", "kv", "config"];

export interface EventMeta {
  /**
   * `usage`: the base prefix's USAGE stream; `responses`: its RESPONSES stream (their cursors are
   * not among the decision records' `cursors`: a decision records the affinity it used instead).
   */
  stream: StateStream | "usage" | "responses";
  subject: string;
  /** Stream sequence (for the config bucket: the entry's revision, which is its stream sequence). */
  seq: number;
  /** Server timestamp of the message (ms). */
  serverTs: number;
}

/** One config bucket entry as the watcher delivers it; `value` is the parsed JSON, undefined if it was not JSON. */
export interface ConfigEntry {
  type: "config-entry";
  key: string;
  operation: "PUT" | "DEL" | "PURGE";
  value?: unknown;
  /** True when the bytes were present but not JSON. */
  notJson?: boolean;
}

export type StateEvent = PodEvent | PodSourceHeartbeat | LoadSample | ChargeEvent | ReleaseEvent | ReleaseBatch | GatewayHeartbeat | KvBatch | KvPodCleared | KvRouted | ConfigEntry | UsageSummary | ResponseLocationEvent;

/** What `apply` did with an event; `note` is set where an operator should hear of it (logged by the shell). */
export interface ApplyResult {
  applied: boolean;
  /** Why an event changed nothing: "own-echo", "own-namespace", "stale", "duplicate", "expired", "not-config". */
  ignored?: string;
  note?: { level: "info" | "warn" | "error"; message: string; fields: Record<string, unknown>; rejected?: boolean };
}

export interface GatewayStateOptions {
  /** This gateway's id (its echoes are ignored). Absent in a fold that belongs to no gateway. */
  self?: string;
  /** `false` = `--consistency off`: other gateways' charges are not counted as load. */
  shareCharges?: boolean;
  heartbeatTimeoutMs?: number;
  maxCharges?: number;
  loadStaleAfterMs?: number;
  rateConfirmMs?: number;
  prefixIndex?: PrefixIndexOptions;
  /**
   * Pods of a watcher source silent (no heartbeat, no pod event) for longer than this, on broker
   * time, are not routable (docs/architecture.md, "Pod source liveness"). 0 or absent = never.
   */
  podSourceTimeoutMs?: number;
  /** This gateway's pool (streams/pools.ts); undefined = the unpooled namespace. Usage summaries of its own namespace are ignored. */
  pool?: string;
  /** Most response locations held (services/views/response-locations.ts). */
  maxResponseLocations?: number;
  /** Bounds on the other namespaces' usage summaries held (services/views/rate-view.ts). */
  foreignUsage?: ForeignUsageBounds;
  /**
   * A model config checked beyond its schema: the routing core's `validateModelConfig`
   * (services/routing/config-check.ts: every strategy it names must parse), injected because the
   * views sit below the routing core. Absent = the schema alone.
   */
  checkModelConfig?: (value: unknown, model: string) => string | undefined;
  /** Pod addresses allowed (`--pod-cidrs`, services/shared/cidr.ts); default: any. */
  podAddressAllowed?: (address: string) => boolean;
  /**
   * Signed records (streams/signatures.ts): config entries (signed under `$KV.<bucket>.<key>`) that
   * do not verify are ignored as invalid ones are (an API key's is removed); absent = unchecked.
   * Each entry is checked against its own role's keys only (streams/record-keys.ts): `operator`
   * for API keys, limits, pools and model configs, `podWatcher` for InferencePool policies.
   */
  configSignatures?: RecordKeySets & { bucket: string };
  /** Signed records: PODS events (pods and watcher heartbeats) that do not verify are ignored; absent = unchecked. */
  podSignatures?: RecordVerifier;
}

/** Records refused for their signature, by what they were and why. */
export type SignatureRefusalCounts = Record<"config" | "pods", Record<SignatureRefusal, number>>;

/** How an own charge is remembered for the rate limits' burst guard (only where a limit applies). */
export interface OwnAdmission {
  readonly user?: string;
  readonly model?: string;
  readonly tokens: number;
  readonly ts: number;
}

const APPLIED: ApplyResult = Object.freeze({ applied: true });
const zeroRefusals = () => Object.fromEntries(SIGNATURE_REFUSALS.map((r) => [r, 0])) as Record<SignatureRefusal, number>;
const ignored = (why: string): ApplyResult => ({ applied: false, ignored: why });

export class GatewayState {
  readonly self: string | undefined;
  readonly pool: string | undefined;
  readonly shareCharges: boolean;
  readonly pods: PodSet;
  readonly load: LoadView;
  readonly ledger: ChargeLedger;
  readonly usage = new UsageView();
  readonly rates: RateView;
  readonly routed = new RoutedPrefixes();
  readonly configs = new ModelConfigView();
  readonly apiKeys = new ApiKeyView();
  readonly pools = new PoolMap();
  /** InferencePool objectives and rewrites (config bucket `inferencepool.*`). */
  readonly poolPolicies = new PoolPolicies();
  /** The latency model, learned from every gateway's releases (latency-model.ts). */
  readonly latency = new LatencyModel();
  /** Where each Responses API response lives (RESPONSES stream; response-locations.ts). */
  readonly responses: ResponseLocations;
  private prefixIndex: PrefixIndex;
  readonly prefixIndexOptions: PrefixIndexOptions;
  /** Last sequence handled per source (applied, ignored, skipped or dead-lettered). */
  readonly cursors: Record<StateStream, number> = { pods: 0, load: 0, charges: 0, kv: 0, config: 0 };
  /** Last USAGE stream sequence handled (kept apart: decision records list `cursors` as they are). */
  usageCursor = 0;
  /** Last RESPONSES stream sequence handled. */
  responsesCursor = 0;
  /** Config entries refused by validation (their signature included). */
  configRejected = 0;
  /** Records refused for their signature (a subset of `configRejected` for the config bucket). */
  readonly signatureRefusals: SignatureRefusalCounts = { config: zeroRefusals(), pods: zeroRefusals() };
  private readonly configSignatures: GatewayStateOptions["configSignatures"];
  private readonly podSignatures: RecordVerifier | undefined;
  readonly podSourceTimeoutMs: number;
  private readonly checkModelConfig: (value: unknown, model: string) => string | undefined;
  private readonly configRevisions = new Map<string, number>();

  constructor(o: GatewayStateOptions = {}) {
    this.self = o.self;
    this.pool = o.pool;
    this.shareCharges = o.shareCharges ?? true;
    this.podSourceTimeoutMs = o.podSourceTimeoutMs ?? 0;
    this.checkModelConfig = o.checkModelConfig ?? modelConfigError;
    this.configSignatures = o.configSignatures;
    this.podSignatures = o.podSignatures;
    this.pods = new PodSet(o.podAddressAllowed ? { addressAllowed: o.podAddressAllowed } : {});
    this.load = new LoadView(o.loadStaleAfterMs ?? DEFAULT_LOAD_STALE_MS);
    this.ledger = new ChargeLedger({ self: o.self, heartbeatTimeoutMs: o.heartbeatTimeoutMs, maxCharges: o.maxCharges });
    this.responses = new ResponseLocations(o.maxResponseLocations ?? DEFAULT_RESPONSE_LOCATIONS);
    this.rates = new RateView(100_000, o.rateConfirmMs ?? DEFAULT_RATE_CONFIRM_MS, o.foreignUsage);
    // Lookups do not touch blocks: every replica then evicts in the same order, driven by the same
    // stream (engine stores, and routed prefixes touching the blocks they reuse).
    this.prefixIndexOptions = { maxEntries: DEFAULT_PREFIX_MAX_ENTRIES, touchOnMatch: false, ...o.prefixIndex };
    this.prefixIndex = new PrefixIndex(this.prefixIndexOptions);
  }

  get index(): PrefixIndex {
    return this.prefixIndex;
  }

  /** Boots the prefix index from a snapshot that reflects the KV stream up to `seq`. */
  restorePrefixIndex(index: PrefixIndex, seq: number): void {
    this.prefixIndex = index;
    if (seq > this.cursors.kv) this.cursors.kv = seq;
  }

  /**
   * A message was handled without being applied (an echo skipped unparsed, a dead letter): only
   * the cursor moves — and, on CHARGES, the ledger's clock when the caller knows the message's
   * server time (`serverTs` > 0: every applied message, and a gateway's own heartbeat echo).
   */
  skip(meta: EventMeta): void {
    if (meta.stream === "charges" && meta.serverTs > 0) this.ledger.advance(meta.serverTs);
    if (meta.stream === "usage") {
      if (meta.seq > this.usageCursor) this.usageCursor = meta.seq;
    } else if (meta.stream === "responses") {
      if (meta.seq > this.responsesCursor) this.responsesCursor = meta.seq;
    } else if (meta.seq > this.cursors[meta.stream]) this.cursors[meta.stream] = meta.seq;
  }

  apply(ev: StateEvent, meta: EventMeta): ApplyResult {
    this.skip(meta);
    const at = meta.serverTs;
    if ((ev.type === "pod" || ev.type === "pod-source") && this.podSignatures) {
      const why = this.podSignatures.refusal(meta.subject, ev, at);
      if (why) {
        this.signatureRefusals.pods[why]++;
        return { applied: false, ignored: "signature", note: { level: "warn", message: "PODS event refused: its signature does not verify; ignored", fields: { subject: meta.subject.slice(0, 300), seq: meta.seq, reason: why }, rejected: true } };
      }
    }
    switch (ev.type) {
      case "pod-source":
        this.pods.applySource(ev, at);
        return APPLIED;
      case "pod":
        this.pods.apply(ev, meta.seq, at);
        if (ev.action === "remove") {
          this.load.forget(ev.model, ev.pod);
          this.prefixIndex.removePod(ev.model, ev.pod);
          this.routed.removePod(ev.model, ev.pod);
        }
        return APPLIED;
      case "load":
        this.load.apply(ev, meta.seq);
        if (ev.adapters !== undefined) this.pods.setEngineAdapters(ev.model, ev.pod, ev.adapters);
        return APPLIED;
      case "kv": {
        const r = this.prefixIndex.apply(ev, meta.seq);
        return r === "applied" ? APPLIED : ignored(r);
      }
      case "kv-cleared": {
        const r = this.prefixIndex.applyCleared(ev, meta.seq);
        return r === "applied" ? APPLIED : ignored(r);
      }
      case "kv-routed":
        if (ev.gateway === this.self) return ignored("own-echo");
        this.prefixIndex.touch(ev.model, ev.hashes);
        if (ev.ts + ev.ttlMs <= at) return ignored("expired");
        this.routed.apply(ev);
        return APPLIED;
      case "charge":
      case "release":
      case "heartbeat":
        return this.applyCharges(ev, meta);
      case "releases":
        return this.applyReleases(ev, meta);
      case "config-entry":
        return this.applyConfig(ev, meta.seq, at);
      case "usage":
        return this.applyUsage(ev, at);
      case "response-location": {
        // The gateway's own records too: it applies them here when their echo arrives (a record
        // is small, and the order every replica folds them in is then the stream's).
        const r = this.responses.apply(ev, at);
        if (r === "applied") return APPLIED;
        if (r === "conflict" || r === "invalid") {
          return { applied: false, ignored: `response-${r}`, note: { level: "warn", message: r === "conflict" ? "response location refused: the id is held under another tenant" : "response location refused: a stored record without model, pod or expiry", fields: { id: ev.id.slice(0, 128), seq: meta.seq, gateway: ev.gateway.slice(0, 253) }, rejected: true } };
        }
        return ignored(r);
      }
    }
  }

  /**
   * Another namespace's gateway summary of its own per-user admissions (gateway pools): added to
   * the rate view's per-user counts. Summaries of this gateway's own namespace are ignored: their
   * requests are already counted exactly from its CHARGES stream.
   */
  private applyUsage(ev: UsageSummary, at: number): ApplyResult {
    // The namespace first: a gateway of another pool may share this one's id (`--id`).
    if (ev.pool === this.pool) return ignored(ev.gateway === this.self ? "own-echo" : "own-namespace");
    // A minute over by the broker's clock is never counted again (a booting gateway reads old ones).
    if (ev.window + 60_000 <= at - 60_000) return ignored("expired");
    const r = this.rates.applyForeign({ key: `${ev.pool ?? ""}\u0000${ev.gateway}\u0000${ev.startedAt}`, window: ev.window, ts: ev.ts, users: ev.users });
    return r === "applied" ? APPLIED : ignored(r);
  }

  private applyCharges(ev: ChargeEvent | ReleaseEvent | GatewayHeartbeat, meta: EventMeta): ApplyResult {
    if (ev.gateway === this.self) return ignored("own-echo");
    if (this.shareCharges) this.ledger.applyFromStream(ev, meta.serverTs, meta.serverTs, meta.seq);
    // Other replicas' users spend tokens too: fairness and rate limits are per user across the fleet.
    // A P/D prefill leg is the same request as its decode leg's charge: counted once, by that one.
    if (ev.type === "charge" && ev.phase !== "prefill") {
      this.rates.request(ev.user, ev.model, ev.promptTokens, ev.ts);
      if (ev.user) this.usage.record({ user: ev.user, promptTokens: ev.promptTokens, completionTokens: 0, ts: ev.ts });
    } else if (ev.type === "release") this.countRelease(ev, false, ev.model, meta.serverTs);
    return APPLIED;
  }

  /** A `releases` batch is its releases applied in order, without building an event for each. */
  private applyReleases(ev: ReleaseBatch, meta: EventMeta): ApplyResult {
    if (ev.gateway === this.self) return ignored("own-echo");
    if (this.shareCharges) this.ledger.releaseBatch(ev.gateway, ev.releases, meta.seq);
    for (const r of ev.releases) this.countRelease(r, false, ev.model, meta.serverTs);
    return APPLIED;
  }

  /** What a release changes besides the ledger: the engine's counts in the usage and rate windows (`own`: this gateway's, for its usage summary too). */
  private countRelease(r: ReleaseItem, own: boolean, model: string, brokerTs = 0): void {
    // Learned whatever `shareCharges` says: outcomes are facts about the pods, not load.
    if (r.latency) this.latency.learn(model, r.ts, r.latency, brokerTs);
    // The engine's prompt count replaces the charge's estimate in the window it was charged in.
    if (r.promptTokens !== undefined && r.chargedPromptTokens !== undefined && r.chargedAt !== undefined) {
      this.rates.correctPrompt(r.user, r.promptTokens - r.chargedPromptTokens, r.chargedAt, own);
    }
    if (r.user && r.completionTokens) {
      this.usage.record({ user: r.user, promptTokens: 0, completionTokens: r.completionTokens, ts: r.ts });
      this.rates.completion(r.user, r.completionTokens, r.ts, own);
    }
  }

  /**
   * Config bucket entries: model configs, rate limits, API keys. A model config or rate limits that
   * fail validation are ignored (the previous ones stay), so a bad `put` from outside `jetroute
   * config set` can never break routing; an invalid API key record removes the key (fail closed),
   * so a botched hand-made revocation never leaves a key working. Under `configSignatures` an
   * entry whose signature does not verify counts as invalid.
   */
  private applyConfig(e: ConfigEntry, revision: number, storedAt: number): ApplyResult {
    const isKey = e.key.startsWith(API_KEY_KEY_PREFIX);
    const isPool = e.key.startsWith(POOL_KEY_PREFIX);
    const isInferencePool = e.key.startsWith(INFERENCE_POOL_KEY_PREFIX);
    if (e.key !== RATE_LIMITS_KEY && !e.key.startsWith(MODEL_CONFIG_KEY_PREFIX) && !isKey && !isPool && !isInferencePool) return ignored("not-config");
    if ((this.configRevisions.get(e.key) ?? 0) >= revision) return ignored("stale");
    this.configRevisions.set(e.key, revision);
    // With signatures checked, a record that does not verify is invalid (a planted one); a deletion
    // carries no body to sign and is honoured as it is (docs/security.md, "Signed records").
    // Each record type verifies under its own signer's keys only: a pod-watcher's key never
    // verifies an API key, an operator's never an InferencePool policy (streams/record-keys.ts).
    const sigs = this.configSignatures;
    const unsigned = e.operation === "PUT" && sigs ? configRecordRefusal(e.key, configRecordSubject(sigs.bucket, e.key), e.value, storedAt, sigs) : undefined;
    if (unsigned) this.signatureRefusals.config[unsigned]++;
    const reject = (level: "warn" | "error", message: string, fields: Record<string, unknown>): ApplyResult => {
      this.configRejected++;
      return { applied: false, ignored: unsigned ? "signature" : "invalid", note: { level, message, fields, rejected: true } };
    };
    const invalid = (check: (v: unknown) => string | undefined) => (e.notJson || e.value === undefined ? "not JSON" : unsigned ? `signature: ${unsigned}` : check(e.value));
    const info = (message: string, fields: Record<string, unknown>): ApplyResult => ({ applied: true, note: { level: "info", message, fields } });
    if (isKey) {
      const hash = hashOfBucketKey(e.key);
      if (!hash) return reject("warn", "API key entry not named by a SHA-256 hex hash; ignored", { key: e.key.slice(0, API_KEY_KEY_PREFIX.length + SHOWN_HASH_PREFIX) });
      const key = hash.slice(0, SHOWN_HASH_PREFIX);
      if (e.operation !== "PUT") {
        this.apiKeys.set(hash, undefined);
        return info("API key removed", { key, revision });
      }
      const err = invalid(apiKeyRecordError);
      if (err) {
        this.apiKeys.set(hash, undefined);
        return reject("error", "invalid API key record; the key is refused until a valid record is stored", { key, revision, err });
      }
      const rec = e.value as ApiKeyRecord;
      this.apiKeys.set(hash, rec);
      return info("API key applied", { key, user: rec.user, revoked: rec.disabled === true, revision });
    }
    if (isInferencePool) {
      const key = e.key.slice(0, 330);
      if (e.operation !== "PUT") {
        this.poolPolicies.set(e.key, undefined);
        this.configs.setPoolObjectives(this.poolPolicies.objectivesByModel());
        return info("InferencePool policy removed", { key, revision });
      }
      const err = invalid(inferencePoolPolicyError);
      if (err) return reject("error", "invalid InferencePool policy ignored; the previous one stays", { key, revision, err });
      const p = e.value as InferencePoolPolicy;
      if (!this.poolPolicies.set(e.key, p)) return reject("error", "too many InferencePool policies; this one is ignored", { key, revision });
      this.configs.setPoolObjectives(this.poolPolicies.objectivesByModel());
      return info("InferencePool policy applied", { pool: p.pool, objectives: Object.keys(p.objectives).length, rewrites: p.rewrites.length, revision });
    }
    if (isPool) {
      const pool = e.key.slice(POOL_KEY_PREFIX.length);
      const nameErr = poolNameError(pool);
      if (nameErr) return reject("warn", "pool entry with an invalid pool name; ignored", { key: e.key.slice(0, 300), err: nameErr });
      if (e.operation !== "PUT") {
        this.pools.set(pool, undefined);
        return info("pool removed", { pool, revision });
      }
      const err = invalid(poolConfigError);
      if (err) return reject("error", "invalid pool config ignored; the previous one stays", { pool, revision, err });
      this.pools.set(pool, (e.value as PoolConfig).models);
      const clashes = this.pools.conflicts();
      return info("pool applied", { pool, models: (e.value as PoolConfig).models.length, revision, ...(clashes.length ? { clashes: clashes.slice(0, 10) } : {}) });
    }
    if (e.key === RATE_LIMITS_KEY) {
      if (e.operation !== "PUT") {
        this.configs.setLimits(undefined);
        return info("rate limits removed", { revision });
      }
      const err = invalid(rateLimitsError);
      if (err) return reject("error", "invalid rate limits ignored; the previous ones stay", { revision, err });
      this.configs.setLimits(e.value as RateLimits);
      return info("rate limits applied", { revision });
    }
    let model: string;
    try {
      model = decodeToken(e.key.slice(MODEL_CONFIG_KEY_PREFIX.length));
    } catch {
      return reject("warn", "config key is not an escaped model name; ignored", { key: e.key.slice(0, 300) });
    }
    if (e.operation !== "PUT") {
      this.configs.set(model, undefined);
      return info("model config removed", { model, revision });
    }
    const err = invalid((v) => this.checkModelConfig(v, model));
    if (err) return reject("error", "invalid model config ignored; the previous one stays", { model, revision, err });
    this.configs.set(model, e.value as ModelConfig);
    return info("model config applied", { model, revision });
  }

  // ---- this gateway's own events, applied when it makes them ----

  /**
   * A charge this gateway just made: counted in the ledger and the rate and usage windows.
   * `admission` is remembered for the burst guard (only where a limit applies); `counted: false`
   * for a strict-mode retry, which is the same request, counted by its first attempt.
   */
  ownCharge(charge: ChargeEvent, now: number, o: { admission?: OwnAdmission; counted?: boolean; published?: boolean } = {}): void {
    this.ledger.charge(charge, now);
    if (o.counted === false || charge.phase === "prefill") return;
    if (charge.user) this.usage.record({ user: charge.user, promptTokens: charge.promptTokens, completionTokens: 0, ts: now });
    this.rates.request(charge.user, charge.model, charge.promptTokens, now, true);
    const a = o.admission;
    // Published now: the burst guard counts it unseen until its echo is read back (`ownEchoed`).
    if (a) this.rates.noteOwn(a.user, a.model, a.tokens, a.ts, o.published ? charge.id : undefined);
  }

  /** This gateway's charge `chargeId` was read back from the CHARGES stream at `now` (the burst guard's confirmation). */
  ownEchoed(chargeId: string, now: number): void {
    this.rates.echoOwn(chargeId, now);
  }

  /** A prompt this gateway routed: its blocks touched in the index and remembered as routed to the pod. */
  ownRouted(ev: KvRouted, hashes: readonly bigint[]): void {
    this.prefixIndex.touch(ev.model, hashes);
    this.routed.add(ev, hashes);
  }

  /** The request's first response bytes arrived: it moved from prefill to decode. */
  ownFirstToken(chargeId: string): void {
    if (this.self !== undefined) this.ledger.markDecoding(this.self, chargeId);
  }

  /** A strict-mode charge was acknowledged at `now`: the burst guard counts it as unseen from then. */
  ownCommitted(admission: OwnAdmission | undefined, now: number): void {
    if (admission) this.rates.renoteOwn(admission.user, admission.model, admission.tokens, admission.ts, now);
  }

  /**
   * Undoes a charge that was never published (a strict-mode commit lost its race). With
   * `keepCounts` the request stays counted in the rate windows: it is about to be retried.
   */
  ownRetract(charge: ChargeEvent, countedAt: number, admission: OwnAdmission | undefined, keepCounts: boolean): void {
    this.ledger.release({ gateway: charge.gateway, id: charge.id });
    if (!keepCounts) this.ownUncount(charge, countedAt, admission);
  }

  /** Takes a request that will not be routed after all out of the rate windows. */
  ownUncount(charge: ChargeEvent, countedAt: number, admission: OwnAdmission | undefined): void {
    this.rates.retract(charge.user, charge.model, charge.promptTokens, countedAt, admission);
  }

  /** A request this gateway routed ended (the release it publishes). */
  ownRelease(release: ReleaseEvent): void {
    this.ledger.release(release);
    this.countRelease(release, true, release.model);
  }

  /**
   * Time-driven expiry: silent pod-watcher sources, finished windows, expired routed prefixes.
   * `liveNow` is the time source liveness is judged on (the broker's, as heartbeats carry it;
   * default `now`); rate and usage windows follow the gateways' own clocks (their events' `ts`).
   * Charges expire and peers lapse by the CHARGES stream's time instead, as the fold reads it
   * (`skip`, `ChargeLedger.advance`): a timer's moment never changes the ledger.
   */
  sweep(now: number, o: { routed?: boolean; liveNow?: number } = {}): void {
    this.pods.sweepSources(o.liveNow ?? now, this.podSourceTimeoutMs);
    this.usage.sweep(now);
    this.rates.sweep(now);
    if (o.routed) this.routed.sweep(now);
    this.responses.sweep(now);
  }

  /**
   * A deep copy of this fold that belongs to gateway `self` (replay starts a gateway that appears
   * mid-window from the fold of everything before it). Every view is plain data (Maps, arrays,
   * typed arrays), so a structured clone with the classes' prototypes restored is exact.
   */
  cloneAs(self: string | undefined): GatewayState {
    const copy = <T extends object>(x: T): T => Object.assign(Object.create(Object.getPrototypeOf(x)) as T, structuredClone({ ...x }));
    const c = Object.assign(Object.create(GatewayState.prototype) as GatewayState, {
      self,
      pool: this.pool,
      shareCharges: this.shareCharges,
      podSourceTimeoutMs: this.podSourceTimeoutMs,
      checkModelConfig: this.checkModelConfig,
      configSignatures: this.configSignatures,
      podSignatures: this.podSignatures,
      signatureRefusals: structuredClone(this.signatureRefusals),
      pods: copy(this.pods),
      load: copy(this.load),
      ledger: Object.assign(copy(this.ledger), { self }),
      usage: copy(this.usage),
      rates: copy(this.rates),
      routed: copy(this.routed),
      configs: copy(this.configs),
      apiKeys: copy(this.apiKeys),
      pools: copy(this.pools),
      poolPolicies: copy(this.poolPolicies),
      latency: copy(this.latency),
      responses: copy(this.responses),
      responsesCursor: this.responsesCursor,
      prefixIndex: copy(this.prefixIndex),
      prefixIndexOptions: this.prefixIndexOptions,
      cursors: { ...this.cursors },
      usageCursor: this.usageCursor,
      configRejected: this.configRejected,
      configRevisions: new Map(this.configRevisions),
    });
    return c;
  }

  /**
   * A canonical description of the whole state, for comparing two folds: equal for two instances
   * fed the same messages (and own events, and sweeps). The prefix index enters as the SHA-256 of
   * its serialized form.
   */
  snapshot(now: number): Record<string, unknown> {
    const sorted = <T>(xs: Iterable<T>, key: (x: T) => string) => [...xs].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
    return {
      self: this.self ?? null,
      cursors: { ...this.cursors },
      pods: sorted(this.pods.all(), (p) => `${p.model}\u0000${p.pod}`),
      podSources: sorted(this.pods.sourceInfo(), (s) => s.source),
      load: this.load.dump(),
      ledger: this.ledger.dump(now),
      usage: this.usage.dump(now),
      rates: this.rates.dump(now),
      routed: this.routed.dump(now),
      configs: { models: this.configs.modelNames().sort().map((m) => [m, this.configs.get(m)]), limits: this.configs.userLimitsAll(), rejected: this.configRejected },
      apiKeys: this.apiKeys.dump(),
      pools: this.pools.names().map((n) => [n, this.pools.modelsOf(n)]),
      inferencePools: this.poolPolicies.all(),
      latency: this.latency.dump(),
      responses: { cursor: this.responsesCursor, entries: this.responses.dump(), evicted: this.responses.evicted, conflicts: this.responses.conflicts },
      prefixIndex: createHash("sha256").update(this.prefixIndex.serialize()).digest("hex"),
    };
  }
}
