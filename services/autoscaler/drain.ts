/**
 * The drain handshake's state machine, one per policy. Pure: time, the ledger and the gateways'
 * acknowledgements come in as arguments; the shell publishes and applies what it returns.
 *
 * A pod chosen to leave is marked draining (the pod-watcher publishes `draining` on PODS at stream
 * sequence `seq`). Every gateway stops sending it new requests as soon as it folds that event, and
 * says how far it has folded PODS in its heartbeat. The pod may be removed when
 * - every live gateway has acknowledged `seq` (so none can charge it any more) and the shared
 *   ledger, which holds every charge those gateways listed, shows nothing in flight on it; or
 * - the grace deadline has passed (requests still running then are the price of the deadline).
 * A scale-up while pods drain takes them back first (they are warm and cached), newest mark first.
 */

export type DrainPhase = "marking" | "draining";

export interface DrainingPod {
  pod: string;
  phase: DrainPhase;
  /** When the autoscaler chose it (ms). */
  markedAt: number;
  /** Removal happens by this time whatever is still in flight. */
  deadline: number;
  /** PODS stream sequence of its `draining` event, once published. */
  seq?: number;
  /** Its `pod-deletion-cost` annotation (victims.ts): the lowest values, so the ReplicaSet removes it first. */
  deletionCost: number;
}

export type RemovalReason = "idle" | "grace";

export interface DrainStepInput {
  now: number;
  /** In-flight requests on the pod in the shared ledger (every gateway's). */
  inFlight(pod: string): number;
  /** Whether every live gateway has folded PODS up to `seq`. */
  acknowledged(seq: number): boolean;
}

export interface Removal {
  pod: string;
  reason: RemovalReason;
  inFlight: number;
  drainedMs: number;
  deletionCost: number;
}

export class DrainTracker {
  private readonly pods = new Map<string, DrainingPod>();

  constructor(readonly graceMs: number) {}

  /** Pods being drained, in marking order. */
  list(): DrainingPod[] {
    return [...this.pods.values()];
  }

  has(pod: string): boolean {
    return this.pods.has(pod);
  }

  get size(): number {
    return this.pods.size;
  }

  mark(pod: string, now: number, deletionCost = 0): DrainingPod {
    const existing = this.pods.get(pod);
    if (existing) return existing;
    const d: DrainingPod = { pod, phase: "marking", markedAt: now, deadline: now + this.graceMs, deletionCost };
    this.pods.set(pod, d);
    return d;
  }

  /** The `draining` event is on PODS at `seq`. */
  published(pod: string, seq: number): void {
    const d = this.pods.get(pod);
    if (!d) return;
    d.phase = "draining";
    d.seq = seq;
  }

  /** Takes back up to `count` draining pods (a scale-up), the most recently marked first. */
  reclaim(count: number): string[] {
    const back = this.list()
      .sort((a, b) => b.markedAt - a.markedAt || (a.pod < b.pod ? 1 : -1))
      .slice(0, Math.max(0, count))
      .map((d) => d.pod);
    for (const p of back) this.pods.delete(p);
    return back;
  }

  /** A pod that left by itself (deleted, not ready any more) needs no removal. */
  forget(pod: string): void {
    this.pods.delete(pod);
  }

  /** Pods that may be removed now; they leave the tracker. */
  step(input: DrainStepInput): Removal[] {
    const out: Removal[] = [];
    for (const d of this.pods.values()) {
      const inFlight = input.inFlight(d.pod);
      const idle = d.seq !== undefined && input.acknowledged(d.seq) && inFlight === 0;
      if (idle || input.now >= d.deadline) out.push({ pod: d.pod, reason: idle ? "idle" : "grace", inFlight, drainedMs: input.now - d.markedAt, deletionCost: d.deletionCost });
    }
    for (const r of out) this.pods.delete(r.pod);
    return out;
  }
}
