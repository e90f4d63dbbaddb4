/** A pod's live generation sessions by request id and SGLang rid: what /abort_request cancels and a restart drops. */
import type { GenerationSession } from "./generate.js";

export class GenerationSessions {
  private readonly byKey = new Map<string, Set<GenerationSession>>();

  /** Files `session` under each of `keys` until it is done. */
  track(keys: string[], session: GenerationSession): void {
    for (const k of new Set(keys)) {
      const set = this.byKey.get(k) ?? new Set();
      set.add(session);
      this.byKey.set(k, set);
    }
    void session.done.then(() => {
      for (const k of keys) {
        const set = this.byKey.get(k);
        set?.delete(session);
        if (set?.size === 0) this.byKey.delete(k);
      }
    });
  }

  /** Ends the sessions filed under `key` with finish_reason "abort". */
  cancel(key: string): void {
    for (const s of [...(this.byKey.get(key) ?? new Set())]) s.cancel();
  }

  cancelAll(): void {
    for (const set of [...this.byKey.values()]) for (const s of [...set]) s.cancel();
  }

  /** Drops every session's connection, as a crashed engine would. */
  dropAll(): void {
    for (const set of [...this.byKey.values()]) for (const s of [...set]) s.drop();
  }
}
