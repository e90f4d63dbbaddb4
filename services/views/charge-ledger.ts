/**
 * Charge ledger: every gateway's outstanding provisional charges, per pod. Pure: no I/O.
 *
 * A charge counts until the first of: its release, `ts + ttlMs`, or its gateway's heartbeat
 * lapsing (or saying "down"). Expiry is enforced here, by the reader, because nats-server 2.9
 * has no per-message TTL. Per-pod totals are kept incrementally so a strategy reads them in O(1).
 *
 * Time for expiry and lapses is the CHARGES stream's own: the server timestamp of the last
 * message the fold handled (`advance`), never a local clock. A replica whose fold lags (a busy
 * host, a paced reader) judges a peer by the heartbeats it has read, so it does not drop the
 * charges of a live peer whose heartbeat is still unread; and the ledger at a CHARGES cursor is
 * a function of the stream up to it (and the own events), which is what lets `jetroute replay`
 * rebuild it exactly. Every live gateway's own heartbeat comes back on the stream, so the clock
 * moves at least once per heartbeat interval while the replica is connected.
 *
 * A gateway applies its own charges and releases synchronously when it makes them, and ignores
 * its own events when they come back from the stream (`self`): applying the echo of a charge
 * that was already released locally would resurrect it.
 */
import type { ChargeEvent, GatewayHeartbeat, ReleaseEvent } from "../../schemas/events.js";

export interface Outstanding {
  /** Requests charged and not yet released. */
  requests: number;
  /** Prompt tokens of those requests: the KV cache they hold ("kv" tokens, AIBrix TokenLoadTracker). */
  promptTokens: number;
  /** Of those requests, the ones still in prefill (no first token yet). */
  prefillRequests: number;
  /** Their prompt tokens: the prefill work still to do ("active" tokens). */
  prefillTokens: number;
}

/** AIBrix's token-load priority: active (prefill) tokens + 0.3 x KV tokens. */
export function tokenLoad(o: Readonly<Outstanding>): number {
  return o.prefillTokens + 0.3 * o.promptTokens;
}

export interface LedgerReader {
  outstanding(model: string, pod: string): Readonly<Outstanding>;
}

interface Entry {
  readonly key: string;
  readonly model: string;
  readonly pod: string;
  /** Its pod's totals (the object `outstanding` returns; alive while any entry of the pod is). */
  readonly totals: Outstanding;
  readonly gateway: string;
  readonly expiresAt: number;
  readonly promptTokens: number;
  /** Past its first token (decode): no longer counted as prefill work. */
  decoding: boolean;
  /** The last whole heartbeat of its gateway that listed it (`ChargeLedger.listStamp`): see `reconcile`. */
  listedAt: number;
}

interface GatewayState {
  lastSeen: number;
  down: boolean;
}

/**
 * The beat a gateway's parted heartbeat is at: the keys its parts listed so far. One per gateway
 * (a newer beat replaces it), so memory stays at one list per live gateway.
 */
interface BeatState {
  startedAt: number;
  beat: number;
  parts: number;
  got: Set<number>;
  listed: Set<string>;
  truncated: boolean;
  /** All parts arrived and the removals were made: later copies of its parts change nothing. */
  done: boolean;
}

export interface ChargeLedgerOptions {
  /** This gateway's id; its events from the stream are echoes and are skipped. */
  self?: string;
  /** A gateway whose last heartbeat is older than this no longer holds charges. */
  heartbeatTimeoutMs?: number;
  /** Bound on tracked charges; the oldest is dropped beyond it (counted in `evicted`). */
  maxCharges?: number;
}

/** A pod with nothing outstanding. */
export const ZERO_OUTSTANDING: Readonly<Outstanding> = Object.freeze({ requests: 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 });

/**
 * Drops a pod's totals (and its model's map, once empty) when nothing is outstanding on it any
 * more, so per-pod totals live only while the pod has requests in flight. Only while `t` is still
 * that pod's object (it always is: each entry counts one request).
 */
export function forgetIdleTotals(totals: Map<string, Map<string, Outstanding>>, model: string, pod: string, t: Outstanding): void {
  if (t.requests > 0) return;
  const pods = totals.get(model);
  if (pods?.get(pod) === t) {
    pods.delete(pod);
    if (pods.size === 0) totals.delete(model);
  }
}
const podKeyOf = (model: string, pod: string) => `${model}\u0000${pod}`;

