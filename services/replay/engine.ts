/**
 * The replay engine: re-decides recorded requests on the views their gateway had. Pure: it is fed
 * messages (from NATS or an export file, merged in server-time order by the shell) and returns a
 * report; no I/O, no clock.
 *
 * Per recorded gateway G it keeps a GatewayState of its own (the same fold the gateway runs) and,
 * for each of G's decisions, advances that fold to exactly what G had applied: every stream up to
 * the decision's cursors (other gateways' events; G's echoes are ignored, as live), plus G's own
 * events made before this decision — its charges and releases before the decision's charge on
 * CHARGES, its routed prefixes with smaller charge ids on KV, the first tokens it had seen (from
 * its other decision records). Then it runs the scheduling stage with the recorded inputs:
 * - fidelity: the recorded strategy must pick the recorded pod (tie-breaks are seeded by request
 *   id, gateway and charge id; the tie order by the recorded rank);
 * - counterfactuals: each `--strategies` entry picks on the same views, except that its load is a
 *   ledger of its own picks (each charged at the decision time and released after the recorded
 *   duration), as if the whole fleet had used it; prefix hits and regret come from the index as
 *   of the decision.
 *
 * Decision records are published when a request ends, so they arrive out of routing order. A
 * decision is evaluated once every earlier charge of its gateway has its decision (or has been
 * released without one for `lostDecisionMs`, or is older than `reorderMs`): memory holds the
 * messages between the slowest gateway's fold and the read head, bounded by those windows.
 *
 * This file holds the folds and the fidelity check; the decoding of messages and their buffers
 * are in message-log.ts, the counterfactual arms and their report sections in counterfactuals.ts.
 */
import { checkEvent } from "../../schemas/validate.js";
import { DECISION_RECORD_VERSION, type DecisionRecord, type EngineLoadFields, type ReleaseEvent } from "../../schemas/events.js";
import { GatewayState, type GatewayStateOptions, STATE_STREAMS, type StateStream } from "../views/gateway-state.js";
import { hexToHash } from "../views/block-hash.js";
import { decodeBlockHashes } from "../views/packed-hashes.js";
import type { PodLoad } from "../views/load-view.js";
import type { PodInfo } from "../views/pod-set.js";
import { RouteError, matchPrefix, type PrefixMatchResult, schedule, parseStrategy, strategyTraits, chargeSeqOf, isPrefillLegCharge, type RoutingRequest, validateModelConfig, featureVector, latencyFeaturesOf, inputsOfRecord, enginePriorityFor } from "../routing/mod.js";
import type { FidelityExample, ReplayReport } from "./report-types.js";
import { type TraceRequest, ttftHistogram } from "./whatif.js";
import { type Buffered, bufferedOf, Log, type ReplayMessage, type ReplayStream } from "./message-log.js";
import { Counterfactuals, DecisionDraws } from "./counterfactuals.js";
import { LatencyModel, UNCLASSED } from "../views/latency-model.js";
import { PredictionError } from "./prediction-error.js";
import { MinHeap } from "../shared/min-heap.js";

export type { ReplayMessage, ReplayStream } from "./message-log.js";

export interface ReplayOptions {
  /** Decisions routed in [fromMs, toMs] are evaluated. */
  fromMs: number;
  toMs: number;
  /** Counterfactual strategy specs. */
  strategies: readonly string[];
  /** How long a decision may wait for an earlier one of its gateway (stream time). Default 60 s. */
  reorderMs?: number;
  /** A charge released this long ago (stream time) without its decision arriving: the decision is lost. Default 2 s. */
  lostDecisionMs?: number;
  /** The folds' bounds (as the gateways were run). */
  state?: Omit<GatewayStateOptions, "self">;
  /** Timeline buckets over the window. Default 60. */
  timelineBuckets?: number;
  /** Top regrets listed. Default 20. */
  topRegrets?: number;
  /** Keep the arrival trace of evaluated decisions (for the what-if simulation), up to this many. Default 0. */
  traceLimit?: number;
  source?: string;
}

interface Pending {
  d: DecisionRecord;
  chargeSeq: number;
  arrivedAt: number;
}

/** An own release seen in the look-ahead window, waiting for a decision whose charge comes after its `afterCharge`. */
interface AheadRelease {
  afterCharge: number;
  /** Its message's position in the CHARGES log, and its index within a `releases` batch (0 for a single release). */
  pos: number;
  item: number;
  ev: ReleaseEvent;
}

interface AheadReleases {
  /** Index into `own.charges` up to which the look-ahead has read. */
  scanned: number;
  /** By `afterCharge`: the smallest comes out first. */
  heap: MinHeap<AheadRelease>;
}

const aheadOrder = (a: AheadRelease, b: AheadRelease) => a.pos - b.pos || a.item - b.item;

interface Replica {
  id: string;
  state: GatewayState;
  /** Next position to apply per stream (others' events). */
  heads: Record<StateStream, number>;
  /** Positions of this gateway's own messages on CHARGES and KV, in order, and how far they are applied. */
  own: { charges: number[]; kv: number[]; chargesNext: number; kvNext: number };
  /** Own releases stamped with `afterCharge` in the look-ahead window past `own.chargesNext` (see `applyDelayedReleases`). */
  ahead: AheadReleases;
  pending: Pending[];
  /** Own charges seen on CHARGES without their decision: charge seq -> when seen / released, and the charge's own time. */
  awaiting: Map<number, { seenTs: number; chargeTs: number; releasedTs?: number }>;
  /** Charges whose record was given up on (so a record arriving later is counted once, as late). */
  givenUp: Map<number, "decision-lost" | "waited-too-long">;
  /** First tokens of own requests (from their decision records), by charge id: the time, and the gateway's charge count then. */
  firstToken: Map<string, { at: number; afterCharge: number | undefined }>;
  /** Own charges applied and not yet decoding. */
  undecoded: Set<string>;
  /** Own releases applied ahead of their stream position (batched after later charges); bounded by the look-ahead. */
  releasedAhead: Set<string>;
  /** The gateway stamps its releases with `afterCharge` (it batches them): its decisions are held back `RELEASE_HOLD_MS`. */
  batchesReleases: boolean;
  lastEvaluated: number;
  nextSweep: number;
  nextRoutedSweep: number;
  /** Server time of the gateway's last own message or record: a gateway silent for long is dropped. */
  lastSeenTs: number;
}

