/**
 * The gateway process, composed: the fold (GatewayState) fed by its followers, the request path
 * (the routing core's Director) publishing through the gateway's publishers, the ext_proc and
 * health listener, prefix-index snapshots, the config watch and the admin port. Each piece lives
 * in its own module; this file only wires them and orders start and shutdown.
 */
import { OtlpTraceExporter, RequestTracer } from "./otlp-traces.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { ResponseStore } from "./response-store.js";
import { ResponsesHandler } from "./responses-handler.js";
import { type Namespace, namespaceOf } from "../../streams/pools.js";
import { sharedKeyError } from "../../streams/record-keys.js";
import { Subjects } from "../../streams/subjects.js";
import type { ExtProcConnectionStats } from "../extproc/reset-budget.js";
import type { Logger } from "../shared/log.js";
import { podAddressFilter } from "../shared/cidr.js";
import { readVerifier } from "../shared/signing-keys.js";
import type { RecordVerifier } from "../../streams/signatures.js";
import { connectNats, type NatsHandles } from "../shared/nats.js";
import { DeadLetterSink } from "../shared/dead-letter.js";
import { GatewayState } from "../views/gateway-state.js";
import type { PrefixIndex } from "../views/prefix-index.js";
import type { TokenizerSetting } from "../tokenizer/prompt-tokens.js";
import { type AdminServer, adminAuthorizer, startAdminServer } from "./admin-server.js";
import { Director, type DirectorOptions, type GatewayViews, explain, RouteError, validateModelConfig, configureSessionSigning, DEFAULT_SUMMARY_INTERVAL_MS, FleetQueues, immediateYield } from "../routing/mod.js";
import { EmbeddingClient } from "./embeddings.js";
import { createExtProcHandler, DEFAULT_PD_WATCHDOG, type ExtProcHandlerOptions } from "./extproc-server.js";
import { PdHttpClient } from "./pd-client.js";
import { GatewayMetrics, type GatewayMetricsSources } from "./metrics.js";
import { type LoadedSnapshot, loadNewestSnapshot, type Snapshotter, startSnapshotter } from "./snapshots.js";
import { watchModelConfigs } from "./config-watch.js";
import type { ApiKeyView } from "./auth.js";
import { createPrefixSupport } from "./prefix-support.js";
import { ServerClock } from "./server-clock.js";
import { Tokenizer } from "./tokenization.js";
import { StrictCommitter } from "./strict-commit.js";
import { SubjectCursors } from "./subject-cursor.js";
import { type GatewayConfig, GatewayConfigError, type GatewayConfigInput, resolveGatewayConfig } from "./config.js";
import { createFollowers, type GatewayFollowers } from "./followers.js";
import { GatewayPublishers } from "./publishers.js";
import { debugStateOf } from "./debug-state.js";
import { ExtProcListener, tlsCredentials } from "./extproc-listener.js";
import { FlowSummaries } from "./flow-summaries.js";

/** A gateway's configuration (config.ts: the schema with every default) and its runtime parts. */
export type GatewayOptions = Omit<GatewayConfigInput, "tokenizerMode" | "tokenizerModes"> & {
  /** Tokenizer mode for prefix routing: default and per model (`remote` | `local` | `approximate` | `hf:<dir>`). */
  tokenizerMode?: TokenizerSetting;
  tokenizerModes?: Record<string, TokenizerSetting>;
  /**
   * The gateway's clock (ms): decisions, charges, rate windows and expiry read it. Default
   * Date.now; tests shift it (to start at the beginning of a rate window, or to skew a host).
   */
  clock?: () => number;
  log: Logger;
};

export interface GatewayHandle {
  /** The configuration in effect, every default filled in. */
  config: GatewayConfig;
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
  /** The OTLP trace exporter (--otlp-endpoint), absent when traces are off. */
  traces: OtlpTraceExporter | undefined;
  /** The Responses API's state handling (docs/stateful-apis.md), absent without the RESPONSES streams. */
  responses: ResponsesHandler | undefined;
  close(): Promise<void>;
}

