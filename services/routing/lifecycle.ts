/**
 * A routed request's life after its decision, apart from routing: its first token, its end
 * (release + decision record), a strict-mode charge's commit or retraction, a refusal's record,
 * and the replica's drain. Owns the requests in flight and the charge counter.
 */
import { randomUUID } from "node:crypto";
import type { ReleaseEvent, ReleaseOutcome } from "../../schemas/events.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { PodInfo } from "../views/pod-set.js";
import { chargeIdOf } from "./charge-id.js";
import { rejectedRecord, routedRecord } from "./decision-record.js";
import { RouteError } from "./errors.js";
import type { FlowController } from "./flow/controller.js";
import type { EventSink } from "./ports.js";
import type { FinishInfo, RoutedRequest } from "./request.js";
import type { PdCoordinator } from "./stages/pd-coordinator.js";

const round2 = (x: number) => Math.round(x * 100) / 100;

/**
 * The release's latency sample (docs/latency-model.md): a completed streamed request's features
 * and the TTFT and TPOT it saw. Not for a P/D leg (its TTFT spans two pods), nor for a request
 * answered whole (its first bytes are its last: no TTFT).
 */
function latencySampleOf(r: RoutedRequest, outcome: ReleaseOutcome, info: FinishInfo, now: number): { latency?: ReleaseEvent["latency"] } {
  if (!r.latency || outcome !== "completed" || r.pd || r.stream !== true) return {};
  const ttft = r.firstChunkAt !== undefined ? r.firstChunkAt - r.startedAt : undefined;
  const tokens = info.completionTokens;
  const tpot = r.firstChunkAt !== undefined && tokens !== undefined && tokens > 1 ? (now - r.firstChunkAt) / (tokens - 1) : undefined;
  return { latency: { ...r.latency, ...(ttft !== undefined ? { ttftMs: round2(ttft) } : {}), ...(tpot !== undefined ? { tpotMs: round2(tpot) } : {}) } };
}

export interface LifecycleDeps {
  gatewayId: string;
  defaultStrategy: string;
  state: GatewayState;
  sink: EventSink;
  now: () => number;
  pd: PdCoordinator;
  flow: FlowController;
  recordRouted?: (pod: PodInfo, hashes: readonly bigint[], now: number, chargeId: string) => void;
}

export class RequestLifecycle {
  /** Requests routed and not yet finished, by charge id (drained on shutdown). */
  readonly inFlight = new Map<string, RoutedRequest>();
  private chargeSeq = 0;
  /** Set by `drain`: the gateway is shutting down and routes nothing more. */
  private closedFlag = false;
  /** A flow-control pump is queued for this turn (releases coalesce into one). */
  private pumpQueued = false;
  /** Charges made with `publish: false` whose routed prefix waits for `committed` (dropped with the request if it never is). */
  private readonly routedPending = new WeakMap<RoutedRequest, readonly bigint[]>();

  constructor(private readonly d: LifecycleDeps) {}

  get closed(): boolean {
    return this.closedFlag;
  }

  /** Charges made so far (the number in the last charge id). */
  get chargesMade(): number {
    return this.chargeSeq;
  }

  /**
   * The next charge id: unique within this gateway process (the ledger keys charges by gateway
   * id + charge id), and increasing in routing order: replay orders this gateway's own events by it.
   */
  nextChargeId(): string {
    return chargeIdOf(++this.chargeSeq);
  }

  /** A request was charged: it is in flight until it finishes (or is retracted). */
  track(r: RoutedRequest): void {
    this.inFlight.set(r.chargeId, r);
  }

  /** A charge left to its committer: its routed prefix is recorded when it is committed. */
  holdRouted(r: RoutedRequest, hashes: readonly bigint[]): void {
    this.routedPending.set(r, hashes);
  }

  /** Every request holding a charge of this replica: what heartbeats list. */
  *holdingCharges(): Iterable<RoutedRequest> {
    yield* this.inFlight.values();
    yield* this.d.pd.lingering;
  }