/**
 * Stream time a decision is held back before it is evaluated, so that releases its gateway batched
 * (5 ms by default, `--release-batch-ms`) and published after the decision's charge are buffered.
 */
const RELEASE_HOLD_MS = 50;
/** Own messages looked past for releases batched after later charges (a window of a few ms of one gateway's traffic). */
const DELAYED_RELEASE_LOOKAHEAD = 512;
/** The residual of a pick that depended on a pod-watcher source's silence (see `podLivenessNear`). */
export const POD_LIVENESS_RESIDUAL = "pod-watcher silence judged on the gateway's clock";
/** How near its timeout a source's silence must be to explain a residual: the gateway's sweep period plus its clock estimate's error. */
const POD_LIVENESS_SLACK_MS = 2_000;
/** Residual picks listed in the report's `fidelity.examples`. */
const MAX_FIDELITY_EXAMPLES = 20;
/** How much recent stream time the buffers keep beyond what every fold has passed. */
const YOUNG_MS = 1_000;
/** An idle gateway silent this long (stream time: no heartbeat, charge or record) is dropped. */
const DROP_SILENT_MS = 30_000;

export class ReplayEngine {
  private readonly o: Required<Pick<ReplayOptions, "reorderMs" | "lostDecisionMs" | "timelineBuckets" | "topRegrets">> & ReplayOptions;
  private readonly logs: Record<StateStream, Log> = { pods: new Log(), load: new Log(), charges: new Log(), kv: new Log(), config: new Log() };
  private readonly lastSeq: Record<ReplayStream, number> = { pods: 0, load: 0, charges: 0, kv: 0, config: 0, decisions: 0 };
  /** First sequence delivered per stream: a decision whose view predates it cannot be rebuilt. */
  private readonly firstSeq: Record<ReplayStream, number> = { pods: 0, load: 0, charges: 0, kv: 0, config: 0, decisions: 0 };
  /** Per stream, how far the base fold has applied the buffer (absolute position). */
  private readonly baseApplied: Record<StateStream, number> = { pods: 0, load: 0, charges: 0, kv: 0, config: 0 };
  /** The fold of everything before the buffers: where a gateway that appears later starts. */
  private readonly base: GatewayState;
  private readonly replicas = new Map<string, Replica>();
  private watermark = 0;
  /** The recorded picks and the `strategies` ones, scored on each evaluated decision's views. */
  private readonly arms: Counterfactuals;
  private readonly ttft: number[] = [];
  /** Flow control: recorded waits per band (every flow-controlled request, held or not). */
  private readonly flowWaits = new Map<number, number[]>();
  private readonly counts = {
    read: 0,
    evaluated: 0,
    rejected: 0,
    skipped: {} as Record<string, number>,
    eventsApplied: 0,
    eventsSkipped: {} as Record<string, number>,
    reproduced: 0,
    residuals: {} as Record<string, number>,
    rewrites: { evaluated: 0, reproduced: 0 },
    enginePriority: { evaluated: 0, reproduced: 0 },
  };
  private readonly warnings = new Set<string>();
  /** Arrival trace for the what-if simulation, and the largest fleet seen per model. */
  readonly trace: TraceRequest[] = [];
  readonly fleet: Record<string, number> = {};
  /** Per model, the largest KV cache of its pods in tokens, from their load samples (num_gpu_blocks x block_size). */
  readonly kvCapacityTokens: Record<string, number> = {};
  /** Per model, the largest number of candidates seen per pod class (the calibrated what-if's fleet). */
  readonly fleetClasses: Record<string, Record<string, number>> = {};
  /** The recorded outcomes of the window, one fit per (model, pod class): the calibrated what-if's engine parameters. */
  readonly calibration = new LatencyModel({ bucketMs: 2 ** 50, windowBuckets: 1, maxBucketSamples: Number.MAX_SAFE_INTEGER });
  /** The recorded predictions against the recorded outcomes (decision records' `prediction`). */
  private readonly predictionError = new PredictionError();
  /** How often each strategy was recorded in the window (the calibrated what-if re-runs the most common). */
  readonly recordedStrategies = new Map<string, number>();

  constructor(opts: ReplayOptions) {
    this.o = { reorderMs: 60_000, lostDecisionMs: 2_000, timelineBuckets: 60, topRegrets: 20, ...opts };
    this.base = new GatewayState({ checkModelConfig: validateModelConfig, ...opts.state });
    // Validated here: an unknown strategy fails before any work (a StrategySpecError naming it).
    this.arms = new Counterfactuals(opts.strategies, this.o);
  }

  private skip(bucket: Record<string, number>, why: string): void {
    bucket[why] = (bucket[why] ?? 0) + 1;
  }

