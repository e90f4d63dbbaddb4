/**
 * A gateway's heartbeat: it is alive, and — with `state: "up"` — the full list of the charges it
 * holds, which every other replica reconciles its ledger against (a lost charge or release heals
 * within one heartbeat). Pure; the gateway publishes it through the outbox, so the list sits
 * after every charge and release published before it.
 *
 * The list grows with in-flight requests (~70 bytes per charge plus its model and pod names:
 * ~125 bytes with typical names, so ~8,400 charges fill 1 MiB), so at peak load one message
 * would pass the server's `max_payload` and be refused — and peers would then declare the replica
 * dead exactly when it is busiest. So a beat that does not fit in `maxBytes` is split into parts,
 * each carrying the liveness fields and a slice of the list; receivers remove unlisted charges
 * only once they hold every part of the beat (services/views/charge-ledger.ts).
 */
import type { GatewayHeartbeat, OutstandingCharge } from "../../schemas/events.js";
import type { RoutedRequest } from "../routing/mod.js";

export interface HeartbeatInput {
  gateway: string;
  now: number;
  intervalMs: number;
  startedAt: number;
  chargeTtlMs: number;
  /** Bound on the charges listed (beyond it the list is marked truncated: receivers then only add). */
  maxListed: number;
  /** This heartbeat's number, increasing within the gateway process: groups the parts of one beat. */
  beat: number;
  /**
   * Most bytes of JSON per message (the caller gives ~90% of the server's `max_payload`, leaving
   * room for the protocol line and any headers). Unbounded when absent.
   */
  maxBytes?: number;
  /** The PODS sequence the gateway has applied (the drain handshake's acknowledgement). */
  podsSeq?: number;
}

const byteLength = (s: string): number => Buffer.byteLength(s, "utf8");

/** Printable ASCII but `"` and `\`: JSON writes such a string as it is, between quotes. */
const PLAIN = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;
const stringBytes = (s: string): number => (PLAIN.test(s) ? s.length + 2 : byteLength(JSON.stringify(s)));
/** JSON writes a finite number as String() does (anything else as null); integers counted by digits, which is cheaper. */
function numberBytes(n: number): number {
  if (n >= 0 && n < 1e15 && Number.isInteger(n)) {
    let d = 1;
    for (let p = 10; n >= p; p *= 10) d++;
    return d;
  }
  return Number.isFinite(n) ? String(n).length : 4;
}
/** `{"id":` `,"model":` `,"pod":` `,"promptTokens":` `,"ts":` `}` */
const ENTRY_FRAME = 6 + 9 + 7 + 16 + 6 + 1;
/** `,"decoding":true` */
const DECODING = 16;

/**
 * The bytes of `JSON.stringify(c)`, computed without serializing: the heartbeat measures every
 * listed charge every second, and stringifying each one cost twice the final encoding (~14 ms a
 * beat at 20,000 charges, on the event loop that serves requests). Model and pod names repeat
 * across charges, so their sizes are memoized in `names` for one heartbeat.
 */
export function outstandingBytes(c: OutstandingCharge, names: Map<string, number> = new Map()): number {
  let model = names.get(c.model);
  if (model === undefined) names.set(c.model, (model = stringBytes(c.model)));
  let pod = names.get(c.pod);
  if (pod === undefined) names.set(c.pod, (pod = stringBytes(c.pod)));
  return ENTRY_FRAME + stringBytes(c.id) + model + pod + numberBytes(c.promptTokens) + numberBytes(c.ts) + (c.decoding ? DECODING : 0);
}

/**
 * The heartbeat as one message when it fits in `maxBytes`, else as the parts of one beat, in
 * order. Publish all of them in the same loop turn: nothing of this gateway may sit between them.
 */
export function heartbeatOf(o: HeartbeatInput, state: "up" | "down", inFlight: Iterable<RoutedRequest>): GatewayHeartbeat[] {
  const base: GatewayHeartbeat = { type: "heartbeat", gateway: o.gateway, ts: o.now, intervalMs: o.intervalMs, startedAt: o.startedAt, state, beat: o.beat, ...(o.podsSeq !== undefined ? { podsSeq: o.podsSeq } : {}) };
  if (state === "down") return [base];
  const outstanding: OutstandingCharge[] = [];
  let truncated = false;
  for (const r of inFlight) {
    if (outstanding.length >= o.maxListed) {
      truncated = true;
      break;
    }
    if (!r.finished) outstanding.push({ id: r.chargeId, model: r.pod.model, pod: r.pod.pod, promptTokens: r.promptTokens, ts: r.startedAt, ...(r.firstChunkAt !== undefined ? { decoding: true } : {}) });
    // A P/D request's prefill leg is a charge of its own: listed too, or peers drop it at this beat.
    const leg = r.pd?.prefillCharge;
    if (leg && outstanding.length < o.maxListed) outstanding.push({ id: leg.id, model: leg.model, pod: leg.pod, promptTokens: leg.promptTokens, ts: leg.ts });
  }
  const whole: GatewayHeartbeat = { ...base, chargeTtlMs: o.chargeTtlMs, ...(truncated ? { truncated } : {}), outstanding };
  const maxBytes = o.maxBytes ?? Number.POSITIVE_INFINITY;
  if (!Number.isFinite(maxBytes)) return [whole];

  // Sizes are summed rather than the message serialized per candidate split: each entry's size
  // computed once, plus the envelope's. The envelope is measured with `part` and `parts` set to
  // the entry count, which no real index or count exceeds, so a part's sum is an upper bound.
  const names = new Map<string, number>();
  const sizes = outstanding.map((c) => outstandingBytes(c, names));
  const emptyWhole = byteLength(JSON.stringify({ ...whole, outstanding: [] }));
  const commas = Math.max(0, outstanding.length - 1);
  if (emptyWhole + sizes.reduce((a, b) => a + b, 0) + commas <= maxBytes) return [whole];

  const n = outstanding.length;
  const envelope = byteLength(JSON.stringify({ ...base, part: n, parts: n, chargeTtlMs: o.chargeTtlMs, truncated: true, outstanding: [] }));
  const slices: OutstandingCharge[][] = [];
  let slice: OutstandingCharge[] = [];
  let bytes = envelope;
  for (const [i, c] of outstanding.entries()) {
    const size = sizes[i] ?? 0;
    const add = size + (slice.length > 0 ? 1 : 0);
    if (bytes + add <= maxBytes) {
      slice.push(c);
      bytes += add;
      continue;
    }
    if (slice.length > 0) slices.push(slice);
    slice = [];
    bytes = envelope;
    if (envelope + size > maxBytes) {
      // Cannot be sent even alone (a bound far below any real max_payload): leave it out, and say
      // the list is incomplete so no receiver drops it as released.
      truncated = true;
      continue;
    }
    slice.push(c);
    bytes += size;
  }
  if (slice.length > 0 || slices.length === 0) slices.push(slice);
  return slices.map((s, part) => ({ ...base, part, parts: slices.length, chargeTtlMs: o.chargeTtlMs, ...(truncated ? { truncated } : {}), outstanding: s }));
}
