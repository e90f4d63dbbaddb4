/**
 * The leader-election shell: reads and writes a lease through a `LeaseStore` on a timer and tells
 * the watcher when it gains or loses leadership. The rules are in lease.ts.
 */
import { performance } from "node:perf_hooks";
import type { Logger } from "../shared/log.js";
import { decideLease, type LeaseObservation, type LeaseRecord, leaderUntil, observe, renewIntervalMs } from "./lease.js";

export interface LeaseStore {
  /** Where the lease lives, for logs. */
  readonly describe: string;
  read(): Promise<LeaseRecord | undefined>;
  /**
   * Writes `me` as holder. `expected` undefined = create; otherwise replace only if the stored
   * version is still `expected.version`. False when another writer got there first.
   */
  write(me: string, durationMs: number, transitions: number, acquire: boolean, expected: LeaseRecord | undefined): Promise<boolean>;
  /** Gives the lease up (holder emptied) if still ours, so the other candidate need not wait it out. */
  release(me: string, expected: LeaseRecord): Promise<void>;
}

export interface LeaderElectorOptions {
  store: LeaseStore;
  me: string;
  durationMs: number;
  log: Logger;
  onChange(leader: boolean): void;
  /** Monotonic clock (ms). */
  now?: () => number;
}

export class LeaderElector {
  private timer: NodeJS.Timeout | undefined;
  private seen: LeaseObservation | undefined;
  private until = Number.NEGATIVE_INFINITY;
  private leader = false;
  private running: Promise<void> = Promise.resolve();
  private stopped = false;
  readonly stats = { acquired: 0, lost: 0, conflicts: 0, errors: 0 };
  private readonly now: () => number;

  constructor(private readonly o: LeaderElectorOptions) {
    this.now = o.now ?? (() => performance.now());
  }

  isLeader(): boolean {
    return this.leader && this.now() < this.until;
  }

  start(): void {
    const tick = () => {
      // Leadership lapses by the clock even while a store call hangs (the rounds queue behind it).
      if (this.leader && this.now() >= this.until) this.set(false);
      this.running = this.running.then(() => this.round()).catch((err: unknown) => {
        this.stats.errors++;
        this.o.log.warn({ err: (err as Error).message, lease: this.o.store.describe }, "lease round failed");
      });
    };
    tick();
    this.timer = setInterval(tick, renewIntervalMs(this.o.durationMs));
  }

  private set(leader: boolean): void {
    if (leader === this.leader) return;
    this.leader = leader;
    if (leader) this.stats.acquired++;
    else this.stats.lost++;
    this.o.log.info({ me: this.o.me, lease: this.o.store.describe, leader }, leader ? "became leader" : "lost leadership");
    this.o.onChange(leader);
  }

  private async round(): Promise<void> {
    if (this.stopped) return;
    if (this.leader && this.now() >= this.until) this.set(false);
    const lease = await this.o.store.read();
    const now = this.now();
    this.seen = observe(lease, this.seen, now);
    const action = decideLease(this.o.me, lease, this.seen, now);
    if (action.kind === "follow") {
      this.set(false);
      return;
    }
    const started = this.now();
    const ok = await this.o.store.write(this.o.me, this.o.durationMs, action.kind === "acquire" ? action.transitions : (lease?.transitions ?? 0), action.kind === "acquire", lease);
    if (this.stopped) return;
    if (!ok) {
      this.stats.conflicts++;
      this.set(false);
      return;
    }
    this.until = leaderUntil(started, this.o.durationMs);
    this.set(true);
  }

  /** Stops contending; with `release`, a held lease is given up for the other candidate. */
  async stop(release = true): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await this.running.catch(() => undefined);
    const wasLeader = this.leader;
    this.set(false);
    if (release && wasLeader) {
      const lease = await this.o.store.read().catch(() => undefined);
      if (lease?.holder === this.o.me) await this.o.store.release(this.o.me, lease).catch(() => undefined);
    }
  }
}
