/**
 * Flow control's shell (the decisions are in services/routing/flow/): drives the replica's
 * dispatch (`pump`) on a short timer while it holds anything, publishes its summary of what it
 * holds for the other replicas on core NATS, and folds theirs into the fleet view the dispatch
 * order reads.
 *
 * Summaries go out every `intervalMs` while this replica holds requests, at once (at the next
 * pump tick) when the set of bands it holds changes — a higher band appearing is what the others
 * must yield to — and once more when it stops holding any (so the others stop yielding to it at
 * once, not after the staleness bound). Nothing is stored: a replica that starts late sees the
 * others' next summary within one interval.
 */
import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import type { Subjects } from "../../streams/subjects.js";
import { type FleetQueues, type SummaryRefusal, summaryOf, type FlowController } from "../routing/mod.js";
import type { DeadLetter } from "../shared/dead-letter.js";
import type { Logger } from "../shared/log.js";
import { LogRate } from "../shared/log-rate.js";

const REFUSALS: Record<SummaryRefusal, string> = {
  malformed: "not a flow summary (malformed, or a band outside [-16, 16])",
  "wrong-gateway": "names another gateway than its subject",
  "future-ts": "its ts is ahead of the receive time by more than the clock-skew allowance",
  "too-old": "a band older than any request may be held",
};

/** How often a replica holding requests tries to dispatch them (ms); a release also triggers it. */
export const FLOW_PUMP_INTERVAL_MS = 20;
/** Summaries larger than this are refused (a summary lists bands per model, a few hundred bytes). */
export const MAX_SUMMARY_BYTES = 256 * 1024;

export interface FlowSummariesOptions {
  nc: NatsConnection;
  subjects: Subjects;
  gatewayId: string;
  flow: FlowController;
  fleet: FleetQueues;
  clock: () => number;
  intervalMs: number;
  log: Logger;
  /** Where refused summaries are recorded (`<prefix>.dlq.flow`); absent: counted and logged only. */
  deadLetters?: { send(dl: DeadLetter): void };
}

export class FlowSummaries {
  readonly stats = { sent: 0, received: 0, invalid: 0 };
  private readonly sub: Subscription;
  private readonly pumpTimer: NodeJS.Timeout;
  private readonly summaryTimer: NodeJS.Timeout;
  private wasHolding = false;
  /** The bands held per model at the last publish ("model:band,band;…"). */
  private lastBands = "";
  private readonly invalidLog = new LogRate(1, 10_000);

  constructor(private readonly o: FlowSummariesOptions) {
    this.sub = o.nc.subscribe(o.subjects.all("flow"), {
      callback: (err, m) => {
        if (err) return;
        if (m.data.length > MAX_SUMMARY_BYTES) return this.invalid(m.subject, m.data, "too large");
        let s: unknown;
        try {
          s = m.json();
        } catch {
          return this.invalid(m.subject, m.data, "not JSON");
        }
        // The gateway the subject names: a summary speaks only for its own publisher's subject.
        const from = o.subjects.parse(m.subject)?.names[0];
        if (from === o.gatewayId) return;
        const r = o.fleet.applyFrom(from, s, o.clock());
        if (r.refused) return this.invalid(m.subject, m.data, REFUSALS[r.refused]);
        this.stats.received++;
      },
    });
    let ticks = 0;
    this.pumpTimer = setInterval(() => {
      o.fleet.sweep(o.clock());
      if (o.flow.held > 0) o.flow.pump();
      // Every 5 s: forget saturation baselines of pods that are gone.
      if (++ticks % 250 === 0) o.flow.sweep();
      if (this.bandsNow() !== this.lastBands) this.publish(true);
    }, FLOW_PUMP_INTERVAL_MS);
    this.pumpTimer.unref?.();
    this.summaryTimer = setInterval(() => this.publish(), o.intervalMs);
    this.summaryTimer.unref?.();
  }

  private invalid(subject: string, data: Uint8Array, why: string): void {
    this.stats.invalid++;
    this.o.deadLetters?.send({ family: "flow", subject, reason: `flow summary refused: ${why}`, data });
    // One line per 10 s at most: a misbehaving publisher cannot flood the log.
    if (this.invalidLog.admit(Date.now()).log) this.o.log.warn({ subject: subject.slice(0, 200), why, invalid: this.stats.invalid }, "flow summary ignored");
  }

  private bandsNow(): string {
    let sig = "";
    for (const [model, q] of this.o.flow.queueSummaries()) sig += `${model}:${q.summary().map((b) => b.band).join(",")};`;
    return sig;
  }

  /** Publishes this replica's summary while it holds anything, and once when it stops (`force`: the bands changed). */
  publish(force = false): void {
    const holding = this.o.flow.held > 0;
    if (!holding && !this.wasHolding && !force) return;
    this.wasHolding = holding;
    this.lastBands = this.bandsNow();
    const s = summaryOf(this.o.gatewayId, this.o.clock(), this.o.flow.queueSummaries());
    try {
      this.o.nc.publish(this.o.subjects.flow(this.o.gatewayId), JSON.stringify(s));
      this.stats.sent++;
    } catch {
      // Disconnected: the next interval tries again; the others' staleness bound covers the gap.
    }
  }

  /** Stops; a replica that held anything says it holds nothing now, so the others stop yielding to it at once. */
  stop(): void {
    clearInterval(this.pumpTimer);
    clearInterval(this.summaryTimer);
    if (this.wasHolding) this.publish(true);
    this.sub.unsubscribe();
  }
}
