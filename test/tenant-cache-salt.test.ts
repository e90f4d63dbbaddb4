/**
 * Tenant isolation of the prefix cache end to end: simulated vLLM pods (KV events over real ZMQ),
 * the kv-bridge, a gateway with `--auth required` behind the dev front, on a real nats-server. API
 * keys carry a tenant cache salt (`config add-key --cache-salt`): every request of a key runs under
 * its salt at the engine and in the router's block hashes, so one tenant's prompt gives another
 * tenant neither an engine cache hit nor a prefix match in routing — not even when the other
 * tenant sends the first one's salt — while keys with the same salt share both. Replay still
 * re-decides every recorded pick from the salted hashes the records keep.
 */
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ApiKeyRecord } from "../schemas/config.js";
import type { DecisionRecord } from "../schemas/events.js";
import { type FrontServer, startFront } from "../services/front/front.js";
import { apiKeyBucketKey, generateApiKey, hashApiKey } from "../services/gateway/auth.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startKvBridge } from "../services/kv-bridge/bridge.js";
import { runReplay } from "../services/replay/command.js";
import { natsSource } from "../services/replay/sources.js";
import { spawnJetroute } from "../services/shared/processes.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { tokenizeChat } from "../services/tokenizer/sim-tokenizer.js";
import { chainSeed, promptBlockHashes } from "../services/views/block-hash.js";
import { configBucketName, streamName } from "../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";
import { bridgeCaughtUp, bridgeJoined } from "./harness/kv-bridge.js";

const BLOCK = 16;
const SALT_A = "9f3c1e7a55d04b2c8e6f0a1b2c3d4e5f";
const SALT_B = "0b7d2f4e6a8c1e3g5i7k9m1o3q5s7u9w";

