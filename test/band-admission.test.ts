/**
 * Admission per band, end to end (issue 36, docs/flow-control.md "Two schedulers"): a real
 * nats-server, a gateway, the metrics scraper and a simulated vLLM pod that schedules by priority
 * with one batch slot. The pod's queue is full for the batch band: a batch request is held at the
 * gateway, while an interactive request is admitted at once with its engine priority in the body,
 * and the engine runs it before the batch request that was already waiting there. Every step
 * waits for a condition (the pod's own /debug/state, the gateway's views), never for time.
 */
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MODEL_CONFIG_KEY_PREFIX } from "../schemas/config.js";
import { configBucketName } from "../streams/definitions.js";
import { encodeToken } from "../streams/tokens.js";
import { ExtProcClient, type ExtProcExchange, type PhaseResult } from "../services/extproc/envoy-client.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startScraper, type ScraperHandle } from "../services/metrics-scraper/scraper.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const MODEL = "band/model";
// Batch's queue limit is 1 waiting request; interactive's 1 + 2 (one band in play below it).
const flowControl = { objectives: { interactive: { priority: 10 }, batch: { priority: 0 } }, defaultObjective: "batch", saturation: { queueDepth: 1, queueDepthPerBand: 2 } };

const headers = (objective: string, user: string) => ({ ":method": "POST", ":path": "/v1/completions", ":authority": "gw", "content-type": "application/json", "x-jetroute-objective": objective, user });

interface Sent {
  ex: ExtProcExchange;
  result: Promise<PhaseResult>;
  settled: () => boolean;
}

describe("admission per band against a pod that schedules by priority", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let scraper: ScraperHandle;
  let gw: GatewayHandle;
  let client: ExtProcClient;
  let address: string;

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 1, model: MODEL, kvEvents: false, maxBatch: 1, maxModelLen: 4096, schedulingPolicy: "priority", logger: quietLog, namePrefix: "band-" });
    const pod = fleet.pods[0];
    if (!pod) throw new Error("no pod");
    address = pod.address;
    await env.publishPod({ model: MODEL, pod: pod.name, address, ...(pod.schedulingPolicy ? { schedulingPolicy: pod.schedulingPolicy } : {}) });
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(MODEL)}`, JSON.stringify({ flowControl }));
    scraper = await startScraper({ nats: env.server.url, intervalMs: 100, log: quietLog });
    gw = await env.gateway({ id: "band-gw" });
    client = new ExtProcClient(`127.0.0.1:${gw.port}`, { messageTimeoutMs: 60_000 });
    await waitFor(() => gw.views.pods.readyPods(MODEL).length === 1 && gw.state.configs.get(MODEL)?.flowControl !== undefined && gw.views.load.fresh(MODEL, pod.name, Date.now()) !== undefined, 15_000, "the pod, its load and the config on the gateway");
  }, 60_000);

  afterAll(async () => {
    client?.close();
    await scraper?.close();
    await fleet?.close();
    await env?.stop();
  });

  const engine = async () => (await (await fetch(`http://${address}/debug/state`)).json()) as { running: number; waiting: number };
  const pod = () => fleet.pods[0]?.name as string;

  async function send(objective: string, user: string, prompt: string, maxTokens: number): Promise<Sent> {
    const ex = client.open();
    await ex.requestHeaders(headers(objective, user));
    let done = false;
    const result = ex.requestBody(Buffer.from(JSON.stringify({ model: MODEL, prompt, max_tokens: maxTokens })));
    result.then(
      () => void (done = true),
      () => void (done = true),
    );
    return { ex, result, settled: () => done };
  }

  /** The body the gateway routed the request with (its engine priority written in). */
  async function routedBody(s: Sent): Promise<Record<string, unknown>> {
    const r = await s.result;
    if (r.kind !== "continue") throw new Error(`expected the request to be routed, got ${r.kind}`);
    return JSON.parse((r.bodyMutation ?? Buffer.from("{}")).toString()) as Record<string, unknown>;
  }

  /** Plays the proxy: sends the routed body to the pod, then ends the exchange (releasing the charge). */
  function upstream(s: Sent, body: Record<string, unknown>, finished: string[], name: string, signal?: AbortSignal): Promise<void> {
    return fetch(`http://${address}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), ...(signal ? { signal } : {}) })
      .then(async (res) => {
        const text = await res.text();
        finished.push(name);
        await s.ex.responseHeaders(res.status, { "content-type": "application/json" });
        await s.ex.responseBodyChunk(Buffer.from(text), true);
      })
      .catch(() => s.ex.cancel())
      .finally(() => s.ex.end().catch(() => undefined));
  }

  it("an interactive request is admitted and served first while a batch request is held at the gateway", async () => {
    const finished: string[] = [];
    // A batch request holds the only slot until its client leaves.
    const hold = new AbortController();
    const holder = await send("batch", "tenant-a", "hold the slot", 4_000);
    const holding = upstream(holder, await routedBody(holder), finished, "holder", hold.signal);
    await waitFor(async () => (await engine()).running === 1, 10_000, "the holder running");

    // A second batch request goes once a scrape shows the queue empty, and waits in the engine.
    const waitingBatch = await send("batch", "tenant-b", "batch one", 3);
    const wb = await routedBody(waitingBatch);
    expect(wb.priority).toBe(0);
    const batchDone = upstream(waitingBatch, wb, finished, "batch");
    await waitFor(async () => (await engine()).waiting === 1, 10_000, "the batch request waiting in the engine");
    // ...and a scrape taken since then has reached the gateway (an older sample, folded after the
    // charge, would leave the charge out of its estimate: the room check is only as fresh as that).
    await waitFor(() => gw.views.load.get(MODEL, pod())?.load?.waiting === 1, 10_000, "the gateway's sample showing it");

    // The queue is full for the batch band: the next batch request is held at the gateway.
    const heldBatch = await send("batch", "tenant-a", "batch two", 3);
    await waitFor(() => gw.director.flow.held === 1, 10_000, "the second batch request held");

    // Interactive: room for its band (1 waiting < 3), so it goes now, with vLLM's urgent priority.
    const interactive = await send("interactive", "tenant-c", "quick question", 3);
    const ib = await routedBody(interactive);
    expect(ib.priority).toBe(-10);
    expect(heldBatch.settled()).toBe(false);
    expect(gw.director.flow.held).toBe(1);
    const interactiveDone = upstream(interactive, ib, finished, "interactive");
    await waitFor(async () => (await engine()).waiting === 2, 10_000, "the interactive request waiting in the engine");

    // The slot frees: the engine runs the interactive request before the batch one queued earlier.
    hold.abort();
    await holding;
    await Promise.all([interactiveDone, batchDone]);
    expect(finished.filter((n) => n !== "holder")).toEqual(["interactive", "batch"]);

    // The held batch request goes once the pod has room for its band, and is served.
    const hb = await routedBody(heldBatch);
    await upstream(heldBatch, hb, finished, "held batch");
    expect(finished.at(-1)).toBe("held batch");
    await waitFor(() => gw.views.ledger.outstanding(MODEL, pod()).requests === 0, 10_000, "every charge released");
  }, 60_000);
});
