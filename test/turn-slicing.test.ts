/**
 * A large request's work in short turns of the gateway's loop (services/routing/turn-budget.ts,
 * `--turn-budget-ms`), end to end: real nats-server, real gRPC ext_proc, the real Llama-3 tokenizer
 * (`hf:`). A ~100k-token agent prompt whose first blocks one pod holds (KV events on the KV
 * stream) is routed by a gateway that slices its work and by one that does not: the same pod. And a
 * short chat sent while a large request is being worked on gets its answer first.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { KvBatch } from "../schemas/events.js";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { Tokenizer } from "../services/gateway/tokenization.js";
import { acked } from "../services/shared/publish.js";
import { chainSeed, hashToHex, promptBlockHashes } from "../services/views/block-hash.js";
import { streamName } from "../streams/definitions.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";
import { tokenizerDir } from "./harness/real-tokenizers.js";

const HF = `hf:${tokenizerDir("llama3")}` as const;
const BLOCK = 16;

/** An agent conversation of about `chars` characters: a system prompt, tasks, tool calls and results. */
function conversation(chars: number, seed: number): Array<Record<string, unknown>> {
  const messages: Array<Record<string, unknown>> = [{ role: "system", content: `You are agent ${seed}. ${"Follow the runbook step by step. ".repeat(200)}` }];
  let n = 0;
  for (let i = 0; n < chars; i++) {
    const text = `Step ${i} of session ${seed}: ${"the pod reported its cache state and the queue depth again; ".repeat(40)}`;
    messages.push({ role: i % 2 === 0 ? "user" : "assistant", content: text });
    n += text.length;
  }
  messages.push({ role: "user", content: "What next?" });
  return messages;
}

async function route(client: ExtProcClient, body: Buffer, id: string, strategy: string): Promise<string> {
  const ex = client.open();
  try {
    const h = await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "t", "content-type": "application/json", "x-request-id": id, "routing-strategy": strategy });
    if (h.kind !== "continue") throw new Error(`headers answered ${h.status}`);
    const b = await ex.requestBody(body);
    if (b.kind !== "continue") throw new Error(`body answered ${b.status}: ${b.body.toString().slice(0, 200)}`);
    return b.headerMutation.set["x-gateway-destination-endpoint"] ?? h.headerMutation.set["x-gateway-destination-endpoint"] ?? "";
  } finally {
    ex.cancel();
  }
}

describe("turn slicing: a large request's pick is unchanged, and a short one is not held behind it", () => {
  let env: TestEnv;
  let sliced: GatewayHandle;
  let whole: GatewayHandle;
  let cs: ExtProcClient;
  let cw: ExtProcClient;
  const large = Buffer.from(JSON.stringify({ model: MODEL, messages: conversation(450_000, 1), max_tokens: 8 }));

  beforeAll(async () => {
    env = await startTestEnv();
    for (let i = 0; i < 3; i++) await env.publishPod({ pod: `p${i}`, address: `10.9.0.${i}:8000` });
    // p2's engine holds the large prompt's first half (what an earlier turn left there).
    const own = new Tokenizer({ defaultMode: HF });
    const ids = (await own.tokenize(MODEL, { messages: JSON.parse(large.toString()).messages }, undefined)).tokens;
    await own.close();
    const hashes = promptBlockHashes(ids, chainSeed(MODEL, null, BLOCK), BLOCK).slice(0, Math.floor(ids.length / BLOCK / 2));
    const ev: KvBatch = {
      type: "kv", model: MODEL, pod: "p2", epoch: "e1", seq: 0, ts: Date.now(),
      events: [{ kind: "stored", engineHashes: hashes.map((_, i) => `e${i}`), routerHashes: hashes.map(hashToHex), parentEngineHash: null, blockSize: BLOCK, medium: "GPU", lora: null }],
    };
    await acked(env.nats.js, env.subjects.kv(MODEL, "p2"), ev);
    const common = { tokenizerModes: { [MODEL]: HF }, consistency: "off" as const, snapshots: false };
    sliced = await env.gateway({ id: "ts-sliced", ...common });
    whole = await env.gateway({ id: "ts-whole", turnBudgetMs: 0, ...common });
    const last = (await env.nats.jsm.streams.info(streamName("jr", "KV"))).state.last_seq;
    for (const g of [sliced, whole]) {
      await waitFor(() => g.kvLastSeq() >= last, 20_000, "gateway caught up with KV");
      await waitFor(() => g.views.pods.readyPods(MODEL).length === 3, 20_000, "three ready pods");
    }
    cs = new ExtProcClient(`127.0.0.1:${sliced.port}`, { messageTimeoutMs: 60_000 });
    cw = new ExtProcClient(`127.0.0.1:${whole.port}`, { messageTimeoutMs: 60_000 });
  }, 120_000);
  afterAll(async () => {
    cs?.close();
    cw?.close();
    await env?.stop();
  });

  it("the large prompt goes to the pod holding its prefix, sliced or not, cold and as a later turn", async () => {
    for (let i = 0; i < 2; i++) {
      const a = await route(cs, large, `big-s-${i}`, "prefix-cache");
      const b = await route(cw, large, `big-w-${i}`, "prefix-cache");
      expect(a).toBe("10.9.0.2:8000");
      expect(b).toBe(a);
    }
  }, 120_000);

  it("a short chat sent right after a large request is answered before it", async () => {
    const order: string[] = [];
    const next = Buffer.from(JSON.stringify({ model: MODEL, messages: [...JSON.parse(large.toString()).messages, { role: "user", content: "and then?" }], max_tokens: 8 }));
    const big = route(cs, next, "big-2", "prefix-cache").then((p) => order.push(`large ${p}`));
    const short = route(cs, Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 8 })), "short-1", "least-request").then((p) => order.push(`short ${p !== ""}`));
    await Promise.all([big, short]);
    expect(order).toEqual(["short true", "large 10.9.0.2:8000"]);
  }, 120_000);
});