  /** Feeds one message; messages must come in server-time order across streams (per stream: in sequence order). */
  offer(m: ReplayMessage): void {
    if (m.serverTs > this.watermark) this.watermark = m.serverTs;
    const prev = this.lastSeq[m.stream];
    if (m.seq <= prev) {
      this.skip(this.counts.eventsSkipped, "duplicate");
      return;
    }
    if (this.firstSeq[m.stream] === 0) {
      this.firstSeq[m.stream] = m.seq;
      if (m.stream === "kv" && m.seq > 1) this.warnings.add(`KV history starts at sequence ${m.seq} (older messages were purged): blocks stored before it are missing from the rebuilt prefix index`);
    }
    if (prev > 0 && m.seq > prev + 1) {
      // Messages missing from the stream: purged, deleted, or lost between export and now.
      this.counts.eventsSkipped.missing = (this.counts.eventsSkipped.missing ?? 0) + (m.seq - prev - 1);
      this.warnings.add(`${m.stream}: ${m.seq - prev - 1} message(s) missing before sequence ${m.seq} (purged or deleted); views may differ from the gateways'`);
    }
    this.lastSeq[m.stream] = m.seq;
    if (m.stream === "decisions") {
      this.offerDecision(m);
      return;
    }
    const b = bufferedOf(m.stream, m);
    if (b.ev === undefined) this.skip(this.counts.eventsSkipped, "invalid");
    const pos = this.logs[m.stream].push(b);
    if (b.gateway !== undefined) {
      const r = this.replicaOf(b.gateway);
      r.lastSeenTs = m.serverTs;
      if (m.stream === "charges") {
        r.own.charges.push(pos);
        const ev = b.ev;
        // Only charges routed inside the window have a record to wait for.
        if (ev?.type === "charge" && b.chargeSeq !== undefined && !isPrefillLegCharge(ev.id) && b.chargeSeq > r.lastEvaluated && ev.ts >= this.o.fromMs && ev.ts <= this.o.toMs) r.awaiting.set(b.chargeSeq, { seenTs: m.serverTs, chargeTs: ev.ts });
        // The lapse its ledger judged peers by: as run (`state.heartbeatTimeoutMs`), else the
        // gateways' default, 3 x its heartbeat interval.
        if (ev?.type === "heartbeat" && this.o.state?.heartbeatTimeoutMs === undefined) r.state.ledger.heartbeatTimeoutMs = 3 * ev.intervalMs;
        for (const rel of ev?.type === "release" ? [ev] : ev?.type === "releases" ? ev.releases : []) {
          if (rel.afterCharge !== undefined) r.batchesReleases = true;
          if (isPrefillLegCharge(rel.id)) continue;
          const a = r.awaiting.get(chargeSeqOf(rel.id) ?? -1);
          if (a) a.releasedTs = m.serverTs;
        }
      } else if (m.stream === "kv") r.own.kv.push(pos);
    }
    this.pump();
  }

  private offerDecision(m: ReplayMessage): void {
    if (m.invalid) {
      this.skip(this.counts.skipped, "invalid");
      return;
    }
    const raw = m.data as { type?: unknown; v?: unknown } | null;
    if (raw?.type !== "decision") {
      this.skip(this.counts.skipped, "not-a-decision");
      return;
    }
    if (typeof raw.v !== "number" || raw.v < DECISION_RECORD_VERSION) {
      this.warnings.add(`decision records of version ${typeof raw.v === "number" ? raw.v : 1} cannot be replayed (no view cursors); this build reads version ${DECISION_RECORD_VERSION}`);
      this.skip(this.counts.skipped, "other-version");
      return;
    }
    if (raw.v > DECISION_RECORD_VERSION) {
      this.warnings.add(`decision records of version ${raw.v} are newer than this build (${DECISION_RECORD_VERSION}); upgrade jetroute to replay them`);
      this.skip(this.counts.skipped, "other-version");
      return;
    }
    const c = checkEvent("decision", raw);
    if (!c.ok) {
      this.skip(this.counts.skipped, "invalid");
      return;
    }
    const d = c.event;
    // A P/D prefill leg's record: its request is re-decided by the decode leg's record.
    if (d.pd?.leg === "prefill") {
      this.skip(this.counts.skipped, "pd-prefill-leg");
      return;
    }
    const cs = chargeSeqOf(d.charge);
    // Whatever becomes of the record, its charge no longer waits for it.
    if (cs !== undefined) this.replicas.get(d.gateway)?.awaiting.delete(cs);
    if (d.ts < this.o.fromMs || d.ts > this.o.toMs) {
      this.skip(this.counts.skipped, "outside-window");
      return;
    }
    this.counts.read++;
    if (d.pick === null || d.outcome === "rejected") {
      this.counts.rejected++;
      return;
    }
    if (d.ttftMs !== undefined) this.ttft.push(d.ttftMs);
    this.predictionError.record(d);
    if (!d.pd && this.recordedStrategies.size < 256) this.recordedStrategies.set(d.strategy, (this.recordedStrategies.get(d.strategy) ?? 0) + 1);
    if (d.flow) {
      const waits = this.flowWaits.get(d.flow.band) ?? [];
      waits.push(d.flow.waitMs);
      this.flowWaits.set(d.flow.band, waits);
    }
    if (cs === undefined || !d.cursors) {
      this.skip(this.counts.skipped, "no-cursors");
      return;
    }
    const r = this.replicaOf(d.gateway);
    r.lastSeenTs = Math.max(r.lastSeenTs, m.serverTs);
    // Everything up to a record's cursors was published before the record, and sources merge by
    // server time: a stream that has delivered nothing up to its cursor yet never will.
    // (Config is not needed to re-decide: the record names its strategy, parameters and targets.)
    const purged = (["pods", "kv", "charges"] as const).find((st) => d.cursors && d.cursors[st] > 0 && (this.firstSeq[st] === 0 || d.cursors[st] < this.firstSeq[st]));
    if (purged) {
      this.warnings.add(
        `some decisions saw ${purged} messages older than the first one available (${this.firstSeq[purged] === 0 ? "none delivered" : `sequence ${this.firstSeq[purged]}`}: purged by retention, or before the read window); they were skipped`,
      );
      this.skip(this.counts.skipped, "history-purged");
      return;
    }
    if (d.cursors.load > 0 && this.firstSeq.load === 0) this.warnings.add("no LOAD history for the window (LOAD keeps 10 minutes): load-based picks are re-decided without samples");
    // A record given up on that still came is counted once: as late, or as evaluated.
    this.unGiveUp(r, cs);
    if (cs <= r.lastEvaluated) {
      // Its gateway's fold has moved past this decision's place (it arrived after `reorderMs`).
      this.skip(this.counts.skipped, "late");
      return;
    }
    if (d.ttftMs !== undefined && d.charge) r.firstToken.set(d.charge, { at: d.ts + d.ttftMs, afterCharge: d.firstTokenAfterCharge });
    insertSorted(r.pending, { d, chargeSeq: cs, arrivedAt: m.serverTs });
    this.pump();
  }

