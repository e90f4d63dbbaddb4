/**
 * The gateway process: folds PODS, LOAD and CHARGES into views, serves Envoy's ext_proc stream
 * and the gRPC health protocol, publishes charges, releases, heartbeats and decision records.
 */
import { readFileSync } from "node:fs";
import os from "node:os";
import { randomBytes } from "node:crypto";
import * as grpc from "@grpc/grpc-js";
import { HealthImplementation } from "grpc-health-check";
import type { EventType } from "../../schemas/events.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { namespaceOf } from "../../streams/pools.js";
import { Subjects } from "../../streams/subjects.js";
import { EXT_PROC_SERVER_OPTIONS, EXT_PROC_SERVICE_NAME, loadExtProc } from "../extproc/protos.js";
import { type ExtProcConnectionStats, guardResetBudget } from "../extproc/reset-budget.js";
import { StreamFollower } from "../shared/follower.js";
import type { Logger } from "../shared/log.js";
import { connectNats, type NatsHandles } from "../shared/nats.js";
import { DEFAULT_RELEASE_BATCH_MS, Outbox, ReleaseBatcher } from "../shared/publish.js";
import { tokenLoad } from "../views/charge-ledger.js";
import { GatewayState, type StateStream } from "../views/gateway-state.js";
import { DEFAULT_POD_SOURCE_TIMEOUT_MS } from "../views/pod-set.js";
import type { PrefixIndex } from "../views/prefix-index.js";
import type { TokenizerSetting } from "../tokenizer/prompt-tokens.js";
import { type AdminServer, adminAuthorizer, startAdminServer } from "./admin-server.js";
import { Director, type EventSink, type GatewayViews } from "../routing/director.js";
import { explain } from "../routing/explain.js";
import { createExtProcHandler, DEFAULT_PD_WATCHDOG } from "./extproc-server.js";
import { PdHttpClient } from "./pd-client.js";
import { GatewayMetrics } from "./metrics.js";
import { type LoadedSnapshot, loadNewestSnapshot, startSnapshotter } from "./snapshots.js";
import { watchModelConfigs } from "./config-watch.js";
import type { ApiKeyView, AuthMode } from "./auth.js";
import { createPrefixSupport } from "./prefix-support.js";
import { heartbeatOf } from "./heartbeat.js";
import { ServerClock } from "./server-clock.js";
import { configureSessionSigning } from "../routing/strategies/session-affinity.js";
import { Tokenizer } from "./tokenization.js";
import { StrictCommitter } from "./strict-commit.js";
import { SubjectCursors } from "./subject-cursor.js";
import { UsageSummaries } from "./usage-summary.js";
import { validateModelConfig } from "../routing/config-check.js";