/** Bound on the charges a ledger tracks. */
export const DEFAULT_MAX_CHARGES = 1_000_000;
/** A charge stops counting after this long even without a release (ms). */
export const DEFAULT_CHARGE_TTL_MS = 600_000;

export class ChargeLedger implements LedgerReader {
  readonly self: string | undefined;
  private lapseMs: number;
  readonly maxCharges: number;
  private readonly entries = new Map<string, Entry>();
  /** Per model, per pod: the totals. Two levels, so a read builds no key string (strategies read every candidate per decision). */
  private readonly totals = new Map<string, Map<string, Outstanding>>();
  private readonly gateways = new Map<string, GatewayState>();
  /** Charge keys per gateway: heartbeat reconciliation and drops touch only that gateway's charges. */
  private readonly byGateway = new Map<string, Set<string>>();
  /** Numbers the whole heartbeats reconciled, so an entry can say which one last listed it. */
  private listStamp = 0;
  /** Per gateway, the beat its parted heartbeats are at (see `heartbeat`). */
  private readonly beats = new Map<string, BeatState>();
  /** Charges removed because the owner's heartbeat no longer listed them (lost releases healed). */
  reconciledRemoved = 0;
  /** Charges added because the owner's heartbeat listed them and we had not seen them (lost charges healed). */
  reconciledAdded = 0;
  /** Parted heartbeats given up incomplete (a newer beat started first): nothing was removed for them. */
  incompleteBeats = 0;
  /** Charges dropped because the bound was reached. */
  evicted = 0;
  /** Charges dropped by TTL or heartbeat lapse (not by a release). */
  expired = 0;
  lastSeq = 0;
  /** The CHARGES stream's time as far as the fold has read it (server ms): expiry and lapses are judged on it. */
  private clock = Number.NEGATIVE_INFINITY;
  /** No gateway lapses (or is forgotten) before the clock passes this (a lower bound: a renewed gateway leaves it early). */
  private nextLapse = Number.POSITIVE_INFINITY;
  /** No charge expires before this (a lower bound: a released charge leaves it early). */
  private nextExpiry = Number.POSITIVE_INFINITY;
  private rankAt = Number.NEGATIVE_INFINITY;
  private cachedRank: Readonly<{ index: number; count: number }> = { index: 0, count: 1 };

  constructor(opts: ChargeLedgerOptions = {}) {
    this.self = opts.self;
    this.lapseMs = opts.heartbeatTimeoutMs ?? 3_000;
    this.maxCharges = opts.maxCharges ?? DEFAULT_MAX_CHARGES;
  }

  /** A gateway silent this long (stream time) no longer holds charges. */
  get heartbeatTimeoutMs(): number {
    return this.lapseMs;
  }

  /**
   * Replay learns a recorded gateway's setting from its heartbeats (`heartbeatTimeoutMs`, or 3 x
   * its interval): a fold judges lapses with its own gateway's timeout.
   */
  set heartbeatTimeoutMs(ms: number) {
    if (!(ms > 0) || ms === this.lapseMs) return;
    this.lapseMs = ms;
    this.nextLapse = Number.NEGATIVE_INFINITY;
  }

  /** The CHARGES stream time the ledger is at (`advance`). */
  get streamTime(): number {
    return this.clock;
  }

  /** Records a charge. Returns false if it was already known (duplicate) or its gateway is dead. */
  charge(ev: ChargeEvent, now: number): boolean {
    const key = `${ev.gateway}/${ev.id}`;
    if (this.entries.has(key)) return false;
    if (ev.gateway !== this.self && !this.isAlive(ev.gateway, now)) return false;
    const expiresAt = ev.ts + ev.ttlMs;
    // Already expired by the stream's clock too: a charge added after its expiry was read (replay
    // applies a gateway's own charge after the messages read before its next decision) stays out.
    if (expiresAt <= now || expiresAt <= this.clock) return false;
    if (expiresAt < this.nextExpiry) this.nextExpiry = expiresAt;
    if (this.entries.size >= this.maxCharges) this.evictOldest();
    let pods = this.totals.get(ev.model);
    if (!pods) this.totals.set(ev.model, (pods = new Map()));
    let t = pods.get(ev.pod);
    if (!t) pods.set(ev.pod, (t = { requests: 0, promptTokens: 0, prefillRequests: 0, prefillTokens: 0 }));
    this.entries.set(key, { key, model: ev.model, pod: ev.pod, totals: t, gateway: ev.gateway, expiresAt, promptTokens: ev.promptTokens, decoding: false, listedAt: 0 });
    let mine = this.byGateway.get(ev.gateway);
    if (!mine) this.byGateway.set(ev.gateway, (mine = new Set()));
    mine.add(key);
    t.requests++;
    t.promptTokens += ev.promptTokens;
    t.prefillRequests++;
    t.prefillTokens += ev.promptTokens;
    return true;
  }

