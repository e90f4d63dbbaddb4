/**
 * SGLang KV events end to end: simulated SGLang pods in their KV-events mode publish SGLang's wire
 * (one event per page, CPython tuple hashes, the root's hash(()) as the first parent, old replay
 * layout) over real ZMQ; the kv-bridge decodes them in the SGLang dialect; a gateway matches a
 * prompt against them and finds exactly the blocks the engine holds.
 */
import { Dealer } from "zeromq";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startKvBridge } from "../services/kv-bridge/bridge.js";
import { decodeBatch, parseReplayMessage, seqFrame } from "../services/kv-bridge/wire.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { pythonTupleHash } from "../services/sim/python-hash.js";
import { routerHashesOf } from "../services/sim/router-hashes.js";
import { tokenizeChat } from "../services/tokenizer/sim-tokenizer.js";
import { chainSeed, promptBlockHashes } from "../services/views/block-hash.js";
import { streamName } from "../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";
import { bridgeCaughtUp, bridgeJoined } from "./harness/kv-bridge.js";

const BLOCK = 16;

describe("SGLang KV events: simulated SGLang -> kv-bridge -> gateway", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let bridge: Awaited<ReturnType<typeof startKvBridge>>;
  let gw: GatewayHandle;
  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: MODEL, engine: "sglang", sglangKvEvents: true, timeScale: 50, blockSize: BLOCK, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, engine: "sglang", kvEvents: p.kvEvents });
    bridge = await startKvBridge({ nats: env.server.url, log: quietLog });
    gw = await env.gateway({ id: "sg-a", adminPort: 0, tokenizerMode: "local" });
    await bridgeJoined(bridge, 2);
  }, 60_000);
  afterAll(async () => {
    await bridge?.close();
    await fleet?.close();
    await env?.stop();
  });

  const system = `SGLang system prompt: ${"the radix cache keeps pages of sixteen tokens. ".repeat(10)}`;
  const chat = (address: string, user: string) =>
    fetch(`http://${address}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "system", content: system }, { role: "user", content: user }], max_tokens: 4 }),
    }).then(async (r) => {
      expect(r.status).toBe(200);
      await r.arrayBuffer();
    });

  it("publishes SGLang's wire: per-page events, tuple hashes, root parent, old replay layout", async () => {
    const pod = fleet.pods[0] as SimFleet["pods"][0];
    expect(pod.kvEventsEncoding).toBe("sglang");
    await chat(pod.address, "first");
    await waitFor(() => fleet.cacheListing(pod.name).pendingEvents === 0 && (fleet.cacheListing(pod.name).nextSeq ?? 0) > 0, 10_000, "events out");
    const dealer = new Dealer({ linger: 0, receiveTimeout: 5_000 });
    dealer.connect(pod.kvEvents?.replayEndpoint as string);
    await dealer.send([Buffer.alloc(0), seqFrame(0)]);
    const stored: Array<{ hashes: string[]; parent: string | null; tokens: number[] }> = [];
    for (;;) {
      const frames = (await dealer.receive()) as Buffer[];
      // Old layout: [delimiter, seq8, payload] as a DEALER sees it.
      expect(frames).toHaveLength(3);
      const r = parseReplayMessage(frames);
      if (!r.ok) throw new Error(r.reason);
      if (r.value === "end") break;
      const b = decodeBatch(r.value.payload, "sglang");
      if (!b.ok) throw new Error(b.reason);
      expect(b.value.dpRank).toBe(0);
      for (const e of b.value.events) if (e.kind === "stored") stored.push(e);
    }
    dealer.close();
    expect(stored.length).toBeGreaterThan(5);
    for (const e of stored) {
      expect(e.hashes).toHaveLength(1);
      expect(e.tokens).toHaveLength(BLOCK);
      expect(e.hashes[0]).toBe(BigInt.asUintN(64, pythonTupleHash(e.tokens)).toString(16));
    }
    // The first page chains from the root (decoded as no parent), every later one from the page before.
    expect(stored[0]?.parent).toBeNull();
    for (let i = 1; i < stored.length; i++) expect(stored[i]?.parent).toBe(stored[i - 1]?.hashes[0]);
  });

  it("the gateway matches exactly the blocks the SGLang engine holds for a prompt", async () => {
    const holder = fleet.pods[1] as SimFleet["pods"][0];
    await chat(holder.address, "warm the second pod");
    await bridgeCaughtUp(fleet, bridge);
    const last = (await env.nats.jsm.streams.info(streamName("jr", "KV"))).state.last_seq;
    await waitFor(() => gw.kvLastSeq() >= last, 10_000, "gateway caught up");
    expect(bridge.stats.unknownParents).toBe(0);

    const messages = [{ role: "system", content: system }, { role: "user", content: "a new question" }];
    const wanted = promptBlockHashes(tokenizeChat(messages), chainSeed(MODEL, null, BLOCK), BLOCK);
    const listing = fleet.cacheListing(holder.name);
    const routerHash = routerHashesOf(listing, MODEL, BLOCK);
    const held = new Set(listing.blocks.map((b) => String(routerHash(b.hash))));
    let engineBlocks = 0;
    while (engineBlocks < wanted.length && held.has(String(wanted[engineBlocks]))) engineBlocks++;
    expect(engineBlocks).toBeGreaterThan(5);

    const res = await fetch(`http://127.0.0.1:${gw.adminPort}/debug/explain`, {
      method: "POST",
      body: JSON.stringify({ model: MODEL, messages }),
      headers: { "routing-strategy": "prefix-cache", "x-request-id": "sg-explain" },
    });
    expect(res.status).toBe(200);
    const answer = (await res.json()) as { candidates: Array<{ pod: string; prefix?: { indexBlocks: number } }> };
    // Both pods saw the same system prompt; each holds (at least) its blocks.
    for (const p of fleet.pods) {
      const l = fleet.cacheListing(p.name);
      const rh = routerHashesOf(l, MODEL, BLOCK);
      const h = new Set(l.blocks.map((b) => String(rh(b.hash))));
      let n = 0;
      while (n < wanted.length && h.has(String(wanted[n]))) n++;
      expect(answer.candidates.find((c) => c.pod === p.name)?.prefix?.indexBlocks).toBe(n);
    }
  });
});
