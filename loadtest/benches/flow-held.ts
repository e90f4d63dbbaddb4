/**
 * `node --expose-gc dist/loadtest/bench.js flow-held`: what a request held by flow control keeps
 * in memory, against what the flow queue counts for it (services/routing/flow/held-bytes.ts).
 *
 * In process, one Director over a state with pods: the model's flow control is on with
 * `maxInFlightPerPod: 1`, each pod gets one request (saturated), then `count` requests of `bodyBytes`
 * are sent and held. Measured: heap + array buffers after forced GCs, before and after the held
 * requests (each body Buffer is allocated between the two figures: it is part of what is held).
 * Cases: ASCII content; content with characters outside Latin-1 (two-byte
 * strings in V8); ASCII with a tenant cache salt (a salted copy of the body).
 * A last case holds 2,000 requests of 1 KiB: the fixed part of a held request.
 * Reports per held request: retained bytes (measured), counted bytes (the queue's), their ratio.
 */
import { Director, type RouteInput } from "../../services/routing/mod.js";
import { FakeClock, MemorySink, MODEL, stateWithPods } from "../../services/routing/stages/testing.js";
import { encodeToken } from "../../streams/tokens.js";

export interface FlowHeldOptions {
  count?: number;
  bodyBytes?: number;
}

type Gc = () => void;
const gcFn = (globalThis as { gc?: Gc }).gc;

function settled(): number {
  if (gcFn) for (let i = 0; i < 4; i++) gcFn();
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

type Case = "ascii" | "two-byte" | "ascii-salted";

function bodyOf(c: Case, bytes: number, i: number): Buffer {
  // One user message of about `bytes` bytes of UTF-8; unique per request so nothing is shared.
  const unit = c === "two-byte" ? "数据" : "data ";
  const unitBytes = Buffer.byteLength(unit);
  const content = `${i} ${unit.repeat(Math.floor(bytes / unitBytes))}`;
  return Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content }], max_tokens: 1 }));
}

async function runCase(c: Case, count: number, bodyBytes: number) {
  const clock = new FakeClock(1_000_000);
  const state = stateWithPods(2, "gw");
  state.apply(
    { type: "config-entry", key: `model.${encodeToken(MODEL)}`, operation: "PUT", value: { flowControl: { saturation: { maxInFlightPerPod: 1 }, maxBytesPerBand: 2 ** 36, maxRequestsPerBand: 100_000 } } },
    { stream: "config", subject: "config", seq: 10, serverTs: 0 },
  );
  const sink = new MemorySink();
  const director = new Director({ gatewayId: "gw", defaultStrategy: "least-request", chargeTtlMs: 600_000, state, sink, config: state.configs, clock, now: clock.now });
  const small = (id: string): RouteInput => ({ headers: { "x-request-id": id }, body: Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }] })) });
  // Saturate both pods.
  director.route(small("s0"));
  director.route(small("s1"));
  const before = settled();
  const held: unknown[] = [];
  for (let i = 0; i < count; i++) {
    const input: RouteInput = { headers: { "x-request-id": `h${i}`, user: `u${i % 4}` }, body: bodyOf(c, bodyBytes, i), ...(c === "ascii-salted" ? { tenantSalt: "tenant-secret" } : {}) };
    const r = director.route(input);
    if (!(r instanceof Promise)) throw new Error("expected the request to be held");
    r.catch(() => undefined);
    held.push(r);
  }
  const after = settled();
  const q = director.flow.queueSummaries().get(MODEL);
  const counted = q?.bytes ?? 0;
  const retained = (after - before) / count;
  const result = { case: c, held: q?.size ?? 0, bodyBytes, retainedPerRequest: Math.round(retained), countedPerRequest: Math.round(counted / count), retainedOverBody: Number((retained / bodyBytes).toFixed(2)), countedOverRetained: Number((counted / count / retained).toFixed(2)) };
  director.drain();
  held.length = 0;
  return result;
}

export async function runFlowHeldBench(o: FlowHeldOptions = {}) {
  const count = o.count ?? 20;
  const bodyBytes = o.bodyBytes ?? 4 * 1024 * 1024;
  const cases: Case[] = ["ascii", "two-byte", "ascii-salted"];
  const results = [];
  for (const c of cases) {
    const r = await runCase(c, count, bodyBytes);
    process.stderr.write(`${JSON.stringify(r)}\n`);
    results.push(r);
  }
  // The fixed part: many small held requests.
  const small = await runCase("ascii", 2_000, 1024);
  process.stderr.write(`${JSON.stringify(small)}\n`);
  results.push(small);
  return { bench: "flow-held", gc: gcFn !== undefined, count, bodyBytes, results };
}