export async function startGateway(options: GatewayOptions): Promise<GatewayHandle> {
  const { log, clock: clockOption, ...input } = options;
  const config = resolveGatewayConfig(input);
  const { id } = config;
  const ns = namespaceOf(config.prefix, config.pool);
  const prefix = ns.prefix;
  // Read before anything starts: a bad TLS file stops the gateway before it connects anywhere.
  const credentials = tlsCredentials(config.tls);
  const clock = clockOption ?? Date.now;
  if (config.sessionSecret !== undefined) configureSessionSigning(config.sessionSecret || undefined);
  else if (!config.exposePodAddresses) log.warn("no JETROUTE_SESSION_SECRET: session-affinity's x-session-id values carry the pod's address in the clear; set a secret shared by the fleet to make them opaque");
  // Peers' heartbeats carry the server's time: liveness is judged on it, whatever this host's clock says.
  const serverClock = new ServerClock(clock);
  // Also before connecting: an `hf:` tokenizer directory that is missing or corrupt stops the gateway here, naming the file.
  const engineKey = config.engineApiKey ? { engineApiKey: config.engineApiKey } : {};
  const tokenizer = new Tokenizer({ ...engineKey, defaultMode: config.tokenizerMode as TokenizerSetting, modes: config.tokenizerModes as Record<string, TokenizerSetting>, hf: { prefixCacheBytes: config.tokenizerPrefixCacheBytes, renderCacheBytes: config.tokenizerRenderCacheBytes, ...(config.turnBudgetMs > 0 ? { yieldTurn: immediateYield } : {}) } });
  // Also before connecting: a public key file that is missing or holds no Ed25519 key stops the gateway.
  const signatures = recordVerifiersOf(config);
  const nats = await connectNats(config.nats, `jetroute-gateway-${id}`);
  const state = foldOf(config, ns, signatures);
  const views: GatewayViews = state;
  // A snapshot (snapshots.ts) holds the index as of a KV stream sequence: the KV follower starts right after it.
  const snapshot: LoadedSnapshot | undefined = config.snapshots ? await loadNewestSnapshot({ nats, prefix, log, indexOptions: state.prefixIndexOptions }) : undefined;
  if (snapshot) state.restorePrefixIndex(snapshot.index, snapshot.seq);

  const cursors = new SubjectCursors();
  const { followers, views: viewNames } = await createFollowers({ nats, ns, id, state, cursors, serverClock, clock, heartbeatTimeoutMs: config.heartbeatTimeoutMs, chargesPaceMs: config.foldPaceMs, ...(snapshot ? { kvAfterSeq: snapshot.seq } : {}), log });
  let isReady = false;
  const listener = new ExtProcListener(log);
  const publishers: GatewayPublishers = new GatewayPublishers({ nats, ns, id, config, state, metrics: () => metrics, clock, log });
  // Returns once every current entry (API keys included) is applied: the ext_proc server below
  // never answers a request with the keys half loaded.
  const configWatch = await watchModelConfigs(nats.nc, configBucketName(ns.configPrefix), state, log);
  const subjects = new Subjects(prefix);
  const pdClient = new PdHttpClient(engineKey);
  // Flow control: the other replicas' queue summaries (services/gateway/flow-summaries.ts feeds it).
  // A replica yields to any higher band another holds as soon as its summary arrives (no grace):
  // the documented inversion bound (DEFAULT_INVERSION_BOUND_MS) is what that guarantees.
  const fleet = new FleetQueues({ self: id, boundMs: 0 });
  // OpenTelemetry traces (docs/tracing.md): off unless --otlp-endpoint; observation only.
  const traces = config.otlpEndpoint ? new OtlpTraceExporter({ endpoint: config.otlpEndpoint, serviceName: config.otlpServiceName, log }) : undefined;
  const tracer = traces ? new RequestTracer(traces) : undefined;
  // The Responses API's store and locations (docs/stateful-apis.md), on the base prefix's streams.
  const responses = await responsesHandlerOf({ nats, ns, id, state, clock, engineApiKey: config.engineApiKey, log });
  const { director, strict } = routingCoreOf({
    responses: responses?.port,
    fleet,
    tracer,
    config, ns, state, clock, serverClock, publishers, pdClient, subjects, cursors, log, js: nats.js,
    prefix: createPrefixSupport({ gatewayId: id, state, tokenizer, subjects, outbox: publishers.outbox }),
    onPick: (st, sec) => metrics.pick(st, sec),
    metrics: () => metrics,
  });
  const metrics: GatewayMetrics = new GatewayMetrics(
    id,
    { ...metricSourcesOf({ state, followers, viewNames, director, strict, publishers, listener, ready: () => isReady, flowSummaries: () => flowSummaries.stats }), ...(traces ? { traceSpans: () => traces.stats } : {}), ...(responses ? { responses: () => responses.figures() } : {}) },
    ns.pool,
  );
  tokenizer.registerMetrics(metrics.registry);
  publishers.start(director);
  const flowDeadLetters = new DeadLetterSink(nats.js, subjects, `gateway-${id}-flow`, log, () => nats.nc.info?.max_payload ?? 1024 * 1024);
  const flowSummaries = new FlowSummaries({ nc: nats.nc, subjects, gatewayId: id, flow: director.flow, fleet, clock, intervalMs: DEFAULT_SUMMARY_INTERVAL_MS, log, deadLetters: flowDeadLetters });
  const stopSweeps = startSweeps(state, clock, serverClock, config.heartbeatIntervalMs);

  await Promise.all(followers.map((f) => f.start()));
  const readyPromise = Promise.all(followers.map((f) => f.whenCaughtUp())).then(() => {
    isReady = true;
    listener.setReady(true);
    log.info({ pods: views.pods.size, charges: views.ledger.size }, "views caught up; gateway ready");
  });

  // Everything up to the snapshot's sequence is in the index before the follower's first message.
  const kvLastSeq = () => state.cursors.kv;
  const snapshotter = config.snapshots
    ? await startSnapshotter({
        nats, prefix, gatewayId: id, log, index: () => state.index, seq: kvLastSeq,
        // A replica still catching up must neither hold the lease nor publish a partial index.
        ready: () => isReady, intervalMs: config.snapshotIntervalMs, leaseMs: config.snapshotLeaseMs,
      })
    : undefined;

  const apiKeys = state.apiKeys;
  const port = await listener.listen(
    createExtProcHandler({ ...extProcOptionsOf(config, state, metrics, log), router: tracer ? tracer.wrap(director) : director, isReady: () => isReady, ...extProcAuthOf(config, apiKeys, metrics, log), ...(responses ? { responses } : {}) }),
    config.host,
    config.port,
    credentials,
  );

  const admin = await startAdminPort(config, apiKeys, {
    log,
    ready: () => isReady,
    state: () =>
      debugStateOf({ id, ns, config, state, director, followers, viewNames, snapshot, snapshotStats: () => snapshotter?.stats, tokenizer, publishers, strict, configWatch, ready: () => isReady, connections: () => listener.connections }),
    metrics,
    explain: (headers, body) => explain(director, views, headers, body),
  });
  const adminPort = admin?.port;
  log.info({ id, port, adminPort, auth: config.auth }, "gateway listening");

  let closed = false;
  return {
    config,
    id,
    port,
    adminPort,
    views,
    state,
    director,
    traces,
    responses,
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
      return listener.connections;
    },
    async close() {
      if (closed) return;
      closed = true;
      await shutDown({ config, listener, director, flowSummaries, stopSweeps, publishers, admin, configWatch, snapshotter, followers, nats, pdClient, tokenizer, log });
      await traces?.close();
      await responses?.close();
    },
  };
}

