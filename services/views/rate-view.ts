/**
 * Request and token counts for rate limits, from every replica's charges and releases. Pure.
 *
 * Fixed windows as AIBrix uses them: per user, requests and tokens (prompt + completion) in the
 * current minute; per model, requests in the current second. Every replica folds the same
 * CHARGES stream, so all enforce the same counts; the overshoot is bounded by what other
 * replicas admit during one propagation delay (see docs/architecture.md).
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

export class RateView implements RateReader {
  private readonly users = new Map<string, Window>();
  private readonly models = new Map<string, Window>();

  constructor(private readonly maxKeys = 100_000) {}

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
  }

  get size(): number {
    return this.users.size + this.models.size;
  }
}
