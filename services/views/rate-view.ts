/**
 * Request and token counts for rate limits, from every replica's charges and releases. Pure.
 *
 * Fixed windows as AIBrix uses them: per user, requests and tokens (prompt + completion) in the
 * current minute; per model, requests in the current second. Every replica folds the same
 * CHARGES stream, so all enforce the same counts; the overshoot is bounded by what other
 * replicas admit during one propagation delay (see docs/architecture.md).
 *
 * It also remembers this replica's own admissions that other replicas may not have seen yet: an
 * admission counts as unseen until its own charge has come back through the CHARGES stream (its
 * echo: the stream has it, and the other replicas read it as this one does) and `unconfirmedMs`
 * more have passed after that echo; at most `maxUnseenMs` (a lost publish). Waiting for the echo, not a fixed
 * time, keeps the guard true on a loaded host, where the stream's delay grows past any constant.
 * The director reserves room for as many from each other replica, so a burst spread over R
 * replicas inside the propagation delay cannot take R x the limit (docs/architecture.md, "Model
 * configs and rate limits").
 *
 * Gateway pools: a pool's replicas fold only their pool's CHARGES stream, so the per-user counts
 * above are the pool's. Every gateway therefore also keeps its OWN per-user counts of the window
 * (`ownUsage`, published as a `usage` summary by the shell), and the summaries of the gateways of
 * other namespaces are added to `userRequests` / `userTokens` (`applyForeign`). Per-model counts
 * need none of it: a model is in one pool.
 */

interface Window {
  window: number;
  requests: number;
  tokens: number;
}

export interface RateReader {
  userRequests(user: string, now: number): number;
  userTokens(user: string, now: number): number;
  modelRequests(model: string, now: number): number;
}

/** One foreign gateway's latest summary of one window: users and their [requests, tokens], flat. */
interface HeldSummary {
  ts: number;
  users: string[];
  /** requests, tokens per user, in `users` order. */
  counts: number[];
}

/** A `usage` summary as the fold hands it over (schemas/events.ts `UsageSummary`, keyed). */
export interface ForeignSummary {
  /** The publishing gateway process: gateway id and start time (a restart is another publisher). */
  key: string;
  /** Start of the summary's minute (ms). */
  window: number;
  ts: number;
  users: ReadonlyArray<readonly [string, number, number]>;
}

export interface ForeignUsageBounds {
  /** Users held over every foreign summary (default 200,000). */
  maxEntries?: number;
  /** Foreign gateway processes held (default 4,096). */
  maxGateways?: number;
}

interface OwnAdmission {
  ts: number;
  tokens: number;
  /** The charge's echo was read back from the stream (or nothing waits for one). */
  echoed: boolean;
  /** When the echo was read (the admission's `ts` when none was awaited). */
  echoedAt: number;
  /** The charge id whose echo is awaited. */
  id?: string;
}

/**
 * The one bucket requests without a user share (per-user limits: `users.default`). No client can
 * name it: HTTP header values cannot carry NUL, and API-key users are validated names.
 */
export const ANONYMOUS_USER = "\u0000anonymous";
/** The key a request's user is counted under. */
export const rateUserOf = (user: string | undefined): string => user || ANONYMOUS_USER;

/** Key of a user's or a model's own-admission list. */
const ownKey = (kind: "user" | "model", name: string) => `${kind === "user" ? "u" : "m"}\u0000${name}`;

/** How often a request held for an admission whose echo has not come yet asks again (ms). */
export const ECHO_POLL_MS = 5;

/** How long own admissions may be unseen by the other replicas before room stops being reserved for theirs (ms). */
export const DEFAULT_RATE_CONFIRM_MS = 25;

