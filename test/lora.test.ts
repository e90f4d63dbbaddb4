/**
 * LoRA end to end: simulated vLLM pods serving adapters (loaded at run time through
 * `/v1/load_lora_adapter`), the metrics-scraper reading them from `/v1/models` and
 * `vllm:lora_requests_info`, the pod-watcher's static list naming one, two gateways routing an
 * adapter's requests only to pods serving it, and the KV events of adapter requests carrying
 * `lora_name` through the kv-bridge into the KV stream.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { KvBatch } from "../schemas/events.js";
import { streamName } from "../streams/definitions.js";
import { startFront, type FrontServer } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startKvBridge } from "../services/kv-bridge/bridge.js";
import { startScraper } from "../services/metrics-scraper/scraper.js";
import { StreamFollower } from "../services/shared/follower.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

describe("LoRA adapters end to end", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let front: FrontServer;
  let base = "";
  const gws: GatewayHandle[] = [];
  const closers: Array<() => Promise<void>> = [];
  const kvLoras: Array<string | null> = [];

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 3, model: MODEL, kvEvents: true, logger: quietLog });
    const [p0, p1, p2] = fleet.pods as [SimFleet["pods"][number], SimFleet["pods"][number], SimFleet["pods"][number]];
    // pod 2 serves "listed-lora" as the pod list says (an adapter configured outside the engine's API).
    await env.publishPod({ pod: p0.name, address: p0.address, kvEvents: p0.kvEvents });
    await env.publishPod({ pod: p1.name, address: p1.address, kvEvents: p1.kvEvents });
    await env.publishPod({ pod: p2.name, address: p2.address, kvEvents: p2.kvEvents, adapters: ["listed-lora"] });
    const scraper = await startScraper({ nats: env.server.url, intervalMs: 100, log: quietLog });
    closers.push(() => scraper.close());
    const bridge = await startKvBridge({ nats: env.server.url, log: quietLog });
    closers.push(() => bridge.close());
    const f = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "test-kv", family: "kv", types: ["kv"] as const,
      stream: streamName("jr", "KV"), filter: env.subjects.all("kv"), startAt: { kind: "all" },
      onEvent: (b: KvBatch) => {
        for (const e of b.events) if (e.kind === "stored") kvLoras.push(e.lora);
      },
    });
    await f.start();
    closers.push(() => f.stop());
    // Local tokenization (the simulator's tokenizer): router block hashes match the engines' blocks.
    for (const id of ["gw-lora-1", "gw-lora-2"]) gws.push(await env.gateway({ id, adminPort: 0, tokenizerMode: "local" }));
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: gws.map((g) => `127.0.0.1:${g.port}`), logger: quietLog });
    base = `http://127.0.0.1:${front.port}`;
  });
  afterAll(async () => {
    await front?.close();
    for (const c of closers.reverse()) await c().catch(() => undefined);
    await fleet?.close();
    await env?.stop();
  });

  const requestsOf = async (address: string) => ((await (await fetch(`http://${address}/debug/state`)).json()) as { totals: { requests: number } }).totals.requests;
  const complete = (model: string, prompt = "Translate to SQL: all users older than 30") =>
    fetch(`${base}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model, prompt, max_tokens: 4 }) });
  const adapterPods = (g: GatewayHandle, a: string) => g.views.pods.readyPods(a).map((p) => p.pod);
  const lora = (address: string, op: "load" | "unload", name: string) =>
    fetch(`http://${address}/v1/${op}_lora_adapter`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lora_name: name, lora_path: `/adapters/${name}` }) });

  it("the simulator serves adapters like vLLM: load, list with parent, metric, unload, errors", async () => {
    const p0 = fleet.pods[0] as SimFleet["pods"][number];
    expect((await lora(p0.address, "load", "probe-lora")).status).toBe(200);
    expect((await lora(p0.address, "load", "probe-lora")).status).toBe(400);
    const models = (await (await fetch(`http://${p0.address}/v1/models`)).json()) as { data: Array<{ id: string; parent: string | null }> };
    expect(models.data.map((m) => [m.id, m.parent])).toEqual([[MODEL, null], ["probe-lora", MODEL]]);
    expect(await (await fetch(`http://${p0.address}/metrics`)).text()).toMatch(/vllm:lora_requests_info\{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""\} \d/);
    expect((await lora(p0.address, "unload", "probe-lora")).status).toBe(200);
    expect((await lora(p0.address, "unload", "probe-lora")).status).toBe(404);
    expect((await fetch(`http://${p0.address}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "probe-lora", prompt: "x" }) })).status).toBe(404);
  });

  it("an adapter loaded at run time becomes routable in every gateway within a scrape, only to the pods serving it", async () => {
    const [p0, p1] = fleet.pods as [SimFleet["pods"][number], SimFleet["pods"][number]];
    expect((await complete("sql-lora")).status).toBe(404);
    expect((await lora(p1.address, "load", "sql-lora")).status).toBe(200);
    await waitFor(() => gws.every((g) => adapterPods(g, "sql-lora").join() === p1.name), 5_000, "sql-lora routable on pod 1 only");
    const before = await Promise.all(fleet.pods.map((p) => requestsOf(p.address)));
    for (let i = 0; i < 12; i++) {
      const res = await complete("sql-lora", `query ${i}: all users older than ${i}`);
      expect(res.status).toBe(200);
      expect(((await res.json()) as { model: string }).model).toBe("sql-lora");
    }
    const after = await Promise.all(fleet.pods.map((p) => requestsOf(p.address)));
    expect(after.map((n, i) => n - (before[i] as number))).toEqual([0, 12, 0]);
    // The base model is still served by every pod.
    expect(gws[0]?.views.pods.readyPods(MODEL)).toHaveLength(3);
    // A second pod loading it joins; unloading on the first leaves only the second.
    expect((await lora(p0.address, "load", "sql-lora")).status).toBe(200);
    await waitFor(() => gws.every((g) => adapterPods(g, "sql-lora").length === 2), 5_000, "two pods serve sql-lora");
    expect((await lora(p1.address, "unload", "sql-lora")).status).toBe(200);
    await waitFor(() => gws.every((g) => adapterPods(g, "sql-lora").join() === p0.name), 5_000, "only pod 0 after the unload");
  });

  it("an adapter named by the pod list routes to that pod", async () => {
    const p2 = fleet.pods[2] as SimFleet["pods"][number];
    expect(gws.every((g) => adapterPods(g, "listed-lora").join() === p2.name)).toBe(true);
    // The engine has not loaded it: the simulator answers 404, which is what routing to a pod
    // that does not have it would mean in production too. Loading it makes it served.
    expect((await lora(p2.address, "load", "listed-lora")).status).toBe(200);
    const res = await complete("listed-lora");
    expect(res.status).toBe(200);
  });

  it("KV events of adapter requests carry lora_name, through the kv-bridge into the KV stream", async () => {
    // Prompts of several blocks (16 tokens each), so the engines store full blocks.
    const long = "SELECT name, email FROM users WHERE age > 30 ORDER BY created_at DESC; ".repeat(8);
    const p0 = fleet.pods[0] as SimFleet["pods"][number];
    if (!gws.every((g) => adapterPods(g, "sql-lora").length > 0)) expect((await lora(p0.address, "load", "sql-lora")).status).toBe(200);
    await waitFor(() => gws.every((g) => adapterPods(g, "sql-lora").length > 0), 5_000, "sql-lora routable");
    for (const model of ["sql-lora", MODEL]) expect((await complete(model, long)).status).toBe(200);
    await waitFor(() => kvLoras.includes("sql-lora") && kvLoras.includes(null), 5_000, "adapter and base blocks in KV");
  });

  it("prefix hashes are seeded by the adapter: the adapter's cached prompt matches for the adapter, not for the base model", async () => {
    const p0 = fleet.pods[0] as SimFleet["pods"][number];
    const prompt = "Explain the query plan of a hash join over two large tables, step by step. ".repeat(6);
    expect((await complete("sql-lora", prompt)).status).toBe(200);
    const explain = async (g: GatewayHandle, model: string) => {
      const res = await fetch(`http://127.0.0.1:${g.adminPort}/debug/explain`, { method: "POST", headers: { "content-type": "application/json", "routing-strategy": "prefix-cache" }, body: JSON.stringify({ model, prompt, max_tokens: 4 }) });
      expect(res.status).toBe(200);
      return ((await res.json()) as { candidates: Array<{ pod: string; prefix?: { indexBlocks: number } }> }).candidates;
    };
    const blocksOn = (cs: Array<{ pod: string; prefix?: { indexBlocks: number } }>, pod: string) => cs.find((c) => c.pod === pod)?.prefix?.indexBlocks ?? 0;
    for (const g of gws) {
      let adapterView: Array<{ pod: string; prefix?: { indexBlocks: number } }> = [];
      await waitFor(async () => blocksOn((adapterView = await explain(g, "sql-lora")), p0.name) > 0, 5_000, `${g.id}'s index to hold the adapter's blocks`, 50);
      expect(blocksOn(adapterView, p0.name)).toBeGreaterThan(2);
      const baseView = await explain(g, MODEL);
      expect(baseView.map((c) => blocksOn([c], c.pod))).toEqual(baseView.map(() => 0));
    }
  });
});