  /** A charged request produced its first token: its prompt is no longer prefill work. */
  markDecoding(gateway: string, id: string): boolean {
    const e = this.entries.get(`${gateway}/${id}`);
    return e !== undefined && this.decode(e);
  }

  private decode(e: Entry): boolean {
    if (e.decoding) return false;
    e.decoding = true;
    const t = e.totals;
    t.prefillRequests--;
    t.prefillTokens -= e.promptTokens;
    return true;
  }

  /** Ends a charge. Returns false for an unknown charge (already released, expired, or never seen). */
  release(ev: Pick<ReleaseEvent, "gateway" | "id">): boolean {
    const e = this.entries.get(`${ev.gateway}/${ev.id}`);
    if (!e) return false;
    this.remove(e);
    return true;
  }

  /**
   * Records a heartbeat at `seenAt` (the server's timestamp of the message, ms) and, when it lists
   * the gateway's outstanding charges, makes this ledger agree with that list.
   *
   * A heartbeat split into `parts` (its list passed the server's max_payload) is one beat: every
   * part is a sign of life and its listed charges are added at once, but unlisted charges are
   * removed only when every part of the beat has arrived — a lost part must not read as released
   * charges. A part of a newer beat gives up the older incomplete one; parts of an older beat than
   * the current one are only signs of life.
   */
  heartbeat(hb: GatewayHeartbeat, seenAt: number, now = seenAt): void {
    const g = this.gateways.get(hb.gateway);
    if (g && g.lastSeen > seenAt) return;
    if (!g || g.down !== (hb.state === "down")) this.rankAt = Number.NEGATIVE_INFINITY;
    this.gateways.set(hb.gateway, { lastSeen: seenAt, down: hb.state === "down" });
    this.lapseAt(seenAt);
    if (hb.state === "down") this.dropGateway(hb.gateway);
    else if (hb.parts !== undefined && hb.parts > 1) this.reconcilePart(hb, hb.parts, now);
    else if (hb.outstanding) {
      // A whole list supersedes any parted beat in progress (the list shrank below one message).
      this.endBeat(hb.gateway);
      this.reconcile(hb, now);
    }
  }

  private reconcilePart(hb: GatewayHeartbeat, parts: number, now: number): void {
    const beat = hb.beat ?? 0;
    const part = hb.part ?? 0;
    let b = this.beats.get(hb.gateway);
    const order = b ? (hb.startedAt !== b.startedAt ? hb.startedAt - b.startedAt : beat - b.beat) : 1;
    if (order < 0 || part >= parts) return;
    if (!b || order > 0) {
      this.endBeat(hb.gateway);
      b = { startedAt: hb.startedAt, beat, parts, got: new Set(), listed: new Set(), truncated: false, done: false };
      this.beats.set(hb.gateway, b);
    }
    // A part disagreeing on the count is not of this beat as we know it (malformed): ignored.
    if (b.done || b.got.has(part) || parts !== b.parts) return;
    b.got.add(part);
    if (hb.truncated) b.truncated = true;
    this.addListed(hb, now, b.listed);
    if (b.got.size < b.parts) return;
    b.done = true;
    const listed = b.listed;
    b.listed = new Set();
    if (!b.truncated) this.removeUnlisted(hb.gateway, listed);
  }

  /** Forgets the gateway's parted beat, counting it when it was given up incomplete. */
  private endBeat(gateway: string): void {
    const b = this.beats.get(gateway);
    if (!b) return;
    if (!b.done) this.incompleteBeats++;
    this.beats.delete(gateway);
  }

  /**
   * A whole list (the common case, every second per peer): each listed entry is stamped with this
   * heartbeat's number and the unstamped ones are removed, rather than the listed keys collected
   * in a set first (half the apply cost of a steady-state beat: `npm run bench -- fold`).
   */
  private reconcile(hb: GatewayHeartbeat, now: number): void {
    const stamp = ++this.listStamp;
    const gw = hb.gateway;
    for (const c of hb.outstanding ?? []) {
      const e = this.entries.get(`${gw}/${c.id}`) ?? this.addUnseen(hb, c, now);
      if (!e) continue;
      e.listedAt = stamp;
      // Other replicas learn of first tokens from the owner's heartbeat (no event per token).
      if (c.decoding) this.decode(e);
    }
    if (hb.truncated) return;
    const mine = this.byGateway.get(gw);
    if (!mine) return;
    // Deleting the element just visited is safe while iterating a Set.
    for (const key of mine) {
      const e = this.entries.get(key);
      if (!e || e.listedAt === stamp) continue;
      this.remove(e);
      this.reconciledRemoved++;
    }
  }

