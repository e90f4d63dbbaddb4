/**
 * The embedding signal on its real path: a simulated embedding pod serving `/v1/embeddings` over
 * HTTP, found through the fold's pods like any model's, called by the gateway's EmbeddingClient,
 * through real ext_proc streams. Also its deadline (a pod that never answers), no pod at all, and
 * the cache's byte bound and measured bytes per entry.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { ModelConfig } from "../../schemas/config.js";
import { ExtProcClient } from "../extproc/envoy-client.js";
import { EXT_PROC_SERVER_OPTIONS, loadExtProc } from "../extproc/protos.js";
import { Director } from "../routing/director.js";
import { CODER, EMBED, GENERAL, MATH, putModelConfig, semanticState } from "../routing/semantic/testing.js";
import { FakeClock, MemorySink } from "../routing/stages/testing.js";
import { createLogger } from "../shared/log.js";
import { type SimFleet, startSimFleet } from "../sim/fleet.js";
import { simEmbedding } from "../sim/embeddings.js";
import { cosine } from "../routing/semantic/signals.js";
import { EmbeddingClient, VectorCache } from "./embeddings.js";
import { createExtProcHandler } from "./extproc-server.js";

const quietLog = createLogger("test", "silent");

const SIMILAR: ModelConfig = {
  semantic: {
    signals: {
      maths: { type: "similarity", examples: ["solve the equation for x", "compute the integral of the function"], threshold: 0.35, lexicalThreshold: 0.3 },
      coding: { type: "similarity", examples: ["write a python function", "fix the bug in my code"], threshold: 0.35, lexicalThreshold: 0.3 },
    },
    decisions: [
      { name: "math", priority: 2, when: "maths", action: { model: MATH } },
      { name: "code", priority: 1, when: "coding", action: { model: CODER } },
    ],
    default: { model: GENERAL },
    embeddingModel: EMBED,
    embeddingTimeoutMs: 150,
  },
};

let fleet: SimFleet;
let hanging: http.Server;
let hangingAddress = "";
const held: http.ServerResponse[] = [];
beforeAll(async () => {
  fleet = await startSimFleet({ pods: 1, model: EMBED, kvEvents: false, logger: quietLog });
  hanging = http.createServer((_req, res) => void held.push(res));
  await new Promise<void>((r) => hanging.listen(0, "127.0.0.1", r));
  hangingAddress = `127.0.0.1:${(hanging.address() as AddressInfo).port}`;
});
afterAll(async () => {
  for (const r of held) r.destroy();
  hanging.closeAllConnections();
  await new Promise((r) => hanging.close(r));
  await fleet.close();
});

const servers: Array<{ client: ExtProcClient; server: grpc.Server }> = [];
afterEach(() => {
  for (const s of servers.splice(0)) {
    s.client.close();
    s.server.forceShutdown();
  }
});

async function gateway(embedAddress: string | undefined) {
  const models = embedAddress ? [CODER, GENERAL, MATH, EMBED] : [CODER, GENERAL, MATH];
  const state = semanticState(models, 1, "gw", embedAddress ? { [EMBED]: [embedAddress] } : {});
  putModelConfig(state, "auto", SIMILAR, 100);
  const events: string[] = [];
  const embeddings = new EmbeddingClient({ readyPods: (m) => state.pods.readyPods(m), observe: (e) => events.push(e) });
  const clock = new FakeClock(1_000_000);
  const sink = new MemorySink();
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs, clock, now: clock.now, embeddings });
  const server = new grpc.Server(EXT_PROC_SERVER_OPTIONS);
  server.addService(loadExtProc().service, { Process: createExtProcHandler({ log: quietLog, isReady: () => true, listModels: () => [], router: director }) });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  const client = new ExtProcClient(`127.0.0.1:${port}`);
  servers.push({ client, server });
  const ask = async (content: string, id: string) => {
    const ex = client.open();
    await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "x-request-id": id });
    const r = await ex.requestBody(Buffer.from(JSON.stringify({ model: "auto", messages: [{ role: "user", content }] })));
    await ex.responseHeaders(200, {});
    await ex.responseBodyChunk(Buffer.from("{}"), true);
    await ex.end();
    if (r.kind !== "continue") throw new Error(`expected continue, got ${r.kind}`);
    return { model: (JSON.parse((r.bodyMutation as Buffer).toString()) as { model: string }).model, record: sink.decisions.find((d) => d.id === id) };
  };
  return { ask, events, embeddings };
}

describe("the simulator's /v1/embeddings", () => {
  it("is deterministic, and texts sharing words are closer than texts sharing none", async () => {
    const res = await fetch(`http://${fleet.pods[0]?.address}/v1/embeddings`, { method: "POST", body: JSON.stringify({ model: EMBED, input: ["solve the equation", "solve an equation now", "a poem about the sea"] }) });
    const body = (await res.json()) as { data: Array<{ index: number; embedding: number[] }> };
    expect(body.data.map((d) => d.index)).toEqual([0, 1, 2]);
    const [a, b, c] = body.data.map((d) => d.embedding) as [number[], number[], number[]];
    expect(a).toEqual(simEmbedding("solve the equation"));
    expect(cosine(a, b)).toBeGreaterThan(0.5);
    expect(cosine(a, c)).toBeLessThan(cosine(a, b) - 0.3);
    const bad = await fetch(`http://${fleet.pods[0]?.address}/v1/embeddings`, { method: "POST", body: JSON.stringify({ model: EMBED, input: [1, 2] }) });
    expect(bad.status).toBe(400);
  });
});

describe("the embedding signal through ext_proc", () => {
  it("scores on the embedding pod's vectors, then serves the same text from the cache", async () => {
    const g = await gateway(fleet.pods[0]?.address);
    const first = await g.ask("please solve this equation for y", "e1");
    expect(first.model).toBe(MATH);
    expect(first.record?.semantic?.signals.maths).toMatchObject({ value: true, via: "embedding" });
    expect(g.events).toEqual(["miss"]);
    const again = await g.ask("please solve this equation for y", "e2");
    expect(again.model).toBe(MATH);
    expect(g.events).toEqual(["miss", "hit"]);
    expect(g.embeddings.cache.size).toBe(5);
    expect((await g.ask("fix the bug in my python code", "e3")).model).toBe(CODER);
  });

  it("a pod that does not answer within embeddingTimeoutMs: the lexical fallback decides, without waiting longer", async () => {
    const g = await gateway(hangingAddress);
    const t0 = performance.now();
    const r = await g.ask("compute the integral of this function", "t1");
    expect(performance.now() - t0).toBeLessThan(2_000);
    expect(r.model).toBe(MATH);
    expect(r.record?.semantic?.signals.maths).toMatchObject({ value: true, via: "lexical" });
    expect(g.events).toEqual(["miss", "timeout"]);
  });

  it("no ready embedding pod: the lexical fallback at once", async () => {
    const g = await gateway(undefined);
    const r = await g.ask("fix the bug in my python code", "n1");
    expect(r.model).toBe(CODER);
    expect(r.record?.semantic?.signals.coding).toMatchObject({ via: "lexical" });
    expect(g.events).toEqual(["miss", "no-pod"]);
  });
});

describe("the embedding cache", () => {
  it("is bounded in bytes: the least recently used entries go first", () => {
    const v = () => new Float32Array(256);
    const per = VectorCache.costOf(v());
    const c = new VectorCache(per * 3);
    c.set("a", v());
    c.set("b", v());
    c.set("c", v());
    c.get("a");
    c.set("d", v());
    expect([c.get("a") !== undefined, c.get("b") !== undefined, c.get("c") !== undefined, c.get("d") !== undefined]).toEqual([true, false, true, true]);
    expect(c.bytes).toBeLessThanOrEqual(per * 3);
  });
});
