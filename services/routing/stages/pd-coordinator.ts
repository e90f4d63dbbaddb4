/**
 * The P/D coordinator: a disaggregated request's charges, beside the legs stage that runs its
 * prefill leg (pd-legs.ts). It charges the prefill pod of each attempt, ends that charge (once)
 * with the leg's decision record, picks another prefill pod of the roleset for a retry, and holds
 * the requests whose SGLang prefill leg outlives their decode ("lingering": their prefill charge
 * is released when the leg returns). Pure apart from the injected sink and clock.
 */
import type { ChargeEvent, DecisionRecord, ReleaseEvent, ReleaseOutcome } from "../../../schemas/events.js";
import type { ChargeLedger } from "../../views/charge-ledger.js";
import type { GatewayState } from "../../views/gateway-state.js";
import type { PodInfo, PodSet } from "../../views/pod-set.js";
import { prefillChargeIdOf } from "../charge-id.js";
import { prefillLegRecord } from "../decision-record.js";
import type { PdRouted, RoutedRequest } from "../request.js";
import { DEFAULT_ROLESET, type PdPlan } from "../strategies/pd.js";

export interface PdCoordinatorDeps {
  gatewayId: string;
  /** The fold the charges are applied to as they are made. */
  state: Pick<GatewayState, "ownCharge" | "ownRelease">;
  views: { pods: PodSet; ledger: ChargeLedger };
  sink: { charge(ev: ChargeEvent): void; release(ev: ReleaseEvent): void; decision(rec: DecisionRecord): void };
  now(): number;
  /** The prefill pod that computed a prompt keeps it cached: its routed prefix is recorded. */
  recordRouted?(pod: PodInfo, hashes: readonly bigint[], now: number, chargeId: string): void;
  /**
   * Runs a completed vLLM prefill leg's decision record's publishing after the
   * decode leg's reply went to the proxy, off the request's critical path (the gateway: setImmediate).
   * Absent: at once. The fold (the charge ended in this replica's ledger) is never deferred.
   */
  defer?(fn: () => void): void;
}

export class PdCoordinator {
  /** P/D plans made: disaggregated, prefill skipped by the decider, combined fallbacks, unusable rolesets seen. */
  readonly stats = { disaggregated: 0, skipped: 0, combined: 0, unusableRolesets: 0 };
  /** Finished requests whose SGLang prefill leg is still out (its charge is released when it returns). */
  readonly lingering = new Set<RoutedRequest>();

  constructor(private readonly d: PdCoordinatorDeps) {}

  /** Counts a `pd` strategy's plan; for a disaggregated one, starts its prefill leg's bookkeeping (and charge, unless skipped). */
  planned(r: RoutedRequest, plan: PdPlan): void {
    const st = this.stats;
    if (plan.kind === "combined") st.combined++;
    else if (plan.skipPrefill) st.skipped++;
    else st.disaggregated++;
    st.unusableRolesets += plan.unusable.length;
    if (plan.kind !== "pd") return;
    r.pd = { plan, prefillPod: plan.prefill, tried: new Set([plan.prefill.pod]), attempts: 0 };
    if (!plan.skipPrefill) this.chargePrefill(r, plan.prefill);
  }

  /** Charges a prefill pod for the request's prefill leg (an attempt; a retry charges another pod). */
  private chargePrefill(r: RoutedRequest, pod: PodInfo): void {
    const pd = r.pd as PdRouted;
    pd.attempts++;
    pd.prefillPod = pod;
    pd.tried.add(pod.pod);
    const { maxTokens: _decodeOnly, ...base } = r.charge;
    const charge: ChargeEvent = { ...base, id: prefillChargeIdOf(r.chargeId, pd.attempts), pod: pod.pod, model: pod.model, ts: this.d.now(), phase: "prefill" };
    pd.prefillCharge = charge;
    // One request, counted once in the rate windows: by its decode charge.
    this.d.state.ownCharge(charge, charge.ts, { counted: false });
    this.d.sink.charge(charge);
  }

