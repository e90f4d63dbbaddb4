/**
 * Where each Responses API response lives: response id -> {pod, model, tenant, createdAt,
 * expiresAt}, folded by every gateway replica from the RESPONSES stream
 * (docs/stateful-apis.md). Pure: no I/O, no clock of its own.
 *
 * Bounds:
 * - time: an entry is dead at its `expiresAt` (the writer's `ts` + the retention), judged on the
 *   time the caller passes (the broker's time of the message being folded, the gateway's clock on
 *   a lookup); `sweep(now)` drops expired entries from the oldest end;
 * - count: at most `maxEntries`; folding one more evicts the oldest (insertion order = fold
 *   order, the same on every replica), counted in `evicted`. An evicted or expired response loses
 *   only its affinity: a continuation is then expanded from the response store.
 * Memory: ~200 bytes per entry (measured in response-locations.test.ts: ids of 37 characters,
 * interned pod, model and tenant strings), so the default bound of 250,000 holds ~50 MB.
 *
 * A record for an id already held under another tenant is refused (`conflicts`): an engine that
 * lets a client pick its response id (vLLM's `request_id`) cannot make one tenant's response
 * point at another tenant's pod entry. A deletion applies only from the owning tenant.
 */
import type { ResponseLocationEvent } from "../../schemas/responses.js";

export const DEFAULT_RESPONSE_LOCATIONS = 250_000;
/** Distinct pod, model and tenant strings shared between entries; past it, entries keep their own copies. */
const MAX_INTERNED = 65_536;

export interface ResponseLocation {
  readonly pod: string;
  readonly model: string;
  /** `tenantDigest(owner)` (schemas/responses.ts). */
  readonly tenant: string;
  readonly createdAt: number;
  readonly expiresAt: number;
  /** The response store holds its items. */
  readonly stored: boolean;
}

export type LocationApplyResult = "applied" | "expired" | "conflict" | "invalid" | "unknown";

export class ResponseLocations {
  private readonly byId = new Map<string, ResponseLocation>();
  private readonly interned = new Map<string, string>();
  /** Entries dropped to stay within `maxEntries`. */
  evicted = 0;
  /** Entries dropped (or refused on arrival) past their `expiresAt`. */
  expired = 0;
  /** Records refused: the id is held under another tenant. */
  conflicts = 0;
  /** `stored` records lacking a field the deletion may omit. */
  invalid = 0;

  constructor(readonly maxEntries = DEFAULT_RESPONSE_LOCATIONS) {
    if (!(maxEntries >= 1)) throw new Error("maxEntries must be >= 1");
  }

  get size(): number {
    return this.byId.size;
  }

  private intern(s: string): string {
    const hit = this.interned.get(s);
    if (hit !== undefined) return hit;
    if (this.interned.size < MAX_INTERNED) this.interned.set(s, s);
    return s;
  }

  /** Folds one record at broker time `at`. */
  apply(ev: ResponseLocationEvent, at: number): LocationApplyResult {
    const held = this.byId.get(ev.id);
    if (held && held.tenant !== ev.tenant && held.expiresAt > at) {
      this.conflicts++;
      return "conflict";
    }
    if (ev.action === "deleted") {
      if (!held) return "unknown";
      this.byId.delete(ev.id);
      return "applied";
    }
    if (ev.model === undefined || ev.pod === undefined || ev.expiresAt === undefined) {
      this.invalid++;
      return "invalid";
    }
    if (ev.expiresAt <= at) {
      this.expired++;
      if (held) this.byId.delete(ev.id);
      return "expired";
    }
    // Re-inserted at the young end (a re-recorded id is as fresh as its record).
    if (held) this.byId.delete(ev.id);
    this.byId.set(ev.id, {
      pod: this.intern(ev.pod),
      model: this.intern(ev.model),
      tenant: this.intern(ev.tenant),
      createdAt: ev.ts,
      expiresAt: ev.expiresAt,
      stored: ev.stored ?? false,
    });
    while (this.byId.size > this.maxEntries) {
      const oldest = this.byId.keys().next().value as string;
      this.byId.delete(oldest);
      this.evicted++;
    }
    return "applied";
  }

  /** The live location of `id` at `now`, undefined when unknown, evicted or expired. */
  get(id: string, now: number): ResponseLocation | undefined {
    const l = this.byId.get(id);
    return l && l.expiresAt > now ? l : undefined;
  }

  /**
   * Drops expired entries from the oldest end, stopping at the first live one (entries are
   * inserted in creation order with one retention, so this finds them all but for clock skew
   * between gateways; those few go when `get` finds them dead or eviction reaches them).
   */
  sweep(now: number): number {
    let n = 0;
    for (const [id, l] of this.byId) {
      if (l.expiresAt > now) break;
      this.byId.delete(id);
      n++;
    }
    this.expired += n;
    return n;
  }

  /** Every entry in fold order, for state comparison. */
  dump(): Array<[string, ResponseLocation]> {
    return [...this.byId.entries()];
  }
}
