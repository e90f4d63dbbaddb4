/**
 * Request and token counts for rate limits, from every replica's charges and releases. Pure.
 *
 * Fixed windows as AIBrix uses them: per user, requests and tokens (prompt + completion) in the
 * current minute; per model, requests in the current second. Every replica folds the same
 * CHARGES stream, so all enforce the same counts; the overshoot is bounded by what other
 * replicas admit during one propagation delay (see docs/architecture.md).
 *
 * It also remembers this replica's own admissions of the last `unconfirmedMs`: the ones other
 * replicas may not have seen yet. The director reserves room for as many from each other
 * replica, so a burst spread over R replicas inside the propagation delay cannot take R x the
 * limit (docs/architecture.md, "Model configs and rate limits").
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

interface OwnAdmission {
  ts: number;
  tokens: number;
}

/** Key of a user's or a model's own-admission list. */
const ownKey = (kind: "user" | "model", name: string) => `${kind === "user" ? "u" : "m"}\u0000${name}`;

/** Drops the admissions at or before `cutoff` from the front of a time-ordered list. */
function pruneOwn(list: OwnAdmission[], cutoff: number): void {
  let drop = 0;
  while (drop < list.length && (list[drop] as OwnAdmission).ts <= cutoff) drop++;
  if (drop > 0) list.splice(0, drop);
}

export class RateView implements RateReader {
  private readonly users = new Map<string, Window>();
  private readonly models = new Map<string, Window>();
  /** Own admissions of the last `unconfirmedMs`, per `u\0user` / `m\0model`, oldest first. */
  private readonly own = new Map<string, OwnAdmission[]>();

  constructor(
    private readonly maxKeys = 100_000,
    /** How long an own admission may still be unseen by other replicas (above the charge propagation delay). */
    readonly unconfirmedMs = 25,
  ) {}

  /**
   * Records one of this replica's own admissions (besides `request`, which counts it), for the
   * user and/or the model; the caller passes only those that have a limit.
   */
  noteOwn(user: string | undefined, model: string | undefined, tokens: number, ts: number): void {
    if (user) this.pushOwn(ownKey("user", user), ts, tokens);
    if (model) this.pushOwn(ownKey("model", model), ts, 0);
  }

  private pushOwn(key: string, ts: number, tokens: number): void {
    let list = this.own.get(key);
    if (!list) {
      if (this.own.size >= this.maxKeys) this.own.delete(this.own.keys().next().value as string);
      this.own.set(key, (list = []));
    }
    list.push({ ts, tokens });
    // Bounded by what one replica admits within `unconfirmedMs`, whether or not anyone reads it.
    pruneOwn(list, ts - this.unconfirmedMs);
  }

  /**
   * Restarts the unseen period of an own admission made at `ts` whose publish was acknowledged
   * only at `now` (strict mode): it is moved to `now`, or noted again if it had already aged out.
   */
  renoteOwn(user: string | undefined, model: string | undefined, tokens: number, ts: number, now: number): void {
    for (const [key, t] of [[user && ownKey("user", user), tokens] as const, [model && ownKey("model", model), 0] as const]) {
      if (!key) continue;
      this.takeOwn(key, ts, t);
      this.pushOwn(key, Math.max(now, ts), t);
    }
  }

  /** Own admissions of the last `unconfirmedMs` for a user or a model: requests and tokens. */
  ownRecent(kind: "user" | "model", name: string, now: number): { requests: number; tokens: number } {
    const key = ownKey(kind, name);
    const list = this.own.get(key);
    if (!list) return { requests: 0, tokens: 0 };
    pruneOwn(list, now - this.unconfirmedMs);
    if (list.length === 0) {
      this.own.delete(key);
      return { requests: 0, tokens: 0 };
    }
    let tokens = 0;
    for (const a of list) tokens += a.tokens;
    return { requests: list.length, tokens };
  }

  /** When the oldest own admission of a user or model stops counting as unconfirmed (or `now`). */
  ownConfirmedAt(kind: "user" | "model", name: string, now: number): number {
    const first = this.own.get(ownKey(kind, name))?.[0];
    return first ? Math.max(now, first.ts + this.unconfirmedMs) : now;
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

  /** A request charged at `ts` (ms). */
  request(user: string | undefined, model: string, promptTokens: number, ts: number): void {
    if (user) this.bump(this.users, user, Math.floor(ts / 60_000), 1, promptTokens);
    this.bump(this.models, model, Math.floor(ts / 1_000), 1, 0);
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
    if (user) undo(this.users, user, Math.floor(ts / 60_000), promptTokens);
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
    list.splice(i, 1);
    return true;
  }

  /**
   * Replaces a request's estimated prompt tokens by the engine's count (its usage report) in the
   * window the request was charged in, if that window is still the user's current one.
   */
  correctPrompt(user: string | undefined, delta: number, chargedAt: number): void {
    if (!user || delta === 0) return;
    const w = this.users.get(user);
    if (w && w.window === Math.floor(chargedAt / 60_000)) w.tokens = Math.max(0, w.tokens + delta);
  }

  /** Completion tokens of a request that ended at `ts`. */
  completion(user: string | undefined, tokens: number, ts: number): void {
    if (user && tokens > 0) this.bump(this.users, user, Math.floor(ts / 60_000), 0, tokens);
  }

  private current(map: Map<string, Window>, key: string, window: number): Window | undefined {
    const w = map.get(key);
    return w && w.window === window ? w : undefined;
  }

  userRequests(user: string, now: number): number {
    return this.current(this.users, user, Math.floor(now / 60_000))?.requests ?? 0;
  }

  userTokens(user: string, now: number): number {
    return this.current(this.users, user, Math.floor(now / 60_000))?.tokens ?? 0;
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
    for (const [k, list] of this.own) if ((list[list.length - 1]?.ts ?? 0) <= now - this.unconfirmedMs) this.own.delete(k);
  }

  get size(): number {
    return this.users.size + this.models.size + this.own.size;
  }

  /** The windows still current at `now`, in a canonical order (state comparison). */
  dump(now: number): { users: Array<[string, number, number]>; models: Array<[string, number]> } {
    const minute = Math.floor(now / 60_000);
    const second = Math.floor(now / 1_000);
    const users = [...this.users.entries()].filter(([, w]) => w.window === minute).map(([k, w]): [string, number, number] => [k, w.requests, w.tokens]);
    const models = [...this.models.entries()].filter(([, w]) => w.window === second).map(([k, w]): [string, number] => [k, w.requests]);
    const byKey = (a: [string, ...unknown[]], b: [string, ...unknown[]]) => (a[0] < b[0] ? -1 : 1);
    return { users: users.sort(byKey), models: models.sort(byKey) };
  }
}