export class RateView implements RateReader {
  private readonly users = new Map<string, Window>();
  private readonly models = new Map<string, Window>();
  /** Own admissions still possibly unseen by other replicas, per `u\0user` / `m\0model`, oldest first. */
  private readonly own = new Map<string, OwnAdmission[]>();
  /** Own admissions waiting for their charge's echo, by charge id (a user's and a model's entry share one). */
  private readonly awaiting = new Map<string, OwnAdmission[]>();
  /** An own admission whose echo never comes (its publish was lost) stops counting after this long (ms). */
  readonly maxUnseenMs: number;
  /** This replica's own per-user counts of the current minute: what its `usage` summary says. */
  private readonly mine = new Map<string, Window>();
  /** Bumped on every change of `mine`: the shell skips a summary that would repeat the last one. */
  mineVersion = 0;
  /**
   * Other namespaces' gateways: per gateway process, its latest summary per minute (at most the
   * two newest minutes). Memory, measured on Node 20 (heap after GC, 13-character user ids,
   * 200,000 entries from 20 gateways): about 70 bytes per held entry when the gateways list the
   * same users, about 175 when every entry is another user (then each also has its own totals
   * entry): the default bound of 200,000 entries takes 14 to 35 MB.
   */
  private readonly foreign = new Map<string, Map<number, HeldSummary>>();
  /** Sum of the held summaries per minute and user: [requests, tokens]. */
  private readonly foreignTotals = new Map<number, Map<string, [number, number]>>();
  /** User entries over all held summaries (the bound's measure). */
  foreignEntries = 0;
  /** Held summaries dropped to keep the bound (oldest-updated gateway first). */
  foreignEvicted = 0;
  private readonly maxForeignEntries: number;
  private readonly maxForeignGateways: number;

  constructor(
    private readonly maxKeys = 100_000,
    /** How long an own admission may still be unseen by other replicas (above the charge propagation delay). */
    readonly unconfirmedMs = DEFAULT_RATE_CONFIRM_MS,
    foreignBounds: ForeignUsageBounds = {},
  ) {
    this.maxUnseenMs = Math.max(1_000, 4 * unconfirmedMs);
    this.maxForeignEntries = foreignBounds.maxEntries ?? 200_000;
    this.maxForeignGateways = foreignBounds.maxGateways ?? 4_096;
  }

  /**
   * Records one of this replica's own admissions (besides `request`, which counts it), for the
   * user and/or the model; the caller passes only those that have a limit. With `chargeId` the
   * admission stays unseen until `echoOwn(chargeId)` (then `unconfirmedMs` more); without, for
   * `unconfirmedMs`.
   */
  noteOwn(user: string | undefined, model: string | undefined, tokens: number, ts: number, chargeId?: string): void {
    if (user) this.pushOwn(ownKey("user", user), ts, tokens, chargeId);
    if (model) this.pushOwn(ownKey("model", model), ts, 0, chargeId);
  }

  private pushOwn(key: string, ts: number, tokens: number, id?: string): void {
    let list = this.own.get(key);
    if (!list) {
      if (this.own.size >= this.maxKeys) this.dropOwn(this.own.keys().next().value as string);
      this.own.set(key, (list = []));
    }
    const a: OwnAdmission = id === undefined ? { ts, tokens, echoed: true, echoedAt: ts } : { ts, tokens, echoed: false, echoedAt: ts, id };
    list.push(a);
    if (id !== undefined) {
      const same = this.awaiting.get(id);
      if (same) same.push(a);
      else this.awaiting.set(id, [a]);
    }
    // Bounded by what one replica admits within the unseen time, whether or not anyone reads it.
    this.pruneOwn(list, ts);
  }

  private dropOwn(key: string): void {
    for (const a of this.own.get(key) ?? []) this.unawait(a);
    this.own.delete(key);
  }

  private unawait(a: OwnAdmission): void {
    if (a.echoed || a.id === undefined) return;
    const same = this.awaiting.get(a.id);
    if (!same) return;
    const i = same.indexOf(a);
    if (i >= 0) same.splice(i, 1);
    if (same.length === 0) this.awaiting.delete(a.id);
  }

  /** Whether an own admission may still be unseen by the other replicas at `now`. */
  private unseen(a: OwnAdmission, now: number): boolean {
    // 0 turns the guard off (`--rate-confirm-ms 0`).
    if (this.unconfirmedMs <= 0 || a.ts <= now - this.maxUnseenMs) return false;
    return !a.echoed || a.echoedAt > now - this.unconfirmedMs;
  }

  /** Drops the seen admissions from the front of a time-ordered list. */
  private pruneOwn(list: OwnAdmission[], now: number): void {
    let drop = 0;
    while (drop < list.length && !this.unseen(list[drop] as OwnAdmission, now)) this.unawait(list[drop++] as OwnAdmission);
    if (drop > 0) list.splice(0, drop);
  }

  /** Own charges published and not yet read back: the shell looks for their echoes only then. */
  get awaitingEcho(): number {
    return this.awaiting.size;
  }

  /**
   * The charge `chargeId`, published by this replica, was read back from the CHARGES stream at
   * `now`: the other replicas read it about as late, so it stays unseen `unconfirmedMs` more.
   */
  echoOwn(chargeId: string, now: number): void {
    const same = this.awaiting.get(chargeId);
    if (!same) return;
    this.awaiting.delete(chargeId);
    for (const a of same) {
      a.echoed = true;
      a.echoedAt = Math.max(a.ts, now);
    }
  }