  /** A listed charge this ledger never saw (a lost charge): added, and returned when it counts. */
  private addUnseen(hb: GatewayHeartbeat, c: NonNullable<GatewayHeartbeat["outstanding"]>[number], now: number): Entry | undefined {
    const added = this.charge({ type: "charge", id: c.id, gateway: hb.gateway, model: c.model, pod: c.pod, ts: c.ts, ttlMs: hb.chargeTtlMs ?? DEFAULT_CHARGE_TTL_MS, promptTokens: c.promptTokens }, now);
    if (!added) return undefined;
    this.reconciledAdded++;
    return this.entries.get(`${hb.gateway}/${c.id}`);
  }

  /** Adds the listed charges this ledger does not hold, and notes every listed key in `listed`. */
  private addListed(hb: GatewayHeartbeat, now: number, listed: Set<string>): void {
    for (const c of hb.outstanding ?? []) {
      const key = `${hb.gateway}/${c.id}`;
      listed.add(key);
      if (this.entries.has(key)) {
        // Other replicas learn of first tokens from the owner's heartbeat (no event per token).
        if (c.decoding) this.markDecoding(hb.gateway, c.id);
        continue;
      }
      const added = this.charge(
        { type: "charge", id: c.id, gateway: hb.gateway, model: c.model, pod: c.pod, ts: c.ts, ttlMs: hb.chargeTtlMs ?? DEFAULT_CHARGE_TTL_MS, promptTokens: c.promptTokens },
        now,
      );
      if (added) this.reconciledAdded++;
      if (added && c.decoding) this.markDecoding(hb.gateway, c.id);
    }
  }

  /** Removes the gateway's charges missing from its (complete, untruncated) list: lost releases. */
  private removeUnlisted(gateway: string, listed: Set<string>): void {
    for (const key of [...(this.byGateway.get(gateway) ?? [])]) {
      if (listed.has(key)) continue;
      const e = this.entries.get(key);
      if (e) {
        this.remove(e);
        this.reconciledRemoved++;
      }
    }
  }

  /** Applies a `releases` batch read from the stream: each of its releases, in order (own echoes ignored). */
  releaseBatch(gateway: string, items: readonly { id: string }[], seq = 0): void {
    if (seq) this.lastSeq = seq;
    if (gateway === this.self) return;
    for (const it of items) {
      const e = this.entries.get(`${gateway}/${it.id}`);
      if (e) this.remove(e);
    }
  }

  /** Applies an event read from the stream; the gateway's own echoes are ignored. */
  applyFromStream(ev: ChargeEvent | ReleaseEvent | GatewayHeartbeat, serverTs: number, now: number, seq = 0): void {
    if (seq) this.lastSeq = seq;
    if (ev.gateway === this.self) return;
    if (ev.type === "charge") {
      // A charge is also a sign of life of its gateway: it was alive when it was published.
      if (!this.gateways.has(ev.gateway)) {
        this.gateways.set(ev.gateway, { lastSeen: serverTs, down: false });
        this.rankAt = Number.NEGATIVE_INFINITY;
        this.lapseAt(serverTs);
      }
      this.charge(ev, now);
    } else if (ev.type === "release") this.release(ev);
    else this.heartbeat(ev, serverTs, now);
  }

  isAlive(gateway: string, now: number): boolean {
    if (gateway === this.self) return true;
    const g = this.gateways.get(gateway);
    return !!g && !g.down && now - g.lastSeen <= this.lapseMs;
  }

  /** A gateway seen at `seenAt` lapses (or is forgotten) no earlier than a timeout later. */
  private lapseAt(seenAt: number): void {
    if (seenAt + this.lapseMs < this.nextLapse) this.nextLapse = seenAt + this.lapseMs;
  }

