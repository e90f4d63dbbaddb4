/**
 * `GET /debug/state` on the admin port: what this replica folds and holds, for an operator —
 * followers, prefix index and snapshots, pods and their sources, the ledger per pod, limits,
 * usage summaries, consistency per model, auth. Read at request time; nothing is kept for it.
 */
import type { EventType } from "../../schemas/events.js";
import type { Namespace } from "../../streams/pools.js";
import type { ExtProcConnectionStats } from "../extproc/reset-budget.js";
import type { Director } from "../routing/mod.js";
import type { StreamFollower } from "../shared/follower.js";
import { tokenLoad } from "../views/charge-ledger.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { GatewayConfig } from "./config.js";
import type { GatewayPublishers } from "./publishers.js";
import type { LoadedSnapshot } from "./snapshots.js";
import type { StrictCommitter } from "./strict-commit.js";
import type { Tokenizer } from "./tokenization.js";

export interface DebugStateSources {
  id: string;
  ns: Namespace;
  config: GatewayConfig;
  state: GatewayState;
  director: Director;
  followers: ReadonlyArray<StreamFollower<EventType>>;
  viewNames: readonly string[];
  snapshot: LoadedSnapshot | undefined;
  snapshotStats: () => object | undefined;
  tokenizer: Tokenizer;
  publishers: GatewayPublishers;
  strict: StrictCommitter | undefined;
  configWatch: { rejected: number; reopens: number };
  ready: () => boolean;
  connections: () => ExtProcConnectionStats | undefined;
}

export function debugStateOf(s: DebugStateSources): Record<string, unknown> {
  const { state, director, config } = s;
  const views = state;
  const consistency = config.consistency;
  const modelConfigs = state.configs;
  const apiKeys = state.apiKeys;
  const usage = s.publishers.usageSummaries;
  return {
    id: s.id,
    ready: s.ready(),
    // Gateway pools: which namespace this replica folds, and the config's assignment of models.
    pool: { name: s.ns.pool ?? null, prefix: s.ns.prefix, models: config.poolModels ?? (s.ns.pool !== undefined ? state.pools.modelsOf(s.ns.pool) ?? [] : null), clashes: state.pools.conflicts() },
    followers: s.followers.map((f, i) => ({ view: s.viewNames[i], lastSeq: f.lastSeq, applied: f.applied, skipped: f.skipped, invalid: f.invalid, reopens: f.reopens, caughtUp: f.caughtUp })),
    prefixIndex: state.index.stats(),
    snapshots: {
      booted: s.snapshot ? { name: s.snapshot.name, seq: s.snapshot.seq, bytes: s.snapshot.bytes, ageMs: s.snapshot.ageMs, loadMs: Math.round(s.snapshot.loadMs), lost: s.snapshot.lost } : null,
      ...s.snapshotStats(),
    },
    routedPrefixes: { blocks: state.routed.size, evicted: state.routed.evicted },
    tokenizer: s.tokenizer.stats,
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
    // The latency model per (model, pod class): samples in its window and its coefficients (docs/latency-model.md).
    latencyModel: { learned: state.latency.learned, rejected: state.latency.rejected, classes: state.latency.coefficients(Date.now()).slice(0, 256) },
    inFlight: director.inFlight.size,
    rateWaits: director.rateWaits,
    // Flow control: what this replica holds, per model, band and flow (bounded by the queues' own bounds; 200 flows shown per model).
    flow: Object.fromEntries([...director.flow.queueSummaries()].map(([model, q]) => [model, { held: q.size, bytes: q.bytes, bands: q.summary(), flows: q.flows().slice(0, 200) }])),
    usageSummaries: { sent: usage.sent, truncatedUsers: usage.truncatedUsers, foreignGateways: state.rates.foreignGateways, foreignEntries: state.rates.foreignEntries, foreignEvicted: state.rates.foreignEvicted },
    extProcConnections: s.connections(),
    consistency,
    // The mode in effect: with `--consistency off` a model's own setting has nothing to share with.
    consistencyByModel: Object.fromEntries(
      modelConfigs.modelNames().flatMap((m) => {
        const c = modelConfigs.consistency(m);
        return c ? [[m, consistency === "off" ? "off" : c]] : [];
      }),
    ),
    configs: { rejected: s.configWatch.rejected, watchReopens: s.configWatch.reopens },
    auth: { mode: config.auth, activeKeys: apiKeys.active, revokedKeys: apiKeys.size - apiKeys.active },
    ...(s.strict ? { strict: s.strict.stats } : {}),
  };
}
