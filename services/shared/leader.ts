/**
 * The leader-election shell: reads and writes a lease through a `LeaseStore`, on its own timer
 * (`start`: a pod-watcher pair) or at its owner's pace (`step`: the gateways' snapshot writer,
 * once per tick), and tells the owner when it gains or loses leadership. The rule is lease.ts.
 *
 * Every store call is bounded by a timeout no longer than the renewal interval, and a tick while
 * a round is still in flight is skipped: a hung API call can never queue rounds behind it.
 * Leadership is granted only while the renewal's `until` is still ahead, and a timer ends it at
 * `until` even if no round runs. A holder whose publishes have been failing (`healthy` false:
 * cut off from NATS, say) steps down and releases the lease: renewing it would keep the healthy
 * standby out while every gateway times the source out.
 */
import { performance } from "node:perf_hooks";
import type { Logger } from "./log.js";
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
  onChange?(leader: boolean): void;
  /** Monotonic clock (ms). */
  now?: () => number;
  /** False = this candidate cannot do the leader's job (publishes failing): do not hold the lease. */
  healthy?: () => boolean;
}

class StoreTimeout extends Error {
  override name = "StoreTimeout";
}

function bounded<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new StoreTimeout(`${what} took longer than ${ms} ms`)), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

export class LeaderElector {
  private timer: NodeJS.Timeout | undefined;
  private seen: LeaseObservation | undefined;
  private until = Number.NEGATIVE_INFINITY;
  private leader = false;
  private running: Promise<void> = Promise.resolve();
  private inFlight = false;
  private lapseTimer: NodeJS.Timeout | undefined;
  /** After stepping down as unhealthy, do not contend again before this (own clock). */
  private holdOffUntil = Number.NEGATIVE_INFINITY;
  private stopped = false;
  private seenHolder: string | undefined;
  readonly stats = { acquired: 0, lost: 0, conflicts: 0, errors: 0, skippedTicks: 0, timeouts: 0, steppedDown: 0 };
  private readonly now: () => number;

  constructor(private readonly o: LeaderElectorOptions) {
    this.now = o.now ?? (() => performance.now());
  }

  isLeader(): boolean {
    return this.leader && this.now() < this.until;
  }

  /** Who held the lease at the last round that learnt it (this candidate while it leads); undefined before. */
  get holder(): string | undefined {
    return this.seenHolder;
  }

  private get callTimeoutMs(): number {
    return renewIntervalMs(this.o.durationMs);
  }

  /** Runs a round now and every renewal interval (a third of the lease) until `stop`. */
  start(): void {
    void this.step();
    this.timer = setInterval(() => void this.step(), renewIntervalMs(this.o.durationMs));
  }

  /**
   * One round now: read the lease, then take, renew or follow it. Skipped while a round is still in
   * flight (resolving when that one ends). Never rejects: failures are counted and logged. A caller
   * driving the rounds itself must step at least every renewal interval to keep the lease.
   */
  step(): Promise<void> {
    if (this.leader && this.now() >= this.until) this.set(false);
    if (this.inFlight) {
      this.stats.skippedTicks++;
      return this.running;
    }
    this.inFlight = true;
    this.running = this.round()
      .catch((err: unknown) => {
        this.stats.errors++;
        if (err instanceof StoreTimeout) this.stats.timeouts++;
        this.o.log.warn({ err: (err as Error).message, lease: this.o.store.describe }, "lease round failed");
      })
      .finally(() => {
        this.inFlight = false;
      });
    return this.running;
  }

  private set(leader: boolean): void {
    if (!leader && this.lapseTimer) {
      clearTimeout(this.lapseTimer);
      this.lapseTimer = undefined;
    }
    if (leader === this.leader) return;
    this.leader = leader;
    if (leader) this.stats.acquired++;
    else this.stats.lost++;
    this.o.log.info({ me: this.o.me, lease: this.o.store.describe, leader }, leader ? "became leader" : "lost leadership");
    this.o.onChange?.(leader);
  }

  private async round(): Promise<void> {
    if (this.stopped) return;
    const started = this.now();
    if (this.leader && started >= this.until) this.set(false);
    if (this.o.healthy && !this.o.healthy()) {
      await this.stepDown();
      return;
    }
    if (started < this.holdOffUntil) return;
    const lease = await bounded(this.o.store.read(), this.callTimeoutMs, `reading ${this.o.store.describe}`);
    if (this.stopped) return;
    // Expiry counts from when this round started: the version was current at least since then.
    this.seen = observe(lease, this.seen, started);
    const action = decideLease(this.o.me, lease, this.seen, this.now());
    if (action.kind === "follow") {
      this.seenHolder = action.holder;
      this.set(false);
      return;
    }
    const writeStarted = this.now();
    const ok = await bounded(
      this.o.store.write(this.o.me, this.o.durationMs, action.kind === "acquire" ? action.transitions : (lease?.transitions ?? 0), action.kind === "acquire", lease),
      this.callTimeoutMs,
      `writing ${this.o.store.describe}`,
    );
    if (this.stopped) return;
    if (!ok) {
      this.stats.conflicts++;
      this.set(false);
      return;
    }
    const until = leaderUntil(writeStarted, this.o.durationMs);
    // A write that came back too late grants nothing: the lease may be someone else's by now.
    if (this.now() >= until) {
      this.set(false);
      return;
    }
    this.until = until;
    this.seenHolder = this.o.me;
    if (this.lapseTimer) clearTimeout(this.lapseTimer);
    this.lapseTimer = setTimeout(() => {
      this.lapseTimer = undefined;
      if (this.now() >= this.until) this.set(false);
    }, Math.max(0, until - this.now()) + 1);
    this.set(true);
  }

  /** Gives leadership (and the lease, if ours) up because this candidate cannot publish. */
  private async stepDown(): Promise<void> {
    const wasLeader = this.leader;
    this.set(false);
    if (!wasLeader) return;
    this.holdOffUntil = this.now() + this.o.durationMs;
    this.stats.steppedDown++;
    this.o.log.error({ me: this.o.me, lease: this.o.store.describe }, "publishes failing: stepping down and releasing the lease for the standby");
    const lease = await bounded(this.o.store.read(), this.callTimeoutMs, `reading ${this.o.store.describe}`);
    if (lease?.holder === this.o.me) await bounded(this.o.store.release(this.o.me, lease), this.callTimeoutMs, `releasing ${this.o.store.describe}`);
  }

  /** Stops contending; with `release`, a held lease is given up for the other candidate. */
  async stop(release = true): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await this.running.catch(() => undefined);
    const wasLeader = this.leader;
    this.set(false);
    if (release && wasLeader) {
      const lease = await bounded(this.o.store.read(), this.callTimeoutMs, "reading the lease").catch(() => undefined);
      if (lease?.holder === this.o.me) await bounded(this.o.store.release(this.o.me, lease), this.callTimeoutMs, "releasing the lease").catch(() => undefined);
    }
  }
}