  /**
   * Ends the current prefill attempt's charge (once) and records the prefill leg. With
   * `afterReply` (a vLLM leg that completed) the decision record is published through `defer`;
   * the ledger is updated and the release published now either way.
   */
  endPrefill(r: RoutedRequest, outcome: ReleaseOutcome, status: number, afterReply = false): void {
    const pd = r.pd;
    const charge = pd?.prefillCharge;
    if (!pd || !charge) return;
    pd.prefillCharge = undefined;
    this.lingering.delete(r);
    const now = this.d.now();
    // The prefill pod that computed the prompt keeps it cached (the one of the attempt that succeeded).
    const hashes = r.inputs.blocks?.hashes;
    if (outcome === "completed" && hashes && hashes.length > 0) this.d.recordRouted?.(pd.prefillPod, [...hashes], charge.ts, charge.id);
    const release: ReleaseEvent = { type: "release", id: charge.id, gateway: this.d.gatewayId, model: charge.model, pod: charge.pod, ts: now, outcome, ...(r.user ? { user: r.user } : {}) };
    this.d.state.ownRelease(release);
    // The release goes out now, in its place among this replica's charges (a release batch stamps
    // it with the charges made so far: replay's ordering); only the decision record may wait.
    this.d.sink.release(release);
    const publish = () => {
      pd.publishPrefill = undefined;
      this.d.sink.decision(prefillLegRecord(this.d.gatewayId, r, pd, charge, outcome, status, now));
    };
    if (!afterReply || !this.d.defer) {
      publish();
      return;
    }
    pd.publishPrefill = publish;
    this.d.defer(() => pd.publishPrefill?.());
  }

  /** A retry: charges the least loaded prefill pod of the roleset not tried yet; false when none is left. */
  /** A retry goes to a pod still routable now: ready and not draining (the autoscaler's handshake). */
  retryPrefill(r: RoutedRequest): boolean {
    const isRoutable = (p: { ready: boolean; draining?: unknown } | undefined) => p === undefined || (p.ready !== false && p.draining === undefined);
    const pd = r.pd;
    if (!pd || r.finished) return false;
    const { pods, ledger } = this.d.views;
    // Only the plan's roleset: its decode pod reads the KV from one of its own prefill pods.
    const left = pd.plan.prefillCandidates.map((c) => c.pod).filter((p) => (p.roleset ?? DEFAULT_ROLESET) === pd.plan.roleset && !pd.tried.has(p.pod) && isRoutable(pods.get(p.model, p.pod)));
    if (left.length === 0) return false;
    const next = left.reduce((a, b) => (ledger.outstanding(b.model, b.pod).requests < ledger.outstanding(a.model, a.pod).requests ? b : a));
    this.chargePrefill(r, next);
    return true;
  }

  /**
   * The request ended (`outcome`) while its prefill leg may still be out: a failed or cancelled
   * request ends the leg now; a completed SGLang request keeps it lingering until it returns.
   */
  requestEnded(r: RoutedRequest, outcome: ReleaseOutcome, status: number): void {
    const pd = r.pd;
    // A deferred prefill record goes out before the decode's (records of one request stay in leg order).
    pd?.publishPrefill?.();
    if (!pd?.prefillCharge) return;
    if (outcome !== "completed") pd.cancelPrefill?.();
    if (outcome !== "completed" || pd.plan.engine !== "sglang") this.endPrefill(r, outcome === "completed" ? "cancelled" : outcome, outcome === "completed" ? 499 : status);
    else this.lingering.add(r);
  }

  /** Shutdown: every lingering prefill leg is cancelled and its charge released. */
  drain(): void {
    for (const r of [...this.lingering]) {
      r.pd?.cancelPrefill?.();
      this.endPrefill(r, "shutdown", 503);
    }
  }
}
