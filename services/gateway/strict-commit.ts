/**
 * `strict` consistency: a charge counts only once it won a per-pod compare-and-set on the pod's
 * charge subject (`Nats-Expected-Last-Subject-Sequence` = the last sequence this replica has seen
 * on that subject). Losing means the subject moved on without our view: either another replica
 * charged that pod after our view was taken (retract the local charge, wait until the view has
 * caught up to the winner, select again), or the pod's last charges left the stream (its max_age)
 * and the server's sequence for the subject is older than ours: the cursor follows the server's
 * number down (`afterLostRace`, subject-cursor.ts) and the next try wins. Bounded retries, then
 * the charge is published as in `eventual` mode, and counted.
 *
 * Costs one JetStream round trip per request (plus one per lost race); buys: no two replicas can
 * both charge a pod on the strength of the same stale view.
 */
import type { JetStreamClient } from "@nats-io/jetstream";
import { currentSubjectSequence } from "../../streams/errors.js";
import type { Subjects } from "../../streams/subjects.js";
import { encodeEvent } from "../shared/publish.js";
import { afterLostRace, type SubjectCursor } from "./subject-cursor.js";
import type { Committer, CommitPort, PlannedContext, RoutedRequest } from "../routing/mod.js";

export interface StrictStats {
  committed: number;
  /** Of those, committed only after the stream failed to take writes for a while (a failover). */
  committedAfterError: number;
  conflicts: number;
  /** Charges published without a compare-and-set after retries ran out or the CAS failed otherwise. */
  fallbacks: number;
}

export interface StrictCommitOptions {
  js: JetStreamClient;
  subjects: Subjects;
  cursor: SubjectCursor;
  /** Re-selections after a lost race before falling back (default 6). */
  maxRetries?: number;
  /** How long to wait for the view to reach the winner's sequence (default 50 ms). */
  catchUpMs?: number;
  /**
   * How long a commit may take before the charge falls back to a plain publish (default 3 s):
   * waiting behind this replica's earlier charges on the pod, the publishes' ack timeouts, lost
   * races and retries of a compare-and-set that failed for another reason (a failover).
   */
  failoverWaitMs?: number;
  onFallback?: (err: unknown) => void;
}

/**
 * The shortest ack timeout a compare-and-set's publish is given, even at its deadline: a publish
 * stored but acknowledged after its timeout would be published again by the fallback, and the
 * pod's next charge of ours would lose its race to it.
 */
const MIN_PUBLISH_TIMEOUT_MS = 500;

/** A charge gave up waiting behind this replica's earlier charges on its pod. */
class ChainWaitTimeout extends Error {
  override name = "ChainWaitTimeout";
  constructor() {
    super("strict commit: waited past the deadline behind this replica's earlier charges on the pod");
  }
}

export class StrictCommitter implements Committer {
  readonly stats: StrictStats = { committed: 0, committedAfterError: 0, conflicts: 0, fallbacks: 0 };
  private readonly maxRetries: number;
  private readonly catchUpMs: number;

  constructor(private readonly o: StrictCommitOptions) {
    this.maxRetries = o.maxRetries ?? 6;
    this.catchUpMs = o.catchUpMs ?? 50;
    this.failoverWaitMs = o.failoverWaitMs ?? 3_000;
  }

  private readonly failoverWaitMs: number;

  /**
   * One compare-and-set, in this subject's chain: expects the cursor's sequence as it is when the
   * publish goes out. A refusal naming the subject's sequence comes back as `lost`; any other
   * failure is thrown.
   */
  private async compareAndSet(subject: string, data: Uint8Array, deadline: number): Promise<{ ack: { seq: number } } | { lost: { expected: number; server: number } }> {
    const { js, cursor } = this.o;
    let expected = 0;
    try {
      const ack = await this.serialized(subject, deadline, async () => {
        expected = cursor.lastSeq(subject);
        const timeout = Math.max(MIN_PUBLISH_TIMEOUT_MS, deadline - Date.now());
        const a = await js.publish(subject, data, { expect: { lastSubjectSequence: expected }, timeout });
        // Inside the chain: the next of our own charges on this pod runs as soon as this one's
        // promise settles, before the caller's continuation could note the ack, and must expect it.
        cursor.note(subject, a.seq);
        return a;
      });
      return { ack };
    } catch (err) {
      const server = currentSubjectSequence(err);
      if (server === undefined) throw err;
      return { lost: { expected, server } };
    }
  }