describe("tenant cache salts - engines, kv-bridge, gateway --auth required, front", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let bridge: Awaited<ReturnType<typeof startKvBridge>>;
  let gw: GatewayHandle;
  let front: FrontServer;
  const keys: Record<"alice" | "aliceCi" | "bob" | "carol", string> = { alice: "", aliceCi: "", bob: "", carol: "" };
  const decisions = new Map<string, DecisionRecord>();
  let fromMs = 0;

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: MODEL, timeScale: 50, blockSize: BLOCK, kvCacheBlocks: 256, kvEventsEncoding: "map", logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, kvEvents: p.kvEvents });
    bridge = await startKvBridge({ nats: env.server.url, log: quietLog });
    await bridgeJoined(bridge, 2);
    // alice's key through the real CLI: the `--cache-salt` flag as an operator uses it.
    const cli = spawnJetroute("config", ["config", "add-key", "--user", "alice", "--cache-salt", SALT_A, "--json", "--nats", env.server.url]);
    expect(await cli.exited).toBe(0);
    const made = cli.jsonLines[0] as { key: string; cacheSalt: string };
    expect(made.cacheSalt).toBe(SALT_A);
    keys.alice = made.key;
    // The others straight into the config bucket: a second key of alice's tenant, bob's tenant, and carol without a salt.
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const put = async (user: string, cacheSalt?: string) => {
      const key = generateApiKey();
      const rec: ApiKeyRecord = { user, createdAt: Date.now(), ...(cacheSalt ? { cacheSalt } : {}) };
      await kv.create(apiKeyBucketKey(hashApiKey(key)), JSON.stringify(rec));
      return key;
    };
    keys.aliceCi = await put("alice-ci", SALT_A);
    keys.bob = await put("bob", SALT_B);
    keys.carol = await put("carol");
    gw = await env.gateway({ id: "salt-gw", auth: "required", tokenizerMode: "local", defaultStrategy: "prefix-cache", adminPort: 0 });
    await waitFor(() => gw.apiKeys.size === 4, 5_000, "the four keys to reach the gateway");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${gw.port}`], logger: quietLog });
    env.nats.nc.subscribe(env.subjects.all("decisions"), {
      callback: (_e, m) => {
        const d = m.json<DecisionRecord>();
        decisions.set(d.id, d);
      },
    });
    await env.nats.nc.flush();
  }, 60_000);
  afterAll(async () => {
    await front?.close();
    await bridge?.close();
    await fleet?.close();
    await env?.stop();
  });

  const system = `Tenant system prompt: ${"answer from the confidential handbook, section by section. ".repeat(10)}`;
  const messages = [
    { role: "system", content: system },
    { role: "user", content: "what does section two say?" },
  ];

  async function chat(key: string, id: string, extra: Record<string, unknown> = {}): Promise<Response> {
    return fetch(`http://127.0.0.1:${front.port}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}`, "x-request-id": id },
      body: JSON.stringify({ model: MODEL, messages, max_tokens: 4, ...extra }),
    });
  }

  /** Engine prefix-cache hits (tokens) summed over the fleet. */
  async function engineHits(): Promise<number> {
    let n = 0;
    for (const p of fleet.pods) n += ((await (await fetch(`http://${p.address}/debug/state`)).json()) as { totals: { prefixCacheHits: number } }).totals.prefixCacheHits;
    return n;
  }

  /** Sends one request, waits for everything it caused to reach the gateway's index; returns its record and the engine hits it made. */
  async function send(key: string, id: string, extra: Record<string, unknown> = {}): Promise<{ rec: DecisionRecord; hits: number }> {
    const before = await engineHits();
    const res = await chat(key, id, extra);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    await waitFor(() => decisions.has(id), 10_000, `the decision record of ${id}`);
    await bridgeCaughtUp(fleet, bridge);
    const last = (await env.nats.jsm.streams.info(streamName("jr", "KV"))).state.last_seq;
    await waitFor(() => gw.kvLastSeq() >= last, 10_000, "the gateway caught up with KV");
    return { rec: decisions.get(id) as DecisionRecord, hits: (await engineHits()) - before };
  }

  const matchedOf = (rec: DecisionRecord) => Object.fromEntries(rec.candidates.map((c) => [c.pod, c.score]));
  const hashesFor = (salt: string | null) => promptBlockHashes(tokenizeChat(messages), chainSeed(MODEL, null, BLOCK, salt), BLOCK);
  /** The engine holds blocks under exactly this `cache_salt` (the first block's extra key). */
  const engineSalts = () => new Set(fleet.pods.flatMap((p) => fleet.cacheListing(p.name).blocks.filter((b) => b.parentHash === null).map((b) => b.extraKeys?.[0] ?? null)));

  it("a tenant's prompt is cached and indexed under its salt only", async () => {
    fromMs = Date.now();
    const { rec } = await send(keys.alice, "alice-1");
    expect(rec.fallback).toBe("least-request (no match)");
    const holder = rec.pick;
    // The engine got the tenant's salt (the front forwarded the gateway's body).
    expect(engineSalts()).toEqual(new Set([SALT_A]));
    // The index holds the salted blocks on the pod that computed them, and nothing under any other key.
    const idx = gw.prefixIndex;
    for (const h of hashesFor(SALT_A).slice(0, 4)) expect(idx.holders(MODEL, h).map((x) => x.pod)).toEqual([holder]);
    for (const h of [...hashesFor(null), ...hashesFor(SALT_B)]) expect(idx.holders(MODEL, h)).toEqual([]);
  });

  it("another tenant with the same prompt gets no prefix match and no engine hit, even naming the first tenant's salt", async () => {
    const bob = await send(keys.bob, "bob-1");
    expect(Object.values(matchedOf(bob.rec)).every((s) => s === 0)).toBe(true);
    expect(bob.rec.fallback).toBe("least-request (no match)");
    expect(bob.hits).toBe(0);
    // bob names alice's salt himself: it goes under his own (SALT_B.SALT_A), which matches nothing of alice's.
    const probe = await send(keys.bob, "bob-probe", { cache_salt: SALT_A });
    expect(Object.values(matchedOf(probe.rec)).every((s) => s === 0)).toBe(true);
    expect(probe.hits).toBe(0);
    expect(engineSalts()).toEqual(new Set([SALT_A, SALT_B, `${SALT_B}.${SALT_A}`]));
    // A key without a salt (carol) sends the prompt unsalted: no salted block matches it.
    const carol = await send(keys.carol, "carol-1");
    expect(Object.values(matchedOf(carol.rec)).every((s) => s === 0)).toBe(true);
    expect(carol.hits).toBe(0);
  });

  it("a second key of the same tenant shares the cache: routed to the pod holding the prefix, and an engine hit", async () => {
    const holder = decisions.get("alice-1")?.pick as string;
    const ci = await send(keys.aliceCi, "alice-ci-1");
    expect(ci.rec.pick).toBe(holder);
    expect(ci.rec.fallback).toBeUndefined();
    expect(matchedOf(ci.rec)[holder]).toBeGreaterThanOrEqual(4);
    expect(ci.hits).toBeGreaterThanOrEqual(4 * BLOCK);
  });

  it("a malformed cache_salt is a 400 naming the field, before routing", async () => {
    const res = await chat(keys.alice, "alice-bad", { cache_salt: 42 });
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: { type: string; param: string; message: string } };
    expect(body.error).toMatchObject({ type: "invalid_request_error", param: "cache_salt" });
    expect(body.error.message).toMatch(/cache_salt/);
  });

  it("replay re-decides every recorded pick from the salted hashes the records keep", async () => {
    const toMs = Date.now();
    const report = await runReplay({ source: await natsSource(env.nats, "jr", { fromMs, toMs, tailMs: 2_000 }), fromMs, toMs, strategies: ["prefix-cache"], reorderMs: 2_000 });
    expect(report.fidelity.evaluated).toBe(5);
    expect(report.fidelity.reproduced).toBe(5);
    // The shared tenant's hit is seen in the rebuilt index (the check is not vacuous).
    expect(report.strategies.find((s) => s.name === "recorded")?.hitBlocks ?? 0).toBeGreaterThanOrEqual(4);
  }, 30_000);
});
