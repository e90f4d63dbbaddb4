/**
 * The shared prefix index against real simulated engines: KV events over real ZMQ, through the
 * kv-bridge and the KV stream, into two gateway replicas. After a random workload with evictions
 * the index must agree with the engines' true cache contents, and both replicas must explain a
 * request identically.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startKvBridge } from "../services/kv-bridge/bridge.js";
import { writeSnapshot } from "../services/gateway/snapshots.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { routerHashesOf } from "../services/sim/router-hashes.js";
import { streamName } from "../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";
import { bridgeCaughtUp, bridgeJoined } from "./harness/kv-bridge.js";

const BLOCK = 16;

/** A deterministic pseudo-random generator for the workload. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

describe("prefix index - engines -> kv-bridge -> KV stream -> gateways", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let bridge: Awaited<ReturnType<typeof startKvBridge>>;
  let gws: GatewayHandle[];
  beforeAll(async () => {
    env = await startTestEnv();
    // Small caches (48 blocks each) so the workload evicts.
    fleet = await startSimFleet({ pods: 4, model: MODEL, timeScale: 50, kvCacheBlocks: 40, blockSize: BLOCK, kvEventsEncoding: ["map", "array"], logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, kvEvents: p.kvEvents });
    bridge = await startKvBridge({ nats: env.server.url, log: quietLog });
    gws = [
      await env.gateway({ id: "px-a", adminPort: 0, tokenizerMode: "local" }),
      await env.gateway({ id: "px-b", adminPort: 0, tokenizerMode: "local" }),
    ];
    // The bridge's SUB sockets joined before the engines produce events.
    await bridgeJoined(bridge, 4);
  }, 60_000);
  afterAll(async () => {
    await bridge?.close();
    await fleet?.close();
    await env?.stop();
  });

  // 5 system prompts of ~10-15 blocks each: 4 pods x 40 blocks cannot hold everything.
  const systemPrompts = Array.from({ length: 5 }, (_, i) => `System prompt ${i}: ${"you are a careful assistant who answers briefly and cites sources. ".repeat(16 + 3 * i)}`);

  async function chat(address: string, system: string, user: string) {
    const res = await fetch(`http://${address}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "system", content: system }, { role: "user", content: user }], max_tokens: 8 }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
  }

  /**
   * Waits until everything the engines did is in every gateway's index: engines idle, the bridge
   * has taken each pod's last batch, the KV stream stopped growing, every replica caught up.
   * (Engines idle alone is not enough under load: the bridge may still be publishing.)
   */
  async function quiesce(replicas: GatewayHandle[]): Promise<void> {
    await bridgeCaughtUp(fleet, bridge);
    let last = -1;
    let stable = 0;
    await waitFor(
      async () => {
        const now = (await env.nats.jsm.streams.info(streamName("jr", "KV"))).state.last_seq;
        stable = now === last ? stable + 1 : 0;
        last = now;
        return stable >= 3;
      },
      20_000,
      "the KV stream to stop growing (the same last sequence three times, 100 ms apart)",
      100,
    );
    await waitFor(() => replicas.every((g) => lastKvSeq(g) >= last), 10_000, "gateways caught up with KV");
  }

  it("agrees with the engines' true cache contents after a random workload with evictions", async () => {
    const r = rng(42);
    for (let i = 0; i < 60; i++) {
      const pod = fleet.pods[Math.floor(r() * fleet.pods.length)] as SimFleet["pods"][0];
      await chat(pod.address, systemPrompts[Math.floor(r() * systemPrompts.length)] as string, `question ${Math.floor(r() * 8)}`);
    }
    await quiesce(gws);

    let compared = 0;
    let agreed = 0;
    let skipped = 0;
    for (const p of fleet.pods) {
      const listing = fleet.cacheListing(p.name);
      const routerHash = routerHashesOf(listing, MODEL, BLOCK);
      for (const g of gws) {
        const idx = prefixIndexOf(g);
        let here = 0;
        for (const b of listing.blocks) {
          const rh = routerHash(b.hash);
          if (rh === null) {
            skipped++;
            continue;
          }
          compared++;
          here++;
          if (idx.holders(MODEL, rh).some((x) => x.pod === p.name)) agreed++;
        }
        // Nothing extra either: the index holds no more blocks for this pod than the engine does.
        expect(idx.podEntries(MODEL, p.name)).toBeLessThanOrEqual(listing.blocks.length);
        expect(here).toBeGreaterThan(0);
      }
    }
    const agreement = agreed / compared;
    const removed = bridge.stats.blocksRemoved;
    console.log(`index vs engine caches: ${agreed}/${compared} blocks agree (${(agreement * 100).toFixed(2)}%), ${skipped} skipped (parent evicted), ${removed} blocks evicted by the engines`);
    expect(agreement).toBeGreaterThanOrEqual(0.99);
    expect(removed).toBeGreaterThan(0);
  }, 60_000);

  it("two caught-up replicas explain the same request identically, naming the pod that holds its prefix", async () => {
    // A prompt no engine has seen, warmed on exactly one pod.
    const system = `Unique system prompt: ${"only this pod has computed these blocks. ".repeat(12)}`;
    const holder = fleet.pods[1] as SimFleet["pods"][0];
    await chat(holder.address, system, "warm it up");
    await quiesce(gws);
    const body = JSON.stringify({ model: MODEL, messages: [{ role: "system", content: system }, { role: "user", content: "a new question" }] });
    const answers = await Promise.all(
      gws.map(async (g) => {
        const res = await fetch(`http://127.0.0.1:${g.adminPort}/debug/explain`, { method: "POST", body, headers: { "routing-strategy": "prefix-cache", "x-request-id": "explain-1" } });
        expect(res.status).toBe(200);
        return (await res.json()) as { pick: { pod: string }; candidates: Array<{ pod: string; prefix?: { indexBlocks: number } }>; strategy: string; tokenizer: string };
      }),
    );
    // A third replica started later boots from a snapshot of the index plus the stream's tail.
    await writeSnapshot({ nats: env.nats, prefix: "jr", index: (gws[0] as GatewayHandle).prefixIndex, seq: (gws[0] as GatewayHandle).kvLastSeq, gatewayId: "test" });
    await chat(holder.address, "an unrelated prompt published after the snapshot", "tail");
    const late = await env.gateway({ id: "px-late", adminPort: 0, tokenizerMode: "local" });
    await quiesce([...gws, late]);
    const state = (await (await fetch(`http://127.0.0.1:${late.adminPort}/debug/state`)).json()) as { snapshots: { booted: { seq: number } | null } };
    expect(state.snapshots.booted?.seq).toBeGreaterThan(0);
    const lateAnswer = await (
      await fetch(`http://127.0.0.1:${late.adminPort}/debug/explain`, { method: "POST", body, headers: { "routing-strategy": "prefix-cache", "x-request-id": "explain-1" } })
    ).json();
    expect(lateAnswer).toEqual(answers[0]);
    expect(late.prefixIndex.stats().entries).toBe((gws[0] as GatewayHandle).prefixIndex.stats().entries);
    expect(answers[0]).toEqual(answers[1]);
    const a = answers[0] as (typeof answers)[0];
    expect(a.strategy).toBe("prefix-cache");
    expect(a.tokenizer).toBe("local");
    expect(a.pick.pod).toBe(holder.name);
    expect(a.candidates.find((c) => c.pod === holder.name)?.prefix?.indexBlocks).toBeGreaterThan(3);
    // Explaining charges nothing.
    expect(gws.every((g) => g.views.ledger.size === 0)).toBe(true);
  });
});

function prefixIndexOf(g: GatewayHandle) {
  return g.prefixIndex;
}
function lastKvSeq(g: GatewayHandle): number {
  return g.kvLastSeq();
}