  /** Retries a compare-and-set with backoff until it is acknowledged, loses a race, or the deadline passes. */
  private async retryAfterError(subject: string, data: Uint8Array, deadline: number): Promise<{ ack: { seq: number } } | { lost: { expected: number; server: number } } | { error: unknown }> {
    let lastError: unknown;
    for (let delay = 50; Date.now() < deadline; delay = Math.min(delay * 2, 500)) {
      await new Promise((r) => setTimeout(r, Math.min(delay, Math.max(0, deadline - Date.now()))));
      try {
        return await this.compareAndSet(subject, data, Math.min(deadline, Date.now() + 1_000));
      } catch (err) {
        lastError = err;
      }
    }
    return { error: lastError };
  }

  /**
   * Commits on one pod subject are chained inside this replica: two of our own charges on a pod
   * would otherwise both expect the same last sequence and one would lose to ourselves. The
   * chain makes each wait for the previous ack, whose sequence it then expects.
   */
  private readonly tails = new Map<string, Promise<unknown>>();

  private serialized<T>(subject: string, deadline: number, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(subject) ?? Promise.resolve();
    // Waiting in the chain is bounded by the deadline: when the stream takes no writes, each of
    // the pod's queued charges would otherwise wait for every publish timeout before its own.
    // A charge that gave up never runs (the chain goes on without it); one that started runs to
    // its publish's own timeout (it may be stored: giving up then could charge twice).
    let state: "waiting" | "running" | "gave-up" = "waiting";
    const run = (): Promise<T> => {
      if (state === "gave-up") return Promise.reject(new ChainWaitTimeout());
      state = "running";
      return fn();
    };
    const next = prev.then(run, run);
    const tail = next.catch(() => undefined);
    this.tails.set(subject, tail);
    tail.then(() => {
      if (this.tails.get(subject) === tail) this.tails.delete(subject);
    });
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        if (state !== "waiting") return;
        state = "gave-up";
        reject(new ChainWaitTimeout());
      }, Math.max(0, deadline - Date.now()));
      next.then(
        (v) => {
          clearTimeout(timer);
          resolve(v);
        },
        (err) => {
          clearTimeout(timer);
          if (!(err instanceof ChainWaitTimeout)) reject(err);
        },
      );
    });
  }

  async commit(ctx: PlannedContext, port: CommitPort): Promise<RoutedRequest> {
    const { subjects, cursor } = this.o;
    // The rate limits admit a request once, at its first attempt; a lost race keeps its counts
    // (its slot must not go to another request meanwhile) and the retry carries them over.
    let lost: RoutedRequest | undefined;
    // One deadline for the whole commit, every attempt included: after a failover a request may
    // lose a race on each attempt, and a deadline per attempt would let it wait several times over.
    const deadline = Date.now() + this.failoverWaitMs;
    try {
      for (let attempt = 0; ; attempt++) {
        if (attempt > this.maxRetries || (attempt > 0 && Date.now() >= deadline)) {
          this.stats.fallbacks++;
          const r = port.section(ctx, { publish: true, ...(lost ? { carry: lost } : {}) });
          port.committed(r);
          return r;
        }
        const r = lost ? port.section(ctx, { publish: false, carry: lost }) : await port.admit(ctx, () => port.section(ctx, { publish: false }));
        lost = undefined;
        const subject = subjects.charges(r.pod.model, r.pod.pod);
        const data = encodeEvent(r.charge);
        let outcome: { ack: { seq: number } } | { lost: { expected: number; server: number } };
        try {
          outcome = await this.compareAndSet(subject, data, deadline);
        } catch (err) {
          // Not a lost race: the stream has no leader (a failover), the publish timed out, or the
          // charges before this one on the pod held it past the deadline. A charge published
          // without its compare-and-set now would most likely be lost too (a fault run lost all
          // 903 such fallbacks): keep trying the compare-and-set until the stream takes writes
          // again, within the attempt's deadline; only then fall back.
          const retried = await this.retryAfterError(subject, data, deadline);
          if ("error" in retried) {
            this.stats.fallbacks++;
            this.o.onFallback?.(retried.error ?? err);
            port.publishCharge(r);
            port.committed(r);
            return r;
          }
          if ("ack" in retried) this.stats.committedAfterError++;
          outcome = retried;
        }
        if ("ack" in outcome) {
          cursor.note(subject, outcome.ack.seq);
          this.stats.committed++;
          port.committed(r);
          return r;
        }
        this.stats.conflicts++;
        port.retract(r, true);
        lost = r;
        const { expected, server } = outcome.lost;
        const move = afterLostRace({ expected, server, current: cursor.lastSeq(subject), serverPredatesView: cursor.predatesView(server) });
        if (move.kind === "adopt") cursor.reset(subject, move.seq);
        else if (move.kind === "catch-up") await cursor.waitFor(subject, move.seq, this.catchUpMs);
      }
    } catch (err) {
      // A retry that could not be routed (no ready pod any more, shutting down): not counted.
      if (lost) port.uncount(lost);
      throw err;
    }
  }
}