  private replicaOf(id: string): Replica {
    let r = this.replicas.get(id);
    if (r) return r;
    // A gateway seen for the first time starts from the fold of everything already dropped from the buffers.
    const heads = {} as Record<StateStream, number>;
    for (const st of STATE_STREAMS) heads[st] = this.baseApplied[st];
    r = {
      id,
      state: this.base.cloneAs(id),
      heads,
      own: { charges: [], kv: [], chargesNext: 0, kvNext: 0 },
      ahead: { scanned: 0, heap: new MinHeap<AheadRelease>((a, b) => a.afterCharge < b.afterCharge) },
      pending: [],
      awaiting: new Map(),
      givenUp: new Map(),
      firstToken: new Map(),
      undecoded: new Set(),
      releasedAhead: new Set(),
      batchesReleases: false,
      lastEvaluated: 0,
      nextSweep: 0,
      nextRoutedSweep: 0,
      lastSeenTs: this.watermark,
    };
    this.replicas.set(id, r);
    return r;
  }

  /** Evaluates every decision that is ready, runs the counterfactuals that are due, then drops what every fold has passed. */
  private pump(): void {
    for (const r of this.replicas.values()) {
      while (r.pending.length > 0) {
        const p = r.pending[0] as Pending;
        if (!this.ready(r, p)) break;
        r.pending.shift();
        this.evaluate(r, p.d, p.chargeSeq);
      }
    }
    this.runArms(false);
    // The buffers are trimmed every 256 messages: often enough to stay bounded, cheap per message.
    if ((++this.pumps & 255) === 0) this.trim();
  }

  private pumps = 0;

  private giveUp(r: Replica, seq: number, why: "decision-lost" | "waited-too-long"): void {
    r.awaiting.delete(seq);
    this.skip(this.counts.skipped, why);
    r.givenUp.set(seq, why);
    if (r.givenUp.size > 10_000) r.givenUp.delete(r.givenUp.keys().next().value as number);
  }

  /** Takes back the skip counted when `seq`'s record was given up on. */
  private unGiveUp(r: Replica, seq: number): void {
    const was = r.givenUp.get(seq);
    if (!was) return;
    r.givenUp.delete(seq);
    const left = (this.counts.skipped[was] ?? 1) - 1;
    if (left > 0) this.counts.skipped[was] = left;
    else delete this.counts.skipped[was];
  }

  private ready(r: Replica, p: Pending): boolean {
    // Releases made before this charge may still be in a batch published after it: wait until the
    // stream has moved past any batch window (`applyDelayedReleases` then finds them buffered).
    if (r.batchesReleases && this.watermark - p.arrivedAt < RELEASE_HOLD_MS) return false;
    for (const [seq, a] of r.awaiting) {
      if (seq >= p.chargeSeq) continue;
      const lost = a.releasedTs !== undefined && this.watermark - a.releasedTs >= this.o.lostDecisionMs;
      if (lost || this.watermark - a.seenTs >= this.o.reorderMs) {
        this.giveUp(r, seq, lost ? "decision-lost" : "waited-too-long");
        continue;
      }
      return false;
    }
    return true;
  }

  /** A replica with nothing to evaluate and no charge waiting for its record: it need not hold the buffers back. */
  private idle(r: Replica): boolean {
    if (r.pending.length > 0) return false;
    for (const [seq, a] of r.awaiting) {
      if (this.watermark - a.seenTs >= this.o.reorderMs) this.giveUp(r, seq, a.releasedTs !== undefined ? "decision-lost" : "waited-too-long");
      else return false;
    }
    return true;
  }

  /**
   * Moves the base fold up to what every busy replica has passed (keeping the last few seconds of
   * stream time for a gateway about to appear: it is seen at its first heartbeat, which it sends
   * once its own views caught up), brings idle replicas along, and lets the buffers drop it.
   */
  private trim(): void {
    const youngMs = Math.min(this.o.reorderMs, YOUNG_MS);
    const busy = [...this.replicas.values()].filter((r) => !this.idle(r));
    const keep = {} as Record<StateStream, number>;
    for (const st of STATE_STREAMS) {
      const log = this.logs[st];
      let k = log.end;
      for (const r of busy) k = Math.min(k, r.heads[st]);
      // Server times never decrease within a log: scan forward from what the base already has.
      let young = this.baseApplied[st];
      while (young < k && this.watermark - (log.at(young) as Buffered).serverTs > youngMs) young++;
      keep[st] = Math.max(this.baseApplied[st], young);
    }
    for (const r of [...this.replicas.values()]) {
      if (busy.includes(r)) continue;
      // Gone (restarted under a new id, scaled in): its fold is not needed any more; should it
      // come back, it starts again from the base fold, as a new gateway does.
      if (this.watermark - r.lastSeenTs > DROP_SILENT_MS) {
        this.replicas.delete(r.id);
        continue;
      }
      this.advanceTo(r, (st) => keep[st] - 1, Number.POSITIVE_INFINITY);
      this.applyOwnBefore(r, Number.POSITIVE_INFINITY, keep.charges, keep.kv);
    }
    for (const st of STATE_STREAMS) {
      const log = this.logs[st];
      for (let pos = this.baseApplied[st]; pos < keep[st]; pos++) this.applyTo(this.base, st, log.at(pos) as Buffered, undefined, false);
      this.baseApplied[st] = keep[st];
      log.trim(keep[st]);
    }
  }