/** The Responses API's handler over the base prefix's RESPONSE_STORE and RESPONSES streams; undefined (warned) when they do not exist. */
async function responsesHandlerOf(o: { nats: NatsHandles; ns: Namespace; id: string; state: GatewayState; clock: () => number; engineApiKey: string | undefined; log: Logger }): Promise<ResponsesHandler | undefined> {
  const stream = streamName(o.ns.configPrefix, "RESPONSE_STORE");
  const exists = await o.nats.jsm.streams.info(stream).then(
    () => true,
    (err: unknown) => {
      if (isStreamNotFound(err)) return false;
      throw err;
    },
  );
  if (!exists) {
    o.log.warn({ stream }, "no RESPONSE_STORE stream (run `jetroute streams apply`): Responses API continuations are not stored, DELETE and input_items are not served");
    return undefined;
  }
  const store = new ResponseStore({ nats: o.nats, prefix: o.ns.configPrefix, log: o.log, name: `gateway-${o.id}-responses`, now: o.clock });
  return new ResponsesHandler({ store, state: o.state, gatewayId: o.id, log: o.log, now: o.clock, ...(o.engineApiKey ? { engineApiKey: o.engineApiKey } : {}) });
}

/** The one fold every view changes in (services/views/gateway-state.ts), sized from the config. */
function foldOf(config: GatewayConfig, ns: Namespace, signatures: RecordVerifiers): GatewayState {
  return new GatewayState({
    self: config.id,
    ...(ns.pool !== undefined ? { pool: ns.pool } : {}),
    shareCharges: config.consistency !== "off",
    heartbeatTimeoutMs: config.heartbeatTimeoutMs,
    maxCharges: config.maxCharges,
    loadStaleAfterMs: config.loadStaleAfterMs,
    rateConfirmMs: config.rateConfirmMs,
    podSourceTimeoutMs: config.podSourceTimeoutMs,
    prefixIndex: { maxEntries: config.prefixMaxEntries },
    maxResponseLocations: config.responseLocations,
    checkModelConfig: validateModelConfig,
    ...(config.podCidrs ? { podAddressAllowed: podAddressFilter(config.podCidrs) } : {}),
    // Config entries: operator records under --config-public-key, InferencePool policies under --pod-public-key (streams/record-keys.ts).
    ...(signatures.config || signatures.pods ? { configSignatures: { ...(signatures.config ? { operator: signatures.config } : {}), ...(signatures.pods ? { podWatcher: signatures.pods } : {}), bucket: configBucketName(ns.configPrefix) } } : {}),
    ...(signatures.pods ? { podSignatures: signatures.pods } : {}),
  });
}

