/**
 * Replay against a recorded run: three gateway replicas (eventual) behind the dev front route a
 * shared-prefix chat workload to simulated vLLM pods whose KV events reach the gateways through
 * the kv-bridge and whose load reaches them through the metrics-scraper. Then `jetroute replay`'s
 * engine reads the streams back and must re-decide every recorded pick on the views each gateway
 * had (on a loaded host too: heartbeats then come late and peers lapse, by the stream's time); an export file must replay the same; a window routed `random` must show what prefix-cache
 * would have hit, and the what-if simulation a better TTFT for it.
 */
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startFront, type FrontServer } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startKvBridge } from "../services/kv-bridge/bridge.js";
import { startScraper } from "../services/metrics-scraper/scraper.js";
import { runReplay } from "../services/replay/command.js";
import { spawnJetroute } from "../services/shared/processes.js";
import { EXPORT_FORMAT, EXPORT_VERSION, fileSource, natsSource, writeExport } from "../services/replay/sources.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { streamName } from "../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

describe("replay - a recorded run of three gateway replicas", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let bridge: Awaited<ReturnType<typeof startKvBridge>>;
  let scraper: Awaited<ReturnType<typeof startScraper>>;
  let gws: GatewayHandle[];
  let front: FrontServer;
  // 12 system prompts of 7-33 blocks: more than the 4 x 64 blocks the pods can cache, so routing decides the hits.
  const systems = Array.from({ length: 12 }, (_, i) => `System ${i}: ${"you are a careful assistant who answers briefly and cites sources. ".repeat(6 + 2 * i)}`);

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 4, model: MODEL, timeScale: 20, kvCacheBlocks: 64, blockSize: 16, maxBatch: 8, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, kvEvents: p.kvEvents });
    bridge = await startKvBridge({ nats: env.server.url, log: quietLog });
    scraper = await startScraper({ nats: env.server.url, intervalMs: 100, log: quietLog });
    gws = [];
    for (const id of ["rp-a", "rp-b", "rp-c"]) gws.push(await env.gateway({ id, tokenizerMode: "local", snapshots: false }));
    await waitFor(() => bridge.pods().length === 4, 5_000, "bridge to take the pods");
    await waitFor(() => gws.every((g) => g.views.ledger.rank(Date.now()).count === 3), 5_000, "replicas to see each other");
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: gws.map((g) => `127.0.0.1:${g.port}`), logger: quietLog });
  }, 60_000);
  afterAll(async () => {
    await front?.close();
    await scraper?.close();
    await bridge?.close();
    await fleet?.close();
    await env?.stop();
  });

  /** Sends `n` chat requests, `concurrency` at a time, each with the strategy `strategyOf(i)`. */
  async function drive(n: number, concurrency: number, strategyOf: (i: number) => string, seed: number): Promise<void> {
    const r = rng(seed);
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < n; i = next++) {
        const system = systems[Math.floor(r() * systems.length)] as string;
        const res = await fetch(`http://127.0.0.1:${front.port}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "routing-strategy": strategyOf(i), "x-request-id": `req-${seed}-${i}`, user: `user-${i % 5}` },
          body: JSON.stringify({ model: MODEL, messages: [{ role: "system", content: system }, { role: "user", content: `question ${i}` }], max_tokens: 4 + (i % 5), stream: i % 2 === 0 }),
        });
        const text = await res.text();
        expect(res.status, `req-${seed}-${i}: ${text.slice(0, 300)}`).toBe(200);
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    await waitFor(() => gws.every((g) => g.director.inFlight.size === 0 && g.views.ledger.size === 0), 10_000, "every request released everywhere");
  }

  async function decisionsStored(atLeast: number): Promise<void> {
    const name = streamName("jr", "DECISIONS");
    await waitFor(async () => (await env.nats.jsm.streams.info(name)).state.messages >= atLeast, 10_000, `${atLeast} decision records in the stream`, 20);
  }

  let fromMs = 0;
  let toMs = 0;
  const N = 400;
  const STRATEGIES = ["prefix-cache", "least-request", "random", "power-of-two", "least-kv-cache:1,least-request:1", "session-affinity"];

  it("re-decides every recorded pick on the views each gateway had, whatever the host's load", async () => {
    fromMs = Date.now();
    await drive(N, 12, (i) => STRATEGIES[i % STRATEGIES.length] as string, 1);
    toMs = Date.now();
    await decisionsStored(N);
    const st = (await env.nats.jsm.streams.info(streamName("jr", "DECISIONS"))).state;
    console.error(`decision records: ${Math.round(st.bytes / st.messages)} bytes each as stored (${st.messages} records, prompts of ~${Math.round(systems.reduce((a, x) => a + x.length, 0) / systems.length / 4)} tokens)`);
    const report = await runReplay({ source: await natsSource(env.nats, "jr", { fromMs, toMs, tailMs: 5_000 }), fromMs, toMs, strategies: ["prefix-cache", "random"], reorderMs: 5_000 });
    console.error(`replay fidelity: ${report.fidelity.reproduced}/${report.fidelity.evaluated} residuals ${JSON.stringify(report.fidelity.residuals)} skipped ${JSON.stringify(report.decisions.skipped)}`);
    for (const x of report.fidelity.examples ?? []) console.error(`not reproduced: ${JSON.stringify(x)}`);
    expect(report.decisions.read).toBe(N);
    expect(report.decisions.evaluated).toBe(N);
    expect(report.fidelity.evaluated).toBe(N);
    // Exact: the records carry every input the gateways decided on (docs/replay.md names the
    // residual kinds that remain possible; this run routes none of them).
    expect(report.fidelity.residuals).toEqual({});
    expect(report.fidelity.reproduced).toBe(N);
    // The prefix strategies really found blocks in the rebuilt index (the check is not vacuous).
    const recorded = report.strategies.find((s) => s.name === "recorded");
    expect(recorded?.hitBlocks ?? 0).toBeGreaterThan(0);
    expect(report.agreement.matrix[0]?.[0]).toBe(1);
  }, 120_000);

  it("`jetroute export` then `jetroute replay --file` as processes: a final JSON line and a self-contained HTML report", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "jr-cli-"));
    const file = path.join(dir, "window.jsonl.gz");
    const html = path.join(dir, "report.html");
    const window = ["--from", new Date(fromMs).toISOString(), "--to", new Date(toMs + 1).toISOString()];
    const exp = spawnJetroute("export", ["export", "--nats", env.server.url, ...window, "--tail-ms", "5000", "--out", file, "--no-progress"]);
    expect(await exp.exited).toBe(0);
    expect(exp.jsonLines.at(-1)).toMatchObject({ export: file });
    const rep = spawnJetroute("replay", ["replay", "--file", file, "--strategies", "prefix-cache,least-request", "--reorder-ms", "5000", "--report", html]);
    expect(await rep.exited).toBe(0);
    const line = rep.jsonLines.at(-1) as { fidelity: { ratio: number; evaluated: number }; strategies: Array<{ name: string }>; report: string };
    expect(line.fidelity.evaluated).toBe(N);
    expect(line.fidelity.ratio).toBe(1);
    expect(line.strategies.map((x) => x.name)).toEqual(["recorded", "prefix-cache", "least-request"]);
    expect(line.report).toBe(html);
    const page = readFileSync(html, "utf8");
    expect(page).toContain('id="report-data"');
    expect(page).not.toMatch(/src="https?:/);
    // A window that names a DECISIONS sequence the stream never had is refused with the reason.
    const bad = spawnJetroute("replay", ["replay", "--nats", env.server.url, "--from", "seq:999999", "--report", path.join(dir, "x.html"), "--no-progress"]);
    expect(await bad.exited).toBe(1);
  }, 60_000);

  it("an export file replays exactly like the live streams", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "jr-export-"));
    const file = path.join(dir, "window.jsonl.gz");
    const counts = await writeExport(file, { format: EXPORT_FORMAT, version: EXPORT_VERSION, prefix: "jr", window: { fromMs, toMs }, createdAt: new Date().toISOString() }, (await natsSource(env.nats, "jr", { fromMs, toMs, tailMs: 5_000 })).batches);
    expect(counts?.decisions?.count ?? 0).toBeGreaterThanOrEqual(N);
    const fromFile = await runReplay({ source: await fileSource(file), fromMs, toMs, strategies: ["prefix-cache", "random"], reorderMs: 5_000 });
    const live = await runReplay({ source: await natsSource(env.nats, "jr", { fromMs, toMs, tailMs: 5_000 }), fromMs, toMs, strategies: ["prefix-cache", "random"], reorderMs: 5_000 });
    expect(fromFile.fidelity).toEqual(live.fidelity);
    expect(fromFile.strategies).toEqual(live.strategies);
  }, 60_000);

  it("traffic routed `random`: prefix-cache would have hit more blocks, and simulates to a better TTFT", async () => {
    const from = Date.now();
    // Two at a time: the counterfactual ledgers see little load, so prefix-cache follows its matches.
    await drive(240, 2, () => "random", 2);
    const to = Date.now();
    await decisionsStored(N + 240);
    const report = await runReplay({ source: await natsSource(env.nats, "jr", { fromMs: from, toMs: to, tailMs: 5_000 }), fromMs: from, toMs: to, strategies: ["prefix-cache", "random"], simulate: ["random", "prefix-cache"], reorderMs: 5_000 });
    const by = Object.fromEntries(report.strategies.map((s) => [s.name, s]));
    expect(report.decisions.evaluated).toBe(240);
    expect(report.fidelity.residuals).toEqual({});
    expect(by["prefix-cache"]?.hitBlocks ?? 0).toBeGreaterThan(by.recorded?.hitBlocks ?? 0);
    expect(by["prefix-cache"]?.meanRegretBlocks ?? 1).toBeLessThan(by.recorded?.meanRegretBlocks ?? 0);
    const sim = Object.fromEntries((report.simulation ?? []).map((s) => [s.strategy, s]));
    console.error(
      `random window: hit blocks recorded ${by.recorded?.hitBlocks} vs prefix-cache ${by["prefix-cache"]?.hitBlocks} (of ${by.recorded?.queriedBlocks}); what-if TTFT p50 random ${sim.random?.ttft.p50Ms} ms, prefix-cache ${sim["prefix-cache"]?.ttft.p50Ms} ms; hit rate ${sim.random?.hitRate.toFixed(3)} vs ${sim["prefix-cache"]?.hitRate.toFixed(3)}`,
    );
    expect(sim["prefix-cache"]?.completed).toBe(240);
    expect(sim["prefix-cache"]?.hitRate ?? 0).toBeGreaterThan(sim.random?.hitRate ?? 1);
    expect(sim["prefix-cache"]?.ttft.p50Ms ?? Number.POSITIVE_INFINITY).toBeLessThan(sim.random?.ttft.p50Ms ?? 0);
  }, 120_000);
});
