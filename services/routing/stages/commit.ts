/**
 * The commit stage: how a scheduled request's charge becomes shared. Two committers behind one
 * interface, chosen per model (its config's `consistency`, else `--consistency`):
 * - eventual (here): admit, schedule and charge in one synchronous step, publish without waiting;
 * - strict (strict-commit.ts): a per-pod compare-and-set on the charge subject, owning its
 *   retries and the retraction of a charge that lost its race.
 */
import type { Prepared, RoutedRequest, RouteInput } from "../request.js";

export interface Committer {
  commit(input: RouteInput, prepared: Prepared): RoutedRequest | Promise<RoutedRequest>;
}

/** What the committers need from the director: admission, and the synchronous schedule-and-charge step. */
export interface ChargeStep {
  admit<T>(input: RouteInput, prepared: Prepared, then: () => T): T | Promise<T>;
  charge(input: RouteInput, opts: { publish?: boolean; prepared?: Prepared; carry?: RoutedRequest }): RoutedRequest;
}

export class EventualCommitter implements Committer {
  constructor(private readonly step: ChargeStep) {}

  commit(input: RouteInput, prepared: Prepared): RoutedRequest | Promise<RoutedRequest> {
    return this.step.admit(input, prepared, () => this.step.charge(input, { prepared }));
  }
}
