/**
 * A token bucket on an injected clock: `take()` says whether one more event fits in `ratePerS`
 * sustained with bursts up to `burst`. Pure apart from the clock (tests pass a fake one).
 */
export class TokenBucket {
  private tokens: number;
  private last: number;

  constructor(
    private readonly ratePerS: number,
    private readonly burst: number,
    private readonly now: () => number,
  ) {
    if (!(ratePerS >= 0) || !(burst >= 0)) throw new RangeError(`token bucket rate and burst must be >= 0, got ${ratePerS} and ${burst}`);
    this.tokens = burst;
    this.last = now();
  }

  take(): boolean {
    const t = this.now();
    if (t > this.last) {
      this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.ratePerS);
      this.last = t;
    }
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}