  /** The request's first response bytes arrived: it moved from prefill to decode. */
  firstToken(r: RoutedRequest, at = this.d.now()): void {
    if (r.firstChunkAt !== undefined || r.finished) return;
    r.firstChunkAt = at;
    // Which of this replica's routing decisions came before it, exactly (a time cannot say within a millisecond).
    r.firstTokenAfterCharge = this.chargeSeq;
    this.d.state.ownFirstToken(r.chargeId);
  }

  /**
   * A strict-mode charge was acknowledged (or published after all): other replicas can only see
   * it from now on, so the burst guard counts it as unseen from now (not from when it was made),
   * and its routed prefix is recorded and published now, naming the pod it was committed to.
   */
  committed(r: RoutedRequest): void {
    const now = this.d.now();
    this.d.state.ownCommitted(r.admission, now);
    const hashes = this.routedPending.get(r);
    if (!hashes) return;
    this.routedPending.delete(r);
    this.d.recordRouted?.(r.pod, hashes, now, r.chargeId);
  }

  /** Publishes a charge made with `publish: false` the eventual way. */
  publishCharge(r: RoutedRequest): void {
    this.d.sink.charge(r.charge);
  }

  /**
   * Undoes a charge that was never published (a strict-mode commit lost its race). With
   * `keepCounts` the request stays counted in the rate windows: it is about to be retried (pass
   * it as `carry`), and its slot must not go to another request meanwhile.
   */
  retract(r: RoutedRequest, keepCounts = false): void {
    if (r.finished) return;
    r.finished = true;
    this.inFlight.delete(r.chargeId);
    this.d.state.ownRetract(r.charge, r.countedAt, r.admission, keepCounts);
  }

  /** Takes a request that will not be routed after all out of the rate windows. */
  uncount(r: RoutedRequest): void {
    this.d.state.ownUncount(r.charge, r.countedAt, r.admission);
  }

  /** Ends a routed request: releases its charge and records the decision. Idempotent. */
  finish(r: RoutedRequest, outcome: ReleaseOutcome, info: FinishInfo): boolean {
    if (r.finished) return false;
    r.finished = true;
    this.inFlight.delete(r.chargeId);
    this.d.pd.requestEnded(r, outcome, info.status);
    const now = this.d.now();
    const release: ReleaseEvent = {
      type: "release",
      id: r.chargeId,
      gateway: this.d.gatewayId,
      model: r.pod.model,
      pod: r.pod.pod,
      ts: now,
      outcome,
      // The engine's own counts: other replicas replace the charge's prompt estimate with it.
      ...(info.promptTokens !== undefined ? { promptTokens: info.promptTokens, chargedPromptTokens: r.promptTokens, chargedAt: r.countedAt } : {}),
      ...(info.completionTokens !== undefined ? { completionTokens: info.completionTokens } : {}),
      ...(r.user ? { user: r.user } : {}),
      ...latencySampleOf(r, outcome, info, now),
    };
    this.d.state.ownRelease(release);
    this.d.sink.release(release);
    // A pod got room: held requests may go (after this call, not inside the caller's).
    if (this.d.flow.held > 0 && !this.pumpQueued) {
      // One pump for a burst of releases in the same turn.
      this.pumpQueued = true;
      queueMicrotask(() => {
        this.pumpQueued = false;
        this.d.flow.pump();
      });
    }
    this.d.sink.decision(routedRecord(this.d.gatewayId, r, outcome, info, now));
    return true;
  }

  /** Records a request refused before routing (the decision stream sees rejections too). */
  reject(headers: Readonly<Record<string, string>>, model: string | undefined, err: RouteError): void {
    this.d.sink.decision(rejectedRecord({ gateway: this.d.gatewayId, headers, model, err, now: this.d.now(), defaultStrategy: this.d.defaultStrategy, newId: randomUUID }));
  }

  /** Releases everything still in flight (clean shutdown); later routing attempts get a 503. */
  drain(): number {
    this.closedFlag = true;
    this.d.flow.drain(new RouteError("notReady", "gateway is shutting down"));
    let n = 0;
    for (const r of [...this.inFlight.values()]) if (this.finish(r, "shutdown", { status: 503 })) n++;
    this.d.pd.drain();
    return n;
  }
}
