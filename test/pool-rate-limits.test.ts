/**
 * Per-user rate limits across gateway pools (docs/architecture.md, "Model configs and rate
 * limits"), end to end on a real nats-server: two pools, each with its own pod-watcher, gateway
 * and front, simulated vLLM pods, one `limits` entry in the shared config bucket.
 *
 * A pool's gateway folds only its pool's charges; what it knows of the user's requests in the
 * other pool comes from that pool's `usage` summaries on the base prefix's USAGE stream. The test
 * waits until they are folded (the documented overshoot is then 0) and checks the limit is the
 * user's, not the pool's: k requests at a, then exactly N - k at b.
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { POOL_KEY_PREFIX, RATE_LIMITS_KEY } from "../schemas/config.js";
import { applyStreams } from "../streams/apply.js";
import { configBucketName, streamName } from "../streams/definitions.js";
import { isStreamNotFound } from "../streams/errors.js";
import { namespaceOf } from "../streams/pools.js";
import { type FrontServer, startFront } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { type PodWatcherHandle, startPodWatcher } from "../services/pod-watcher/pod-watcher.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { minuteStartClock, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const MA = "org/model-a";
const MB = "org/model-b";
const nsA = namespaceOf("jr", "a");
const nsB = namespaceOf("jr", "b");
/** alice's requests per minute, and how many of them she sends to pool a first. */
const N = 6;
const K = 2;

