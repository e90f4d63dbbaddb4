/**
 * Chat templates rendered on worker threads. A Jinja render of a long conversation costs
 * milliseconds (Qwen3's template, 10 turns: ~4 ms, docs/benchmarks.md) — far more than routing
 * the request — so it must not run on the event loop that serves every other request.
 *
 * Each worker compiles the model's templates once (@huggingface/jinja, loaded by absolute path so
 * the worker needs no module resolution of its own) and renders one job at a time; jobs go to the
 * least busy worker. Outstanding jobs are bounded: past `maxQueued` waiting beyond one per worker,
 * a render is refused at once (QueueFullError) and the caller falls back. Workers start on first
 * use and hold the process open only while they owe an answer; one that dies fails its jobs as
 * template errors and is replaced on the next render. A worker that dies before it is ready (its
 * module or templates do not load, or it is not ready within `startupTimeoutMs`) fails its jobs
 * with RenderPoolUnavailableError instead (they render on the caller's thread) and counts as a
 * startup failure: after 3 in a row the pool stops
 * spawning and refuses at once (RenderPoolUnavailableError: the caller renders on its own thread)
 * until a backoff passes (1 s, doubling to 60 s), then tries one worker again. A render that runs past `renderTimeoutMs` (a template
 * that loops over a huge range) fails as a template error and its worker is terminated, with every
 * job it held; the next render starts a fresh one. A render's time starts when its worker begins
 * it: once the worker is ready and the jobs before it are answered (the worker renders in order),
 * so neither a worker's start-up nor a queue on a loaded host counts against the template.
 */
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";
import { QueueFullError } from "./bounded-queue.js";
import { ChatTemplateError, type RenderJob } from "./chat-template.js";

