/**
 * The finished prefills whose KV a decode has not taken yet, keyed by what the decode will ask
 * for (vLLM: the request id; SGLang: the bootstrap room). Each entry expires after a timeout on
 * the pod's simulated clock. Decodes that arrive before their prefill (SGLang sends both legs at
 * once) wait here for the key to appear. No I/O: the side channel and bootstrap servers sit on top.
 */
import type { SimClock } from "./clock.js";

export interface HeldKv {
  /** Blocks the decode reads. */
  blocks: number;
  /** Frees the blocks in the prefill engine; called once, on take or expiry. */
  release(): void;
  /** The entry ends: a decode took it, or nobody did before `timeoutMs`, or it was dropped. */
  onEnd?(how: "taken" | "expired" | "dropped"): void;
}

interface Entry {
  kv: HeldKv;
  cancelTimer: () => void;
}

interface Waiter {
  resolve(blocks: number): void;
}

export class HeldKvRegistry {
  private readonly entries = new Map<string, Entry>();
  private readonly waiters = new Map<string, Set<Waiter>>();
  private waiting = 0;

  constructor(
    private readonly clock: SimClock,
    /** Bound on held entries and on waiting decodes, each. */
    readonly maxEntries = 4096,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  get waitingDecodes(): number {
    return this.waiting;
  }

  /**
   * Holds `kv` under `key` until taken or `timeoutMs` (simulated) passes. A decode already
   * waiting for the key takes it at once. A second entry under a live key expires the first.
   * Returns false (and holds nothing) when the registry is full.
   */
  hold(key: string, kv: HeldKv, timeoutMs: number): boolean {
    this.end(key, "expired");
    if (this.entries.size >= this.maxEntries) return false;
    const cancelTimer = this.clock.at(this.clock.now() + timeoutMs, () => this.end(key, "expired"));
    this.entries.set(key, { kv, cancelTimer });
    const waiter = this.waiters.get(key)?.values().next().value as Waiter | undefined;
    if (waiter) {
      const blocks = this.take(key);
      if (blocks !== undefined) waiter.resolve(blocks);
    }
    return true;
  }

  /** Takes the KV under `key` (the prefill frees its blocks); undefined when there is none. */
  take(key: string): number | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    const blocks = e.kv.blocks;
    this.end(key, "taken");
    return blocks;
  }

  /** Ends the entry without a decode: its prefill's client left or the request was aborted. */
  drop(key: string, kv?: HeldKv): void {
    if (kv && this.entries.get(key)?.kv !== kv) return;
    this.end(key, "dropped");
  }

  /**
   * Waits for `key` to be held, then takes it. Rejects when `signal` fires (the decode gave up)
   * or when too many decodes already wait.
   */
  waitAndTake(key: string, signal: AbortSignal): Promise<number> {
    const now = this.take(key);
    if (now !== undefined) return Promise.resolve(now);
    if (signal.aborted) return Promise.reject(new Error("aborted"));
    if (this.waiting >= this.maxEntries) return Promise.reject(new Error("too many decodes waiting"));
    return new Promise((resolve, reject) => {
      const set = this.waiters.get(key) ?? new Set<Waiter>();
      this.waiters.set(key, set);
      const leave = (): void => {
        set.delete(waiter);
        if (set.size === 0) this.waiters.delete(key);
        this.waiting--;
        signal.removeEventListener("abort", onAbort);
      };
      const waiter: Waiter = {
        resolve: (blocks) => {
          leave();
          resolve(blocks);
        },
      };
      const onAbort = (): void => {
        leave();
        reject(new Error("aborted"));
      };
      set.add(waiter);
      this.waiting++;
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** Forgets everything without ending entries (an engine restart already freed the blocks). */
  clear(): void {
    for (const e of this.entries.values()) e.cancelTimer();
    this.entries.clear();
  }

  private end(key: string, how: "taken" | "expired" | "dropped"): void {
    const e = this.entries.get(key);
    if (!e) return;
    this.entries.delete(key);
    e.cancelTimer();
    e.kv.release();
    e.kv.onEnd?.(how);
  }
}
