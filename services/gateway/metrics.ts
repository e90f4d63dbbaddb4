/**
 * Prometheus metrics of a gateway, served on the admin port at `/metrics`. Counters are bumped
 * from the decision records the gateway publishes anyway; view and ledger figures are read at
 * scrape time, so nothing here sits on the request path beyond two increments.
 */
import client from "prom-client";
import type { DecisionRecord } from "../../schemas/events.js";
import { PredictionDrift, REQUEST_PATH, stagesOf, strategyLabel } from "../routing/mod.js";
import { registerLoopProbe } from "./loop-probe.js";
import type { LatencyRejections } from "../views/latency-model.js";

export interface GatewayMetricsSources {
  followers: () => Array<{ view: string; lastSeq: number; applied: number; invalid: number; deadLetterPublishFailures: number; reopens: number; pending: number; delayMs: number }>;
  ledger: () => { charges: number; evicted: number; expired: number; reconciledAdded: number; reconciledRemoved: number; liveGateways: number };
  prefixIndex: () => { entries: number; blocks: number; evictedEntries: number };
  strict: () => { committed: number; conflicts: number; fallbacks: number } | undefined;
  inFlight: () => number;
  ready: () => boolean;
  /** API keys known to this replica: active and revoked. */
  apiKeys?: () => { active: number; revoked: number };
  /** ext_proc HTTP/2 connections (see services/extproc/reset-budget.ts). */
  connections?: () => { open: number; opened: number; rotated: number; resets: number } | undefined;
  /** P/D: plans and legs (Director.pdStats and PdLegs.stats). */
  pd?: () => Readonly<Record<string, number>>;
  /** OpenTelemetry traces (--otlp-endpoint): spans exported, dropped (queue full), failed (the POST failed); absent: traces off. */
  traceSpans?: () => { exported: number; dropped: number; failed: number } | undefined;
  /** Events the outbox did not publish, by reason (services/shared/publish.ts). */
  outboxDrops?: () => { closed: number; tooLarge: number; failed: number };
  /** Pod-watcher sources known to the pod set (services/views/pod-set.ts). */
  podSources?: () => ReadonlyArray<{ silent: boolean }>;
  /** Engine-reported adapters ignored because they are named like a served base model (services/views/pod-set.ts). */
  shadowingAdapters?: () => number;
  /** Pods held as absent because their address is outside `--pod-cidrs`. */
  refusedPodAddresses?: () => number;
  /** Records refused for their signature (`--config-public-key`, `--pod-public-key`), by kind and reason. */
  signatureRefusals?: () => Readonly<Record<string, Readonly<Record<string, number>>>>;
  /** Usage summaries across pools (services/gateway/usage-summary.ts, services/views/rate-view.ts). */
  usage?: () => { foreignGateways: number; foreignEntries: number; foreignEvicted: number; sent: number; truncatedUsers: number };
  /** Flow control: requests held per model queue and band (services/routing/flow/). */
  flowHeld?: () => Iterable<{ band: number; count: number }>;
  /** Flow control: bytes held across models, as counted (what held requests retain). */
  flowHeldBytes?: () => number;
  /** Flow control: summaries sent, received from other replicas, ignored as invalid. */
  flowSummaries?: () => { sent: number; received: number; invalid: number } | undefined;
  /** The latency model: samples learned, and not learned by reason (services/views/latency-model.ts). */
  latencyModel?: () => { learned: number; rejected: Readonly<LatencyRejections>; entries: number };
  /** The Responses API's state (docs/stateful-apis.md): the location view, the store and the handler's counts. */
  responses?: () => Readonly<Record<string, number>> | undefined;
}

const EMBEDDING_RESULTS = ["hit", "miss", "timeout", "error", "no-pod", "busy"] as const;

