/**
 * Turn slicing: how a large request's work shares the event loop. A gateway replica serves every
 * request on one loop; a ~600 KB agent prompt costs milliseconds in each of its stages (parse,
 * render, ids, block hashes), and run back to back they would hold every other request (a short
 * chat included) for the sum. The request path driver (pipeline.ts) therefore hands the loop back
 * between prepare stages once a turn has used its budget, and after every stage that awaited (its
 * continuation ran an unknown amount of work in the turn that resumed it). Short requests stay
 * synchronous: their stages take microseconds, far below the budget.
 *
 * The answer does not depend on it: prepare stages only compute the request's own inputs; what
 * select reads (views, ledger) is read in the commit section, which is never split, and recorded
 * in the decision record as before. Pure: the yield itself is injected (the gateway: a
 * setImmediate; tests: their own).
 */

export interface TurnSlicing {
  /** Synchronous work (ms) a turn may run before the driver yields at the next stage boundary. */
  readonly budgetMs: number;
  /** Resolves in a later macrotask (after pending I/O callbacks: other requests' messages). */
  yieldTurn(): Promise<void>;
}

/** Default budget: a few milliseconds, the loop block a replica's other requests may see. */
export const DEFAULT_TURN_BUDGET_MS = 2;

/** Whether a turn that has run `ranMs` of synchronous work should hand the loop back. */
export function shouldYieldTurn(ranMs: number, budgetMs: number): boolean {
  return ranMs >= budgetMs;
}

/** A yield through `setImmediate`: the check phase runs after the poll phase's I/O callbacks. */
export function immediateYield(): Promise<void> {
  return new Promise((resolve) => void setImmediate(resolve));
}
