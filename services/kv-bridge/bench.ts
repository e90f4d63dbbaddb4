/**
 * Bridge throughput: scripted engines (test-engine.ts, in a child process so they do not share the
 * bridge's event loop) blast BlockStored batches over real ZMQ; one bridge publishes them to a real
 * nats-server. Reports acked batches/s and blocks/s.
 *
 *   npx tsx services/kv-bridge/bench.ts [--batches 50000] [--blocks 4] [--block-size 16] [--pods 1] [--window 256]
 */
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { applyStreams } from "../../streams/apply.js";
import { Subjects } from "../../streams/subjects.js";
import { createLogger } from "../shared/log.js";
import { connectNats } from "../shared/nats.js";
import { startNatsServer } from "../shared/nats-server.js";
import { acked } from "../shared/publish.js";
import { startKvBridge } from "./bridge.js";
import { encodeBatch, encodeEvent, TestEngine } from "./test-engine.js";

const { values: a } = parseArgs({
  options: {
    batches: { type: "string", default: "50000" },
    blocks: { type: "string", default: "4" },
    "block-size": { type: "string", default: "16" },
    pods: { type: "string", default: "1" },
    window: { type: "string", default: "256" },
    "engine-child": { type: "boolean", default: false },
  },
});
const batches = Number(a.batches);
const blocks = Number(a.blocks);
const blockSize = Number(a["block-size"]);
const podCount = Number(a.pods);

/** Child: the engines. Prints their endpoints, waits for "go", sends, prints "sent". */
async function engineChild(): Promise<void> {
  const engines = await Promise.all(Array.from({ length: podCount }, () => new TestEngine({ form: "array" }).start()));
  const payloads: Buffer[][] = engines.map(() => []);
  let token = 0;
  const parents: Array<bigint | null> = engines.map(() => null);
  for (let i = 0; i < batches; i++) {
    const k = i % podCount;
    const hashes = Array.from({ length: blocks }, () => (BigInt(++token) * 0x9e3779b97f4a7c15n) & ((1n << 64n) - 1n));
    const tokens = Array.from({ length: blocks * blockSize }, () => token++ & 0xffff);
    // Every 8th batch starts a new chain; the others extend the pod's last one.
    const parent = i % (8 * podCount) < podCount ? null : (parents[k] ?? null);
    parents[k] = hashes.at(-1) ?? null;
    (payloads[k] as Buffer[]).push(encodeBatch(Date.now() / 1000 + i / 1e6, [encodeEvent({ type: "BlockStored", hashes, parent, tokens, blockSize }, "array")]));
  }
  console.log(JSON.stringify(engines.map((e) => ({ endpoint: e.endpoint, replayEndpoint: e.replayEndpoint, topic: e.topic }))));
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (line !== "go") break;
    await Promise.all(engines.map(async (e, k) => {
      for (const p of payloads[k] as Buffer[]) await e.publishPayload(p);
    }));
    console.log("sent");
  }
  await Promise.all(engines.map((e) => e.close()));
}

async function main(): Promise<void> {
  const server = await startNatsServer();
  const nats = await connectNats(server.url);
  await applyStreams(nats.nc, nats.jsm);
  const subjects = new Subjects();
  const child = spawn(process.execPath, ["--import", "tsx", fileURLToPath(import.meta.url), "--engine-child", ...process.argv.slice(2)], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const out = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const endpoints = JSON.parse((await out.next()).value as string) as Array<{ endpoint: string; replayEndpoint: string; topic: string }>;
  for (const [i, kvEvents] of endpoints.entries()) {
    await acked(nats.js, subjects.pod("bench/model", `bench-${i}`), {
      type: "pod", action: "upsert", model: "bench/model", pod: `bench-${i}`, address: "127.0.0.1:9", ready: true, engine: "vllm", ts: Date.now(), kvEvents,
    });
  }
  const bridge = await startKvBridge({ nats: server.url, log: createLogger("bench", "warn"), window: Number(a.window) });
  const wait = async (ok: () => boolean, ms: number) => {
    const deadline = Date.now() + ms;
    while (!ok()) {
      if (Date.now() > deadline) throw new Error(`timed out; stats ${JSON.stringify(bridge.stats)}`);
      await new Promise((r) => setTimeout(r, 2));
    }
  };
  await wait(() => bridge.pods().length === podCount && bridge.pods().every((p) => p.state === "live"), 5_000);
  await new Promise((r) => setTimeout(r, 300)); // let the SUBs register
  const t0 = performance.now();
  child.stdin.write("go\n");
  await out.next();
  const tSent = performance.now();
  await wait(() => bridge.stats.acked >= batches, 120_000);
  const t1 = performance.now();
  child.stdin.end();
  const s = bridge.stats;
  const secs = (t1 - t0) / 1000;
  console.log(
    JSON.stringify({
      batches, blocksPerBatch: blocks, blockSize, pods: podCount, window: Number(a.window),
      seconds: Math.round(secs * 100) / 100,
      engineSendSeconds: Math.round(((tSent - t0) / 1000) * 100) / 100,
      batchesPerSec: Math.round(batches / secs),
      blocksPerSec: Math.round((batches * blocks) / secs),
      gaps: s.gaps, replays: s.replays, cleared: s.cleared, duplicates: s.duplicates, publishErrors: s.publishErrors,
    }),
  );
  await bridge.close();
  await new Promise((r) => child.once("exit", r));
  await nats.nc.close();
  await server.stop();
}

if (a["engine-child"]) await engineChild();
else await main();