type RecordVerifiers = { config?: RecordVerifier; pods?: RecordVerifier };

/**
 * Signed records (docs/security.md): the verifiers of `--config-public-key` (operator records) and
 * `--pod-public-key` (pods, heartbeats, InferencePool policies); a key in both is refused.
 */
function recordVerifiersOf(config: GatewayConfig): RecordVerifiers {
  let sets: RecordVerifiers;
  try {
    sets = {
      ...(config.configPublicKeyFile ? { config: readVerifier(config.configPublicKeyFile, "--config-public-key") } : {}),
      ...(config.podPublicKeyFile ? { pods: readVerifier(config.podPublicKeyFile, "--pod-public-key") } : {}),
    };
  } catch (err) {
    throw new GatewayConfigError((err as Error).message);
  }
  // A pod-watcher's key among the operator's would verify API keys: refused at start.
  const shared = sharedKeyError({ ...(sets.config ? { operator: sets.config } : {}), ...(sets.pods ? { podWatcher: sets.pods } : {}) });
  if (shared) throw new GatewayConfigError(shared);
  return sets;
}

/** The request path: the routing core's Director, publishing through this gateway, and its strict committer. */
function routingCoreOf(o: {
  config: GatewayConfig;
  ns: Namespace;
  state: GatewayState;
  clock: () => number;
  serverClock: ServerClock;
  publishers: GatewayPublishers;
  js: NatsHandles["js"];
  prefix: DirectorOptions["prefix"];
  pdClient: PdHttpClient;
  subjects: Subjects;
  cursors: SubjectCursors;
  onPick: NonNullable<DirectorOptions["onPick"]>;
  fleet: FleetQueues;
  metrics: () => GatewayMetrics;
  tracer: RequestTracer | undefined;
  responses: DirectorOptions["responses"];
  log: Logger;
}): { director: Director; strict: StrictCommitter | undefined } {
  const { config, ns, state } = o;
  const modelConfigs = state.configs;
  const consistency = config.consistency;
  const director = new Director({
    gatewayId: config.id, now: o.clock, serverNow: o.serverClock.now, recordPromptBlocks: config.recordPromptBlocks, defaultStrategy: config.defaultStrategy, chargeTtlMs: config.chargeTtlMs,
    state, sink: o.publishers.sink, prefix: o.prefix, config: modelConfigs, consistency,
    pool: { ...(ns.pool !== undefined ? { pool: ns.pool } : {}), ...(config.poolModels ? { models: new Set(config.poolModels) } : {}) },
    strictFor: (model) => consistency !== "off" && (modelConfigs.consistency(model) ?? consistency) === "strict",
    onPick: o.onPick,
    ...(config.turnBudgetMs > 0 ? { turns: { budgetMs: config.turnBudgetMs, yieldTurn: immediateYield } } : {}),
    pdLegClient: o.pdClient,
    pdLegOptions: { prefillTimeoutMs: config.pd.prefillTimeoutMs, prefillBudgetMs: config.pd.prefillBudgetMs, sglangPrefillTimeoutMs: config.pd.sglangPrefillTimeoutMs, maxRetries: config.pd.maxRetries },
    flow: { fleet: o.fleet, limits: { maxHeldBytes: config.flowMaxHeldBytes, maxHeldRequests: config.flowMaxHeld }, hooks: { outcome: (band, outcome, waitMs) => o.metrics().flowOutcome(band, outcome, waitMs), yielded: (band) => o.metrics().flowYield(band) } },
    // Virtual models' similarity signals: the embedding model's pods, found in the fold like any model's.
    embeddings: new EmbeddingClient({ readyPods: (m) => state.pods.readyPods(m), observe: (e) => o.metrics().semanticEmbedding(e), ...(config.engineApiKey ? { engineApiKey: config.engineApiKey } : {}) }),
    // InferenceModelRewrites (docs/inference-pool.md): the pools' rules, each scoped to its pool's models by the view.
    modelRewrites: { active: () => state.poolPolicies.hasRewrites, rewrite: (model, id) => state.poolPolicies.rewrite(model, id, state.pods) },
    ...(o.responses ? { responses: o.responses } : {}),
    onStage: o.tracer
      ? (stage, seconds, ctx) => {
          o.metrics().stage(stage, seconds);
          o.tracer?.stage(stage, seconds, ctx);
        }
      : (stage, seconds) => o.metrics().stage(stage, seconds),
  });
  // Strict commits are chosen per model (its config's `consistency`, else `--consistency`), so the
  // committer exists whenever charges are shared; `off` follows no peer and has nothing to commit against.
  const strict =
    consistency !== "off"
      ? new StrictCommitter({ js: o.js, subjects: o.subjects, cursor: o.cursors, onFallback: (err) => o.log.warn({ err }, "strict charge commit failed; published without compare-and-set") })
      : undefined;
  if (strict) director.useStrictCommitter(strict);
  return { director, strict };
}

