/**
 * Precise prefix routing on a real tokenizer, end to end: simulated engines on Qwen3's tokenizer
 * (`sim --tokenizer hf:`) publish KV events over real ZMQ, the kv-bridge puts them on the KV
 * stream, and a gateway on the same tokenizer (`--tokenizer-model <model>=hf:`) matches a new
 * turn of a conversation against them. The blocks the gateway matches must be exactly the blocks
 * the engine holds for that prompt — which only happens if both computed the same ids.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { Tokenizer } from "../services/gateway/tokenization.js";
import { startKvBridge } from "../services/kv-bridge/bridge.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { routerHashesOf } from "../services/sim/router-hashes.js";
import { chainSeed, promptBlockHashes } from "../services/views/block-hash.js";
import { streamName } from "../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";
import { bridgeCaughtUp, bridgeJoined } from "./harness/kv-bridge.js";
import { tokenizerDir } from "./harness/real-tokenizers.js";

const BLOCK = 16;
const HF = `hf:${tokenizerDir("qwen3")}` as const;

describe("precise prefix routing on a real tokenizer (Qwen3): engines -> kv-bridge -> gateway", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let bridge: Awaited<ReturnType<typeof startKvBridge>>;
  let gw: GatewayHandle;
  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: MODEL, timeScale: 50, blockSize: BLOCK, tokenizer: HF, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, kvEvents: p.kvEvents });
    bridge = await startKvBridge({ nats: env.server.url, log: quietLog });
    gw = await env.gateway({ id: "rt-a", adminPort: 0, tokenizerModes: { [MODEL]: HF } });
    await bridgeJoined(bridge, 2);
  }, 60_000);
  afterAll(async () => {
    await bridge?.close();
    await fleet?.close();
    await env?.stop();
  });

  async function post(address: string, path: string, body: unknown): Promise<Record<string, unknown>> {
    const res = await fetch(`http://${address}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    expect(res.status).toBe(200);
    return (await res.json()) as Record<string, unknown>;
  }

  async function quiesce(): Promise<void> {
    await bridgeCaughtUp(fleet, bridge);
    const last = (await env.nats.jsm.streams.info(streamName("jr", "KV"))).state.last_seq;
    await waitFor(() => gw.kvLastSeq() >= last, 10_000, "gateway caught up with KV");
  }

  const system = `You are the on-call assistant of the routing team. ${"Answer with the exact figure, then one sentence of context. ".repeat(10)}`;

  it("the engine's /tokenize and the gateway compute the same real ids", async () => {
    const pod = fleet.pods[0] as SimFleet["pods"][0];
    const messages = [{ role: "system", content: system }, { role: "user", content: "Ünïcödé 文字 and a KV cache?" }];
    const fromEngine = (await post(pod.address, "/tokenize", { model: MODEL, messages })).tokens;
    const own = new Tokenizer({ defaultMode: HF });
    const fromGateway = await own.tokenize(MODEL, { messages }, undefined);
    expect(fromGateway.mode).toBe("hf");
    expect(fromEngine).toEqual(Array.from(fromGateway.tokens));
    // Real Qwen3 ids: <|im_start|> is 151644, far outside the built-in tokenizer's 32k vocabulary.
    expect(fromGateway.tokens[0]).toBe(151644);
    const completion = await post(pod.address, "/tokenize", { model: MODEL, prompt: "hello world" });
    expect(completion.tokens).toEqual(Array.from((await own.tokenize(MODEL, { prompt: "hello world" }, undefined)).tokens));
    expect((await post(pod.address, "/detokenize", { model: MODEL, tokens: completion.tokens })).prompt).toBe("hello world");
  });

  it("a new turn matches exactly the blocks the engine cached for the conversation so far", async () => {
    const holder = fleet.pods[1] as SimFleet["pods"][0];
    const turn1 = [{ role: "system", content: system }, { role: "user", content: "How many pods are warm?" }];
    const reply = (await post(holder.address, "/v1/chat/completions", { model: MODEL, messages: turn1, max_tokens: 24 })) as { choices: Array<{ message: { content: string } }> };
    const turn2 = [...turn1, { role: "assistant", content: reply.choices[0]?.message.content ?? "" }, { role: "user", content: "And how many are cold?" }];
    await quiesce();

    const ids = (await new Tokenizer({ defaultMode: HF }).tokenize(MODEL, { messages: turn2 }, undefined)).tokens;
    const wanted = promptBlockHashes(ids, chainSeed(MODEL, null, BLOCK), BLOCK);
    // What the engine truly holds for this prompt: the longest run of its blocks from the start.
    const listing = fleet.cacheListing(holder.name);
    const routerHash = routerHashesOf(listing, MODEL, BLOCK);
    const held = new Set(listing.blocks.map((b) => routerHash(b.hash)).filter((h) => h !== null).map(String));
    let engineBlocks = 0;
    while (engineBlocks < wanted.length && held.has(String(wanted[engineBlocks]))) engineBlocks++;
    // At least the first turn's prompt is cached on the engine that served it.
    expect(engineBlocks).toBeGreaterThan(Math.floor(ids.length / BLOCK) / 2);

    const res = await fetch(`http://127.0.0.1:${gw.adminPort}/debug/explain`, {
      method: "POST",
      body: JSON.stringify({ model: MODEL, messages: turn2 }),
      headers: { "routing-strategy": "prefix-cache", "x-request-id": "rt-explain" },
    });
    expect(res.status).toBe(200);
    const answer = (await res.json()) as { pick: { pod: string }; tokenizer: string; candidates: Array<{ pod: string; prefix?: { indexBlocks: number } }> };
    expect(answer.tokenizer).toBe("hf");
    expect(answer.pick.pod).toBe(holder.name);
    expect(answer.candidates.find((c) => c.pod === holder.name)?.prefix?.indexBlocks).toBe(engineBlocks);
    expect(answer.candidates.find((c) => c.pod !== holder.name)?.prefix?.indexBlocks ?? 0).toBe(0);
  });
});
