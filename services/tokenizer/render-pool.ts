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
 * template errors and is replaced on the next render.
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
  pending: Map<number, Pending>;
}

export class RenderPool {
  private readonly slots: Array<Slot | undefined>;
  private readonly jinja: string;
  private nextId = 0;
  private outstanding = 0;
  refused = 0;
  rendered = 0;

  constructor(
    private readonly templates: ReadonlyMap<string, string>,
    readonly threads: number,
    readonly maxQueued: number,
  ) {
    if (!(threads >= 1)) throw new Error("RenderPool needs at least one thread");
    this.slots = new Array(threads).fill(undefined);
    this.jinja = createRequire(import.meta.url).resolve("@huggingface/jinja");
  }

  /** Jobs sent to a worker and not answered yet. */
  get inFlight(): number {
    return this.outstanding;
  }

  render(job: RenderJob): Promise<string> {
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
      slot.worker.postMessage({ id, name: job.name, context: job.context });
    });
  }

  async close(): Promise<void> {
    const all = this.slots.splice(0, this.slots.length, ...new Array(this.threads).fill(undefined));
    await Promise.all(all.map((s) => s?.worker.terminate()));
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
    const slot: Slot = { worker, pending: new Map() };
    worker.on("message", (m: { id: number; text?: string; error?: string }) => {
      const p = slot.pending.get(m.id);
      if (!p) return;
      slot.pending.delete(m.id);
      this.outstanding--;
      if (slot.pending.size === 0) worker.unref();
      if (m.error !== undefined) p.reject(new ChatTemplateError(`chat template failed: ${m.error}`));
      else {
        this.rendered++;
        p.resolve(m.text as string);
      }
    });
    const fail = (why: string) => {
      if (this.slots[i] === slot) this.slots[i] = undefined;
      for (const p of slot.pending.values()) p.reject(new ChatTemplateError(`template worker ${why}`));
      this.outstanding -= slot.pending.size;
      slot.pending.clear();
    };
    worker.on("error", (err) => fail(`failed: ${err.message}`));
    worker.on("exit", (code) => fail(`exited (${code})`));
    // After the listeners: adding a "message" listener refs the worker again.
    worker.unref();
    this.slots[i] = slot;
    return slot;
  }
}