export class GatewayMetrics {
  readonly registry = new client.Registry();
  private readonly decisions: client.Counter<"strategy" | "outcome" | "status">;
  private readonly pickSeconds: client.Histogram<"strategy">;
  /** Per stage of the request path: its histogram's child, bound once (the label set is the stage list). */
  private readonly stageSeconds = new Map<string, client.Histogram.Internal<"stage">>();
  private readonly authFailures: client.Counter<"reason">;
  private readonly usageClampedTotal: client.Counter;
  private readonly servedElsewhereTotal: client.Counter;
  private readonly embeddingsTotal: client.Counter<"result">;
  private readonly unrecordedTotal: client.Counter<"reason">;
  private readonly flow: FlowMetrics;
  /** Rolling prediction error of the latency model per model and pod class (docs/latency-model.md). */
  readonly drift = new PredictionDrift();

  /** `pool`: a pooled replica's series carry its pool (a validated name, 32 characters at most). */
  constructor(gatewayId: string, src: GatewayMetricsSources, pool?: string) {
    const r = this.registry;
    r.setDefaultLabels({ gateway: gatewayId, ...(pool !== undefined ? { pool } : {}) });
    client.collectDefaultMetrics({ register: r, prefix: "jetroute_gateway_" });
    registerLoopProbe(r);
    this.decisions = new client.Counter({ name: "jetroute_gateway_requests_total", help: "Requests by strategy, outcome and status", labelNames: ["strategy", "outcome", "status"], registers: [r] });
    this.pickSeconds = new client.Histogram({
      name: "jetroute_gateway_pick_seconds",
      help: "Time to select a pod (strategy pick, prefix match included)",
      labelNames: ["strategy"],
      buckets: [0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03],
      registers: [r],
    });
    const stages = new client.Histogram({
      name: "jetroute_gateway_stage_seconds",
      help: "Time in each stage of the request path (services/routing/request-path.ts); the flow gate and admit include any hold",
      labelNames: ["stage"],
      buckets: [0.000005, 0.00002, 0.0001, 0.0005, 0.002, 0.01, 0.05, 0.25, 1, 5, 30],
      registers: [r],
    });
    for (const s of stagesOf(REQUEST_PATH)) this.stageSeconds.set(s.name, stages.labels(s.name));
    this.authFailures = new client.Counter({
      name: "jetroute_gateway_auth_failures_total",
      help: "Requests refused with 401 (--auth required), by reason: missing, malformed, unknown, revoked; and x-jetroute-on-behalf-of refused (403, 400 malformed): delegation-not-permitted, delegation-owner-invalid, delegation-malformed",
      labelNames: ["reason"],
      registers: [r],
    });
    // Present from the start (at 0), so rate() over them works before the first failure.
    for (const reason of ["missing", "malformed", "unknown", "revoked", "delegation-not-permitted", "delegation-malformed", "delegation-owner-invalid"]) this.authFailures.inc({ reason }, 0);
    this.unrecordedTotal = new client.Counter({
      name: "jetroute_gateway_rejections_unrecorded_total",
      help: "Rejected requests whose decision record was not published: unknown_path (never recorded), budget (over --rejection-records-per-s)",
      labelNames: ["reason"],
      registers: [r],
    });
    for (const reason of ["unknown_path", "budget"]) this.unrecordedTotal.inc({ reason }, 0);
    this.usageClampedTotal = new client.Counter({
      name: "jetroute_gateway_engine_usage_clamped_total",
      help: "Responses whose engine-reported token usage was fractional or out of range and was clamped",
      registers: [r],
    });
    this.servedElsewhereTotal = new client.Counter({
      name: "jetroute_gateway_served_by_fallback_total",
      help: "Responses the proxy reported (x-gateway-destination-endpoint-served) as served by an endpoint other than the chosen one",
      registers: [r],
    });
    this.embeddingsTotal = new client.Counter({
      name: "jetroute_gateway_semantic_embeddings_total",
      help: "Virtual models' similarity signals: requests whose embeddings were all cached (hit) or not (miss), and why an uncached one fell back to the lexical score (timeout, error, no-pod, busy)",
      labelNames: ["result"],
      registers: [r],
    });
    for (const result of EMBEDDING_RESULTS) this.embeddingsTotal.inc({ result }, 0);
    this.flow = new FlowMetrics(r, src);
    registerStateGauges(r, src, this.drift);
  }