export interface GatewayOptions {
  nats: string | string[];
  /** The base subject prefix (default `jr`); with `pool`, the pool's namespace is under it (streams/pools.ts). */
  prefix?: string;
  /** Gateway pools: fold and route only this pool's namespace; the config bucket stays the base prefix's. */
  pool?: string;
  /** The pool's models, instead of the config bucket's `pool.<name>` list (they answer as this pool's even before a pod serves them). */
  poolModels?: string[];
  /** ext_proc gRPC port (0 = any free port). */
  port: number;
  host?: string;
  /** Admin HTTP port for /healthz, /readyz, /debug/state (0 = any; -1 = off). */
  adminPort?: number;
  /** Admin HTTP listen address (default 127.0.0.1: /debug/* dumps the views). */
  adminHost?: string;
  id?: string;
  defaultStrategy?: string;
  chargeTtlMs?: number;
  heartbeatIntervalMs?: number;
  heartbeatTimeoutMs?: number;
  /** Pods of a pod-watcher source silent this long stop being routable (0 = never; default 30 s). */
  podSourceTimeoutMs?: number;
  loadStaleAfterMs?: number;
  maxCharges?: number;
  /**
   * Rate limits: how long this replica's own admissions may still be unseen by the other
   * replicas (above the charge propagation delay); meanwhile room is reserved for as many of
   * theirs. 0 turns the reservation off. Default 25 ms.
   */
  rateConfirmMs?: number;
  /**
   * Per-user limits across pools: every this many ms the gateway publishes its own per-user
   * admissions of the current minute to the base prefix's USAGE stream (only when they changed);
   * the other namespaces' gateways add them to their counts. 0 = publish none (this gateway still
   * counts the others'). Default 1,000.
   */
  usageSummaryMs?: number;
  /** Tokenizer mode for prefix routing: default and per model (`remote` | `local` | `approximate` | `hf:<dir>`). */
  tokenizerMode?: TokenizerSetting;
  tokenizerModes?: Record<string, TokenizerSetting>;
  /** Bound on the prefix index, in (block, pod) entries. */
  prefixMaxEntries?: number;
  /** Prefix-index snapshots: boot from the newest one and contend for the snapshot lease (default on). */
  snapshots?: boolean;
  /** How often the lease holder writes a snapshot (default 30 s; with the lease at most KV max_age / 10). */
  snapshotIntervalMs?: number;
  /** Snapshot lease (default 15 s): how long a crashed holder keeps the others from writing. */
  snapshotLeaseMs?: number;
  /**
   * `eventual` (default): publish charges without waiting; `strict`: per-pod compare-and-set;
   * `off`: count only this replica's own charges (AIBrix's behaviour; for comparison benchmarks).
   */
  consistency?: "eventual" | "strict" | "off";
  /** Bound on the charges listed in one heartbeat (beyond it the list is marked truncated). */
  maxHeartbeatCharges?: number;
  /**
   * Releases are sent per pod in batches over this window (a `releases` event; a lone release stays
   * a `release`). Default 5 ms (0 = off, for a fleet still running builds that predate the
   * `releases` event: they dead-letter it); at most 20 ms (replay holds decisions 50 ms for a
   * delayed own release).
   */
  releaseBatchMs?: number;
  /** On close, how long in-flight requests may take before their streams are cancelled. */
  shutdownGraceMs?: number;
  /**
   * TLS on the ext_proc port (PEM files): Envoy's ext_proc cluster then uses a TLS transport
   * socket. With `clientCaFile`, mutual TLS: only clients with a certificate that CA signed connect.
   */
  tls?: { certFile: string; keyFile: string; clientCaFile?: string };
  /**
   * Secret every replica shares to sign the `x-session-id` values it hands out (session-affinity):
   * with it, a client cannot pin an arbitrary pod by forging one. Absent: AIBrix's unsigned ids.
   */
  sessionSecret?: string;
  /**
   * The engines' API key (vLLM/SGLang `--api-key`), for the calls the gateway itself makes to them:
   * remote `/tokenize`, P/D prefill legs, `/abort_request`. From `$JETROUTE_ENGINE_API_KEY`.
   */
  engineApiKey?: string;
  /** Tokenize and hash prompts for decision records also under strategies that do not need them (default true). */
  recordPromptBlocks?: boolean;
  /**
   * The gateway's clock (ms): decisions, charges, rate windows and expiry read it. Default
   * Date.now; tests shift it (to start at the beginning of a rate window, or to skew a host).
   */
  clock?: () => number;
  /**
   * `off` (default): no authentication; `required`: every request needs `authorization: Bearer
   * <key>` with a key from the config bucket (`jetroute config add-key`), else 401.
   */
  auth?: AuthMode;
  /**
   * Prefill/decode disaggregation (the `pd` strategy): the prefill leg's timeout per attempt and
   * retries on other prefill pods, and the decode watchdog (first chunk, then between chunks).
   */
  pd?: { prefillTimeoutMs?: number; prefillBudgetMs?: number; sglangPrefillTimeoutMs?: number; maxRetries?: number; firstChunkTimeoutMs?: number; idleTimeoutMs?: number };
  log: Logger;
}

