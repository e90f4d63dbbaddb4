/**
 * Runs async jobs with at most `concurrency` at a time and at most `maxQueued` waiting; a job
 * offered beyond that is refused at once (QueueFullError) so the caller can fall back instead of
 * letting the queue, and the latency of everything behind it, grow without bound.
 */
export class QueueFullError extends Error {
  override name = "QueueFullError";
}

export class BoundedQueue {
  private running = 0;
  private readonly waiting: (() => void)[] = [];
  refused = 0;

  constructor(
    readonly concurrency: number,
    readonly maxQueued: number,
  ) {
    if (!(concurrency >= 1) || !(maxQueued >= 0)) throw new Error("BoundedQueue needs concurrency >= 1 and maxQueued >= 0");
  }

  get queued(): number {
    return this.waiting.length;
  }

  get active(): number {
    return this.running;
  }

  async run<T>(job: () => Promise<T>): Promise<T> {
    if (this.running >= this.concurrency) {
      if (this.waiting.length >= this.maxQueued) {
        this.refused++;
        throw new QueueFullError(`tokenizer queue full (${this.maxQueued} waiting)`);
      }
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.running++;
    }
    try {
      return await job();
    } finally {
      // Hand the slot straight to the next waiter (running stays the same), or free it.
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }
}
