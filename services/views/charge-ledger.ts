/**
 * Charge ledger: every gateway's outstanding provisional charges, per pod. Pure: no I/O.
 *
 * A charge counts until the first of: its release, `ts + ttlMs`, or its gateway's heartbeat
 * lapsing (or saying "down"). Expiry is enforced here, by the reader, because nats-server 2.9
 * has no per-message TTL. Per-pod totals are kept incrementally so a strategy reads them in O(1);
 * expiry is applied by `sweep(now)`, which the shell calls on a short timer.
 *
 * A gateway applies its own charges and releases synchronously when it makes them, and ignores
 * its own events when they come back from the stream (`self`): applying the echo of a charge
 * that was already released locally would resurrect it.
 */
import type { ChargeEvent, GatewayHeartbeat, ReleaseEvent } from "../../schemas/events.js";

export interface Outstanding {
  /** Requests charged and not yet released. */
  requests: number;
  /** Prompt tokens of those requests (AIBrix TokenLoadTracker's "active" tokens, simplified). */
  promptTokens: number;
}

export interface LedgerReader {
  outstanding(model: string, pod: string): Readonly<Outstanding>;
}

interface Entry {
  readonly key: string;
  readonly podKey: string;
  readonly gateway: string;
  readonly expiresAt: number;
  readonly promptTokens: number;
}

interface GatewayState {
  lastSeen: number;
  down: boolean;
}

export interface ChargeLedgerOptions {
  /** This gateway's id; its events from the stream are echoes and are skipped. */
  self?: string;
  /** A gateway whose last heartbeat is older than this no longer holds charges. */
  heartbeatTimeoutMs?: number;
  /** Bound on tracked charges; the oldest is dropped beyond it (counted in `evicted`). */
  maxCharges?: number;
}

const ZERO: Readonly<Outstanding> = Object.freeze({ requests: 0, promptTokens: 0 });
const podKeyOf = (model: string, pod: string) => `${model}\u0000${pod}`;

export class ChargeLedger implements LedgerReader {
  readonly self: string | undefined;
  readonly heartbeatTimeoutMs: number;
  readonly maxCharges: number;
  private readonly entries = new Map<string, Entry>();
  private readonly totals = new Map<string, Outstanding>();
  private readonly gateways = new Map<string, GatewayState>();
  /** Charges dropped because the bound was reached. */
  evicted = 0;
  /** Charges dropped by TTL or heartbeat lapse (not by a release). */
  expired = 0;
  lastSeq = 0;

  constructor(opts: ChargeLedgerOptions = {}) {
    this.self = opts.self;
    this.heartbeatTimeoutMs = opts.heartbeatTimeoutMs ?? 3_000;
    this.maxCharges = opts.maxCharges ?? 1_000_000;
  }

  /** Records a charge. Returns false if it was already known (duplicate) or its gateway is dead. */
  charge(ev: ChargeEvent, now: number): boolean {
    const key = `${ev.gateway}/${ev.id}`;
    if (this.entries.has(key)) return false;
    if (ev.gateway !== this.self && !this.isAlive(ev.gateway, now)) return false;
    const expiresAt = ev.ts + ev.ttlMs;
    if (expiresAt <= now) return false;
    if (this.entries.size >= this.maxCharges) this.evictOldest();
    const podKey = podKeyOf(ev.model, ev.pod);
    this.entries.set(key, { key, podKey, gateway: ev.gateway, expiresAt, promptTokens: ev.promptTokens });
    let t = this.totals.get(podKey);
    if (!t) this.totals.set(podKey, (t = { requests: 0, promptTokens: 0 }));
    t.requests++;
    t.promptTokens += ev.promptTokens;
    return true;
  }

  /** Ends a charge. Returns false for an unknown charge (already released, expired, or never seen). */
  release(ev: Pick<ReleaseEvent, "gateway" | "id">): boolean {
    const e = this.entries.get(`${ev.gateway}/${ev.id}`);
    if (!e) return false;
    this.remove(e);
    return true;
  }

  /** Records a heartbeat at `seenAt` (the server's timestamp of the message, ms). */
  heartbeat(hb: GatewayHeartbeat, seenAt: number): void {
    const g = this.gateways.get(hb.gateway);
    if (g && g.lastSeen > seenAt) return;
    this.gateways.set(hb.gateway, { lastSeen: seenAt, down: hb.state === "down" });
    if (hb.state === "down") this.dropGateway(hb.gateway);
  }

  /** Applies an event read from the stream; the gateway's own echoes are ignored. */
  applyFromStream(ev: ChargeEvent | ReleaseEvent | GatewayHeartbeat, serverTs: number, now: number, seq = 0): void {
    if (seq) this.lastSeq = seq;
    if (ev.gateway === this.self) return;
    if (ev.type === "charge") {
      // A charge is also a sign of life of its gateway: it was alive when it was published.
      if (!this.gateways.has(ev.gateway)) this.gateways.set(ev.gateway, { lastSeen: serverTs, down: false });
      this.charge(ev, now);
    } else if (ev.type === "release") this.release(ev);
    else this.heartbeat(ev, serverTs);
  }

  isAlive(gateway: string, now: number): boolean {
    if (gateway === this.self) return true;
    const g = this.gateways.get(gateway);
    return !!g && !g.down && now - g.lastSeen <= this.heartbeatTimeoutMs;
  }

  /** Drops expired charges and those of gateways whose heartbeat lapsed. Returns how many went. */
  sweep(now: number): number {
    const dead = new Set<string>();
    for (const [gw, g] of this.gateways) {
      if (gw !== this.self && (g.down || now - g.lastSeen > this.heartbeatTimeoutMs)) dead.add(gw);
    }
    let n = 0;
    for (const e of this.entries.values()) {
      if (e.expiresAt <= now || dead.has(e.gateway)) {
        this.remove(e);
        n++;
      }
    }
    // Forget gateways long dead so the map stays bounded by live gateways.
    for (const gw of dead) {
      const g = this.gateways.get(gw);
      if (g && now - g.lastSeen > 10 * this.heartbeatTimeoutMs) this.gateways.delete(gw);
    }
    this.expired += n;
    return n;
  }

  outstanding(model: string, pod: string): Readonly<Outstanding> {
    return this.totals.get(podKeyOf(model, pod)) ?? ZERO;
  }

  /** Outstanding charges of one gateway (for tests and /debug). */
  chargesOf(gateway: string): number {
    let n = 0;
    for (const e of this.entries.values()) if (e.gateway === gateway) n++;
    return n;
  }

  liveGateways(now: number): string[] {
    return [...this.gateways.keys()].filter((g) => this.isAlive(g, now));
  }

  get size(): number {
    return this.entries.size;
  }

  private dropGateway(gateway: string): void {
    for (const e of this.entries.values()) if (e.gateway === gateway) this.remove(e);
  }

  private evictOldest(): void {
    const first = this.entries.values().next();
    if (first.done) return;
    this.remove(first.value);
    this.evicted++;
  }

  private remove(e: Entry): void {
    this.entries.delete(e.key);
    const t = this.totals.get(e.podKey);
    if (!t) return;
    t.requests--;
    t.promptTokens -= e.promptTokens;
    if (t.requests <= 0) this.totals.delete(e.podKey);
  }
}
