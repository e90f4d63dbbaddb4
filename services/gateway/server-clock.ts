/**
 * The broker's clock, as seen from this host. Liveness compares a gateway's heartbeat, stamped
 * with the JetStream server's time, with "now": on a host whose clock runs 5 s ahead, every peer
 * would look dead (and its charges be dropped) if "now" were the local clock. So the gateway
 * estimates local minus server time from the messages it receives — the smallest difference seen
 * recently is the skew plus the shortest delivery delay — and reads liveness on server time.
 * Pure: fed by the followers, read by the sweep and the rank.
 */

export class ServerClock {
  /** Smallest (local - server) in the current and the previous window. */
  private current = Number.POSITIVE_INFINITY;
  private previous = Number.POSITIVE_INFINITY;
  private windowStart: number;

  constructor(
    private readonly local: () => number,
    /** How long one estimate window lasts (two are kept, so a change of skew is followed within two). */
    private readonly windowMs = 10_000,
  ) {
    this.windowStart = local();
  }

  /** A message stamped `serverTs` by the server was received now. */
  observe(serverTs: number): void {
    const now = this.local();
    if (now - this.windowStart >= this.windowMs) {
      this.previous = this.current;
      this.current = Number.POSITIVE_INFINITY;
      this.windowStart = now;
    }
    const d = now - serverTs;
    if (d < this.current) this.current = d;
  }

  /** Estimated local - server (ms); 0 until a message was seen. */
  get skewMs(): number {
    const m = Math.min(this.current, this.previous);
    return Number.isFinite(m) ? m : 0;
  }

  /** The server's time now, as well as this host can tell. */
  readonly now = (): number => this.local() - this.skewMs;
}