/** What the gateway's metrics read at scrape time. */
function metricSourcesOf(o: {
  state: GatewayState;
  followers: GatewayFollowers["followers"];
  viewNames: GatewayFollowers["views"];
  director: Director;
  strict: StrictCommitter | undefined;
  publishers: GatewayPublishers;
  listener: ExtProcListener;
  ready: () => boolean;
  flowSummaries: () => { sent: number; received: number; invalid: number };
}): GatewayMetricsSources {
  const { state, director, publishers } = o;
  const ledger = state.ledger;
  return {
    followers: () => o.followers.map((f, i) => ({ view: o.viewNames[i] ?? String(i), lastSeq: f.lastSeq, applied: f.applied, invalid: f.invalid, deadLetterPublishFailures: f.deadLetters.failed, reopens: f.reopens, pending: f.pending, delayMs: f.delayMs })),
    ledger: () => ({
      charges: ledger.size,
      evicted: ledger.evicted,
      expired: ledger.expired,
      reconciledAdded: ledger.reconciledAdded,
      reconciledRemoved: ledger.reconciledRemoved,
      liveGateways: ledger.liveGateways(Date.now()).length,
    }),
    prefixIndex: () => {
      const st = state.index.stats();
      return { entries: st.entries, blocks: st.blocks, evictedEntries: st.evictedEntries };
    },
    strict: () => o.strict?.stats,
    inFlight: () => director.inFlight.size,
    ready: o.ready,
    apiKeys: () => ({ active: state.apiKeys.active, revoked: state.apiKeys.size - state.apiKeys.active }),
    connections: () => o.listener.connections,
    outboxDrops: () => publishers.outbox.drops(),
    pd: () => ({ ...director.pdStats, ...director.legs?.stats }),
    podSources: () => state.pods.sourceInfo(),
    shadowingAdapters: () => state.pods.shadowingAdapters,
    refusedPodAddresses: () => state.pods.refusedAddresses,
    signatureRefusals: () => state.signatureRefusals,
    flowHeld: () => [...director.flow.queueSummaries().values()].flatMap((q) => q.summary()),
    flowHeldBytes: () => director.flow.heldBytes,
    flowSummaries: o.flowSummaries,
    latencyModel: () => ({ learned: state.latency.learned, rejected: state.latency.rejected, entries: state.latency.size }),
    usage: () => ({ foreignGateways: state.rates.foreignGateways, foreignEntries: state.rates.foreignEntries, foreignEvicted: state.rates.foreignEvicted, sent: publishers.usageSummaries.sent, truncatedUsers: publishers.usageSummaries.truncatedUsers }),
  };
}

