/**
 * What a gateway publishes: its charges and decision records through the outbox, releases in
 * per-pod batches, heartbeats listing the charges it holds, and its per-user usage summaries for
 * the other pools. One ordered outbox, so a heartbeat always follows the charges and releases
 * made before it.
 */
import type { Namespace } from "../../streams/pools.js";
import { Subjects } from "../../streams/subjects.js";
import { type EventSink, publishDecision, type RoutedRequest } from "../routing/mod.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { Outbox, ReleaseBatcher } from "../shared/publish.js";
import { TokenBucket } from "../shared/token-bucket.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { GatewayConfig } from "./config.js";
import { heartbeatOf } from "./heartbeat.js";
import type { GatewayMetrics } from "./metrics.js";
import { UsageSummaries } from "./usage-summary.js";

/** Where the publishers read the request path's own figures (the director, made after them). */
export interface ChargeSource {
  readonly chargesMade: number;
  holdingCharges(): Iterable<RoutedRequest>;
}

export class GatewayPublishers {
  readonly outbox: Outbox;
  readonly usageSummaries: UsageSummaries;
  /** The director's events, onto the streams. */
  readonly sink: EventSink;
  private readonly releases: ReleaseBatcher;
  private readonly subjects: Subjects;
  private readonly baseSubjects: Subjects;
  private readonly startedAt = Date.now();
  private beat = 0;
  private hbTimer: NodeJS.Timeout | undefined;
  private usageTimer: NodeJS.Timeout | undefined;
  private charges: ChargeSource | undefined;

  constructor(
    private readonly o: {
      nats: NatsHandles;
      ns: Namespace;
      id: string;
      config: GatewayConfig;
      state: GatewayState;
      metrics: () => GatewayMetrics;
      clock: () => number;
      log: Logger;
    },
  ) {
    const nc = o.nats.nc;
    this.subjects = new Subjects(o.ns.prefix);
    this.baseSubjects = new Subjects(o.ns.configPrefix);
    this.outbox = new Outbox(nc);
    this.releases = new ReleaseBatcher(this.outbox, (model, pod) => this.subjects.releases(model, pod), o.config.releaseBatchMs, () => this.charges?.chargesMade ?? 0, undefined, () => nc.info?.max_payload);
    this.usageSummaries = new UsageSummaries(o.state, { gateway: o.id, ...(o.ns.pool !== undefined ? { pool: o.ns.pool } : {}), startedAt: this.startedAt, maxPayload: () => nc.info?.max_payload });
    const log = o.log;
    const rejections = new TokenBucket(o.config.rejectionRecordsPerS, 2 * o.config.rejectionRecordsPerS, o.clock);
    const take = () => rejections.take();
    this.sink = {
      charge: (ev) => this.outbox.fire(this.subjects.charges(ev.model, ev.pod), ev),
      release: (ev) => this.releases.add(ev),
      decision: (rec) => {
        o.metrics().decision(rec);
        // Per-request line at debug level (off by default: JETROUTE_LOG_LEVEL=debug turns it on).
        if (log.isLevelEnabled("debug")) log.debug({ requestId: rec.id, model: rec.model, strategy: rec.strategy, pick: rec.pick, status: rec.status, outcome: rec.outcome, ttftMs: rec.ttftMs }, "decision");
        const publish = publishDecision(rec, take);
        if (publish === true) this.outbox.fire(this.subjects.decisions(rec.model || "_"), rec);
        else o.metrics().unrecorded(publish);
      },
    };
  }

  /** Starts the heartbeats (one at once) and the usage summaries, listing `charges`' holdings. */
  start(charges: ChargeSource): void {
    this.charges = charges;
    const c = this.o.config;
    if (c.usageSummaryMs > 0) this.usageTimer = setInterval(() => this.summarizeUsage(), c.usageSummaryMs);
    this.heartbeat("up");
    this.hbTimer = setInterval(() => this.heartbeat("up"), c.heartbeatIntervalMs);
  }

  /**
   * Parts sized to the server's max_payload (read each beat: a reconnect may land on a server with
   * another limit), 10% left for the PUB line and headers; all parts fired in one turn, back to back.
   */
  private heartbeat(st: "up" | "down"): void {
    const c = this.o.config;
    const maxBytes = Math.floor((this.o.nats.nc.info?.max_payload ?? 1024 * 1024) * 0.9);
    // Releases made before this beat go first: a heartbeat never lists as ended a charge whose release peers have not had.
    this.releases.flush();
    const input = { gateway: this.o.id, now: Date.now(), intervalMs: c.heartbeatIntervalMs, startedAt: this.startedAt, chargeTtlMs: c.chargeTtlMs, maxListed: c.maxHeartbeatCharges, beat: this.beat++, maxBytes, podsSeq: this.o.state.cursors.pods };
    for (const hb of heartbeatOf(input, st, this.charges?.holdingCharges() ?? [])) this.outbox.fire(this.subjects.heartbeat(this.o.id), hb);
  }

  private summarizeUsage(): void {
    const { ns, state } = this.o;
    // Unpooled, with no pool in the config and no other namespace's summary seen: nobody to tell.
    if (ns.pool === undefined && state.pools.names().length === 0 && state.rates.foreignGateways === 0) return;
    const ev = this.usageSummaries.next(this.o.clock());
    if (ev) this.outbox.fire(this.baseSubjects.usage(ns.pool, this.o.id, this.startedAt), ev);
  }

  /** The last word: every release made so far, the last usage summary, a `down` heartbeat, all flushed. */
  stop(): void {
    clearInterval(this.hbTimer);
    // Every release made so far goes out before the final beat (drain just made the last ones).
    this.releases.flush();
    // The requests of the last interval count in the other pools too.
    if (this.usageTimer) {
      clearInterval(this.usageTimer);
      this.summarizeUsage();
    }
    this.heartbeat("down");
    this.outbox.flush();
  }
}