  decision(rec: DecisionRecord): void {
    // A P/D request is counted once, by its decode leg's record (prefill attempts: jetroute_gateway_pd).
    if (rec.pd?.leg === "prefill") return;
    this.drift.record(rec);
    this.decisions.inc({ strategy: strategyLabel(rec.strategy), outcome: rec.outcome, status: String(rec.status) });
  }

  /** A held request left the queue. */
  flowOutcome(band: number, outcome: string, waitMs: number): void {
    this.flow.outcome(band, outcome, waitMs);
  }

  flowYield(band: number): void {
    this.flow.yielded(band);
  }

  unrecorded(reason: "unknown_path" | "budget"): void {
    this.unrecordedTotal.inc({ reason });
  }

  semanticEmbedding(result: (typeof EMBEDDING_RESULTS)[number]): void {
    this.embeddingsTotal.inc({ result });
  }

  usageClamped(): void {
    this.usageClampedTotal.inc();
  }

  servedElsewhere(): void {
    this.servedElsewhereTotal.inc();
  }

  authFailure(reason: string): void {
    this.authFailures.inc({ reason });
  }

  /** A stage of the request path took `seconds` (a name outside the stage list is not counted). */
  stage(name: string, seconds: number): void {
    this.stageSeconds.get(name)?.observe(seconds);
  }

  pick(strategy: string, seconds: number): void {
    this.pickSeconds.observe({ strategy: strategyLabel(strategy) }, seconds);
  }

  render(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}

/** Flow control's series (docs/flow-control.md). Bands are integers in [-16, 16]: a bounded label. */
class FlowMetrics {
  private readonly requests: client.Counter<"band" | "outcome">;
  private readonly wait: client.Histogram<"band">;
  private readonly yields: client.Counter<"band">;

  constructor(r: client.Registry, src: GatewayMetricsSources) {
    this.requests = new client.Counter({
      name: "jetroute_gateway_flow_requests_total",
      help: "Flow control: held requests that left the queue, by band and outcome (dispatched, expired, dropped, cancelled)",
      labelNames: ["band", "outcome"],
      registers: [r],
    });
    this.wait = new client.Histogram({
      name: "jetroute_gateway_flow_wait_seconds",
      help: "Flow control: how long held requests waited before they left the queue, by band",
      labelNames: ["band"],
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers: [r],
    });
    this.yields = new client.Counter({
      name: "jetroute_gateway_flow_yields_total",
      help: "Flow control: dispatch checks that held a band back because another replica holds an older request of a higher band",
      labelNames: ["band"],
      registers: [r],
    });
    new client.Gauge({
      name: "jetroute_gateway_flow_held",
      help: "Flow control: requests this replica holds, by band",
      labelNames: ["band"],
      registers: [r],
      collect() {
        this.reset();
        const byBand = new Map<number, number>();
        for (const b of src.flowHeld?.() ?? []) byBand.set(b.band, (byBand.get(b.band) ?? 0) + b.count);
        for (const [band, n] of byBand) this.set({ band: String(band) }, n);
      },
    });
    new client.Gauge({
      name: "jetroute_gateway_flow_held_bytes",
      help: "Flow control: bytes held by this replica across models, counted as what held requests retain (bounded by --flow-max-held-bytes)",
      registers: [r],
      collect() {
        this.set(src.flowHeldBytes?.() ?? 0);
      },
    });
    new client.Gauge({
      name: "jetroute_gateway_flow_summaries",
      help: "Flow control: queue summaries sent, received from other replicas, ignored as invalid",
      labelNames: ["figure"],
      registers: [r],
      collect() {
        for (const [k, v] of Object.entries(src.flowSummaries?.() ?? {})) this.set({ figure: k }, v);
      },
    });
  }

  outcome(band: number, outcome: string, waitMs: number): void {
    this.requests.inc({ band: String(band), outcome });
    this.wait.observe({ band: String(band) }, waitMs / 1000);
  }

