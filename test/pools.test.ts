/**
 * Gateway pools end to end (streams/pools.ts): two pools on one real nats-server, each with its
 * own streams, pod-watcher (one static list of every pod, filtered by the pool's models), scraper,
 * gateways and front; simulated vLLM pods.
 *
 * - pool a's gateway folds nothing of pool b while b is under load: its streams hold only its own
 *   messages, its cursors end at their last sequence, its views know no b pod, charge or gateway;
 * - b's two replicas share their charges as one unpooled fleet does;
 * - a request for b's model at a gets 421 `wrong_pool` naming b (message and `x-jetroute-pool`),
 *   an unpooled gateway does the same for a pooled model, a model of no pool gets 404;
 * - a pool's kv-bridge feeds its engines' KV events to its own KV stream and gateways' index;
 * - replay reads a pool's namespace;
 * - re-assigning a pool's models in the config bucket moves its pods live.
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { POOL_KEY_PREFIX } from "../schemas/config.js";
import { applyStreams } from "../streams/apply.js";
import { configBucketName, streamName } from "../streams/definitions.js";
import { namespaceOf } from "../streams/pools.js";
import { type FrontServer, startFront } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { type KvBridgeHandle, startKvBridge } from "../services/kv-bridge/bridge.js";
import { startScraper } from "../services/metrics-scraper/scraper.js";
import { runReplay } from "../services/replay/command.js";
import { natsSource } from "../services/replay/sources.js";
import { type PodWatcherHandle, startPodWatcher } from "../services/pod-watcher/pod-watcher.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const MA = "org/model-a";
const MB = "org/model-b";
/** A model no pool lists: the unpooled namespace serves it. */
const MF = "org/model-free";
const nsA = namespaceOf("jr", "a");
const nsB = namespaceOf("jr", "b");