  private applyTo(state: GatewayState, stream: StateStream, b: Buffered, self: string | undefined, count = true): void {
    if (!b.ev || (self !== undefined && b.gateway === self)) {
      // As live: an own echo is skipped unparsed, and only its heartbeat's server time is read
      // (it moves the ledger's clock, charge-ledger.ts); a dead letter's time is not.
      const ownBeat = b.ev?.type === "heartbeat" && b.gateway === self;
      state.skip({ stream, subject: b.subject, seq: b.seq, serverTs: ownBeat ? b.serverTs : 0 });
      return;
    }
    try {
      state.apply(b.ev, { stream, subject: b.subject, seq: b.seq, serverTs: b.serverTs });
      if (count) this.counts.eventsApplied++;
    } catch {
      // A schema-valid event a view cannot apply is a bug, but a replay must go on (as a follower does).
      if (count) this.skip(this.counts.eventsSkipped, "apply-failed");
    }
  }

  /**
   * Applies others' messages to the replica, every stream up to its bound (a position from
   * `uptoPos`, and a sequence `cursor`), merged by server time across streams (ties in the order
   * config, pods, load, charges, kv), as the followers received them: a pod removal forgets that
   * pod's load and blocks, so it must fall between the right messages of the other streams.
   */
  private advanceTo(r: Replica, uptoPos: (st: StateStream) => number, cursorOf: ((st: StateStream) => number) | number): void {
    const cursor = typeof cursorOf === "number" ? () => cursorOf : cursorOf;
    for (;;) {
      let best: StateStream | undefined;
      let bestTs = Number.POSITIVE_INFINITY;
      for (const st of STATE_STREAMS) {
        const h = r.heads[st];
        if (h > uptoPos(st) || h >= this.logs[st].end) continue;
        const b = this.logs[st].at(h) as Buffered;
        if (b.seq > cursor(st)) continue;
        if (b.serverTs < bestTs) {
          best = st;
          bestTs = b.serverTs;
        }
      }
      if (best === undefined) return;
      this.applyTo(r.state, best, this.logs[best].at(r.heads[best]) as Buffered, r.id);
      r.heads[best]++;
    }
  }

  /** An own release, once: one applied ahead of its position (`applyDelayedReleases`) is skipped when reached. */
  private applyOwnRelease(r: Replica, ev: ReleaseEvent): void {
    if (r.releasedAhead.delete(ev.id)) return;
    r.state.ownRelease(ev);
    r.undecoded.delete(ev.id);
    r.firstToken.delete(ev.id);
  }

  /**
   * A gateway batches its releases for a few ms (services/shared/publish.ts), so a release can sit
   * in the stream after charges made later than it. Its `afterCharge` (the gateway's charge count
   * when it released) says whether it came before charge `chargeSeq`: those buffered ahead of the
   * applied position (up to `DELAYED_RELEASE_LOOKAHEAD` own messages past it) are applied now, in
   * stream order, as the live gateway had them when it routed that charge.
   *
   * Incremental: each own message of the look-ahead window is read once (its stamped releases go
   * into a heap by `afterCharge`), not once per decision; a release the applied position has
   * reached meanwhile was applied in place and is dropped when it comes out of the heap.
   */
  private applyDelayedReleases(r: Replica, chargeSeq: number): void {
    const charges = this.logs.charges;
    const own = r.own;
    const ahead = r.ahead;
    const end = Math.min(own.charges.length, own.chargesNext + DELAYED_RELEASE_LOOKAHEAD);
    let i = Math.max(ahead.scanned, own.chargesNext);
    for (; i < end; i++) {
      const pos = own.charges[i] as number;
      const ev = charges.at(pos)?.ev;
      if (ev?.type === "release") {
        if (ev.afterCharge !== undefined) ahead.heap.push({ afterCharge: ev.afterCharge, pos, item: 0, ev });
      } else if (ev?.type === "releases") {
        for (let k = 0; k < ev.releases.length; k++) {
          const it = ev.releases[k] as (typeof ev.releases)[number];
          if (it.afterCharge !== undefined) ahead.heap.push({ afterCharge: it.afterCharge, pos, item: k, ev: { type: "release", gateway: ev.gateway, model: ev.model, pod: ev.pod, ...it } });
        }
      }
    }
    ahead.scanned = i;
    if (ahead.heap.size === 0 || (ahead.heap.peek() as AheadRelease).afterCharge >= chargeSeq) return;
    // Releases at positions before this one were applied in place.
    const applied = own.chargesNext < own.charges.length ? (own.charges[own.chargesNext] as number) : Number.POSITIVE_INFINITY;
    const due: AheadRelease[] = [];
    while (ahead.heap.size > 0 && (ahead.heap.peek() as AheadRelease).afterCharge < chargeSeq) {
      const x = ahead.heap.pop() as AheadRelease;
      if (x.pos >= applied) due.push(x);
    }
    if (due.length > 1) due.sort(aheadOrder);
    let again: AheadRelease[] | undefined;
    for (const x of due) {
      // The same id applied ahead already (a duplicate release): looked at again by later decisions, as in place.
      if (r.releasedAhead.has(x.ev.id)) (again ??= []).push(x);
      else {
        this.applyOwnRelease(r, x.ev);
        r.releasedAhead.add(x.ev.id);
      }
    }
    if (again) for (const x of again) ahead.heap.push(x);
  }

