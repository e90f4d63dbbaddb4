/**
 * Logs the records a gateway's fold refused for their signature (services/views/gateway-state.ts,
 * streams/signatures.ts), and the response locations it refused (another tenant's id), on a `LogRate`: whoever can plant records can plant many, and a flood
 * must not become a flood of log lines. The count of each kind is in the metrics whatever is logged.
 */
import type { Logger } from "../shared/log.js";
import { LogRate } from "../shared/log-rate.js";
import type { ApplyResult } from "../views/gateway-state.js";

export class RefusedRecordLog {
  private readonly rate: LogRate;
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly log: Logger,
    o: { linesPerInterval?: number; intervalMs?: number; now?: () => number } = {},
    private readonly now: () => number = o.now ?? Date.now,
  ) {
    this.rate = new LogRate(o.linesPerInterval ?? 10, o.intervalMs ?? 60_000);
  }

  /** Logs a fold result's note: refusals on the rate, anything else at once. */
  note(r: ApplyResult): void {
    const n = r.note;
    if (!n) return;
    // Planted records come in floods: signature refusals and refused response locations go on the rate.
    if (!n.rejected || (r.ignored !== "signature" && !r.ignored?.startsWith("response-"))) {
      this.log[n.level](n.fields, n.message);
      return;
    }
    const d = this.rate.admit(this.now());
    if (d.summary > 0) this.summarize(d.summary);
    if (d.log) this.log[n.level](n.fields, n.message);
    else this.arm();
  }

  private arm(): void {
    const due = this.rate.dueAt;
    if (this.timer || due === undefined) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const n = this.rate.flush(this.now());
      if (n > 0) this.summarize(n);
      else this.arm();
    }, Math.max(1, due - this.now()));
    this.timer.unref?.();
  }

  private summarize(n: number): void {
    this.log.warn({ notLogged: n, intervalMs: this.rate.intervalMs }, "records refused for their signature beyond the log rate: counted (jetroute_gateway_records_refused_signature), not logged one by one");
  }

  stop(): void {
    clearTimeout(this.timer);
  }
}