export interface GatewayHandle {
  id: string;
  port: number;
  adminPort: number | undefined;
  views: GatewayViews;
  /** The whole fold (views, prefix index, configs, keys, cursors). */
  state: GatewayState;
  director: Director;
  /** API keys folded from the config bucket (whatever the auth mode). */
  apiKeys: ApiKeyView;
  strict: StrictCommitter | undefined;
  readonly prefixIndex: PrefixIndex;
  /** Last KV stream sequence this replica has applied. */
  kvLastSeq(): number;
  nats: NatsHandles;
  ready(): boolean;
  whenReady(): Promise<void>;
  /** Envoy's HTTP/2 connections to the ext_proc port (undefined if the reset guard could not be installed). */
  extProcConnections: ExtProcConnectionStats | undefined;
  close(): Promise<void>;
}

function indexOfBytes(hay: Uint8Array, needle: Uint8Array): number {
  return Buffer.from(hay.buffer, hay.byteOffset, hay.byteLength).indexOf(needle);
}

/** Server credentials from PEM files; a missing or unreadable file is an error naming it. */
function tlsCredentials(t: NonNullable<GatewayOptions["tls"]>): grpc.ServerCredentials {
  const read = (what: string, file: string) => {
    try {
      return readFileSync(file);
    } catch (err) {
      throw new Error(`cannot read the ext_proc TLS ${what} ${file}: ${(err as Error).message}`);
    }
  };
  const cert = read("certificate", t.certFile);
  const key = read("key", t.keyFile);
  const ca = t.clientCaFile ? read("client CA", t.clientCaFile) : null;
  return grpc.ServerCredentials.createSsl(ca, [{ cert_chain: cert, private_key: key }], ca !== null);
}

export function defaultGatewayId(): string {
  return `${os.hostname()}-${process.pid}-${randomBytes(2).toString("hex")}`;
}

