/**
 * Last stream sequence seen per charge subject, for strict mode's compare-and-set. Fed by the
 * CHARGES follower (every message, our own echoes included), by our own publish acks, and by the
 * server's answer to a compare-and-set that lost (`afterLostRace`).
 */

/** What strict mode's committer (strict-commit.ts) reads and moves. */
export interface SubjectCursor {
  /** Last stream sequence this replica applied on `subject` (0 = none). */
  lastSeq(subject: string): number;
  /** Records a sequence learned from our own publish ack. */
  note(subject: string, seq: number): void;
  /** Sets the subject's last sequence to what the server said, even below what was seen. */
  reset(subject: string, seq: number): void;
  /** Resolves true once `lastSeq(subject) >= seq`, false after `timeoutMs`. */
  waitFor(subject: string, seq: number, timeoutMs: number): Promise<boolean>;
  /** True when `seq` is older than anything this replica's view was built from. */
  predatesView(seq: number): boolean;
}

/** What the cursor does after a lost compare-and-set (see `afterLostRace`). */
export type CursorMove =
  /** Take the server's number as the subject's last sequence, lower or higher than the cursor's. */
  | { kind: "adopt"; seq: number }
  /** The server's number is a message inside this replica's view: wait until the view has applied it. */
  | { kind: "catch-up"; seq: number }
  /** The cursor already holds something at least as new as the server's answer: try again as is. */
  | { kind: "retry" };

export interface LostRace {
  /** The last subject sequence the compare-and-set expected (the cursor when it was sent). */
  expected: number;
  /** The subject's last sequence according to the server's refusal (0: the subject holds no message). */
  server: number;
  /** The cursor now (the follower may have moved it while the refusal travelled). */
  current: number;
  /** Whether `server` is older than anything this replica's view was built from. */
  serverPredatesView: boolean;
}

/**
 * The rule for the cursor after the server refused a compare-and-set, naming the subject's last
 * sequence. Sequences on a subject only grow while its messages stay, so:
 * - server < expected: the messages after `server` are gone from the stream (aged out by the
 *   stream's max_age, removed by a limit, purged, or the stream was recreated); no view will ever
 *   deliver them again, so the cursor follows the server down. Unless the cursor moved past
 *   `expected` meanwhile: that newer message is fresher news than the refusal; retry with it.
 * - server > expected: another writer's message. Already applied (cursor >= server): retry. Older
 *   than the view (a replica that started after it never sees it): the server's number is the
 *   truth. Otherwise the view must apply it first, or the next pick would run on a stale view.
 */
export function afterLostRace(r: LostRace): CursorMove {
  if (r.server < r.expected) return r.current === r.expected ? { kind: "adopt", seq: r.server } : { kind: "retry" };
  if (r.current >= r.server) return { kind: "retry" };
  return r.serverPredatesView ? { kind: "adopt", seq: r.server } : { kind: "catch-up", seq: r.server };
}

export class SubjectCursors implements SubjectCursor {
  private readonly seqs = new Map<string, number>();
  /** First stream sequence the follower delivered: anything older predates this replica's view. */
  private firstSeen: number | undefined;

  /** Fed by the follower with every message (before `note`). */
  seen(subject: string, seq: number): void {
    if (this.firstSeen === undefined || seq < this.firstSeen) this.firstSeen = seq;
    this.note(subject, seq);
  }

  /** Called when a wait begins: the CHARGES follower reads now instead of at its paced time. */
  onWait?: () => void;

  predatesView(seq: number): boolean {
    return this.firstSeen === undefined || seq < this.firstSeen;
  }
  private readonly waiters = new Map<string, Array<{ seq: number; resolve: (ok: boolean) => void }>>();

  lastSeq(subject: string): number {
    return this.seqs.get(subject) ?? 0;
  }

  /**
   * Sets the subject's last sequence to the server's word, also below what was seen (the newer
   * messages left the stream); 0 forgets the subject.
   */
  reset(subject: string, seq: number): void {
    if (seq >= this.lastSeq(subject)) this.note(subject, seq);
    else if (seq <= 0) this.seqs.delete(subject);
    else this.seqs.set(subject, seq);
  }

  note(subject: string, seq: number): void {
    if (seq <= (this.seqs.get(subject) ?? 0)) return;
    this.seqs.set(subject, seq);
    const ws = this.waiters.get(subject);
    if (!ws) return;
    const still = ws.filter((w) => {
      if (w.seq > seq) return true;
      w.resolve(true);
      return false;
    });
    if (still.length) this.waiters.set(subject, still);
    else this.waiters.delete(subject);
  }

  waitFor(subject: string, seq: number, timeoutMs: number): Promise<boolean> {
    if (this.lastSeq(subject) >= seq) return Promise.resolve(true);
    this.onWait?.();
    return new Promise((resolve) => {
      const entry = { seq, resolve };
      const list = this.waiters.get(subject) ?? [];
      list.push(entry);
      this.waiters.set(subject, list);
      setTimeout(() => {
        const l = this.waiters.get(subject);
        if (!l) return;
        const i = l.indexOf(entry);
        if (i < 0) return;
        l.splice(i, 1);
        if (l.length === 0) this.waiters.delete(subject);
        resolve(false);
      }, timeoutMs);
    });
  }

  get size(): number {
    return this.seqs.size;
  }
}
