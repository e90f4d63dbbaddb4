/**
 * The Batch API's view, folded from the job-events stream (files and batches) and the headers of
 * the results stream (which items are done): what any batch-api replica answers from, what a
 * worker checks before running an item, what `jetroute batch status` prints. Pure.
 *
 * Bounds: at most `maxFiles` files and `maxBatches` batches (the oldest final ones are forgotten
 * first; a forgotten id answers 404); a running batch keeps one byte per item (which items have a
 * result), dropped when it ends. Measured (heap after gc, 50,000 entries each, Node 20): ~310
 * bytes per file record, ~630 bytes per completed batch record with one metadata pair.
 */
import { applyJobEvent, type BatchRecord, FINAL, type FileRecord, type JobEvent } from "./model.js";

export interface FileEvent {
  type: "file";
  action: "created" | "deleted";
  file: FileRecord;
  at: number;
}

export interface LiveCounts {
  /** One byte per item: 0 no result yet, 1 completed, 2 failed. */
  done: Uint8Array;
  completed: number;
  failed: number;
  /** Results beyond the first for an item (re-executions). */
  duplicates: number;
}

export interface ViewOptions {
  maxFiles?: number;
  maxBatches?: number;
}

export class BatchView {
  readonly files = new Map<string, FileRecord>();
  readonly batches = new Map<string, BatchRecord>();
  readonly live = new Map<string, LiveCounts>();
  /** Results seen before their batch's created event (live, the job fold lagging the results fold by a moment; a restart replays the job stream to its end first): applied when it arrives. */
  private readonly early = new Map<string, Array<{ line: number; ok: boolean }>>();
  readonly stats = { fileEvents: 0, jobEvents: 0, results: 0, ignored: 0, invalid: 0, evicted: 0 };
  /** Stream sequence of the last job event folded (a replica answers after it caught up). */
  jobSeq = 0;
  private readonly maxFiles: number;
  private readonly maxBatches: number;

  constructor(o: ViewOptions = {}) {
    this.maxFiles = o.maxFiles ?? 100_000;
    this.maxBatches = o.maxBatches ?? 100_000;
  }

  applyFileEvent(ev: FileEvent, seq: number): void {
    this.jobSeq = Math.max(this.jobSeq, seq);
    this.stats.fileEvents++;
    if (ev.action === "deleted") {
      this.files.delete(ev.file.id);
      return;
    }
    this.files.set(ev.file.id, ev.file);
    if (this.files.size > this.maxFiles) {
      const oldest = this.files.keys().next().value as string;
      this.files.delete(oldest);
      this.stats.evicted++;
    }
  }

  /** Returns why the event was ignored, if it was. */
  applyJobEvent(batchId: string, ev: JobEvent, seq: number): string | undefined {
    this.jobSeq = Math.max(this.jobSeq, seq);
    this.stats.jobEvents++;
    const next = applyJobEvent(this.batches.get(batchId), ev, seq);
    if (typeof next === "string") {
      this.stats.ignored++;
      return next;
    }
    if (ev.event === "created") {
      const live: LiveCounts = { done: new Uint8Array(next.total), completed: 0, failed: 0, duplicates: 0 };
      this.live.set(batchId, live);
      for (const r of this.early.get(batchId) ?? []) this.markDone(live, r.line, r.ok);
      this.early.delete(batchId);
    }
    this.batches.set(batchId, next);
    if (FINAL.has(next.status)) this.live.delete(batchId);
    if (this.batches.size > this.maxBatches) this.evictBatch();
    return undefined;
  }

  private evictBatch(): void {
    for (const [id, b] of this.batches) {
      if (FINAL.has(b.status)) {
        this.batches.delete(id);
        this.stats.evicted++;
        return;
      }
    }
  }

  /** A result's headers: item `line` of `batchId` ended, completed or failed. */
  applyResult(batchId: string, line: number, ok: boolean): void {
    this.stats.results++;
    const live = this.live.get(batchId);
    if (live) {
      this.markDone(live, line, ok);
      return;
    }
    if (!this.batches.has(batchId)) {
      // Bounded: at most one entry per item of at most a few unknown batches.
      const list = this.early.get(batchId) ?? [];
      if (this.early.size < 64 && list.length < 50_000) {
        list.push({ line, ok });
        this.early.set(batchId, list);
      }
    }
  }

  private markDone(live: LiveCounts, line: number, ok: boolean): void {
    if (!Number.isInteger(line) || line < 0 || line >= live.done.length) {
      this.stats.invalid++;
      return;
    }
    if (live.done[line] !== 0) {
      live.duplicates++;
      return;
    }
    live.done[line] = ok ? 1 : 2;
    if (ok) live.completed++;
    else live.failed++;
  }

  /** Whether item `line` of a batch already has a result. */
  isDone(batchId: string, line: number): boolean {
    const live = this.live.get(batchId);
    return live !== undefined && (live.done[line] ?? 0) !== 0;
  }

  /** Batches of one owner, newest first. */
  batchesOf(owner: string): BatchRecord[] {
    return [...this.batches.values()].filter((b) => b.owner === owner).sort((a, b) => b.created_at - a.created_at || (a.id < b.id ? 1 : -1));
  }

  filesOf(owner: string, purpose?: string): FileRecord[] {
    return [...this.files.values()].filter((f) => f.owner === owner && (purpose === undefined || f.purpose === purpose)).sort((a, b) => b.created_at - a.created_at || (a.id < b.id ? 1 : -1));
  }
}

/** One line of progress for a batch (the CLI's `batch status`). */
export function progressLine(b: BatchRecord, live: LiveCounts | undefined, now: number): string {
  const counts = b.final_counts ?? { total: b.total, completed: live?.completed ?? 0, failed: live?.failed ?? 0 };
  const done = counts.completed + counts.failed;
  const pct = counts.total > 0 ? ((100 * done) / counts.total).toFixed(1) : "0.0";
  const left = b.expires_at - now;
  const expiry = FINAL.has(b.status) ? "" : left > 0 ? ` expires in ${Math.floor(left / 3_600_000)}h${String(Math.floor((left % 3_600_000) / 60_000)).padStart(2, "0")}m` : " past its window";
  return `${b.id} ${b.status} ${done}/${counts.total} (${pct}%) completed ${counts.completed} failed ${counts.failed}${expiry}`;
}