  /**
   * Moves the ledger's clock to `serverTs`, the server timestamp of a CHARGES message the fold
   * handles (applied, or an own heartbeat's echo), before the message itself is applied. Drops the
   * charges of gateways whose heartbeat lapsed by then and the charges whose TTL ended; forgets
   * gateways long dead. Cheap while nothing is due (two comparisons). Returns how many charges went.
   */
  advance(serverTs: number): number {
    if (!(serverTs > this.clock)) return 0;
    const now = serverTs;
    this.clock = now;
    let n = 0;
    if (now > this.nextLapse) {
      let next = Number.POSITIVE_INFINITY;
      for (const [gw, g] of this.gateways) {
        if (gw === this.self) continue;
        if (g.down || now - g.lastSeen > this.lapseMs) {
          n += this.byGateway.get(gw)?.size ?? 0;
          this.dropGateway(gw);
          // Forget gateways long dead so the map stays bounded by live gateways.
          if (now - g.lastSeen > 10 * this.lapseMs) {
            this.gateways.delete(gw);
            continue;
          }
          next = Math.min(next, g.lastSeen + 10 * this.lapseMs);
        } else next = Math.min(next, g.lastSeen + this.lapseMs);
      }
      this.nextLapse = next;
    }
    if (now >= this.nextExpiry) {
      let next = Number.POSITIVE_INFINITY;
      for (const e of this.entries.values()) {
        if (e.expiresAt <= now) {
          this.remove(e);
          n++;
        } else if (e.expiresAt < next) next = e.expiresAt;
      }
      this.nextExpiry = next;
    }
    this.expired += n;
    return n;
  }

  outstanding(model: string, pod: string): Readonly<Outstanding> {
    return this.totals.get(model)?.get(pod) ?? ZERO_OUTSTANDING;
  }

  /** Outstanding charges of one gateway (for tests and /debug). */
  chargesOf(gateway: string): number {
    return this.byGateway.get(gateway)?.size ?? 0;
  }

  liveGateways(now: number): string[] {
    return [...this.gateways.keys()].filter((g) => this.isAlive(g, now));
  }

  /**
   * This gateway's position among the live gateways it knows of (itself included), ordered by id:
   * every replica computes the same order from the same heartbeats, so replicas can stagger their
   * tie-breaks. `{ index: 0, count: 1 }` when it knows no peer (or has no id). Recomputed at most
   * every 250 ms: membership changes at heartbeat pace.
   */
  rank(now: number): Readonly<{ index: number; count: number }> {
    if (now - this.rankAt < 250 && now >= this.rankAt) return this.cachedRank;
    this.rankAt = now;
    const self = this.self;
    if (self === undefined) return this.cachedRank;
    const live = this.liveGateways(now);
    if (!live.includes(self)) live.push(self);
    live.sort();
    this.cachedRank = { index: live.indexOf(self), count: live.length };
    return this.cachedRank;
  }

  get size(): number {
    return this.entries.size;
  }

  /** The charges that still count at `now` and the gateways known, in a canonical order (state comparison). */
  dump(now: number): { charges: Array<[string, string, number, boolean]>; gateways: Array<[string, number, boolean]> } {
    const charges: Array<[string, string, number, boolean]> = [];
    for (const e of this.entries.values()) if (e.expiresAt > now) charges.push([e.key, podKeyOf(e.model, e.pod), e.promptTokens, e.decoding]);
    charges.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    const gateways = [...this.gateways.entries()].map(([g, s]): [string, number, boolean] => [g, s.lastSeen, s.down]).sort((a, b) => (a[0] < b[0] ? -1 : 1));
    return { charges, gateways };
  }

  private dropGateway(gateway: string): void {
    // A beat in progress of a gateway that is gone must not remove anything if it ever completes.
    this.endBeat(gateway);
    for (const key of [...(this.byGateway.get(gateway) ?? [])]) {
      const e = this.entries.get(key);
      if (e) this.remove(e);
    }
  }

  private evictOldest(): void {
    const first = this.entries.values().next();
    if (first.done) return;
    this.remove(first.value);
    this.evicted++;
  }

  private remove(e: Entry): void {
    this.entries.delete(e.key);
    const mine = this.byGateway.get(e.gateway);
    if (mine) {
      mine.delete(e.key);
      if (mine.size === 0) this.byGateway.delete(e.gateway);
    }
    const t = e.totals;
    t.requests--;
    t.promptTokens -= e.promptTokens;
    if (!e.decoding) {
      t.prefillRequests--;
      t.prefillTokens -= e.promptTokens;
    }
    forgetIdleTotals(this.totals, e.model, e.pod, t);
  }
}
