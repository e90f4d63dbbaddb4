/**
 * The replay engine's input side: the message a source delivers, its decoding into a buffered
 * entry (a checked event, and the gateway and charge number it belongs to), and the per-stream
 * buffer the engine's folds read by absolute position. Pure: no I/O.
 */
import { checkEvent } from "../../schemas/validate.js";
import type { EventType } from "../../schemas/events.js";
import type { StateEvent, StateStream } from "../views/gateway-state.js";
import { chargeSeqOf } from "../routing/mod.js";
import { STREAM_EVENT_TYPES } from "../../streams/event-types.js";

export type ReplayStream = StateStream | "decisions";

/** One message as a source delivers it. `data` is the payload (parsed JSON, or the raw text when it was not JSON). */
export interface ReplayMessage {
  stream: ReplayStream;
  subject: string;
  seq: number;
  /** Server timestamp (ms). */
  serverTs: number;
  /** Parsed JSON payload; for the config stream, a config entry (see services/views/gateway-state.ts). */
  data: unknown;
  /** Set when the payload was not JSON. */
  invalid?: string;
}

export interface Buffered {
  seq: number;
  serverTs: number;
  subject: string;
  ev?: StateEvent;
  /** The gateway that published it (charges, releases, heartbeats, routed prefixes). */
  gateway?: string;
  /** Charge sequence (numeric charge id) for charges and routed prefixes. */
  chargeSeq?: number;
}

/** A FIFO with absolute positions, compacted as it is consumed. */
export class Log {
  private items: Buffered[] = [];
  /** Absolute position of items[0]. */
  base = 0;
  get end(): number {
    return this.base + this.items.length;
  }
  push(b: Buffered): number {
    this.items.push(b);
    return this.end - 1;
  }
  at(pos: number): Buffered | undefined {
    return this.items[pos - this.base];
  }
  /** Drops everything before `pos`. */
  trim(pos: number): void {
    const n = Math.min(pos - this.base, this.items.length);
    if (n <= 0) return;
    if (n > 4096 || n * 2 > this.items.length) {
      this.items = this.items.slice(n);
      this.base += n;
    }
  }
  get size(): number {
    return this.items.length;
  }
}

/** The event types each state stream may carry (anything else on it is skipped). */
export const STATE_STREAM_TYPES: Record<StateStream, readonly EventType[]> = {
  pods: STREAM_EVENT_TYPES.PODS,
  load: STREAM_EVENT_TYPES.LOAD,
  charges: STREAM_EVENT_TYPES.CHARGES,
  kv: STREAM_EVENT_TYPES.KV,
  config: [],
};

/**
 * A message of state stream `stream` (its `m.stream`) as the buffers hold it. `ev` is left unset when the payload is not a
 * valid event of its stream (not JSON, a config entry of the wrong shape, an event that fails its
 * schema or belongs on another stream): such a message only moves the folds' cursors.
 */
export function bufferedOf(stream: StateStream, m: ReplayMessage): Buffered {
  const b: Buffered = { seq: m.seq, serverTs: m.serverTs, subject: m.subject };
  if (m.invalid) return b;
  if (stream === "config") {
    const e = m.data as { type?: unknown; key?: unknown; operation?: unknown } | null;
    if (e?.type === "config-entry" && typeof e.key === "string" && (e.operation === "PUT" || e.operation === "DEL" || e.operation === "PURGE")) b.ev = m.data as StateEvent;
    return b;
  }
  const d = checkEventOf(m.data, STATE_STREAM_TYPES[stream]);
  if (!d.ok) return b;
  b.ev = d.event as StateEvent;
  const g = (d.event as { gateway?: unknown }).gateway;
  const ev = b.ev;
  if (typeof g === "string" && (ev.type === "charge" || ev.type === "release" || ev.type === "releases" || ev.type === "heartbeat" || ev.type === "kv-routed")) {
    b.gateway = g;
    if (ev.type === "charge") b.chargeSeq = chargeSeqOf(ev.id);
    if (ev.type === "kv-routed") b.chargeSeq = chargeSeqOf(ev.charge);
  }
  return b;
}

function checkEventOf(data: unknown, types: readonly EventType[]) {
  const type = (data as { type?: unknown } | null)?.type;
  if (typeof type !== "string" || !(types as readonly string[]).includes(type)) return { ok: false as const, reason: `unexpected event type ${JSON.stringify(type)}` };
  return checkEvent(type as EventType, data);
}
