/**
 * Waiting on a kv-bridge in integration tests: joined to every engine, and caught up with what
 * the engines published (taken and acknowledged by the KV stream), each a condition, never a sleep.
 */
import type { KvBridgeHandle } from "../../services/kv-bridge/bridge.js";
import type { SimFleet } from "../../services/sim/fleet.js";
import { waitFor } from "./env.js";

/** The bridge bridges `pods` pods and has joined each engine's events (services/kv-bridge/pod-bridge.ts `settled`). */
export async function bridgeJoined(bridge: KvBridgeHandle, pods: number): Promise<void> {
  await waitFor(() => bridge.pods().length === pods, 5_000, "bridge to take the pods");
  await waitFor(() => bridge.pods().every((p) => p.settled), 5_000, "the bridge to join every engine's events");
}

/**
 * Everything the engines did is in the KV stream: engines idle, the bridge took each pod's last
 * batch, and the stream acknowledged it (a batch is taken before it is stored). Read the stream's
 * last sequence after this, not before.
 */
export async function bridgeCaughtUp(fleet: SimFleet, bridge: KvBridgeHandle): Promise<void> {
  await waitFor(() => fleet.pods.every((p) => fleet.cacheListing(p.name).pendingEvents === 0), 10_000, "engines idle");
  await waitFor(
    () =>
      fleet.pods.every((p) => {
        const next = fleet.cacheListing(p.name).nextSeq ?? 0;
        return next === 0 || bridge.pods().find((b) => b.pod === p.name)?.lastSeq === next - 1;
      }),
    10_000,
    "bridge to take every batch",
  );
  await waitFor(() => bridge.pods().every((b) => b.unacked === 0), 10_000, "the KV stream to acknowledge every batch");
}
