/**
 * The one way tests wait: for a condition, never for a fixed time. A test that must let time
 * pass with nothing to observe (proving that something does NOT happen within a window) sleeps
 * where it does so, with a comment saying why no condition exists.
 */
import { vi } from "vitest";

/**
 * Waits until `check` returns true, polling it with vitest's own `vi.waitFor` every
 * `intervalMs` (an async check is never run twice at once). A check that throws or rejects
 * counts as "not yet" and is tried again, so it may read from something still starting.
 * Resolves to the ms waited (some tests report or bound it); after `timeoutMs` it rejects with
 * "timed out after … waiting for <what>", carrying the check's last error if it threw one;
 * `what` may be a function, called then, to add what was seen (a log's tail, the last reading).
 * Give a costly check (an HTTP scrape, a stream read) a longer interval.
 */
export async function waitFor(check: () => boolean | Promise<boolean>, timeoutMs = 5_000, what: string | (() => string) = "condition", intervalMs = 2): Promise<number> {
  const t0 = performance.now();
  let lastError: unknown;
  const attempt = async (): Promise<void> => {
    let ok: boolean;
    try {
      ok = await check();
    } catch (err) {
      lastError = err;
      throw err;
    }
    lastError = undefined;
    if (!ok) throw new Error("not yet");
  };
  try {
    await vi.waitFor(attempt, { timeout: timeoutMs, interval: intervalMs });
  } catch {
    const why = lastError === undefined ? "" : ` (the check last threw: ${lastError instanceof Error ? lastError.message : String(lastError)})`;
    throw new Error(`timed out after ${timeoutMs} ms waiting for ${typeof what === "string" ? what : what()}${why}`, { cause: lastError });
  }
  return performance.now() - t0;
}
