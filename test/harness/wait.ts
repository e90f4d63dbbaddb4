/**
 * The one way tests wait: for a condition, never for a fixed time. A test that must let time
 * pass with nothing to observe (proving that something does NOT happen within a window) sleeps
 * where it does so, with a comment saying why no condition exists.
 */
import { vi } from "vitest";

/**
 * Waits until `check` returns true, polling it with vitest's own `vi.waitUntil` every
 * `intervalMs` (an async check is never run twice at once). Resolves to the ms waited (some
 * tests report or bound it); after `timeoutMs` it rejects with "timed out after … waiting for
 * <what>" (`what` may be a function, called then, to add what was last seen). A check that
 * throws or rejects fails the wait at once with its error, so an assertion inside a check stays
 * an assertion; a check that may fail before it can hold (a call to something still starting)
 * catches that itself. Give a costly check (an HTTP scrape, a stream read) a longer interval.
 */
export async function waitFor(check: () => boolean | Promise<boolean>, timeoutMs = 5_000, what: string | (() => string) = "condition", intervalMs = 2): Promise<number> {
  const t0 = performance.now();
  let threw = false;
  const attempt = async (): Promise<boolean> => {
    try {
      return await check();
    } catch (err) {
      threw = true;
      throw err;
    }
  };
  try {
    await vi.waitUntil(attempt, { timeout: timeoutMs, interval: intervalMs });
  } catch (err) {
    if (threw) throw err;
    throw new Error(`timed out after ${timeoutMs} ms waiting for ${typeof what === "string" ? what : what()}`);
  }
  return performance.now() - t0;
}