  /** Applies the replica's own events made before its charge number `chargeSeq` (and, for idle replicas, before the given positions). */
  private applyOwnBefore(r: Replica, chargeSeq: number, chargesPos = Number.POSITIVE_INFINITY, kvPos = Number.POSITIVE_INFINITY): void {
    const charges = this.logs.charges;
    while (r.own.chargesNext < r.own.charges.length) {
      const pos = r.own.charges[r.own.chargesNext] as number;
      if (pos >= chargesPos) break;
      const b = charges.at(pos);
      const ev = b?.ev;
      if (ev?.type === "charge") {
        if ((b?.chargeSeq ?? Number.POSITIVE_INFINITY) >= chargeSeq) break;
        r.state.ownCharge(ev, ev.ts);
        r.undecoded.add(ev.id);
      } else if (ev?.type === "release") this.applyOwnRelease(r, ev);
      else if (ev?.type === "releases") for (const it of ev.releases) this.applyOwnRelease(r, { type: "release", gateway: ev.gateway, model: ev.model, pod: ev.pod, ...it });
      r.own.chargesNext++;
    }
    // (Only when evaluating a decision: every own message is then applicable, `chargesPos` is unbounded.)
    if (r.batchesReleases && Number.isFinite(chargeSeq) && chargesPos === Number.POSITIVE_INFINITY) this.applyDelayedReleases(r, chargeSeq);
    const kv = this.logs.kv;
    while (r.own.kvNext < r.own.kv.length) {
      const pos = r.own.kv[r.own.kvNext] as number;
      if (pos >= kvPos) break;
      const b = kv.at(pos);
      if (b?.ev?.type === "kv-routed") {
        if (b.chargeSeq !== undefined && b.chargeSeq >= chargeSeq) break;
        r.state.ownRouted(b.ev, b.ev.hashes.map(hexToHash));
      }
      r.own.kvNext++;
    }
    // Compact the own-position lists now and then.
    if (r.own.chargesNext > 4096) {
      r.own.charges = r.own.charges.slice(r.own.chargesNext);
      r.ahead.scanned = Math.max(0, r.ahead.scanned - r.own.chargesNext);
      r.own.chargesNext = 0;
      // Releases the applied position passed wait in the heap until a decision comes after them: drop them now and then.
      const first = r.own.charges[0] ?? Number.POSITIVE_INFINITY;
      if (r.ahead.heap.size > 4 * DELAYED_RELEASE_LOOKAHEAD) r.ahead.heap.retain((x) => x.pos >= first);
    }
    if (r.own.kvNext > 4096) {
      r.own.kv = r.own.kv.slice(r.own.kvNext);
      r.own.kvNext = 0;
    }
  }

