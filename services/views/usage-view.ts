/**
 * Usage view: each user's weighted token usage over a sliding window, for fairness strategies
 * (vtc-basic). Pure: no I/O; the shell feeds it and the gateway's strategies read it.
 *
 * Weighted tokens = prompt × inputWeight (1) + completion × outputWeight (2): generating a token
 * costs the engine more than reading one, as in AIBrix's virtual token counter.
 *
 * The window is a ring of `buckets` time buckets per user (default 10 × 30 s = 5 min). A bucket
 * expires whole, so `tokens()` covers between `windowMs - bucketMs` and `windowMs` of history; in
 * exchange a user costs a fixed, small amount of memory however many requests it makes.
 *
 * Memory is bounded by `maxUsers`: when a new user arrives at the bound, the user whose last
 * record is oldest goes (counted in `evicted`), which is almost always one whose window has already
 * expired. Measured on Node 20 (heap after GC, 100,000 users, 10 buckets): 275 bytes per user
 * with a 13-character id, i.e. about 240 bytes plus the id string; the default 10,000 users take
 * under 3 MB.
 */

export interface UsageRecord {
  readonly user: string;
  readonly promptTokens: number;
  readonly completionTokens: number;
  /** When the tokens were spent (ms): the release time for completions, the charge time for prompts. */
  readonly ts: number;
}

export interface UsageBounds {
  /** Smallest positive usage among users active in the window (0 when `users` is 0). */
  readonly min: number;
  /** Largest usage among users active in the window (0 when `users` is 0). */
  readonly max: number;
  /** Users with positive usage in the window. */
  readonly users: number;
}

export interface UsageReader {
  /** `user`'s weighted tokens within the window ending at `now`; 0 for a user never seen. */
  tokens(user: string, now: number): number;
  /** The spread of usage across active users (may lag by up to `boundsEveryMs`). */
  bounds(now: number): UsageBounds;
}

export interface UsageViewOptions {
  /** Window length (ms). Default 5 minutes. */
  windowMs?: number;
  /** Buckets per window: the window's resolution. Default 10. */
  buckets?: number;
  /** Bound on tracked users. Default 10,000. */
  maxUsers?: number;
  /** Weight of a prompt token. Default 1. */
  inputWeight?: number;
  /** Weight of a completion token. Default 2. */
  outputWeight?: number;
  /**
   * `bounds()` scans every user, so it is recomputed at most this often (ms). Default 1,000:
   * routing reads it per request, and a bucket is 30 s wide anyway.
   */
  boundsEveryMs?: number;
}

interface UserUsage {
  /** Number of the newest bucket written (`floor(ts / bucketMs)`). */
  head: number;
  /** Ring of per-bucket totals; bucket k lives in slot k mod buckets. */
  readonly slots: number[];
}

const NO_USERS: UsageBounds = Object.freeze({ min: 0, max: 0, users: 0 });

export class UsageView implements UsageReader {
  readonly windowMs: number;
  readonly buckets: number;
  readonly bucketMs: number;
  readonly maxUsers: number;
  readonly inputWeight: number;
  readonly outputWeight: number;
  readonly boundsEveryMs: number;
  /** Insertion order = order of last record: the first entry is the least recently active user. */
  private readonly users = new Map<string, UserUsage>();
  private cachedBounds: UsageBounds = NO_USERS;
  private boundsAt = Number.NEGATIVE_INFINITY;
  /** Users dropped because the bound was reached. */
  evicted = 0;
  /** Records ignored: empty user, no tokens, not a finite number, or older than the window. */
  ignored = 0;

  constructor(opts: UsageViewOptions = {}) {
    this.windowMs = opts.windowMs ?? 300_000;
    this.buckets = Math.max(1, Math.floor(opts.buckets ?? 10));
    this.bucketMs = this.windowMs / this.buckets;
    this.maxUsers = Math.max(1, opts.maxUsers ?? 10_000);
    this.inputWeight = opts.inputWeight ?? 1;
    this.outputWeight = opts.outputWeight ?? 2;
    this.boundsEveryMs = opts.boundsEveryMs ?? 1_000;
  }

  record(r: UsageRecord): void {
    const tokens = Math.max(0, r.promptTokens) * this.inputWeight + Math.max(0, r.completionTokens) * this.outputWeight;
    const k = Math.floor(r.ts / this.bucketMs);
    if (!r.user || !(tokens > 0) || !Number.isFinite(tokens) || !Number.isFinite(k)) {
      this.ignored++;
      return;
    }
    let u = this.users.get(r.user);
    if (u && k <= u.head - this.buckets) {
      this.ignored++;
      return;
    }
    if (u) this.users.delete(r.user);
    else {
      if (this.users.size >= this.maxUsers) this.evictOldest();
      u = { head: k, slots: new Array<number>(this.buckets).fill(0) };
    }
    if (k > u.head) {
      // Buckets between the old head and k lie in the past of the new head: clear what they held.
      const stale = Math.min(k - u.head, this.buckets);
      for (let i = 1; i <= stale; i++) u.slots[this.slot(u.head + i)] = 0;
      u.head = k;
    }
    const slot = this.slot(k);
    u.slots[slot] = (u.slots[slot] ?? 0) + tokens;
    this.users.set(r.user, u);
  }

  tokens(user: string, now: number): number {
    const u = this.users.get(user);
    return u ? this.sum(u, now) : 0;
  }

  bounds(now: number): UsageBounds {
    if (now >= this.boundsAt && now - this.boundsAt < this.boundsEveryMs) return this.cachedBounds;
    let min = Number.POSITIVE_INFINITY;
    let max = 0;
    let users = 0;
    const oldest = Math.floor(now / this.bucketMs) - this.buckets + 1;
    for (const [user, u] of this.users) {
      const t = this.sum(u, now);
      if (t > 0) {
        users++;
        if (t < min) min = t;
        if (t > max) max = t;
      } else if (u.head < oldest) this.users.delete(user); // expired: free it while we are here
    }
    this.cachedBounds = users === 0 ? NO_USERS : { min, max, users };
    this.boundsAt = now;
    return this.cachedBounds;
  }

  /** Forgets users with nothing left in the window. Returns how many went. */
  sweep(now: number): number {
    const oldest = Math.floor(now / this.bucketMs) - this.buckets + 1;
    let n = 0;
    for (const [user, u] of this.users) {
      if (u.head < oldest) {
        this.users.delete(user);
        n++;
      }
    }
    return n;
  }

  get size(): number {
    return this.users.size;
  }

  /** Each user's usage in the window ending at `now`, in a canonical order (state comparison). */
  dump(now: number): Array<[string, number]> {
    return [...this.users.keys()]
      .map((u): [string, number] => [u, this.tokens(u, now)])
      .filter(([, t]) => t > 0)
      .sort((a, b) => (a[0] < b[0] ? -1 : 1));
  }

  /** Sum of the buckets of `u` inside the window ending at `now` (a future head still counts). */
  private sum(u: UserUsage, now: number): number {
    const lo = Math.max(u.head - this.buckets + 1, Math.floor(now / this.bucketMs) - this.buckets + 1);
    let t = 0;
    for (let k = lo; k <= u.head; k++) t += u.slots[this.slot(k)] ?? 0;
    return t;
  }

  private slot(k: number): number {
    return ((k % this.buckets) + this.buckets) % this.buckets;
  }

  private evictOldest(): void {
    const first = this.users.keys().next();
    if (first.done) return;
    this.users.delete(first.value);
    this.evicted++;
  }
}
