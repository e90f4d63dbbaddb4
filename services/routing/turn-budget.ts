/**
 * Turn slicing: how a large request's work shares the event loop. A gateway replica serves every
 * request on one loop; a ~600 KB agent prompt costs milliseconds in each of its stages (parse,
 * render, ids, block hashes), and run back to back they would hold every other request (a short
 * chat included) for the sum. The request path driver (pipeline.ts) therefore hands the loop back
 * between prepare stages once a turn has used its budget, and after a stage that awaited when the
 * body is past LARGE_BODY_BYTES (what follows the await is the large part); the tokenizer and tokenize stage yield around the steps
 * of a prompt past LARGE_TEXT_CHARS (hf-tokenizer.ts) / LARGE_TOKEN_COUNT. Short requests never yield: their stages
 * take microseconds, far below the budget.
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

/**
 * Ids past which the tokenize stage hashes a prompt's blocks in a turn of their own (the
 * tokenizer yields likewise around a rendered text past its LARGE_TEXT_CHARS). Below it hashing
 * costs well under the budget, and a short request runs without handing the loop back at all.
 */
export const LARGE_TOKEN_COUNT = 16_384;

/** Request bodies past which a prepare stage that awaited resumes in a turn of its own. */
export const LARGE_BODY_BYTES = 65_536;

export function isLargeBody(bytes: number): boolean {
  return bytes >= LARGE_BODY_BYTES;
}

/** A yield through `setImmediate`: the check phase runs after the poll phase's I/O callbacks. */
export function immediateYield(): Promise<void> {
  return new Promise((resolve) => void setImmediate(resolve));
}
