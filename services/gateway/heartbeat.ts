/**
 * A gateway's heartbeat: it is alive, and — with `state: "up"` — the full list of the charges it
 * holds, which every other replica reconciles its ledger against (a lost charge or release heals
 * within one heartbeat). Pure; the gateway publishes it through the outbox, so the list sits
 * after every charge and release published before it.
 */
import type { GatewayHeartbeat } from "../../schemas/events.js";
import type { RoutedRequest } from "./request.js";

export interface HeartbeatInput {
  gateway: string;
  now: number;
  intervalMs: number;
  startedAt: number;
  chargeTtlMs: number;
  /** Bound on the charges listed (beyond it the list is marked truncated: receivers then only add). */
  maxListed: number;
}

export function heartbeatOf(o: HeartbeatInput, state: "up" | "down", inFlight: Iterable<RoutedRequest>): GatewayHeartbeat {
  const hb: GatewayHeartbeat = { type: "heartbeat", gateway: o.gateway, ts: o.now, intervalMs: o.intervalMs, startedAt: o.startedAt, state };
  if (state === "down") return hb;
  const outstanding: NonNullable<GatewayHeartbeat["outstanding"]> = [];
  for (const r of inFlight) {
    if (outstanding.length >= o.maxListed) {
      hb.truncated = true;
      break;
    }
    outstanding.push({ id: r.chargeId, model: r.pod.model, pod: r.pod.pod, promptTokens: r.promptTokens, ts: r.startedAt, ...(r.firstChunkAt !== undefined ? { decoding: true } : {}) });
  }
  hb.chargeTtlMs = o.chargeTtlMs;
  hb.outstanding = outstanding;
  return hb;
}