export async function startGateway(o: GatewayOptions): Promise<GatewayHandle> {
  const log = o.log;
  const id = o.id ?? defaultGatewayId();
  const ns = namespaceOf(o.prefix ?? "jr", o.pool);
  const prefix = ns.prefix;
  const subjects = new Subjects(prefix);
  const chargeTtlMs = o.chargeTtlMs ?? 10 * 60_000;
  const hbInterval = o.heartbeatIntervalMs ?? 1_000;
  const hbTimeout = o.heartbeatTimeoutMs ?? 3 * hbInterval;
  // Read before anything starts: a bad TLS file stops the gateway before it connects anywhere.
  const credentials = o.tls ? tlsCredentials(o.tls) : grpc.ServerCredentials.createInsecure();
  const clock = o.clock ?? Date.now;
  if (o.sessionSecret !== undefined) configureSessionSigning(o.sessionSecret || undefined);
  // Peers' heartbeats carry the server's time: liveness is judged on it, whatever this host's clock says.
  const serverClock = new ServerClock(clock);
  // Also before connecting: an `hf:` tokenizer directory that is missing or corrupt stops the gateway here, naming the file.
  const tokenizer = new Tokenizer({ ...(o.engineApiKey ? { engineApiKey: o.engineApiKey } : {}), defaultMode: o.tokenizerMode ?? "approximate", modes: o.tokenizerModes });
  const nats = await connectNats(o.nats, `jetroute-gateway-${id}`);
  // Our events serialize `"gateway":"<id>"` right after `"id"`; this exact byte run marks an echo.
  const ownMarker = new TextEncoder().encode(`"gateway":${JSON.stringify(id)},`);
  // The one fold every view changes in (services/views/gateway-state.ts).
  const state = new GatewayState({
    self: id,
    ...(ns.pool !== undefined ? { pool: ns.pool } : {}),
    shareCharges: o.consistency !== "off",
    heartbeatTimeoutMs: hbTimeout,
    maxCharges: o.maxCharges,
    loadStaleAfterMs: o.loadStaleAfterMs,
    rateConfirmMs: o.rateConfirmMs,
    podSourceTimeoutMs: o.podSourceTimeoutMs ?? DEFAULT_POD_SOURCE_TIMEOUT_MS,
    prefixIndex: { maxEntries: o.prefixMaxEntries ?? 4_000_000 },
    checkModelConfig: validateModelConfig,
  });
  const views: GatewayViews = state;
  // A snapshot (snapshots.ts) holds the index as of a KV stream sequence: the KV follower starts
  // right after it instead of replaying the whole stream.
  const snapshot: LoadedSnapshot | undefined = o.snapshots === false ? undefined : await loadNewestSnapshot({ nats, prefix, log, indexOptions: state.prefixIndexOptions });
  if (snapshot) state.restorePrefixIndex(snapshot.index, snapshot.seq);

  const cursors = new SubjectCursors();
  // Every message moves its stream's cursor in the state, applied or not (echoes, dead letters).
  const seen = (stream: StateStream) => (subject: string, seq: number) => state.skip({ stream, subject, seq, serverTs: 0 });
  const fold = (stream: StateStream) => (ev: Parameters<GatewayState["apply"]>[0], m: { seq: number; subject: string; serverTs: number }) => {
    // PODS too: a lone gateway skips its own CHARGES echoes, and watcher heartbeats come every 5 s.
    if (stream === "charges" || stream === "pods") serverClock.observe(m.serverTs);
    state.apply(ev, { stream, ...m });
  };
  const followers: Array<StreamFollower<EventType>> = [
    new StreamFollower({
      // The whole stream: pod events and the watcher sources' heartbeats (`podsrc`) in one fold.
      nats, subjects, log, name: `gateway-${id}-pods`, family: "pods", types: ["pod", "pod-source"] as const,
      stream: streamName(prefix, "PODS"), startAt: { kind: "last-per-subject" },
      onEvent: fold("pods"), onMessage: seen("pods"),
    }),
    new StreamFollower({
      nats, subjects, log, name: `gateway-${id}-load`, family: "load", types: ["load"] as const,
      stream: streamName(prefix, "LOAD"), filter: subjects.all("load"), startAt: { kind: "last-per-subject" },
      onEvent: fold("load"), onMessage: seen("load"),
    }),
    new StreamFollower({
      nats, subjects, log, name: `gateway-${id}-charges`, family: "charges", types: ["charge", "release", "releases", "heartbeat"] as const,
      // Every live gateway's latest heartbeat lists all the charges it holds, so a few heartbeat
      // periods of history rebuild the whole ledger: boot time does not grow with traffic.
      stream: streamName(prefix, "CHARGES"), startAt: { kind: "time", sinceMs: Date.now() - Math.max(10_000, 3 * hbTimeout) },
      onEvent: fold("charges"),
      onMessage: (subject, seq) => {
        state.skip({ stream: "charges", subject, seq, serverTs: 0 });
        cursors.seen(subject, seq);
      },
      // Everything we published ourselves was applied when we made it (the fold ignores its own
      // events anyway): recognise the echoes by a byte search and spare them JSON and schema work.
      skipRaw: (data) => ownMarker.length > 0 && indexOfBytes(data, ownMarker) >= 0,
    }),
    new StreamFollower({
      nats, subjects, log, name: `gateway-${id}-kv`, family: "kv", types: ["kv", "kv-cleared", "kv-routed"] as const,
      // No subject filter: the KV stream captures only `<prefix>.kv.>`, and on nats-server 2.9.10 the
      // redundant filter makes catching up a tail several times slower (loadtest/benches/bootstrap.ts).
      stream: streamName(prefix, "KV"), startAt: snapshot ? { kind: "sequence", seq: snapshot.seq + 1 } : { kind: "all" },
      onEvent: fold("kv"), onMessage: seen("kv"),
      // Our own routed prefixes were applied when we recorded them.
      skipRaw: (data) => indexOfBytes(data, ownMarker) >= 0,
    }),
  ];

  // Per-user limits across pools: the other namespaces' usage summaries, from the base prefix's
  // stream (the newest per gateway is all a booting gateway needs: each is a whole minute's counts).
  const baseSubjects = new Subjects(ns.configPrefix);
  const usageStream = streamName(ns.configPrefix, "USAGE");
  const ownUsageSubjects = baseSubjects.usageOf(ns.pool);
  const notFound = (err: unknown) => {
    if (isStreamNotFound(err)) return false;
    throw err;
  };
  if (await nats.jsm.streams.info(usageStream).then(() => true, notFound)) {
    followers.push(
      new StreamFollower({
        nats, subjects: baseSubjects, log, name: `gateway-${id}-usage`, family: "usage", types: ["usage"] as const,
        stream: usageStream, startAt: { kind: "last-per-subject" },
        onEvent: (ev, m) => state.apply(ev, { stream: "usage", ...m }),
        onMessage: (subject, seq) => state.skip({ stream: "usage", subject, seq, serverTs: 0 }),
        // This namespace's summaries (own echoes included) are never counted: skipped by subject, unparsed.
        skipRaw: (_data, subject) => subject.startsWith(ownUsageSubjects),
      }),
    );
  } else log.warn({ stream: usageStream }, "no USAGE stream (run `jetroute streams apply`): per-user rate limits do not count other pools' requests");

  const outbox = new Outbox(nats.nc);
  const releases = new ReleaseBatcher(outbox, (model, pod) => subjects.releases(model, pod), Math.min(20, o.releaseBatchMs ?? DEFAULT_RELEASE_BATCH_MS), () => director.chargesMade, undefined, () => nats.nc.info?.max_payload);
  const viewNames = ["pods", "load", "charges", "kv", "usage"];
  let extProcConnections: ExtProcConnectionStats | undefined;
  const metrics = new GatewayMetrics(id, {
    followers: () => followers.map((f, i) => ({ view: viewNames[i] ?? String(i), lastSeq: f.lastSeq, applied: f.applied, invalid: f.invalid, reopens: f.reopens, pending: f.pending, delayMs: f.delayMs })),
    ledger: () => ({
      charges: views.ledger.size,
      evicted: views.ledger.evicted,
      expired: views.ledger.expired,
      reconciledAdded: views.ledger.reconciledAdded,
      reconciledRemoved: views.ledger.reconciledRemoved,
      liveGateways: views.ledger.liveGateways(Date.now()).length,
    }),
    prefixIndex: () => {
      const st = state.index.stats();
      return { entries: st.entries, blocks: st.blocks, evictedEntries: st.evictedEntries };
    },
    strict: () => strict?.stats,
    inFlight: () => director.inFlight.size,
    ready: () => isReady,
    apiKeys: () => ({ active: state.apiKeys.active, revoked: state.apiKeys.size - state.apiKeys.active }),
    connections: () => extProcConnections,
    outboxDrops: () => outbox.drops(),
    pd: () => ({ ...director.pdStats, ...director.legs?.stats }),
    podSources: () => state.pods.sourceInfo(),
    usage: () => ({ foreignGateways: state.rates.foreignGateways, foreignEntries: state.rates.foreignEntries, foreignEvicted: state.rates.foreignEvicted, sent: usageSummaries.sent, truncatedUsers: usageSummaries.truncatedUsers }),
  }, ns.pool);
  tokenizer.registerMetrics(metrics.registry);
  const sink: EventSink = {
    charge: (ev) => outbox.fire(subjects.charges(ev.model, ev.pod), ev),
    release: (ev) => releases.add(ev),
    decision: (rec) => {
      metrics.decision(rec);
      // Per-request line at debug level (off by default: JETROUTE_LOG_LEVEL=debug turns it on).
      if (log.isLevelEnabled("debug")) log.debug({ requestId: rec.id, model: rec.model, strategy: rec.strategy, pick: rec.pick, status: rec.status, outcome: rec.outcome, ttftMs: rec.ttftMs }, "decision");
      outbox.fire(subjects.decisions(rec.model || "_"), rec);
    },
  };
  const modelConfigs = state.configs;
  const apiKeys = state.apiKeys;
  // Returns once every current entry (API keys included) is applied: the ext_proc server below
  // never answers a request with the keys half loaded.
  const configWatch = await watchModelConfigs(nats.nc, configBucketName(ns.configPrefix), state, log);
  const authMode: AuthMode = o.auth ?? "off";
  const prefixSupport = createPrefixSupport({ gatewayId: id, state, tokenizer, subjects, outbox });
  const pdClient = new PdHttpClient(o.engineApiKey ? { engineApiKey: o.engineApiKey } : {});
  const director = new Director({
    gatewayId: id, now: clock, serverNow: serverClock.now, recordPromptBlocks: o.recordPromptBlocks, defaultStrategy: o.defaultStrategy ?? "least-request", chargeTtlMs, state, sink, prefix: prefixSupport, config: modelConfigs, consistency: o.consistency,
    pool: { ...(ns.pool !== undefined ? { pool: ns.pool } : {}), ...(o.poolModels ? { models: new Set(o.poolModels) } : {}) },
    strictFor: (model) => defaultConsistency !== "off" && (modelConfigs.consistency(model) ?? defaultConsistency) === "strict",
    onPick: (st, sec) => metrics.pick(st, sec),
    pdLegClient: pdClient,
    pdLegOptions: Object.fromEntries(Object.entries({ prefillTimeoutMs: o.pd?.prefillTimeoutMs, prefillBudgetMs: o.pd?.prefillBudgetMs, sglangPrefillTimeoutMs: o.pd?.sglangPrefillTimeoutMs, maxRetries: o.pd?.maxRetries }).filter(([, v]) => v !== undefined)),
  });
  // Strict commits are chosen per model (its config's `consistency`, else `--consistency`), so the
  // committer exists whenever charges are shared; `off` follows no peer and has nothing to commit against.
  const defaultConsistency = o.consistency ?? "eventual";
  const strict =
    defaultConsistency !== "off"
      ? new StrictCommitter({ js: nats.js, subjects, director, cursor: cursors, onFallback: (err) => log.warn({ err }, "strict charge commit failed; published without compare-and-set") })
      : undefined;
  if (strict) director.useStrictCommitter(strict);
  const startedAt = Date.now();
  const maxListed = o.maxHeartbeatCharges ?? 20_000;
  // Parts sized to the server's max_payload (read each beat: a reconnect may land on a server with
  // another limit), 10% left for the PUB line and headers; all parts fired in one turn, back to back.
  let beat = 0;
  const heartbeat = (st: "up" | "down") => {
    const maxBytes = Math.floor((nats.nc.info?.max_payload ?? 1024 * 1024) * 0.9);
    // Releases made before this beat go first: a heartbeat never lists as ended a charge whose release peers have not had.
    releases.flush();
    for (const hb of heartbeatOf({ gateway: id, now: Date.now(), intervalMs: hbInterval, startedAt, chargeTtlMs, maxListed, beat: beat++, maxBytes }, st, director.holdingCharges())) outbox.fire(subjects.heartbeat(id), hb);
  };
  const usageSummaries = new UsageSummaries(state, { gateway: id, ...(ns.pool !== undefined ? { pool: ns.pool } : {}), startedAt, maxPayload: () => nats.nc.info?.max_payload });
  const summarizeUsage = () => {
    // Unpooled, with no pool in the config and no other namespace's summary seen: nobody to tell.
    if (ns.pool === undefined && state.pools.names().length === 0 && state.rates.foreignGateways === 0) return;
    const ev = usageSummaries.next(clock());
    if (ev) outbox.fire(baseSubjects.usage(ns.pool, id, startedAt), ev);
  };
  const usageMs = o.usageSummaryMs ?? 1_000;
  const usageTimer = usageMs > 0 ? setInterval(summarizeUsage, usageMs) : undefined;
  heartbeat("up");
  const hbTimer = setInterval(() => heartbeat("up"), hbInterval);
  const sweepTimer = setInterval(() => state.sweep(clock(), { liveNow: serverClock.now() }), Math.max(50, Math.min(250, hbInterval / 4)));
  const slowSweep = setInterval(() => state.sweep(clock(), { routed: true, liveNow: serverClock.now() }), 5_000);

  let isReady = false;
  const health = new HealthImplementation({ liveness: "SERVING", readiness: "NOT_SERVING", "": "NOT_SERVING", [EXT_PROC_SERVICE_NAME]: "NOT_SERVING" });
  await Promise.all(followers.map((f) => f.start()));
  const readyPromise = Promise.all(followers.map((f) => f.whenCaughtUp())).then(() => {
    isReady = true;
    for (const s of ["readiness", "", EXT_PROC_SERVICE_NAME]) health.setStatus(s, "SERVING");
    log.info({ pods: views.pods.size, charges: views.ledger.size }, "views caught up; gateway ready");
  });

  // Everything up to the snapshot's sequence is in the index before the follower's first message.
  const kvLastSeq = () => state.cursors.kv;
  const snapshotter =
    o.snapshots === false
      ? undefined
      : await startSnapshotter({
          nats, prefix, gatewayId: id, log, index: () => state.index, seq: kvLastSeq,
          // A replica still catching up must neither hold the lease nor publish a partial index.
          ready: () => isReady,
          intervalMs: o.snapshotIntervalMs, leaseMs: o.snapshotLeaseMs,
        });

  const server = new grpc.Server(EXT_PROC_SERVER_OPTIONS);
  server.addService(loadExtProc().service, {
    Process: createExtProcHandler({
      router: director,
      log,
      isReady: () => isReady,
      pdWatchdog: { ...DEFAULT_PD_WATCHDOG, ...(o.pd?.firstChunkTimeoutMs !== undefined ? { firstChunkMs: o.pd.firstChunkTimeoutMs } : {}), ...(o.pd?.idleTimeoutMs !== undefined ? { idleMs: o.pd.idleTimeoutMs } : {}) },
      listModels: () => [...new Set(views.pods.all().flatMap((p) => [p.model, ...p.adapters]))].sort(),
      ...(authMode === "required"
        ? {
            auth: {
              authenticate: (authorization: string | undefined) => apiKeys.authenticate(authorization),
              failed: (reason, requestId) => {
                metrics.authFailure(reason);
                // The reason only: the header itself is never logged.
                if (log.isLevelEnabled("debug")) log.debug({ requestId, reason }, "request refused: authentication failed");
              },
            },
          }
        : {}),
    }),
  });
  health.addToServer(server);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(`${o.host ?? "0.0.0.0"}:${o.port}`, credentials, (err, p) => (err ? reject(err) : resolve(p))),
  );
  // Envoy resets every ext_proc stream; Node would drop the connection after ~1000 resets.
  extProcConnections = guardResetBudget(server, { onRotate: (streams, resets) => log.debug({ streams, resets }, "ext_proc connection rotated before the HTTP/2 reset limit") });
  if (!extProcConnections) log.warn("cannot reach grpc-js' HTTP/2 servers: ext_proc connections are not rotated before Node's rapid-reset limit");

  const debugState = () => ({
    id,
    ready: isReady,
    // Gateway pools: which namespace this replica folds, and the config's assignment of models.
    pool: { name: ns.pool ?? null, prefix, models: o.poolModels ?? (ns.pool !== undefined ? state.pools.modelsOf(ns.pool) ?? [] : null), clashes: state.pools.conflicts() },
    followers: followers.map((f, i) => ({ view: viewNames[i], lastSeq: f.lastSeq, applied: f.applied, skipped: f.skipped, invalid: f.invalid, reopens: f.reopens, caughtUp: f.caughtUp })),
    prefixIndex: state.index.stats(),
    snapshots: {
      booted: snapshot ? { name: snapshot.name, seq: snapshot.seq, bytes: snapshot.bytes, ageMs: snapshot.ageMs, loadMs: Math.round(snapshot.loadMs), lost: snapshot.lost } : null,
      ...snapshotter?.stats,
    },
    routedPrefixes: { blocks: state.routed.size, evicted: state.routed.evicted },
    tokenizer: tokenizer.stats,
    pods: views.pods.all(),
    podSources: state.pods.sourceInfo(),
    ledger: {
      charges: views.ledger.size,
      evicted: views.ledger.evicted,
      expired: views.ledger.expired,
      liveGateways: views.ledger.liveGateways(Date.now()).map((g) => ({ gateway: g, charges: views.ledger.chargesOf(g) })),
      // Per pod, every replica's charges: in prefill (no first token yet), decoding, and the token-load priority.
      outstanding: views.pods.all().map((p) => {
        const o = views.ledger.outstanding(p.model, p.pod);
        return { model: p.model, pod: p.pod, ...o, decodeRequests: o.requests - o.prefillRequests, tokenLoad: tokenLoad(o) };
      }),
    },
    inFlight: director.inFlight.size,
    rateWaits: director.rateWaits,
    usageSummaries: { sent: usageSummaries.sent, truncatedUsers: usageSummaries.truncatedUsers, foreignGateways: state.rates.foreignGateways, foreignEntries: state.rates.foreignEntries, foreignEvicted: state.rates.foreignEvicted },
    extProcConnections,
    consistency: defaultConsistency,
    // The mode in effect: with `--consistency off` a model's own setting has nothing to share with.
    consistencyByModel: Object.fromEntries(modelConfigs.modelNames().flatMap((m) => { const c = modelConfigs.consistency(m); return c ? [[m, defaultConsistency === "off" ? "off" : c]] : []; })),
    configs: { rejected: configWatch.rejected, watchReopens: configWatch.reopens },
    auth: { mode: authMode, activeKeys: apiKeys.active, revokedKeys: apiKeys.size - apiKeys.active },
    ...(strict ? { strict: strict.stats } : {}),
  });

  let admin: AdminServer | undefined;
  if ((o.adminPort ?? -1) >= 0) {
    admin = await startAdminServer({
      port: o.adminPort ?? 0,
      host: o.adminHost ?? "127.0.0.1",
      ...(authMode === "required" ? { authorize: adminAuthorizer(apiKeys) } : {}),
      log,
      ready: () => isReady,
      state: debugState,
      metrics,
      explain: (headers, body) => explain(director, views, headers, body),
    });
  }
  const adminPort = admin?.port;
  log.info({ id, port, adminPort, auth: authMode }, "gateway listening");

  let closed = false;
  return {
    id,
    port,
    adminPort,
    views,
    state,
    director,
    apiKeys,
    strict,
    get prefixIndex() {
      return state.index;
    },
    kvLastSeq,
    nats,
    ready: () => isReady,
    whenReady: () => readyPromise,
    get extProcConnections() {
      return extProcConnections;
    },
    async close() {
      if (closed) return;
      closed = true;
      for (const s of ["readiness", "", EXT_PROC_SERVICE_NAME]) health.setStatus(s, "NOT_SERVING");
      // Let in-flight requests finish (they release their own charges) for a grace period, then
      // cancel the rest; whatever is still charged after that is released as "shutdown".
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, o.shutdownGraceMs ?? 10_000);
        server.tryShutdown(() => {
          clearTimeout(t);
          resolve();
        });
      });
      const drained = director.drain();
      clearInterval(hbTimer);
      clearInterval(sweepTimer);
      clearInterval(slowSweep);
      // Every release made so far goes out before the final beat (drain just made the last ones).
      releases.flush();
      // The requests of the last interval count in the other pools too.
      clearInterval(usageTimer);
      if (usageTimer) summarizeUsage();
      heartbeat("down");
      outbox.flush();
      admin?.close();
      await configWatch.stop();
      // Releases the lease: another replica takes over at its next tick instead of after expiry.
      await snapshotter?.close();
      await Promise.all(followers.map((f) => f.stop()));
      await nats.nc.drain();
      await pdClient.close();
      await tokenizer.close();
      log.info({ drained }, "gateway stopped");
    },
  };
}