/** `--auth required`: the ext_proc handler authenticates each request's bearer key and counts refusals. */
function extProcAuthOf(config: GatewayConfig, apiKeys: ApiKeyView, metrics: GatewayMetrics, log: Logger): Pick<ExtProcHandlerOptions, "auth"> {
  if (config.auth !== "required") return {};
  return {
    auth: {
      authenticate: (authorization: string | undefined) => apiKeys.authenticate(authorization),
      failed: (reason: Parameters<GatewayMetrics["authFailure"]>[0], requestId: string | undefined) => {
        metrics.authFailure(reason);
        // The reason only: the header itself is never logged.
        if (log.isLevelEnabled("debug")) log.debug({ requestId, reason }, "request refused: authentication failed");
      },
      delegation: (caller, onBehalfOf) => apiKeys.delegation(caller, onBehalfOf),
      delegationRefused: (reason, requestId) => {
        metrics.authFailure(`delegation-${reason}`);
        // The reason only: the header's value is never logged.
        if (log.isLevelEnabled("debug")) log.debug({ requestId, reason }, "request refused: x-jetroute-on-behalf-of not honoured");
      },
    },
  };
}

/** The admin HTTP port (`--admin-port`; off when negative): health, metrics, /debug/*; admin keys under `--auth required`. */
async function startAdminPort(
  config: GatewayConfig,
  apiKeys: ApiKeyView,
  o: Pick<Parameters<typeof startAdminServer>[0], "log" | "ready" | "state" | "metrics" | "explain">,
): Promise<AdminServer | undefined> {
  if (config.adminPort < 0) return undefined;
  return startAdminServer({
    port: config.adminPort,
    host: config.adminHost,
    ...(config.auth === "required" ? { authorize: adminAuthorizer(apiKeys) } : {}),
    ...o,
  });
}

/** The fold's expiry sweeps: charges and liveness often (a fraction of a heartbeat), routed-prefix history every 5 s. */
function startSweeps(state: GatewayState, clock: () => number, serverClock: ServerClock, heartbeatIntervalMs: number): () => void {
  const fast = setInterval(() => state.sweep(clock(), { liveNow: serverClock.now() }), Math.max(50, Math.min(250, heartbeatIntervalMs / 4)));
  const slow = setInterval(() => state.sweep(clock(), { routed: true, liveNow: serverClock.now() }), 5_000);
  return () => {
    clearInterval(fast);
    clearInterval(slow);
  };
}

/**
 * Shutdown, in order: let in-flight requests finish (they release their own charges) for a grace
 * period, then cancel the rest; whatever is still charged after that is released as "shutdown".
 */
async function shutDown(p: {
  config: GatewayConfig;
  listener: ExtProcListener;
  director: Director;
  flowSummaries: FlowSummaries;
  stopSweeps: () => void;
  publishers: GatewayPublishers;
  admin: AdminServer | undefined;
  configWatch: { stop(): Promise<void> };
  snapshotter: Snapshotter | undefined;
  followers: GatewayFollowers["followers"];
  nats: NatsHandles;
  pdClient: PdHttpClient;
  tokenizer: Tokenizer;
  log: Logger;
}): Promise<void> {
  // Held requests keep being dispatched during the grace period; what is still held after it gets
  // a 503 before the streams are cut; the others stop yielding to this replica at once.
  await p.listener.close(p.config.shutdownGraceMs, () => p.director.flow.drain(new RouteError("notReady", "gateway is shutting down")));
  const drained = p.director.drain();
  p.flowSummaries.stop();
  p.stopSweeps();
  p.publishers.stop();
  p.admin?.close();
  await p.configWatch.stop();
  // Releases the lease: another replica takes over at its next tick instead of after expiry.
  await p.snapshotter?.close();
  await Promise.all(p.followers.map((f) => f.stop()));
  await p.nats.nc.drain();
  await p.pdClient.close();
  await p.tokenizer.close();
  p.log.info({ drained }, "gateway stopped");
}

/** The ext_proc adapter's settings from the config: P/D watchdog, model listing, engine key, what responses reveal. */
function extProcOptionsOf(config: GatewayConfig, views: GatewayViews & Pick<GatewayState, "poolPolicies">, metrics: GatewayMetrics, log: Logger): Omit<ExtProcHandlerOptions, "router" | "isReady" | "auth"> {
  return {
    log,
    pdWatchdog: { ...DEFAULT_PD_WATCHDOG, firstChunkMs: config.pd.firstChunkTimeoutMs, idleMs: config.pd.idleTimeoutMs },
    listModels: () => [...new Set(views.pods.all().flatMap((p) => [p.model, ...p.adapters]))].sort(),
    usageClamped: () => metrics.usageClamped(),
    exposePodAddresses: config.exposePodAddresses,
    destinationFallbacks: config.destinationFallbacks,
    servedElsewhere: () => metrics.servedElsewhere(),
    ...(config.engineApiKey ? { engineApiKey: config.engineApiKey } : {}),
  };
}