  /**
   * Restarts the unseen period of an own admission made at `ts` whose publish was acknowledged
   * only at `now` (strict mode): it is moved to `now`, or noted again if it had already aged out.
   * The acknowledgement says the stream has it: no echo is awaited.
   */
  renoteOwn(user: string | undefined, model: string | undefined, tokens: number, ts: number, now: number): void {
    for (const [key, t] of [[user && ownKey("user", user), tokens] as const, [model && ownKey("model", model), 0] as const]) {
      if (!key) continue;
      this.takeOwn(key, ts, t);
      this.pushOwn(key, Math.max(now, ts), t);
    }
  }

  /** Own admissions a user or a model may still have unseen by the other replicas: requests and tokens. */
  ownRecent(kind: "user" | "model", name: string, now: number): { requests: number; tokens: number } {
    const key = ownKey(kind, name);
    const list = this.own.get(key);
    if (!list) return { requests: 0, tokens: 0 };
    this.pruneOwn(list, now);
    if (list.length === 0) {
      this.own.delete(key);
      return { requests: 0, tokens: 0 };
    }
    let requests = 0;
    let tokens = 0;
    for (const a of list) {
      if (!this.unseen(a, now)) continue;
      requests++;
      tokens += a.tokens;
    }
    return { requests, tokens };
  }

  /**
   * When the next own admission of a user or model stops counting as unseen (or `now`); for one
   * whose echo has not come, a short poll (`ECHO_POLL_MS`), never past its `maxUnseenMs`.
   */
  ownConfirmedAt(kind: "user" | "model", name: string, now: number): number {
    let at = Number.POSITIVE_INFINITY;
    for (const a of this.own.get(ownKey(kind, name)) ?? []) {
      if (!this.unseen(a, now)) continue;
      const next = a.echoed ? a.echoedAt + this.unconfirmedMs : Math.min(now + ECHO_POLL_MS, a.ts + this.maxUnseenMs);
      if (next < at) at = next;
    }
    return Number.isFinite(at) ? Math.max(now, at) : now;
  }

  private bump(map: Map<string, Window>, key: string, window: number, requests: number, tokens: number): void {
    let w = map.get(key);
    if (!w || w.window < window) {
      if (!w && map.size >= this.maxKeys) map.delete(map.keys().next().value as string);
      w = { window, requests: 0, tokens: 0 };
      map.set(key, w);
    } else if (w.window > window) return; // an event from a window already over: it no longer counts
    w.requests += requests;
    w.tokens += tokens;
  }

  /** A request charged at `ts` (ms); `own` = admitted by this replica (counted in its summary too). */
  request(user: string | undefined, model: string, promptTokens: number, ts: number, own = false): void {
    const u = rateUserOf(user);
    this.bump(this.users, u, Math.floor(ts / 60_000), 1, promptTokens);
    if (own) this.bumpMine(u, Math.floor(ts / 60_000), 1, promptTokens);
    this.bump(this.models, model, Math.floor(ts / 1_000), 1, 0);
  }

  private bumpMine(user: string, window: number, requests: number, tokens: number): void {
    this.bump(this.mine, user, window, requests, tokens);
    this.mineVersion++;
  }

  /**
   * Undoes `request` (and the `noteOwn` described by `own`, if any) for a request that will not
   * be routed after all: counted at `ts`.
   */
  retract(user: string | undefined, model: string, promptTokens: number, ts: number, own?: { user?: string; model?: string; tokens: number; ts: number }): void {
    const undo = (map: Map<string, Window>, key: string, window: number, tokens: number) => {
      const w = map.get(key);
      if (w && w.window === window) {
        w.requests = Math.max(0, w.requests - 1);
        w.tokens = Math.max(0, w.tokens - tokens);
      }
    };
    const u = rateUserOf(user);
    undo(this.users, u, Math.floor(ts / 60_000), promptTokens);
    // Only this replica's own requests are ever retracted.
    undo(this.mine, u, Math.floor(ts / 60_000), promptTokens);
    this.mineVersion++;
    undo(this.models, model, Math.floor(ts / 1_000), 0);
    if (own) {
      if (own.user) this.takeOwn(ownKey("user", own.user), own.ts, own.tokens);
      if (own.model) this.takeOwn(ownKey("model", own.model), own.ts, 0);
    }
  }

