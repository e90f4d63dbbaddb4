/**
 * Flow control end to end (docs/flow-control.md): real nats-server, gateway replicas, real gRPC
 * ext_proc streams driven in Envoy's phase order. Saturation comes from the shared ledger
 * (`maxInFlightPerPod: 1`), so every step waits for a condition, never for a metrics scrape.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MODEL_CONFIG_KEY_PREFIX } from "../schemas/config.js";
import type { ChargeEvent } from "../schemas/events.js";
import { configBucketName, streamName } from "../streams/definitions.js";
import { runReplay } from "../services/replay/command.js";
import { natsSource } from "../services/replay/sources.js";
import { encodeToken } from "../streams/tokens.js";
import { ExtProcClient, type ExtProcExchange, type PhaseResult } from "../services/extproc/envoy-client.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { cliPath, spawnJetroute } from "../services/shared/processes.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const run = promisify(execFile);
const FLOW_MODEL = "flow/model";
const headers = (extra: Record<string, string> = {}) => ({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", ...extra });
const body = (model = FLOW_MODEL) => Buffer.from(JSON.stringify({ model, messages: [{ role: "user", content: "hello" }], max_tokens: 8 }));

interface Sent {
  ex: ExtProcExchange;
  result: Promise<PhaseResult>;
  settled: () => boolean;
}

/** Sends a request's headers and body; the body's reply comes when the request is routed, refused or expired. */
async function send(client: ExtProcClient, extra: Record<string, string> = {}, model = FLOW_MODEL): Promise<Sent> {
  const ex = client.open();
  await ex.requestHeaders(headers(extra));
  let done = false;
  const result = ex.requestBody(body(model));
  result.then(
    () => void (done = true),
    () => void (done = true),
  );
  return { ex, result, settled: () => done };
}

/** Ends a routed request the way Envoy does after the engine answered (releases its charge). */
async function complete(s: Sent, completionTokens = 1): Promise<void> {
  await s.ex.responseHeaders(200, { "content-type": "application/json" });
  const usage = { prompt_tokens: 5, completion_tokens: completionTokens, total_tokens: 5 + completionTokens };
  await s.ex.responseBodyChunk(Buffer.from(JSON.stringify({ choices: [{ message: { content: "ok" } }], usage })), true);
  await s.ex.end();
}

async function routed(s: Sent): Promise<string> {
  const r = await s.result;
  if (r.kind !== "continue") throw new Error(`expected the request to be routed, got ${JSON.stringify(r).slice(0, 300)}`);
  return r.headerMutation.set["x-gateway-destination-endpoint"] as string;
}

async function refused(s: Sent): Promise<{ status: number; code: string; retryAfter: string | undefined; message: string }> {
  const r = await s.result;
  if (r.kind !== "immediate") throw new Error(`expected an immediate answer, got ${r.kind}`);
  const b = JSON.parse(r.body.toString()) as { error: { code: string; message: string } };
  return { status: r.status, code: b.error.code, retryAfter: r.headers["retry-after"] as string | undefined, message: b.error.message };
}