describe("per-user rate limits across gateway pools", () => {
  let env: TestEnv;
  let fleetA: SimFleet;
  let fleetB: SimFleet;
  const watchers: PodWatcherHandle[] = [];
  let ga: GatewayHandle;
  let gb: GatewayHandle;
  let plain: GatewayHandle;
  let frontA: FrontServer;
  let frontB: FrontServer;
  // Every gateway on one clock that starts at a minute's beginning: the window cannot roll mid-test.
  const clock = minuteStartClock();

  beforeAll(async () => {
    env = await startTestEnv();
    for (const ns of [nsA, nsB]) await applyStreams(env.nats.nc, env.nats.jsm, { prefix: ns.prefix, configPrefix: ns.configPrefix });
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(`${POOL_KEY_PREFIX}a`, JSON.stringify({ models: [MA] }));
    await kv.put(`${POOL_KEY_PREFIX}b`, JSON.stringify({ models: [MB] }));
    await kv.put(RATE_LIMITS_KEY, JSON.stringify({ users: { alice: { rpm: N }, bob: { rpm: N } } }));
    fleetA = await startSimFleet({ pods: 1, model: MA, namePrefix: "a-", logger: quietLog });
    fleetB = await startSimFleet({ pods: 1, model: MB, namePrefix: "b-", logger: quietLog });
    const dir = mkdtempSync(path.join(os.tmpdir(), "jr-pool-limits-"));
    const file = path.join(dir, "pods.json");
    const all = [...fleetA.pods.map((p) => ({ p, model: MA })), ...fleetB.pods.map((p) => ({ p, model: MB }))];
    writeFileSync(file, JSON.stringify(all.map(({ p, model }) => ({ name: p.name, model, address: p.address }))));
    watchers.push(await startPodWatcher({ nats: env.server.url, file, pool: "a", poolModels: [MA], probeIntervalMs: 200, log: quietLog }));
    watchers.push(await startPodWatcher({ nats: env.server.url, file, pool: "b", poolModels: [MB], probeIntervalMs: 200, log: quietLog }));
    ga = await env.gateway({ id: "gw-a", pool: "a", clock, usageSummaryMs: 100 });
    gb = await env.gateway({ id: "gw-b", pool: "b", clock, usageSummaryMs: 100 });
    // The unpooled namespace is one more namespace: it counts both pools' summaries.
    plain = await env.gateway({ id: "gw-plain", clock, usageSummaryMs: 100 });
    const front = (g: GatewayHandle) => startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${g.port}`], logger: quietLog });
    frontA = await front(ga);
    frontB = await front(gb);
    await waitFor(() => ga.views.pods.readyPods(MA).length === 1 && gb.views.pods.readyPods(MB).length === 1, 10_000, "each pool's pod");
    await waitFor(() => [ga, gb, plain].every((g) => g.state.configs.userLimits("alice")?.rpm === N), 5_000, "the limits on every gateway");
  });
  afterAll(async () => {
    for (const f of [frontA, frontB]) await f?.close();
    for (const w of watchers) await w.close().catch(() => undefined);
    await fleetA?.close();
    await fleetB?.close();
    await env?.stop();
  });

  const complete = (front: FrontServer, model: string, user: string) =>
    fetch(`http://127.0.0.1:${front.port}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", user },
      body: JSON.stringify({ model, prompt: "hello limits", max_tokens: 4 }),
    });

  it("the USAGE stream is the base prefix's only", async () => {
    expect((await env.nats.jsm.streams.info(streamName("jr", "USAGE"))).config.subjects).toEqual(["jr.usage.>"]);
    for (const ns of [nsA, nsB]) await expect(env.nats.jsm.streams.info(streamName(ns.prefix, "USAGE"))).rejects.toSatisfy(isStreamNotFound);
  });

  it(`alice at ${N} rpm: ${K} requests at pool a leave exactly ${N - K} at pool b; bob is unaffected`, async () => {
    for (let i = 0; i < K; i++) expect((await complete(frontA, MA, "alice")).status).toBe(200);
    // a's own fold counts them from a's CHARGES stream; b knows of them only by a's summary.
    expect(ga.state.rates.userRequests("alice", clock())).toBe(K);
    await waitFor(() => gb.state.rates.userRequests("alice", clock()) === K, 10_000, "a's summary folded by b");
    expect(gb.state.rates.foreignOf("alice", clock())).toEqual({ requests: K, tokens: expect.any(Number) });
    expect(gb.state.cursors.charges).toBeGreaterThan(0);

    const statuses: number[] = [];
    let refused: { error: { code: string; type: string } } | undefined;
    for (let i = 0; i < N; i++) {
      const r = await complete(frontB, MB, "alice");
      statuses.push(r.status);
      if (r.status === 429) refused = (await r.json()) as { error: { code: string; type: string } };
      else await r.text();
    }
    expect(statuses).toEqual([...Array(N - K).fill(200), ...Array(K).fill(429)]);
    expect(refused?.error).toMatchObject({ type: "rate_limit_error", code: "rate_limit_exceeded" });
    // Another user, same limit, same pool: unaffected.
    expect((await complete(frontB, MB, "bob")).status).toBe(200);

    // The other way round: once b's summary is folded by a, alice is at her limit at a too.
    await waitFor(() => ga.state.rates.userRequests("alice", clock()) === N, 10_000, "b's summary folded by a");
    expect((await complete(frontA, MA, "alice")).status).toBe(429);
    expect((await complete(frontA, MA, "bob")).status).toBe(200);
    // The unpooled gateway counts both pools' summaries, and has no summary of its own to add.
    await waitFor(() => plain.state.rates.userRequests("alice", clock()) === N, 10_000, "both pools' summaries folded by the unpooled gateway");
    expect(plain.state.rates.foreignGateways).toBe(2);
    expect(gb.state.rates.foreignGateways).toBe(1);
  }, 60_000);

  it("a malformed usage summary is dead-lettered and counted; the follower goes on", async () => {
    const dlq = async () => (await env.nats.jsm.streams.info(streamName("jr", "DLQ"), { subjects_filter: "jr.dlq.usage" })).state.subjects?.["jr.dlq.usage"] ?? 0;
    const before = await dlq();
    // One subject per message: JR_USAGE keeps one message per subject, so four on one subject
    // could be replaced before a follower read them.
    let n = 0;
    const subject = () => `jr.usage.c.gw-c.${++n}`;
    const valid = { type: "usage", gateway: "gw-c", pool: "c", startedAt: 1, window: clock() - (clock() % 60_000), ts: clock(), users: [["carol", 2, 20]] };
    await env.nats.js.publish(subject(), "{not json");
    // Schema-invalid: a window that is not a whole minute, and a negative count.
    await env.nats.js.publish(subject(), JSON.stringify({ ...valid, window: valid.window + 1 }));
    await env.nats.js.publish(subject(), JSON.stringify({ ...valid, users: [["carol", -1, 0]] }));
    await env.nats.js.publish(subject(), JSON.stringify(valid));
    // Every gateway (three, each its own follower) dead-letters the three bad ones, then folds the good one.
    await waitFor(() => [ga, gb, plain].every((g) => g.state.rates.userRequests("carol", clock()) === 2), 10_000, "the valid summary after the bad ones");
    // ... into the base prefix's DLQ (the stream they were read from is the base one), one letter per
    // bad message whichever gateway's came first (its Msg-Id is the stream and sequence).
    let dead = 0;
    await waitFor(async () => (dead = await dlq()) >= before + 3, 10_000, () => `three dead letters (${dead - before} so far)`, 20);
    expect(dead).toBe(before + 3);
  }, 30_000);

  it("a gateway on streams applied before JR_USAGE existed still starts and gets ready (it warns, and counts its own namespace only)", async () => {
    await applyStreams(env.nats.nc, env.nats.jsm, { prefix: "old" });
    await env.nats.jsm.streams.delete(streamName("old", "USAGE"));
    const old = await env.gateway({ id: "gw-old", prefix: "old", clock, usageSummaryMs: 100 });
    expect(old.ready()).toBe(true);
    expect(old.state.usageCursor).toBe(0);
  });
});
