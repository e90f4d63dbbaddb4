/**
 * The commit phase: how a scheduled request's charge becomes shared. Two committers behind one
 * interface (pipeline.ts `Committer`), chosen per model (its config's `consistency`, else
 * `--consistency`), both working through the small `CommitPort`:
 * - eventual (here): admit, select and charge in one synchronous step, publish without waiting;
 * - strict (the gateway's strict-commit.ts): a per-pod compare-and-set on the charge subject,
 *   owning its retries and the retraction of a charge that lost its race.
 */
import type { Committer, CommitPort } from "../pipeline.js";
import type { PlannedContext } from "../context.js";
import type { RoutedRequest } from "../request.js";

export type { Committer, CommitPort } from "../pipeline.js";

export class EventualCommitter implements Committer {
  commit(ctx: PlannedContext, port: CommitPort): RoutedRequest | Promise<RoutedRequest> {
    return port.admit(ctx, () => port.section(ctx, { publish: true }));
  }
}