  private evaluate(r: Replica, d: DecisionRecord, chargeSeq: number): void {
    r.lastEvaluated = chargeSeq;
    const cursors = d.cursors as NonNullable<DecisionRecord["cursors"]>;
    // Already past a cursor: the fold had to move on before this decision could be evaluated.
    let ahead = false;
    for (const st of STATE_STREAMS) {
      const prev = this.logs[st].at(r.heads[st] - 1);
      if (prev !== undefined && prev.seq > cursors[st]) ahead = true;
    }
    this.advanceTo(r, () => Number.POSITIVE_INFINITY, (st) => cursors[st]);
    this.applyOwnBefore(r, chargeSeq);
    for (const id of r.undecoded) {
      const ft = r.firstToken.get(id);
      // Before this decision: by the gateway's charge count when it arrived; a record without one
      // (an older gateway) by its time, which cannot order the two within a millisecond.
      if (ft !== undefined && (ft.afterCharge !== undefined ? ft.afterCharge < chargeSeq : ft.at <= d.ts)) {
        r.state.ownFirstToken(id);
        r.undecoded.delete(id);
        r.firstToken.delete(id);
      }
    }
    // As live: expiry every 250 ms, routed prefixes every 5 s.
    if (d.ts >= r.nextSweep) {
      const routed = d.ts >= r.nextRoutedSweep;
      r.state.sweep(d.ts, { routed });
      r.nextSweep = d.ts + 250;
      if (routed) r.nextRoutedSweep = d.ts + 5_000;
    }
    this.counts.evaluated++;

    // The decision's inputs beyond the views, as the record keeps them (routing's decision-inputs.ts).
    const inputs = inputsOfRecord(d);
    const request: RoutingRequest = {
      model: d.model,
      requestId: d.id,
      promptTokens: d.routedPromptTokens ?? d.promptTokens ?? 0,
      ...(d.user ? { user: d.user } : {}),
      ...(inputs.session ? { session: inputs.session } : {}),
    };
    // A model rewrite: the pools' rules as of this decision's config cursor choose the same target.
    if (inputs.rewrite) {
      this.counts.rewrites.evaluated++;
      if (r.state.poolPolicies.rewrite(inputs.rewrite.from, d.id, r.state.pods)?.model === d.model) this.counts.rewrites.reproduced++;
    }
    // The engine's priority (stages/engine-fields.ts): the band, the picked pod as the views know it, the config at the cursor.
    if (inputs.enginePriority !== undefined && inputs.flow && d.pick) {
      this.counts.enginePriority.evaluated++;
      const pod = r.state.pods.readyPods(d.model).find((p) => p.pod === d.pick) ?? r.state.pods.get(r.state.pods.baseOf(d.model) ?? d.model, d.pick);
      if (pod) {
        const e = enginePriorityFor(inputs.flow.band, pod, r.state.configs.get(pod.model)?.flowControl?.enginePriority);
        if ((e.action === "set" ? e.value : e.reason) === inputs.enginePriority) this.counts.enginePriority.reproduced++;
      }
    }
    const hashes = d.blocks ? safeDecode(d.blocks.hashes) : undefined;
    let match: PrefixMatchResult | undefined;
    let matchedFor: readonly PodInfo[] | undefined;
    const blocks = d.blocks;
    const prefix =
      hashes && blocks
        ? (cands: readonly PodInfo[]) => {
            if (matchedFor !== cands) {
              match = matchPrefix(r.state, cands, hashes, blocks.size, blocks.mode === "approximate", d.ts);
              matchedFor = cands;
            }
            return match;
          }
        : undefined;
    const draws = new DecisionDraws(d);
    // Fidelity: the recorded strategy on the recorded views.
    try {
      const recorded = parseStrategy(d.strategy, inputs.strategyParams);
      const s = schedule({
        request,
        ...(inputs.subset ? { subset: inputs.subset } : {}),
        now: d.ts,
        ...(inputs.slo ? { slo: inputs.slo } : {}),
        views: r.state,
        strategy: recorded,
        random: draws.reader(),
        ...(inputs.rank ? { rank: inputs.rank } : {}),
        ...(recorded.needs?.promptTokenIds && prefix ? { prefix } : {}),
      });
      if (s.pick.pod.pod === d.pick) this.counts.reproduced++;
      else this.residual(d, this.residualOf(r, d, ahead), { pick: s.pick.pod.pod, candidates: s.pick.candidates.map((x) => ({ pod: x.pod.pod, score: x.score })) });
    } catch (err) {
      this.residual(d, err instanceof RouteError ? `no-candidates (${err.code})` : "strategy-error");
    }
    // The counterfactuals run later, in time order across gateways (their ledgers are shared by
    // the whole fleet): keep what they need of this decision's views.
    const candidates = r.state.pods.readyPods(d.model);
    if (candidates.length > 0) this.fleet[d.model] = Math.max(this.fleet[d.model] ?? 0, candidates.length);
    this.countClasses(d.model, candidates);
    if (this.trace.length < (this.o.traceLimit ?? 0)) {
      if (this.trace.length + 1 === this.o.traceLimit) this.warnings.add(`the what-if trace is limited to ${this.o.traceLimit} requests (--simulate-max)`);
      this.trace.push({
        requestId: d.id,
        ts: d.ts,
        model: d.model,
        blockSize: d.blocks?.size ?? 16,
        hashes: hashes && d.blocks?.mode === "precise" ? hashes.map((h) => h.toString(16)) : [],
        // The engine's count when it reported one: a strategy that did not tokenize routed on an estimate.
        promptTokens: d.promptTokens ?? d.routedPromptTokens ?? 0,
        outputTokens: d.completionTokens ?? d.maxTokens ?? 64,
      });
    }
    const loads = new Map<string, { fresh: EngineLoadFields | undefined; get: PodLoad | undefined }>();
    for (const p of candidates) {
      const fresh = r.state.load.fresh(p.model, p.pod, d.ts);
      loads.set(p.pod, { fresh, get: r.state.load.get(p.model, p.pod) });
      if (fresh?.numGpuBlocks && fresh.blockSize) this.kvCapacityTokens[d.model] = Math.max(this.kvCapacityTokens[d.model] ?? 0, fresh.numGpuBlocks * fresh.blockSize);
    }
    // vtc-basic reads the user's usage and the spread of all users' usage: as of this decision.
    const usage = r.state.usage;
    const userTokens = d.user ? usage.tokens(d.user, d.ts) : 0;
    const bounds = usage.bounds(d.ts);
    const recordedMatch = prefix && candidates.length > 0 ? prefix(candidates) : undefined;
    this.calibrate(r, d, candidates, recordedMatch);
    this.arms.add({
      d,
      draws,
      request,
      candidates,
      loads,
      usage: { tokens: (u) => (u === d.user ? userTokens : 0), bounds: () => bounds },
      match: recordedMatch,
      latency: r.state.latency,
    });
  }

  /**
   * Runs the counterfactual step of every evaluated decision no later decision can precede: one
   * whose time is before every busy replica's next decision (or all of them, at the end).
   */
  private runArms(all: boolean): void {
    let horizon = Number.POSITIVE_INFINITY;
    if (!all) {
      for (const r of this.replicas.values()) {
        const next = r.pending[0];
        if (next) horizon = Math.min(horizon, next.d.ts);
        for (const a of r.awaiting.values()) horizon = Math.min(horizon, a.chargeTs);
      }
    }
    // Strictly before: a decision of the same millisecond may still come from another gateway.
    this.arms.runBefore(horizon);
  }

  private residual(d: DecisionRecord, why: string, replayed?: FidelityExample["replayed"]): void {
    this.skip(this.counts.residuals, why);
    if (this.examples.length >= MAX_FIDELITY_EXAMPLES) return;
    this.examples.push({ id: d.id, gateway: d.gateway, ts: d.ts, strategy: d.strategy, residual: why, recorded: { pick: d.pick ?? "", candidates: d.candidates }, ...(replayed ? { replayed } : {}) });
  }

  private readonly examples: FidelityExample[] = [];

  /**
   * Whether the pods a decision could pick depended on a pod-watcher source's silence judged at
   * the moment of the decision: the gateway judges it on its own estimate of the broker's clock,
   * on a timer, which the record does not carry. True when a source of one of the model's pods
   * crosses its timeout within `POD_LIVENESS_SLACK_MS` of the decision.
   */
  private podLivenessNear(r: Replica, d: DecisionRecord): boolean {
    const timeout = r.state.podSourceTimeoutMs;
    if (!(timeout > 0)) return false;
    const used = new Set<string>();
    for (const p of r.state.pods.all()) if (p.model === d.model && p.source !== undefined) used.add(p.source);
    if (used.size === 0) return false;
    return r.state.pods.sourceInfo().some((s) => used.has(s.source) && Math.abs(d.ts - (s.lastSeen + timeout)) <= POD_LIVENESS_SLACK_MS);
  }