describe("gateway pools", () => {
  let env: TestEnv;
  let fleetA: SimFleet;
  let fleetB: SimFleet;
  let fleetF: SimFleet;
  const watchers: PodWatcherHandle[] = [];
  const closers: Array<() => Promise<void>> = [];
  const bridges: KvBridgeHandle[] = [];
  let ga: GatewayHandle;
  let gb1: GatewayHandle;
  let gb2: GatewayHandle;
  let plain: GatewayHandle;
  let frontA: FrontServer;
  let frontB: FrontServer;
  let frontPlain: FrontServer;
  const setPool = async (pool: string, models: string[]) => {
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(`${POOL_KEY_PREFIX}${pool}`, JSON.stringify({ models }));
  };

  beforeAll(async () => {
    env = await startTestEnv();
    for (const ns of [nsA, nsB]) await applyStreams(env.nats.nc, env.nats.jsm, { prefix: ns.prefix, configPrefix: ns.configPrefix });
    await setPool("a", [MA]);
    await setPool("b", [MB]);
    // Pool a's engines publish KV events: its own kv-bridge feeds its own KV stream.
    fleetA = await startSimFleet({ pods: 2, model: MA, namePrefix: "a-", kvEvents: true, logger: quietLog });
    fleetB = await startSimFleet({ pods: 2, model: MB, namePrefix: "b-", logger: quietLog });
    fleetF = await startSimFleet({ pods: 1, model: MF, namePrefix: "free-", logger: quietLog });
    // One list of every pod, as a cluster's discovery would see them; each pool's watcher keeps its own.
    const dir = mkdtempSync(path.join(os.tmpdir(), "jr-pools-"));
    const file = path.join(dir, "pods.json");
    const all = [...fleetA.pods.map((p) => ({ name: p.name, p, model: MA })), ...fleetB.pods.map((p) => ({ name: p.name, p, model: MB }))];
    // One more pod, of a model no pool lists.
    all.push({ name: "free-0", p: fleetF.pods[0] as SimFleet["pods"][number], model: MF });
    writeFileSync(file, JSON.stringify(all.map(({ name, p, model }) => ({ name, model, address: p.address, ...(p.kvEvents ? { kvEvents: p.kvEvents } : {}) }))));
    // Pool a takes its models from the config bucket (re-read every 100 ms here); pool b from --models.
    watchers.push(await startPodWatcher({ nats: env.server.url, file, pool: "a", poolPollMs: 100, probeIntervalMs: 200, log: quietLog }));
    watchers.push(await startPodWatcher({ nats: env.server.url, file, pool: "b", poolModels: [MB], probeIntervalMs: 200, log: quietLog }));
    // The unpooled watcher over the same list publishes only the models no pool lists.
    watchers.push(await startPodWatcher({ nats: env.server.url, file, poolPollMs: 100, probeIntervalMs: 200, log: quietLog }));
    for (const ns of [nsA, nsB]) {
      const s = await startScraper({ nats: env.server.url, prefix: ns.prefix, intervalMs: 100, log: quietLog });
      closers.push(() => s.close());
      const k = await startKvBridge({ nats: env.server.url, prefix: ns.prefix, log: quietLog });
      closers.push(() => k.close());
      bridges.push(k);
    }
    ga = await env.gateway({ id: "gw-a", pool: "a", adminPort: 0 });
    gb1 = await env.gateway({ id: "gw-b1", pool: "b" });
    gb2 = await env.gateway({ id: "gw-b2", pool: "b" });
    plain = await env.gateway({ id: "gw-plain" });
    const front = (gws: GatewayHandle[]) => startFront({ port: 0, host: "127.0.0.1", gateways: gws.map((g) => `127.0.0.1:${g.port}`), logger: quietLog });
    frontA = await front([ga]);
    frontB = await front([gb1, gb2]);
    frontPlain = await front([plain]);
    await waitFor(
      () => ga.views.pods.readyPods(MA).length === 2 && gb1.views.pods.readyPods(MB).length === 2 && gb2.views.pods.readyPods(MB).length === 2 && plain.views.pods.readyPods(MF).length === 1,
      10_000,
      "each namespace's pods",
    );
  });
  afterAll(async () => {
    for (const f of [frontA, frontB, frontPlain]) await f?.close();
    for (const w of watchers) await w.close().catch(() => undefined);
    for (const c of closers) await c().catch(() => undefined);
    await fleetA?.close();
    await fleetB?.close();
    await fleetF?.close();
    await env?.stop();
  });

  const complete = (front: FrontServer, model: string, extra: Record<string, unknown> = {}) =>
    fetch(`http://127.0.0.1:${front.port}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model, prompt: "hello pools", max_tokens: 4, ...extra }) });

  /** Subjects a stream holds, with message counts. */
  const subjectsOf = async (stream: string): Promise<Record<string, number>> => (await env.nats.jsm.streams.info(stream, { subjects_filter: ">" })).state.subjects ?? {};

  it("each pool's replicas know only their pool's pods, in their own streams", async () => {
    expect(ga.views.pods.all().map((p) => p.model)).toEqual([MA, MA]);
    expect(new Set(gb1.views.pods.all().map((p) => p.model))).toEqual(new Set([MB]));
    // The unpooled namespace holds only the pod of the model no pool lists.
    expect(plain.views.pods.all().map((p) => [p.model, p.pod])).toEqual([[MF, "free-0"]]);
    expect(Object.keys(await subjectsOf(streamName(nsA.prefix, "PODS"))).filter((s) => s.startsWith("jr.pool.a.pods.")).length).toBe(2);
    expect(Object.keys(await subjectsOf(streamName("jr", "PODS"))).filter((s) => s.startsWith("jr.pods."))).toEqual(["jr.pods.org/model-free.free-0"]);
  });

  it("pool a folds no event of pool b while b is under load; b's replicas share their charges", async () => {
    const aCursors = { ...ga.state.cursors };
    // Concurrent requests through both b replicas, and held ones to see the shared ledger.
    const results = await Promise.all(Array.from({ length: 40 }, () => complete(frontB, MB).then((r) => r.status)));
    expect(results.every((s) => s === 200)).toBe(true);
    // b2 folded b1's charges and releases (its ledger saw a foreign charge): sharing works in the pool.
    await waitFor(() => gb2.state.ledger.liveGateways(Date.now()).includes("gw-b1"), 5_000, "b1 live in b2's ledger");
    const aCharges = await subjectsOf(streamName(nsA.prefix, "CHARGES"));
    // Pool a's CHARGES stream holds a's own heartbeats and nothing else; its load stream only a's pods.
    expect(Object.keys(aCharges)).toEqual(["jr.pool.a.hb.gw-a"]);
    const aLoad = Object.keys(await subjectsOf(streamName(nsA.prefix, "LOAD")));
    expect(aLoad.length).toBeGreaterThan(0);
    expect(aLoad.every((s) => s.startsWith("jr.pool.a.load.org/model-a."))).toBe(true);
    const bCharges = Object.keys(await subjectsOf(streamName(nsB.prefix, "CHARGES")));
    expect(bCharges.some((s) => s.startsWith("jr.pool.b.charges.org/model-b."))).toBe(true);
    // a's fold: caught up to its own streams' ends, nothing it could have read of b.
    const last = async (key: "CHARGES" | "LOAD" | "PODS") => (await env.nats.jsm.streams.info(streamName(nsA.prefix, key))).state.last_seq;
    for (const key of ["CHARGES", "LOAD", "PODS"] as const) {
      const end = await last(key);
      const cursor = key === "CHARGES" ? "charges" : key === "LOAD" ? "load" : "pods";
      await waitFor(() => ga.state.cursors[cursor] >= end, 5_000, `a's ${key} cursor at its stream's end`);
    }
    expect(ga.state.cursors.charges).toBeGreaterThan(aCursors.charges);
    expect(ga.state.ledger.liveGateways(Date.now()).filter((g) => g.startsWith("gw-b"))).toEqual([]);
    expect(ga.state.ledger.size).toBe(0);
    expect(ga.views.pods.knows(MB)).toBe(false);
    expect(ga.state.rates.modelRequests(MB, Date.now())).toBe(0);
  });

  it("replay reads a pool's namespace: pool b's decisions re-decided on pool b's views", async () => {
    const fromMs = Date.now();
    const statuses = await Promise.all(Array.from({ length: 30 }, (_, i) => complete(frontB, MB, { prompt: `replay pool b ${i}` }).then((r) => r.status)));
    expect(statuses.every((s) => s === 200)).toBe(true);
    const toMs = Date.now();
    const decisions = streamName(nsB.prefix, "DECISIONS");
    await waitFor(async () => (await env.nats.jsm.streams.info(decisions)).state.messages >= 70, 10_000, "pool b's decision records in its stream", 20);
    const report = await runReplay({ source: await natsSource(env.nats, nsB.prefix, { fromMs, toMs, tailMs: 5_000, configPrefix: nsB.configPrefix }), fromMs, toMs, strategies: ["random"], reorderMs: 5_000 });
    expect(report.decisions.evaluated).toBe(30);
    expect(report.fidelity.ratio).toBeGreaterThanOrEqual(0.99);
    // Pool a's namespace holds none of them.
    expect((await env.nats.jsm.streams.info(streamName(nsA.prefix, "DECISIONS"))).state.messages).toBe(0);
  });

  it("a pool's kv-bridge feeds its engines' KV events into the pool's KV stream and its gateways' prefix index", async () => {
    const [bridgeA, bridgeB] = bridges as [KvBridgeHandle, KvBridgeHandle];
    // Each pool's bridge takes only its pool's pods.
    await waitFor(() => bridgeA.pods().length === 2 && bridgeA.pods().every((p) => p.settled), 10_000, "pool a's bridge joined its engines");
    expect(bridgeA.pods().every((p) => p.model === MA)).toBe(true);
    expect(bridgeB.pods().every((p) => p.model === MB)).toBe(true);
    const before = ga.state.index.stats().blocks;
    const system = `Pool a's system prompt: ${"keep answers short and cite the pool. ".repeat(12)}`;
    const res = await fetch(`http://127.0.0.1:${frontA.port}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "routing-strategy": "prefix-cache" },
      body: JSON.stringify({ model: MA, messages: [{ role: "system", content: system }, { role: "user", content: "hi" }], max_tokens: 4 }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    await waitFor(() => ga.state.index.stats().blocks > before, 10_000, "pool a's index to hold the engine's blocks");
    // Pool a's KV stream holds only a's pods' events; the unpooled namespace's holds none.
    const kvA = Object.keys((await env.nats.jsm.streams.info(streamName(nsA.prefix, "KV"), { subjects_filter: ">" })).state.subjects ?? {});
    expect(kvA.length).toBeGreaterThan(0);
    expect(kvA.every((subject) => subject.startsWith("jr.pool.a.kv.org/model-a."))).toBe(true);
    expect((await env.nats.jsm.streams.info(streamName("jr", "KV"))).state.messages).toBe(0);
  });

  it("a request for another pool's model gets 421 naming the pool; a model of no pool gets 404", async () => {
    const wrong = await complete(frontA, MB);
    expect(wrong.status).toBe(421);
    expect(wrong.headers.get("x-jetroute-pool")).toBe("b");
    const body = (await wrong.json()) as { error: { code: string; message: string; param: string } };
    expect(body.error.code).toBe("wrong_pool");
    expect(body.error.param).toBe("model");
    expect(body.error.message).toContain("pool `b`");
    // The unpooled gateway sends pooled models to their pool too.
    const fromPlain = await complete(frontPlain, MA);
    expect(fromPlain.status).toBe(421);
    expect(fromPlain.headers.get("x-jetroute-pool")).toBe("a");
    const unknown = await complete(frontA, "org/no-such-model");
    expect(unknown.status).toBe(404);
    const unknownBody = (await unknown.json()) as { error: { code: string; message: string } };
    expect(unknownBody.error.code).toBe("model_not_found");
    expect(unknownBody.error.message).toContain("gateway pool `a`");
    // The model no pool lists is the unpooled gateways': 404 at a pool, 200 unpooled.
    expect((await complete(frontA, MF)).status).toBe(404);
    expect((await complete(frontPlain, MF)).status).toBe(200);
    // Its own model still routes.
    expect((await complete(frontA, MA)).status).toBe(200);
    // The replica's series carry its pool; the misdirected request is counted with its status, twice:
    // fetch (the Fetch standard, as browsers do) retries a 421 once on a new connection.
    const metrics = await (await fetch(`http://127.0.0.1:${ga.adminPort}/metrics`)).text();
    expect(metrics).toMatch(/jetroute_gateway_requests_total\{strategy="least-request",outcome="rejected",status="421",gateway="gw-a",pool="a"\} 2\n/);
    const debug = (await (await fetch(`http://127.0.0.1:${ga.adminPort}/debug/state`)).json()) as { pool: { name: string; prefix: string; models: string[] } };
    expect(debug.pool).toMatchObject({ name: "a", prefix: "jr.pool.a", models: [MA] });
  });

  it("re-assigning a pool's models in the config bucket moves their pods live; a botched entry removes nothing", async () => {
    // Model a moves from pool a to pool b: a's watcher removes its pods, a's gateway sends it to b.
    await setPool("a", ["org/model-unused"]);
    await setPool("b", [MB, MA]);
    await waitFor(() => ga.views.pods.readyPods(MA).length === 0, 10_000, "pool a's pods removed");
    await waitFor(() => ga.state.pools.poolOf(MA) === "b", 5_000, "a's gateway to read the new assignment");
    const moved = await complete(frontA, MA);
    expect(moved.status).toBe(421);
    expect(moved.headers.get("x-jetroute-pool")).toBe("b");
    // b's watcher runs with a fixed --models list: it did not take them; the unpooled one neither (a pool lists it).
    expect(gb1.views.pods.readyPods(MA)).toEqual([]);
    // Between the two edits model a was in no pool, so the unpooled watcher may have taken its
    // pods for a moment; once it reads pool b's entry they leave the unpooled namespace again.
    await waitFor(() => plain.views.pods.readyPods(MA).length === 0, 10_000, "the unpooled gateway without model a's pods");
    // Of the 5 listed pods, pool a's watcher now publishes none.
    expect(watchers[0]?.stats.filteredOut).toBe(5);
    // Back to pool a.
    await setPool("b", [MB]);
    await setPool("a", [MA]);
    await waitFor(() => ga.views.pods.readyPods(MA).length === 2, 10_000, "pool a's pods back");
    expect((await complete(frontA, MA)).status).toBe(200);
    // An entry that stops validating keeps the previous models: two reads later the pods are still there.
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(`${POOL_KEY_PREFIX}a`, JSON.stringify({ models: [] }));
    const reads = watchers[0]?.stats.poolReads ?? 0;
    await waitFor(() => (watchers[0]?.stats.poolReads ?? 0) >= reads + 2, 5_000, "two more reads of the pools");
    expect(ga.views.pods.readyPods(MA).length).toBe(2);
    expect((await complete(frontA, MA)).status).toBe(200);
    await setPool("a", [MA]);
  });
});
