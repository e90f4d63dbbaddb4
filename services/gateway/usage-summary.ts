/**
 * This gateway's `usage` summaries (schemas/events.ts `UsageSummary`): its own per-user admissions
 * in the current rate-limit minute, for the gateways of other pools (docs/architecture.md, "Model
 * configs and rate limits"). Pure: the shell calls `next(now)` on its timer and publishes what it
 * returns.
 *
 * Only users with a rate limit are listed (a deployment without per-user limits sends nothing),
 * most requests first, at most `maxUsers` and within `maxBytes` of JSON; the rest are counted in
 * `truncated`. A summary that would repeat the previous one (same minute, no own admission or
 * release since, same limits) is not sent, except every `USAGE_RESEND_MS` (a reader whose bound
 * evicted it gets it back): each summary is the whole minute so far, and the USAGE stream keeps the
 * last one per gateway process for whoever boots.
 */
import { MAX_USAGE_USERS, type UsageSummary } from "../../schemas/events.js";

export interface UsageSource {
  readonly rates: {
    readonly mineVersion: number;
    ownUsage(now: number, maxUsers: number, include: (user: string) => boolean): { window: number; users: Array<[string, number, number]>; truncated: number };
  };
  readonly configs: { readonly version: number; userLimits(user: string | undefined): object | undefined };
}

export interface UsageSummaryOptions {
  gateway: string;
  /** The gateway's pool; undefined = unpooled. */
  pool?: string;
  startedAt: number;
  /** At most this many users per summary (default and maximum `MAX_USAGE_USERS`). */
  maxUsers?: number;
  /** The server's `max_payload`, read at each summary (a reconnect may change it). */
  maxPayload: () => number | undefined;
}

/** UTF-8 bytes of one `[user, requests, tokens]` entry as JSON, and its separator (a user id of 256 characters may take 768 bytes). */
const entryBytes = (e: readonly [string, number, number]) => Buffer.byteLength(JSON.stringify(e[0])) + String(e[1]).length + String(e[2]).length + 4;

/** A summary that says nothing new is still re-sent this often: a reader that evicted it (its bound) gets it back. */
export const USAGE_RESEND_MS = 10_000;

export class UsageSummaries {
  /** Summaries built, and users left out of them in all. */
  sent = 0;
  truncatedUsers = 0;
  private lastKey = "";
  private lastEmpty = true;

  constructor(
    private readonly source: UsageSource,
    private readonly o: UsageSummaryOptions,
  ) {}

  /** The summary to publish now, or undefined when it would say nothing new. */
  next(now: number): UsageSummary | undefined {
    const { rates, configs } = this.source;
    const maxUsers = Math.min(this.o.maxUsers ?? MAX_USAGE_USERS, MAX_USAGE_USERS);
    const own = rates.ownUsage(now, maxUsers, (u) => configs.userLimits(u) !== undefined);
    const key = `${own.window}/${rates.mineVersion}/${configs.version}/${Math.floor(now / USAGE_RESEND_MS)}`;
    // An empty minute is sent once after a non-empty one (a retracted request may empty it), then not again.
    if (key === this.lastKey || (own.users.length === 0 && this.lastEmpty)) {
      this.lastKey = key;
      return undefined;
    }
    const ev: UsageSummary = {
      type: "usage",
      gateway: this.o.gateway,
      ...(this.o.pool !== undefined ? { pool: this.o.pool } : {}),
      startedAt: this.o.startedAt,
      window: own.window,
      ts: now,
      users: own.users,
    };
    // 10% of the server's bound left for the PUB line and headers, and room for `truncated`.
    const budget = Math.floor((this.o.maxPayload() ?? 1024 * 1024) * 0.9) - Buffer.byteLength(JSON.stringify({ ...ev, users: [] })) - 32;
    const fits = (users: ReadonlyArray<readonly [string, number, number]>) => {
      let left = budget;
      for (let i = 0; i < users.length; i++) if ((left -= entryBytes(users[i] as [string, number, number])) < 0) return i;
      return users.length;
    };
    let truncated = own.truncated;
    if (fits(own.users) < own.users.length) {
      // Over the byte bound: keep the most active users.
      own.users.sort((a, b) => b[1] - a[1] || b[2] - a[2]);
      const n = fits(own.users);
      truncated += own.users.length - n;
      own.users.length = n;
    }
    if (truncated > 0) ev.truncated = truncated;
    this.truncatedUsers += truncated;
    this.lastKey = key;
    this.lastEmpty = own.users.length === 0;
    this.sent++;
    return ev;
  }
}