  /** Removes the newest own admission made at `ts` with `tokens`; false if none is left. */
  private takeOwn(key: string, ts: number, tokens: number): boolean {
    const list = this.own.get(key);
    const i = list ? list.findLastIndex((a) => a.ts === ts && a.tokens === tokens) : -1;
    if (!list || i < 0) return false;
    this.unawait(list[i] as OwnAdmission);
    list.splice(i, 1);
    return true;
  }

  /**
   * Replaces a request's estimated prompt tokens by the engine's count (its usage report) in the
   * window the request was charged in, if that window is still the user's current one.
   */
  correctPrompt(user: string | undefined, delta: number, chargedAt: number, own = false): void {
    if (delta === 0) return;
    const u = rateUserOf(user);
    for (const map of own ? [this.users, this.mine] : [this.users]) {
      const w = map.get(u);
      if (w && w.window === Math.floor(chargedAt / 60_000)) w.tokens = Math.max(0, w.tokens + delta);
    }
    if (own) this.mineVersion++;
  }

  /** Completion tokens of a request that ended at `ts` (`own`: one this replica routed). */
  completion(user: string | undefined, tokens: number, ts: number, own = false): void {
    if (tokens <= 0) return;
    const u = rateUserOf(user);
    this.bump(this.users, u, Math.floor(ts / 60_000), 0, tokens);
    if (own) this.bumpMine(u, Math.floor(ts / 60_000), 0, tokens);
  }

  /**
   * This replica's own per-user counts in the minute of `now`, users with `include(user)` only,
   * most requests first, at most `maxUsers` (the others counted in `truncated`).
   */
  ownUsage(now: number, maxUsers: number, include: (user: string) => boolean = () => true): { window: number; users: Array<[string, number, number]>; truncated: number } {
    const minute = Math.floor(now / 60_000);
    const users: Array<[string, number, number]> = [];
    for (const [user, w] of this.mine) if (w.window === minute && (w.requests > 0 || w.tokens > 0) && include(user)) users.push([user, w.requests, w.tokens]);
    let truncated = 0;
    if (users.length > maxUsers) {
      users.sort((a, b) => b[1] - a[1] || b[2] - a[2]);
      truncated = users.length - maxUsers;
      users.length = maxUsers;
    }
    return { window: minute * 60_000, users, truncated };
  }

  /**
   * Folds another namespace's gateway summary: it replaces that gateway's previous summary of the
   * same minute (each is the whole minute so far), and its minutes older than the one before
   * are dropped. "stale" if an equal or newer summary of that minute is held already.
   */
  applyForeign(s: ForeignSummary): "applied" | "stale" {
    const minute = Math.floor(s.window / 60_000);
    const held = this.foreign.get(s.key);
    if (held) {
      if (minute < Math.max(...held.keys()) - 1) return "stale";
      const same = held.get(minute);
      if (same && same.ts > s.ts) return "stale";
      for (const m of [...held.keys()]) if (m <= minute - 2 || m === minute) this.dropHeld(s.key, m);
    }
    const entries = Math.min(s.users.length, this.maxForeignEntries);
    this.makeRoom(s.key, entries);
    // Most recently updated last: eviction takes the first.
    let byWindow = this.foreign.get(s.key);
    if (byWindow) this.foreign.delete(s.key);
    else byWindow = new Map();
    this.foreign.set(s.key, byWindow);
    const summary: HeldSummary = { ts: s.ts, users: [], counts: [] };
    let totals = this.foreignTotals.get(minute);
    if (!totals) this.foreignTotals.set(minute, (totals = new Map()));
    for (let i = 0; i < entries; i++) {
      const [user, requests, tokens] = s.users[i] as readonly [string, number, number];
      summary.users.push(user);
      summary.counts.push(requests, tokens);
      const t = totals.get(user);
      if (t) {
        t[0] += requests;
        t[1] += tokens;
      } else totals.set(user, [requests, tokens]);
    }
    byWindow.set(minute, summary);
    this.foreignEntries += entries;
    return "applied";
  }

  /** Drops the least recently updated gateways' summaries until `entries` more (from `key`) fit the bounds. */
  private makeRoom(key: string, entries: number): void {
    for (const [k, byWindow] of this.foreign) {
      const gateways = this.foreign.size + (this.foreign.has(key) ? 0 : 1);
      if (this.foreignEntries + entries <= this.maxForeignEntries && gateways <= this.maxForeignGateways) return;
      for (const m of [...byWindow.keys()]) this.dropHeld(k, m);
      this.foreignEvicted++;
    }
  }

