/**
 * Which event types each stream carries: one table for every reader (the gateway's followers,
 * replay, the pod-watcher). A message of another type on a stream is dead-lettered by its reader.
 */
import type { EventType } from "../schemas/events.js";
import type { StreamKey } from "./definitions.js";

export const STREAM_EVENT_TYPES = {
  /** Pod readiness, and the pod-watcher sources' heartbeats (`podsrc`). */
  PODS: ["pod", "pod-source"],
  LOAD: ["load"],
  /** Charges and releases of every gateway replica, and their heartbeats listing what they hold. */
  CHARGES: ["charge", "release", "releases", "heartbeat"],
  /** Engine KV events, caches cleared, and the gateways' routed prefixes. */
  KV: ["kv", "kv-cleared", "kv-routed"],
  USAGE: ["usage"],
  DECISIONS: ["decision"],
  AUTOSCALE: ["autoscale"],
  /** LoRA adapter placements (jetroute adapter-controller). */
  ADAPTERS: ["adapter"],
  /** Where each Responses API response lives (gateways). */
  RESPONSES: ["response-location"],
} as const satisfies Partial<Record<StreamKey, readonly EventType[]>>;
