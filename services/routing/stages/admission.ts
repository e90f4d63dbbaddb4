/**
 * The admission stage: shared rate limits and their burst guard, decided right before the charge.
 * Pure apart from the injected clock and timer (a fake pair in unit tests, so no test waits for a
 * minute to turn).
 *
 * Limits: per user requests and tokens per minute (config key `limits`), per model requests per
 * second (the profile's `requestsPerSecond`). Counts come from every replica's charges, so
 * spreading requests over replicas does not multiply the limit.
 *
 * Burst guard: this replica's own admissions whose charges have not come back through the stream
 * yet (plus `unconfirmedMs`) may not have reached the other R - 1 live replicas, and they may have
 * admitted as many that we have not seen; so a request is held while count + (R - 1) x unseen
 * would reach the limit, until our admissions have been read back, and asked again; after the
 * rate view's `maxUnseenMs` the plain limit decides (docs/architecture.md, "Model configs and
 * rate limits").
 */
import type { ConfigReader } from "../../views/model-config.js";
import type { PodSetReader } from "../../views/pod-set.js";
import { type RateView, rateUserOf } from "../../views/rate-view.js";
import { RouteError } from "../errors.js";
import type { Rank } from "./scheduling.js";

export interface AdmissionClock {
  now(): number;
  /** Calls `fn` after `ms`. */
  setTimeout(fn: () => void, ms: number): void;
}

export const SYSTEM_CLOCK: AdmissionClock = { now: Date.now, setTimeout: (fn, ms) => void setTimeout(fn, ms) };

export interface AdmissionViews {
  readonly rates: RateView;
  readonly pods: PodSetReader;
  readonly ledger: { rank(now: number): Readonly<Rank> };
}

/** What a request is counted as. */
export interface AdmissionRequest {
  model: string;
  user: string | undefined;
  tokens: number;
  /** The profile's per-model request rate limit. */
  rps: number | undefined;
}

export class Admission {
  /** Requests held because room was reserved for other replicas' unseen admissions. */
  waits = 0;

  constructor(
    private readonly views: AdmissionViews,
    private readonly config: ConfigReader | undefined,
    private readonly clock: AdmissionClock = SYSTEM_CLOCK,
  ) {}

  /** Refuses (throws the 429) a request already over a limit, without the burst guard: cheap, early. */
  check(r: AdmissionRequest): void {
    const v = this.verdict(r, this.clock.now(), false);
    if (v instanceof RouteError) throw v;
  }

  /**
   * Admits against the limits, then calls `then` (which charges) in the same synchronous step as
   * the last verdict, so no other request can be admitted in between. Held requests are asked
   * again by timer. Throws/rejects with a 429 RouteError.
   */
  admit<T>(r: AdmissionRequest, then: () => T): T | Promise<T> {
    const first = this.verdict(r, this.clock.now(), true);
    if (first === undefined) return then();
    if (first instanceof RouteError) throw first;
    this.waits++;
    const deadline = this.clock.now() + this.views.rates.maxUnseenMs;
    return new Promise<T>((resolve, reject) => {
      const ask = () => {
        try {
          const now = this.clock.now();
          const v = this.verdict(r, now, now < deadline);
          if (v === undefined) resolve(then());
          else if (v instanceof RouteError) reject(v);
          else this.clock.setTimeout(ask, Math.max(1, v));
        } catch (err) {
          reject(err);
        }
      };
      this.clock.setTimeout(ask, Math.max(1, first));
    });
  }

  /** undefined to admit, a RouteError (429) to refuse, or the ms to wait (the burst guard, with `share`). */
  verdict(r: AdmissionRequest, now: number, share: boolean): RouteError | number | undefined {
    const { rates, pods, ledger } = this.views;
    const others = share ? ledger.rank(now).count - 1 : 0;
    let wait = 0;
    const base = pods.readyPods(r.model)[0]?.model ?? r.model;
    if (r.rps !== undefined) {
      const seen = rates.modelRequests(base, now);
      if (seen >= r.rps) {
        const reset = (1000 - (now % 1000)) / 1000;
        return new RouteError("rateLimited", `model \`${r.model}\` is limited to ${r.rps} requests per second`, null, { "retry-after": String(Math.ceil(reset)), "x-ratelimit-limit-requests": String(r.rps), "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": `${reset.toFixed(3)}s` });
      }
      if (others > 0 && seen + others * rates.ownRecent("model", base, now).requests >= r.rps) wait = Math.max(wait, rates.ownConfirmedAt("model", base, now) - now);
    }
    // Requests without a user share one bucket, under `users.default`.
    const user = rateUserOf(r.user);
    const who = r.user ? `user \`${r.user}\`` : "requests without a user";
    const limits = this.config?.userLimits(r.user);
    if (!limits) return wait > 0 ? wait : undefined;
    const reset = (60_000 - (now % 60_000)) / 1000;
    const headers = (kind: "requests" | "tokens", limit: number) => ({
      "retry-after": String(Math.ceil(reset)),
      [`x-ratelimit-limit-${kind}`]: String(limit),
      [`x-ratelimit-remaining-${kind}`]: "0",
      [`x-ratelimit-reset-${kind}`]: `${reset.toFixed(1)}s`,
    });
    const mine = others > 0 ? rates.ownRecent("user", user, now) : { requests: 0, tokens: 0 };
    if (limits.rpm !== undefined) {
      const seen = rates.userRequests(user, now);
      if (seen >= limits.rpm) return new RouteError("rateLimited", `${who} exceeded ${limits.rpm} requests per minute`, null, headers("requests", limits.rpm));
      if (seen + others * mine.requests >= limits.rpm) wait = Math.max(wait, rates.ownConfirmedAt("user", user, now) - now);
    }
    if (limits.tpm !== undefined) {
      const seen = rates.userTokens(user, now);
      if (seen + r.tokens > limits.tpm) return new RouteError("rateLimited", `${who} exceeded ${limits.tpm} tokens per minute`, null, headers("tokens", limits.tpm));
      if (seen + r.tokens + others * mine.tokens > limits.tpm) wait = Math.max(wait, rates.ownConfirmedAt("user", user, now) - now);
    }
    return wait > 0 ? wait : undefined;
  }
}