  yielded(band: number): void {
    this.yields.inc({ band: String(band) });
  }
}

/** The gauges read at scrape time from the gateway's state (views, followers, ledger, index, P/D, latency model). */
function registerStateGauges(r: client.Registry, src: GatewayMetricsSources, drift: PredictionDrift): void {
  const gauge = (name: string, help: string, labelNames: string[], collect: (g: client.Gauge<string>) => void) =>
    new client.Gauge({
      name,
      help,
      labelNames,
      registers: [r],
      collect() {
        collect(this);
      },
    });
  gauge("jetroute_gateway_ready", "1 once every view caught up with its stream", [], (g) => g.set(src.ready() ? 1 : 0));
  gauge("jetroute_gateway_in_flight", "Requests routed by this replica and not finished", [], (g) => g.set(src.inFlight()));
  gauge("jetroute_gateway_view_last_seq", "Last stream sequence applied, per view", ["view"], (g) => {
    for (const f of src.followers()) g.set({ view: f.view }, f.lastSeq);
  });
  gauge("jetroute_gateway_view_pending", "View lag in messages: stream messages after the last one the view handled (0 = caught up)", ["view"], (g) => {
    for (const f of src.followers()) g.set({ view: f.view }, f.pending);
  });
  gauge("jetroute_gateway_view_delay_seconds", "View lag in time: for the last event the view applied, handled minus stored by the server", ["view"], (g) => {
    for (const f of src.followers()) g.set({ view: f.view }, f.delayMs / 1000);
  });
  gauge("jetroute_gateway_view_applied", "Events applied, per view", ["view"], (g) => {
    for (const f of src.followers()) g.set({ view: f.view }, f.applied);
  });
  gauge("jetroute_gateway_dead_letters", "Invalid events dead-lettered, per view", ["view"], (g) => {
    for (const f of src.followers()) g.set({ view: f.view }, f.invalid);
  });
  gauge("jetroute_gateway_dead_letter_publish_failures", "Dead letters the DLQ stream did not take (publish failed), per view", ["view"], (g) => {
    for (const f of src.followers()) g.set({ view: f.view }, f.deadLetterPublishFailures);
  });
  gauge("jetroute_gateway_consumer_reopens", "Stream consumers reopened after being lost, per view", ["view"], (g) => {
    for (const f of src.followers()) g.set({ view: f.view }, f.reopens);
  });
  gauge("jetroute_gateway_ledger", "Charge ledger: charges held, evicted, expired, healed by heartbeats, live replicas", ["figure"], (g) => {
    for (const [k, v] of Object.entries(src.ledger())) g.set({ figure: k }, v);
  });
  gauge("jetroute_gateway_prefix_index", "Prefix index: (block, pod) entries, blocks, evicted entries", ["figure"], (g) => {
    for (const [k, v] of Object.entries(src.prefixIndex())) g.set({ figure: k }, v);
  });
  gauge("jetroute_gateway_api_keys", "API keys in the config bucket, by state (active, revoked)", ["state"], (g) => {
    for (const [k, v] of Object.entries(src.apiKeys?.() ?? {})) g.set({ state: k }, v);
  });
  gauge("jetroute_gateway_extproc_connections", "ext_proc HTTP/2 connections: open, opened, rotated before Node's reset limit; resets: streams seen ending in RST_STREAM", ["figure"], (g) => {
    for (const [k, v] of Object.entries(src.connections?.() ?? {})) g.set({ figure: k }, v);
  });
  gauge("jetroute_gateway_pod_sources", "Pod-watcher sources by state: live, or silent beyond --pod-source-timeout-ms (their pods not routed)", ["state"], (g) => {
    const all = src.podSources?.() ?? [];
    const silent = all.filter((x) => x.silent).length;
    g.set({ state: "live" }, all.length - silent);
    g.set({ state: "silent" }, silent);
  });
  gauge("jetroute_gateway_shadowing_adapters", "LoRA adapters ignored because they are named like a base model some pod serves (they would take its traffic): engine-reported ones per pod, managed ones (placement records) once", [], (g) => {
    g.set(src.shadowingAdapters?.() ?? 0);
  });
  gauge("jetroute_gateway_pods_refused_address", "Pods published with an address outside --pod-cidrs: never routed to", [], (g) => {
    g.set(src.refusedPodAddresses?.() ?? 0);
  });
  gauge("jetroute_gateway_records_refused_signature", "Records ignored because their signature did not verify (--config-public-key, --pod-public-key), by records (config, pods) and reason (unsigned, malformed, unknown-key, bad-signature, out-of-window)", ["records", "reason"], (g) => {
    for (const [records, byReason] of Object.entries(src.signatureRefusals?.() ?? {})) for (const [reason, n] of Object.entries(byReason)) g.set({ records, reason }, n);
  });
  gauge("jetroute_gateway_trace_spans", "OpenTelemetry spans (--otlp-endpoint) by outcome: exported, dropped (the bounded queue was full), failed (the receiver did not take them); absent with traces off", ["outcome"], (g) => {
    const t = src.traceSpans?.();
    if (!t) return;
    g.set({ outcome: "exported" }, t.exported);
    g.set({ outcome: "dropped" }, t.dropped);
    g.set({ outcome: "failed" }, t.failed);
  });
  gauge("jetroute_gateway_outbox_dropped", "Events not published, by reason: closed (fired while shutting down), too_large (over the server's max_payload), failed (refused by the client)", ["reason"], (g) => {
    const d = src.outboxDrops?.();
    g.set({ reason: "closed" }, d?.closed ?? 0);
    g.set({ reason: "too_large" }, d?.tooLarge ?? 0);
    g.set({ reason: "failed" }, d?.failed ?? 0);
  });
  gauge(
    "jetroute_gateway_pd",
    "P/D: disaggregated requests, decider skips, combined fallbacks, unusable rolesets seen, prefill attempts/retries/failures, answers without transfer params, decode aborts",
    ["figure"],
    (g) => {
      for (const [k, v] of Object.entries(src.pd?.() ?? {})) g.set({ figure: k }, v);
    },
  );
  gauge(
    "jetroute_gateway_usage_summaries",
    "Per-user rate-limit usage across pools: foreign_gateways and foreign_entries (other namespaces' summaries held, user entries in them), foreign_evicted (dropped at the bound), sent (own summaries published), truncated_users (left out of them)",
    ["figure"],
    (g) => {
      const u = src.usage?.();
      if (!u) return;
      g.set({ figure: "foreign_gateways" }, u.foreignGateways);
      g.set({ figure: "foreign_entries" }, u.foreignEntries);
      g.set({ figure: "foreign_evicted" }, u.foreignEvicted);
      g.set({ figure: "sent" }, u.sent);
      g.set({ figure: "truncated_users" }, u.truncatedUsers);
    },
  );
  gauge("jetroute_gateway_latency_prediction_ape", "Latency model: mean absolute percentage error (0.1 = 10 %) of the picked pods' predicted TTFT/TPOT over the last 256 requests, per model and pod class", ["model", "pod_class", "metric"], (g) => {
    for (const f of drift.figures()) {
      if (f.ttftApe !== null) g.set({ model: f.model, pod_class: f.podClass, metric: "ttft" }, f.ttftApe);
      if (f.tpotApe !== null) g.set({ model: f.model, pod_class: f.podClass, metric: "tpot" }, f.tpotApe);
    }
  });
  gauge("jetroute_gateway_latency_samples", "Latency model: release samples learned from (learned) and not (ttftMissing, ttftAbsurd, tpotAbsurd, late, full), and (model, class) entries held", ["figure"], (g) => {
    const m = src.latencyModel?.();
    if (!m) return;
    g.set({ figure: "learned" }, m.learned);
    g.set({ figure: "entries" }, m.entries);
    for (const [k, v] of Object.entries(m.rejected)) g.set({ figure: k }, v);
  });
  gauge(
    "jetroute_gateway_responses",
    "Responses API state: locations held, evicted, expired, refused (conflicts: another tenant's id; invalid); the store's turns stored, too_large, reads, hits, malformed, deleted; replies recorded, record_failures, unrecorded; continuations recovered from the store and recovery_failures; routes under /v1/responses/{id} forwarded to a pod or answered from the store",
    ["figure"],
    (g) => {
      for (const [k, v] of Object.entries(src.responses?.() ?? {})) g.set({ figure: k }, v);
    },
  );
  gauge("jetroute_gateway_strict", "Strict mode: committed charges, lost races, fallbacks", ["figure"], (g) => {
    for (const [k, v] of Object.entries(src.strict() ?? {})) g.set({ figure: k }, v);
  });
}