describe("flow control across gateway replicas", () => {
  let env: TestEnv;
  const gws: GatewayHandle[] = [];
  const clients: ExtProcClient[] = [];
  let putConfig: (flowControl: Record<string, unknown>, model?: string) => Promise<void>;
  const charges: Array<{ gateway: string; id: string }> = [];

  beforeAll(async () => {
    env = await startTestEnv();
    await env.publishPod({ model: FLOW_MODEL, pod: "flow-0", address: "127.0.0.1:8301" });
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const versions = new Map<string, number>();
    putConfig = async (flowControl, model = FLOW_MODEL) => {
      await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(model)}`, JSON.stringify({ flowControl }));
      const want = (versions.get(model) ?? 0) + 1;
      versions.set(model, want);
      // Every replica applies it before the test goes on.
      await waitFor(() => gws.every((g) => JSON.stringify(g.state.configs.get(model)?.flowControl) === JSON.stringify(flowControl)), 10_000, `config ${want} of ${model} on every replica`);
    };
    env.nats.nc.subscribe(env.subjects.all("charges"), { callback: (_e, m) => void charges.push(m.json<ChargeEvent>()) });
    for (let i = 0; i < 3; i++) {
      const gw = await env.gateway({ id: `flow-gw-${i}` });
      gws.push(gw);
      clients.push(new ExtProcClient(`127.0.0.1:${gw.port}`, { messageTimeoutMs: 60_000 }));
    }
    await waitFor(() => gws.every((g) => g.views.pods.readyPods(FLOW_MODEL).length === 1), 10_000, "the pod on every replica");
  });
  afterAll(async () => {
    for (const c of clients) c.close();
    await env?.stop();
  });

  const c = (i: number) => clients[i] as ExtProcClient;
  const g = (i: number) => gws[i] as GatewayHandle;
  const inFlight = (i: number) => g(i).views.ledger.outstanding(FLOW_MODEL, "flow-0").requests;
  const everyLedger = (n: number) => waitFor(() => gws.every((_, i) => inFlight(i) === n), 10_000, `${n} request(s) in flight in every replica's ledger`);
  const objectives = { interactive: { priority: 10 }, batch: { priority: 0 }, scavenger: { priority: -1 } };

  it("a higher band held on one replica goes before an older-queued lower band held on another", async () => {
    await putConfig({ objectives, defaultObjective: "batch", saturation: { maxInFlightPerPod: 1 } });
    // Pods with room: straight through, with the band in the decision context.
    const occupier = await send(c(0));
    await routed(occupier);
    await everyLedger(1);

    const low = await send(c(1), { "x-jetroute-objective": "batch" });
    await waitFor(() => g(1).director.flow.held === 1, 5_000, "the batch request held on replica 1");
    const high = await send(c(2), { "x-jetroute-objective": "interactive" });
    await waitFor(() => g(2).director.flow.held === 1, 5_000, "the interactive request held on replica 2");
    // Replica 1 learns of replica 2's older interactive request from its summary.
    await waitFor(() => g(1).director.flow.fleet?.blocker(FLOW_MODEL, 0, Date.now()) !== undefined, 10_000, "replica 2's interactive request in replica 1's fleet view, past the bound");
    expect(low.settled() || high.settled()).toBe(false);

    const before = charges.length;
    await complete(occupier);
    await routed(high);
    await complete(high);
    await routed(low);
    // Charges are published after the answer to Envoy: wait for both.
    await waitFor(() => charges.slice(before).some((x) => x.gateway === "flow-gw-1"), 5_000, "the batch request's charge");
    const order = charges.slice(before).map((x) => x.gateway);
    expect(order.indexOf("flow-gw-2")).toBeGreaterThanOrEqual(0);
    expect(order.indexOf("flow-gw-2")).toBeLessThan(order.indexOf("flow-gw-1"));
    await complete(low);
    await everyLedger(0);
    expect(gws.map((x) => x.director.flow.held)).toEqual([0, 0, 0]);
  });

  it("least-attained fairness reads every replica's usage: the light tenant goes before an older request of the heavy one", async () => {
    await putConfig({ objectives, defaultObjective: "batch", fairness: "least-attained", saturation: { maxInFlightPerPod: 1 } });
    // `heavy` spends tokens through replica 0 only.
    const spend = await send(c(0), { user: "heavy" });
    await routed(spend);
    await complete(spend, 5_000);
    await waitFor(() => g(1).state.usage.tokens("heavy", Date.now()) > 5_000, 10_000, "heavy's usage on replica 1");

    const occupier = await send(c(0), { user: "someone" });
    await routed(occupier);
    await everyLedger(1);
    const heavy = await send(c(1), { user: "heavy" });
    await waitFor(() => g(1).director.flow.held === 1, 5_000, "heavy held");
    const light = await send(c(1), { user: "light" });
    await waitFor(() => g(1).director.flow.held === 2, 5_000, "light held");
    await complete(occupier);
    await routed(light);
    expect(heavy.settled()).toBe(false);
    await complete(light);
    await routed(heavy);
    await complete(heavy);
    await everyLedger(0);
  });

  it("queue TTL: 429 queue_timeout with retry-after while the model has pods; nothing charged", async () => {
    await putConfig({ objectives: { batch: { priority: 0, ttlMs: 300 } }, defaultObjective: "batch", saturation: { maxInFlightPerPod: 1 } });
    const occupier = await send(c(0));
    await routed(occupier);
    await everyLedger(1);
    const waiting = await send(c(1));
    const r = await refused(waiting);
    expect(r).toMatchObject({ status: 429, code: "queue_timeout", retryAfter: "1" });
    expect(r.message).toMatch(/saturated/);
    expect(g(1).director.flow.held).toBe(0);
    expect(inFlight(1)).toBe(1);
    await complete(occupier);
    await everyLedger(0);
  });

  it("the waiting room holds a model without pods: 503 when none appears in time, routed when one does", async () => {
    const model = "flow/empty";
    await putConfig({ waitingRoomTtlMs: 300 }, model);
    const gone = await send(c(0), {}, model);
    expect(await refused(gone)).toMatchObject({ status: 503, code: "no_ready_pod" });

    await putConfig({ waitingRoomTtlMs: 30_000 }, model);
    const waiting = await send(c(0), {}, model);
    await waitFor(() => g(0).director.flow.held === 1, 5_000, "held in the waiting room");
    await env.publishPod({ model, pod: "late-0", address: "127.0.0.1:8302" });
    expect(await routed(waiting)).toBe("127.0.0.1:8302");
    await complete(waiting);
  });

  it("bounds: a full band refuses with 429 queue_full; a sheddable newcomer replaces the oldest of its band; no higher band is shed", async () => {
    await putConfig({ objectives, defaultObjective: "batch", maxRequestsPerBand: 1, saturation: { maxInFlightPerPod: 1 } });
    const occupier = await send(c(0));
    await routed(occupier);
    await everyLedger(1);
    const b1 = await send(c(0), { "x-jetroute-objective": "batch" });
    await waitFor(() => g(0).director.flow.held === 1, 5_000, "b1 held");
    const b2 = await send(c(0), { "x-jetroute-objective": "batch" });
    expect(await refused(b2)).toMatchObject({ status: 429, code: "queue_full" });
    const s1 = await send(c(0), { "x-jetroute-objective": "scavenger" });
    await waitFor(() => g(0).director.flow.held === 2, 5_000, "s1 held");
    const s2 = await send(c(0), { "x-jetroute-objective": "scavenger" });
    expect(await refused(s1)).toMatchObject({ status: 429, code: "queue_full" });
    expect(b1.settled()).toBe(false);
    await complete(occupier);
    await routed(b1);
    await complete(b1);
    await routed(s2);
    await complete(s2);
    await everyLedger(0);
  });

  it("a client that goes away leaves the queue at once and charges nothing; an unknown objective is a 400", async () => {
    await putConfig({ objectives, defaultObjective: "batch", saturation: { maxInFlightPerPod: 1 } });
    const occupier = await send(c(0));
    await routed(occupier);
    await everyLedger(1);
    const leaving = await send(c(1));
    await waitFor(() => g(1).director.flow.held === 1, 5_000, "held");
    leaving.ex.cancel();
    await waitFor(() => g(1).director.flow.held === 0, 5_000, "the cancelled request out of the queue");
    await complete(occupier);
    await everyLedger(0);
    expect(g(1).director.inFlight.size).toBe(0);

    const bad = await send(c(0), { "x-jetroute-objective": "gold" });
    expect(await refused(bad)).toMatchObject({ status: 400, code: "invalid_header" });
  });

  it("a killed replica takes only its own held requests: the others stop yielding to it", async () => {
    await putConfig({ objectives, defaultObjective: "batch", saturation: { maxInFlightPerPod: 1 } });
    const proc = spawnJetroute("flow-gw-proc", ["gateway", "--nats", env.server.url, "--host", "127.0.0.1", "--port", "0", "--admin-port", "-1", "--id", "flow-gw-killed", "--heartbeat-ms", "200"], {});
    try {
      const started = await proc.waitForLine<{ port: number }>((l) => typeof (l as { port?: unknown }).port === "number", 30_000);
      const pc = new ExtProcClient(`127.0.0.1:${started.port}`, { messageTimeoutMs: 60_000 });
      const occupier = await send(c(0));
      await routed(occupier);
      await everyLedger(1);
      // The process may still be catching up: retry until it holds the request (a 503 before then).
      let high: Sent | undefined;
      await waitFor(
        async () => {
          if (high && !high.settled()) return g(1).director.flow.fleet?.blocker(FLOW_MODEL, 0, Date.now()) !== undefined;
          high = await send(pc, { "x-jetroute-objective": "interactive" });
          return false;
        },
        20_000,
        "the process replica's interactive request in replica 1's fleet view",
        100,
      );
      const low = await send(c(1), { "x-jetroute-objective": "batch" });
      await waitFor(() => g(1).director.flow.held === 1, 5_000, "low held");
      await proc.kill();
      pc.close();
      await complete(occupier);
      // Its summary goes stale; replica 1 dispatches its lower band.
      await routed(low);
      await complete(low);
      await everyLedger(0);
    } finally {
      await proc.stop(1_000);
    }
  });

  it("replay re-decides held requests at their dispatch, as live: fidelity 1.0, waits reported per band", async () => {
    const model = "flow/replay";
    for (let i = 0; i < 3; i++) await env.publishPod({ model, pod: `fr-${i}`, address: `127.0.0.1:${8310 + i}` });
    await waitFor(() => gws.every((x) => x.views.pods.readyPods(model).length === 3), 10_000, "three pods on every replica");
    await putConfig({ objectives, defaultObjective: "batch", saturation: { maxInFlightPerPod: 1 } }, model);
    const decisions = streamName("jr", "DECISIONS");
    const stored = (await env.nats.jsm.streams.info(decisions)).state.messages;
    const from = Date.now();
    const N = 12;
    const sent: Sent[] = [];
    for (let k = 0; k < N; k++) sent.push(await send(c(k % 3), { "x-jetroute-objective": k % 4 === 0 ? "interactive" : "batch" }, model));
    // Complete the routed ones one at a time, so every other request is held and goes when a pod frees.
    const completed = new Set<Sent>();
    while (completed.size < N) {
      await waitFor(() => sent.some((x) => x.settled() && !completed.has(x)), 10_000, `a routed request (${completed.size} of ${N} done)`);
      const next = sent.find((x) => x.settled() && !completed.has(x)) as Sent;
      await routed(next);
      await complete(next);
      completed.add(next);
    }
    const to = Date.now();
    await waitFor(async () => (await env.nats.jsm.streams.info(decisions)).state.messages >= stored + N, 10_000, "the decision records", 20);
    const report = await runReplay({ source: await natsSource(env.nats, "jr", { fromMs: from, toMs: to, tailMs: 2_000 }), fromMs: from, toMs: to, strategies: ["random"], reorderMs: 2_000 });
    const seen = JSON.stringify({ fidelity: report.fidelity, decisions: report.decisions, flow: report.flow?.map((f) => ({ band: f.band, requests: f.requests, held: f.held })) });
    expect(report.fidelity.evaluated, seen).toBe(N);
    expect(report.fidelity.ratio, seen).toBe(1);
    const bands = new Map((report.flow ?? []).map((f) => [f.band, f]));
    expect((bands.get(10)?.requests ?? 0) + (bands.get(0)?.requests ?? 0), seen).toBe(N);
    // About three went at once (a pod each; a replica that had not yet seen another's charge may
    // send one more); the rest were held, and their waits recorded.
    expect((bands.get(10)?.held ?? 0) + (bands.get(0)?.held ?? 0), seen).toBeGreaterThanOrEqual(N - 6);
    expect(bands.get(0)?.wait.p99Ms ?? 0, seen).toBeGreaterThan(0);
  }, 60_000);

  it("shutdown: what is still held after the grace period gets a 503, before the streams are cut", async () => {
    await putConfig({ objectives, defaultObjective: "batch", saturation: { maxInFlightPerPod: 1 } });
    const extra = await env.gateway({ id: "flow-gw-closing", shutdownGraceMs: 300 });
    const xc = new ExtProcClient(`127.0.0.1:${extra.port}`, { messageTimeoutMs: 60_000 });
    try {
      const occupier = await send(c(0));
      await routed(occupier);
      await waitFor(() => extra.views.ledger.outstanding(FLOW_MODEL, "flow-0").requests === 1, 10_000, "the occupier on the closing replica");
      const held = await send(xc);
      await waitFor(() => extra.director.flow.held === 1, 5_000, "held on the closing replica");
      const closing = extra.close();
      expect(await refused(held)).toMatchObject({ status: 503, code: "gateway_not_ready" });
      await closing;
      await complete(occupier);
      await everyLedger(0);
    } finally {
      xc.close();
    }
  });

  it("a forged summary is refused, counted and dead-lettered: another gateway's name, a band out of range, a future ts", async () => {
    const dead: Array<{ subject: string; reason: string }> = [];
    const sub = env.nats.nc.subscribe(env.subjects.deadLetter("flow"), {
      callback: (_e, m) => void dead.push({ subject: m.headers?.get("Jr-Dlq-Subject") ?? "", reason: m.headers?.get("Jr-Dlq-Reason") ?? "" }),
    });
    try {
      const now = Date.now();
      const band16 = (gateway: string, ts = now) => JSON.stringify({ gateway, ts, models: { [FLOW_MODEL]: [{ band: 16, count: 1, oldest: ts - 5_000 }] } });
      // A credential of gateway "intruder" speaks for flow-gw-1, with a ts far ahead to shadow its real summaries.
      env.nats.nc.publish(env.subjects.flow("intruder"), band16("flow-gw-1", now + 3_600_000));
      env.nats.nc.publish(env.subjects.flow("intruder"), JSON.stringify({ gateway: "intruder", ts: now, models: { [FLOW_MODEL]: [{ band: 17, count: 1, oldest: now - 5_000 }] } }));
      env.nats.nc.publish(env.subjects.flow("intruder"), band16("intruder", now + 3_600_000));
      // Every replica refuses each of the three (three replicas: nine dead letters).
      await waitFor(() => dead.length >= 9, 10_000, "nine dead letters");
      expect(new Set(dead.map((d) => d.subject))).toEqual(new Set([env.subjects.flow("intruder")]));
      expect(dead.filter((d) => /another gateway than its subject/.test(d.reason))).toHaveLength(3);
      expect(dead.filter((d) => /band outside \[-16, 16\]/.test(d.reason))).toHaveLength(3);
      expect(dead.filter((d) => /ahead of the receive time/.test(d.reason))).toHaveLength(3);
      // Nothing stalls: no replica yields to the forged band 16.
      for (const gw of gws) expect(gw.director.flow.fleet?.blocker(FLOW_MODEL, 0, Date.now())).toBeUndefined();
    } finally {
      sub.unsubscribe();
    }
  });

  it("config set refuses bad flow config, naming the field", async () => {
    const bad = run(process.execPath, [cliPath(), "config", "set", FLOW_MODEL, "--nats", env.server.url, "--json", JSON.stringify({ flowControl: { defaultObjective: "gold", objectives: { silver: { priority: 1 } } } })]);
    await expect(bad).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/\/flowControl\/defaultObjective: objective "gold" is not defined/) });
    const range = run(process.execPath, [cliPath(), "config", "set", FLOW_MODEL, "--nats", env.server.url, "--json", JSON.stringify({ flowControl: { objectives: { a: { priority: 40 } } } })]);
    await expect(range).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/\/flowControl\/objectives\/a\/priority/) });
  });
});

void quietLog;
