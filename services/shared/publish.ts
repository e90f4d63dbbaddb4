/**
 * Publishing events as JSON. Two ways, chosen per event family:
 * - `fire`: a core NATS publish onto a subject a stream captures. No ack round trip, so it costs
 *   the hot path almost nothing; used for charges, releases, heartbeats, load samples and
 *   decision records, which are either short-lived or re-sent continuously.
 * - `acked`: a JetStream publish awaiting the stream's ack, with `Nats-Msg-Id` for dedupe;
 *   used where losing one message matters (pod readiness).
 */
import type { JetStreamClient, PubAck } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";

const encoder = new TextEncoder();

export function encodeEvent(ev: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(ev));
}

export function fire(nc: NatsConnection, subject: string, ev: unknown): void {
  nc.publish(subject, encodeEvent(ev));
}

export function acked(js: JetStreamClient, subject: string, ev: unknown, msgId?: string): Promise<PubAck> {
  return js.publish(subject, encodeEvent(ev), msgId ? { msgID: msgId } : undefined);
}
