/**
 * Last stream sequence seen per charge subject, for strict mode's compare-and-set. Fed by the
 * CHARGES follower (every message, our own echoes included) and by our own publish acks.
 */
import type { SubjectCursor } from "./strict-commit.js";

export class SubjectCursors implements SubjectCursor {
  private readonly seqs = new Map<string, number>();
  /** First stream sequence the follower delivered: anything older predates this replica's view. */
  private firstSeen: number | undefined;

  /** Fed by the follower with every message (before `note`). */
  seen(subject: string, seq: number): void {
    if (this.firstSeen === undefined || seq < this.firstSeen) this.firstSeen = seq;
    this.note(subject, seq);
  }

  predatesView(seq: number): boolean {
    return this.firstSeen === undefined || seq < this.firstSeen;
  }
  private readonly waiters = new Map<string, Array<{ seq: number; resolve: (ok: boolean) => void }>>();

  lastSeq(subject: string): number {
    return this.seqs.get(subject) ?? 0;
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
