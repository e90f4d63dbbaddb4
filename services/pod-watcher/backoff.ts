/**
 * Retry delays for failed publishes and broken watches: exponential from `baseMs`, capped at
 * `maxMs`, with jitter in [50%, 100%] so a fleet of watchers that lost NATS at once does not
 * come back in lockstep. Pure: the random draw is the caller's.
 */
export interface BackoffOptions {
  baseMs: number;
  maxMs: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = { baseMs: 200, maxMs: 10_000 };

/** Delay before retry number `attempt` (0 = the first retry); `random` in [0, 1). */
export function backoffDelayMs(attempt: number, random: number, o: BackoffOptions = DEFAULT_BACKOFF): number {
  const exp = Math.min(o.maxMs, o.baseMs * 2 ** Math.min(Math.max(0, attempt), 30));
  return Math.round(exp * (0.5 + Math.min(Math.max(random, 0), 1) / 2));
}