  /** Takes one held summary out of the totals (and its gateway out of `foreign` once it holds none). */
  private dropHeld(key: string, minute: number): void {
    const byWindow = this.foreign.get(key);
    const held = byWindow?.get(minute);
    if (!byWindow || !held) return;
    byWindow.delete(minute);
    if (byWindow.size === 0) this.foreign.delete(key);
    this.foreignEntries -= held.users.length;
    const totals = this.foreignTotals.get(minute);
    if (!totals) return;
    for (let i = 0; i < held.users.length; i++) {
      const user = held.users[i] as string;
      const t = totals.get(user);
      if (!t) continue;
      t[0] -= held.counts[2 * i] as number;
      t[1] -= held.counts[2 * i + 1] as number;
      if (t[0] <= 0 && t[1] <= 0) totals.delete(user);
    }
    if (totals.size === 0) this.foreignTotals.delete(minute);
  }

  /** Foreign gateway processes with a summary held. */
  get foreignGateways(): number {
    return this.foreign.size;
  }

  /** Other namespaces' requests and tokens of `user` in the minute of `now`. */
  foreignOf(user: string, now: number): { requests: number; tokens: number } {
    const t = this.foreignTotals.get(Math.floor(now / 60_000))?.get(user);
    return t ? { requests: t[0], tokens: t[1] } : { requests: 0, tokens: 0 };
  }

  private current(map: Map<string, Window>, key: string, window: number): Window | undefined {
    const w = map.get(key);
    return w && w.window === window ? w : undefined;
  }

  /** The user's requests in the minute of `now`: this namespace's, plus the other namespaces' summaries. */
  userRequests(user: string, now: number): number {
    const minute = Math.floor(now / 60_000);
    return (this.current(this.users, user, minute)?.requests ?? 0) + (this.foreignTotals.get(minute)?.get(user)?.[0] ?? 0);
  }

  userTokens(user: string, now: number): number {
    const minute = Math.floor(now / 60_000);
    return (this.current(this.users, user, minute)?.tokens ?? 0) + (this.foreignTotals.get(minute)?.get(user)?.[1] ?? 0);
  }

  modelRequests(model: string, now: number): number {
    return this.current(this.models, model, Math.floor(now / 1_000))?.requests ?? 0;
  }

  /** Drops windows that are over (call on a timer). */
  sweep(now: number): void {
    const minute = Math.floor(now / 60_000);
    const second = Math.floor(now / 1_000);
    for (const [k, w] of this.users) if (w.window < minute) this.users.delete(k);
    for (const [k, w] of this.models) if (w.window < second) this.models.delete(k);
    for (const [k, w] of this.mine) if (w.window < minute) this.mine.delete(k);
    // A gateway that died: its last summary counts until its minute is over.
    for (const [key, byWindow] of [...this.foreign]) for (const m of [...byWindow.keys()]) if (m < minute) this.dropHeld(key, m);
    for (const [k, list] of [...this.own]) {
      this.pruneOwn(list, now);
      if (list.every((a) => !this.unseen(a, now))) this.dropOwn(k);
    }
  }

  get size(): number {
    return this.users.size + this.models.size + this.own.size + this.mine.size + this.foreignEntries;
  }

  /** The windows still current at `now`, in a canonical order (state comparison). */
  dump(now: number): { users: Array<[string, number, number]>; models: Array<[string, number]>; mine: Array<[string, number, number]>; foreign: Array<[string, number, number]> } {
    const minute = Math.floor(now / 60_000);
    const second = Math.floor(now / 1_000);
    const users = [...this.users.entries()].filter(([, w]) => w.window === minute).map(([k, w]): [string, number, number] => [k, w.requests, w.tokens]);
    const models = [...this.models.entries()].filter(([, w]) => w.window === second).map(([k, w]): [string, number] => [k, w.requests]);
    const byKey = (a: [string, ...unknown[]], b: [string, ...unknown[]]) => (a[0] < b[0] ? -1 : 1);
    const mine = [...this.mine.entries()].filter(([, w]) => w.window === minute).map(([k, w]): [string, number, number] => [k, w.requests, w.tokens]);
    const foreign = [...(this.foreignTotals.get(minute) ?? [])].map(([k, t]): [string, number, number] => [k, t[0], t[1]]);
    return { users: users.sort(byKey), models: models.sort(byKey), mine: mine.sort(byKey), foreign: foreign.sort(byKey) };
  }
}