  private residualOf(r: Replica, d: DecisionRecord, ahead: boolean): string {
    if (d.consistency === "strict") return "strict-mode race";
    if (d.consistency === "off") return "consistency off";
    if (ahead) return "view moved on (late decision)";
    if (this.podLivenessNear(r, d)) return POD_LIVENESS_RESIDUAL;
    const traits = strategyTraits(d.strategy);
    if (d.blocks && traits.prefixMatch && d.blocks.total > (safeDecode(d.blocks.hashes)?.length ?? 0)) return "prompt blocks truncated in the record";
    return traits.replayResidual ?? "unexplained";
  }

  /** Decisions evaluated so far (for progress displays and the bench's split timing). */
  get evaluated(): number {
    return this.counts.evaluated;
  }

  /** Decisions waiting for an earlier one (for progress displays). */
  get waiting(): number {
    let n = 0;
    for (const r of this.replicas.values()) n += r.pending.length;
    return n;
  }

  /** Messages held in the buffers (bounded by the reorder window). */
  get buffered(): number {
    let n = 0;
    for (const s of STATE_STREAMS) n += this.logs[s].size;
    return n;
  }

  /**
   * The calibration sample of a streamed, completed decision: the picked pod's features on the
   * views its gateway had (the prefix match from the recorded blocks, whatever the strategy) and
   * the recorded outcome. A request answered whole has no TPOT worth the name (its first bytes
   * were its last): left out.
   */
  private calibrate(r: Replica, d: DecisionRecord, candidates: readonly PodInfo[], match: PrefixMatchResult | undefined): void {
    if (d.pd || d.outcome !== "completed" || d.ttftMs === undefined || d.tpotMs === undefined || d.tpotMs < 0.1) return;
    const pod = candidates.find((p) => p.pod === d.pick);
    if (!pod) return;
    // The engine's prompt count when it reported one (the routed count may be an estimate).
    const f = latencyFeaturesOf(r.state, pod, d.promptTokens ?? d.routedPromptTokens ?? 0, match?.info, d.ts);
    this.calibration.learn(d.model, d.ts, { x: featureVector(f), ...(pod.podClass ? { cls: pod.podClass } : {}), ttftMs: d.ttftMs, tpotMs: d.tpotMs });
  }

  private countClasses(model: string, candidates: readonly PodInfo[]): void {
    if (candidates.length === 0) return;
    const seen = new Map<string, number>();
    for (const p of candidates) seen.set(p.podClass ?? UNCLASSED, (seen.get(p.podClass ?? UNCLASSED) ?? 0) + 1);
    const max = (this.fleetClasses[model] ??= {});
    for (const [k, n] of seen) if (Object.keys(max).length < 64 || k in max) max[k] = Math.max(max[k] ?? 0, n);
  }

  /** Ends the input: every decision still waiting is evaluated, and the report is built. */
  finish(generatedAt: string): ReplayReport {
    this.watermark = Number.POSITIVE_INFINITY;
    this.pump();
    this.trim();
    for (const r of this.replicas.values()) {
      for (const p of r.pending.splice(0)) this.evaluate(r, p.d, p.chargeSeq);
    }
    this.runArms(true);
    const { strategies, timeline, agreement, topRegrets } = this.arms.report();
    const evaluated = this.counts.evaluated;
    const fidelityEvaluated = this.counts.reproduced + Object.values(this.counts.residuals).reduce((a, b) => a + b, 0);
    return {
      report: "jetroute-replay",
      version: 1,
      generatedAt,
      source: this.o.source ?? "",
      window: { fromMs: this.o.fromMs, toMs: this.o.toMs },
      decisions: { read: this.counts.read, evaluated, rejected: this.counts.rejected, skipped: this.counts.skipped },
      events: { applied: this.counts.eventsApplied, skipped: this.counts.eventsSkipped },
      fidelity: {
        evaluated: fidelityEvaluated,
        reproduced: this.counts.reproduced,
        ratio: fidelityEvaluated > 0 ? this.counts.reproduced / fidelityEvaluated : 1,
        residuals: this.counts.residuals,
        ...(this.examples.length > 0 ? { examples: this.examples } : {}),
        ...(this.counts.rewrites.evaluated > 0 ? { rewrites: this.counts.rewrites } : {}),
        ...(this.counts.enginePriority.evaluated > 0 ? { enginePriority: this.counts.enginePriority } : {}),
      },
      strategies,
      timeline,
      agreement,
      topRegrets,
      recordedTtft: ttftHistogram(this.ttft),
      ...(this.predictionError.decisions > 0 ? { prediction: this.predictionError.summary() } : {}),
      ...(this.flowWaits.size > 0
        ? {
            flow: [...this.flowWaits]
              .sort((a, b) => b[0] - a[0])
              .map(([band, waits]) => ({ band, requests: waits.length, held: waits.filter((w) => w > 0).length, wait: ttftHistogram(waits) })),
          }
        : {}),
      warnings: [...this.warnings],
    };
  }
}

function safeDecode(b64: string): bigint[] | undefined {
  try {
    return decodeBlockHashes(b64);
  } catch {
    return undefined;
  }
}

function insertSorted(list: Pending[], p: Pending): void {
  let i = list.length;
  while (i > 0 && (list[i - 1] as Pending).chargeSeq > p.chargeSeq) i--;
  list.splice(i, 0, p);
}