// Plain CommonJS, evaluated as the worker's entry point.
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const { Template } = require(workerData.jinja);
const templates = new Map(Object.entries(workerData.templates).map(([name, src]) => [name, new Template(src)]));
parentPort.postMessage({ ready: true });
parentPort.on("message", ({ id, name, context }) => {
  try {
    parentPort.postMessage({ id, text: templates.get(name).render(context) });
  } catch (err) {
    parentPort.postMessage({ id, error: String((err && err.message) || err) });
  }
});
`;

interface Pending {
  resolve(text: string): void;
  reject(err: Error): void;
}

interface Slot {
  worker: Worker;
  /** In the order the worker renders them: the first is the one it is on. */
  pending: Map<number, Pending>;
  ready: boolean;
  /** The render timeout of the first pending job, or the start-up timeout before `ready`. */
  timer?: NodeJS.Timeout;
  /** Fails every job the worker holds and retires it (set by spawn). */
  fail?: (why: string, startupFailure?: boolean) => void;
}

/** The pool is backing off after workers failed to start: render elsewhere. */
export class RenderPoolUnavailableError extends Error {
  override name = "RenderPoolUnavailableError";
}

export interface RenderPoolOptions {
  /** Module the workers load the Jinja engine from (default: @huggingface/jinja, resolved here). */
  jinjaModule?: string;
  /** Clock for the startup backoff (ms). */
  now?: () => number;
  /** Longest a render may run before its worker is terminated (ms; default DEFAULT_RENDER_TIMEOUT_MS). */
  renderTimeoutMs?: number;
  /** Longest a new worker may take to load its module and templates (ms; default DEFAULT_STARTUP_TIMEOUT_MS). */
  startupTimeoutMs?: number;
}

/** A chat template render that takes longer than this is a template error (it loops, or is hostile). */
export const DEFAULT_RENDER_TIMEOUT_MS = 2_000;
/** A worker not ready after this long (its module load hangs) counts as a start-up failure. */
export const DEFAULT_STARTUP_TIMEOUT_MS = 15_000;

/** Consecutive startup failures after which the pool backs off. */
export const MAX_STARTUP_FAILURES = 3;
const BACKOFF_MIN_MS = 1_000;
const BACKOFF_MAX_MS = 60_000;

export class RenderPool {
  private readonly slots: Array<Slot | undefined>;
  private readonly jinja: string;
  private nextId = 0;
  private outstanding = 0;
  private readonly now: () => number;
  private readonly renderTimeoutMs: number;
  private readonly startupTimeoutMs: number;
  refused = 0;
  /** Renders that ran past the timeout (their workers were terminated). */
  timedOut = 0;
  rendered = 0;
  /** Workers started, and consecutive ones that died before they were ready. */
  spawned = 0;
  startupFailures = 0;
  /** While backing off: when to try a worker again (ms on `now`). */
  private retryAt = 0;
  private backoffMs = BACKOFF_MIN_MS;

  constructor(
    private readonly templates: ReadonlyMap<string, string>,
    readonly threads: number,
    readonly maxQueued: number,
    o: RenderPoolOptions = {},
  ) {
    if (!(threads >= 1)) throw new Error("RenderPool needs at least one thread");
    this.slots = new Array(threads).fill(undefined);
    this.jinja = o.jinjaModule ?? createRequire(import.meta.url).resolve("@huggingface/jinja");
    this.now = o.now ?? Date.now;
    this.renderTimeoutMs = o.renderTimeoutMs ?? DEFAULT_RENDER_TIMEOUT_MS;
    if (!(this.renderTimeoutMs > 0)) throw new RangeError(`renderTimeoutMs must be > 0, got ${this.renderTimeoutMs}`);
    this.startupTimeoutMs = o.startupTimeoutMs ?? DEFAULT_STARTUP_TIMEOUT_MS;
    if (!(this.startupTimeoutMs > 0)) throw new RangeError(`startupTimeoutMs must be > 0, got ${this.startupTimeoutMs}`);
  }

  /** True while startup failures keep the pool from spawning (renders are refused with RenderPoolUnavailableError). */
  get backingOff(): boolean {
    return this.startupFailures >= MAX_STARTUP_FAILURES && this.now() < this.retryAt;
  }

  /** Jobs sent to a worker and not answered yet. */
  get inFlight(): number {
    return this.outstanding;
  }

  render(job: RenderJob): Promise<string> {
    if (this.backingOff) return Promise.reject(new RenderPoolUnavailableError(`template workers failed to start ${this.startupFailures} times; retrying after a backoff`));
    if (this.outstanding >= this.threads + this.maxQueued) {
      this.refused++;
      return Promise.reject(new QueueFullError(`template render queue full (${this.maxQueued} waiting)`));
    }
    const slot = this.leastBusy();
    const id = this.nextId++;
    this.outstanding++;
    return new Promise<string>((resolve, reject) => {
      // Referenced only while it owes an answer: an idle pool never keeps a process alive.
      if (slot.pending.size === 0) slot.worker.ref();
      slot.pending.set(id, { resolve, reject });
      if (slot.pending.size === 1 && slot.ready) this.timeHead(slot);
      slot.worker.postMessage({ id, name: job.name, context: job.context });
    });
  }

  async close(): Promise<void> {
    const all = this.slots.splice(0, this.slots.length, ...new Array(this.threads).fill(undefined));
    await Promise.all(all.map((s) => s?.worker.terminate()));
  }

  /** Starts the render timeout of the job the worker is on now (the first pending one), if any. */
  private timeHead(slot: Slot): void {
    clearTimeout(slot.timer);
    slot.timer = undefined;
    if (slot.pending.size === 0) return;
    slot.timer = setTimeout(() => this.timeOut(slot), this.renderTimeoutMs);
    slot.timer.unref();
  }

  /** A render ran past the timeout: the worker is stuck in it, so it goes, with every job it held. */
  private timeOut(slot: Slot): void {
    this.timedOut++;
    // The worker was ready (the timer starts then): the template, not the module, is at fault.
    slot.fail?.(`render timed out after ${this.renderTimeoutMs} ms`, false);
    void slot.worker.terminate();
  }

  private leastBusy(): Slot {
    let best: Slot | undefined;
    for (let i = 0; i < this.slots.length; i++) {
      const s = this.slots[i] ?? this.spawn(i);
      if (!best || s.pending.size < best.pending.size) best = s;
      if (s.pending.size === 0) break;
    }
    return best as Slot;
  }

  private spawn(i: number): Slot {
    const worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { jinja: this.jinja, templates: Object.fromEntries(this.templates) } });
    const slot: Slot = { worker, pending: new Map(), ready: false };
    this.spawned++;
    slot.timer = setTimeout(() => {
      slot.fail?.(`timed out after ${this.startupTimeoutMs} ms`);
      void worker.terminate();
    }, this.startupTimeoutMs);
    slot.timer.unref();
    let failed = false;
    worker.on("message", (m: { id: number; text?: string; error?: string; ready?: boolean }) => {
      // A worker given up (start-up timeout, render timeout) is being terminated: nothing it says counts.
      if (failed) return;
      if (m.ready) {
        slot.ready = true;
        this.startupFailures = 0;
        this.backoffMs = BACKOFF_MIN_MS;
        this.timeHead(slot);
        return;
      }
      const p = slot.pending.get(m.id);
      if (!p) return;
      slot.pending.delete(m.id);
      // The worker renders in order: it starts on the next job now.
      this.timeHead(slot);
      this.outstanding--;
      if (slot.pending.size === 0) worker.unref();
      if (m.error !== undefined) p.reject(new ChatTemplateError(`chat template failed: ${m.error}`));
      else {
        this.rendered++;
        p.resolve(m.text as string);
      }
    });
    const fail = (why: string, startupFailure = true) => {
      if (!failed && !slot.ready && startupFailure) {
        this.startupFailures++;
        if (this.startupFailures >= MAX_STARTUP_FAILURES) {
          this.retryAt = this.now() + this.backoffMs;
          this.backoffMs = Math.min(this.backoffMs * 2, BACKOFF_MAX_MS);
        }
      }
      failed = true;
      clearTimeout(slot.timer);
      slot.timer = undefined;
      if (this.slots[i] === slot) this.slots[i] = undefined;
      // A worker that never started says nothing about the template: its jobs render elsewhere
      // (the caller's thread), as while the pool backs off.
      const startup = !slot.ready && startupFailure;
      for (const p of slot.pending.values()) {
        p.reject(startup ? new RenderPoolUnavailableError(`template worker ${why} before it was ready`) : new ChatTemplateError(`template worker ${why}`));
      }
      this.outstanding -= slot.pending.size;
      slot.pending.clear();
    };
    slot.fail = fail;
    worker.on("error", (err) => fail(`failed: ${err.message}`));
    worker.on("exit", (code) => fail(`exited (${code})`));
    // After the listeners: adding a "message" listener refs the worker again.
    worker.unref();
    this.slots[i] = slot;
    return slot;
  }
}
