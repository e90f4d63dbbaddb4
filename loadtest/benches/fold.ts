/**
 * `npm run bench -- fold`: what folding one event costs a gateway replica, per event family
 * (charge, release, heartbeat, load sample, KV batch, pod), split into the four things it does:
 *
 * - delivery: the NATS client reading the messages off a JetStream ordered consumer (socket, protocol
 *   parse, message objects, the delivery info the follower reads: subject, sequence, server time,
 *   pending), measured by consuming a stream of N pre-published messages with a callback that only
 *   touches those fields;
 * - parse: `JSON.parse` of the payload bytes;
 * - validate: the compiled schema check (`checkEvent`);
 * - apply: `GatewayState.apply`, the view update, on a fold that holds what it would in a live
 *   replica (pods, the charges a release finds, the previous heartbeats); charges and releases
 *   with `inFlight` of the peer's charges outstanding, as at 32 streams (`steadyApplyUs`).
 *
 * The first family is measured twice and only the second result kept (warm-up; see below).
 *
 * CPU is `process.cpuUsage()` (user + system) over each loop divided by N, median of `rounds`;
 * this process holds only the bench (nats-server is another process). `per_request_us` is what a
 * replica pays per request another replica routed: its charge and its release, plus that
 * request's share of the router's heartbeats (one per second listing its in-flight requests, at
 * `foreignRate` requests per second); `per_request_batched_us` counts the release as its share of a
 * `releases` batch of `releaseBatch` (family `releases`, reported per release it carries).
 */
import { DeliverPolicy } from "@nats-io/jetstream";
import type { ChargeEvent, EventType, GatewayHeartbeat, KvBatch, LoadSample, PodEvent, ReleaseBatch, ReleaseEvent } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { type EventMeta, GatewayState, type StateStream } from "../../services/views/gateway-state.js";
import { applyStreams } from "../../streams/apply.js";
import { type StreamKey, streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";

export type FoldFamily = "charge" | "release" | "releases" | "heartbeat" | "heartbeat-steady" | "load" | "kv" | "pod";
export const FOLD_FAMILIES: readonly FoldFamily[] = ["charge", "release", "releases", "heartbeat", "heartbeat-steady", "load", "kv", "pod"];

export interface FoldBenchOptions {
  /** Messages per family and round. */
  events?: number;
  rounds?: number;
  /** In-flight requests a heartbeat lists (the router's concurrency: 32 streams). */
  inFlight?: number;
  /** The router's request rate, for the heartbeats' share per request. */
  foreignRate?: number;
  /** Releases per `releases` batch (a gateway batches a pod's releases over a few ms). */
  releaseBatch?: number;
}

export interface FamilyCost {
  delivery_us: number;
  parse_us: number;
  validate_us: number;
  apply_us: number;
  total_us: number;
  bytes: number;
}

export interface FoldBenchResult {
  bench: "fold";
  /** Charge + release + heartbeat share, every release its own message (`--release-batch-ms 0`). */
  per_request_us: number;
  /** The same with releases arriving `releaseBatch` per `releases` message (the gateway's default batching). */
  per_request_batched_us: number;
  /**
   * e_hb: the fold of one charge listed in a steady-state heartbeat (family `heartbeat-steady` / in
   * flight). A request lasting D is listed in D / H of its router's beats: add e_hb x D / H per
   * request (docs/scaling.md) where D is far above the bench's 32 ms.
   */
  heartbeat_per_listed_us: number;
  families: Record<FoldFamily, number>;
  detail: Record<FoldFamily, FamilyCost>;
  options: Required<FoldBenchOptions>;
}

const MODEL = "bench/fold-model";
const PODS = 8;
const PEER = "gw-peer";
const SELF = "gw-self";
const progress = (line: string) => process.stderr.write(`[fold] ${line}\n`);
const round = (x: number, d = 2) => Number(x.toFixed(d));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const cpuUs = () => {
  const c = process.cpuUsage();
  return c.user + c.system;
};
const hex = (n: number) => (n >>> 0).toString(16).padStart(8, "0") + ((n * 2654435761) >>> 0).toString(16).padStart(8, "0");

interface Fixture {
  family: FoldFamily;
  type: EventType;
  stream: "pods" | "load" | "charges" | "kv";
  subjects: string[];
  events: object[];
  /** Events applied (not measured) before the measured ones, so the fold is in its live state. */
  setup: Array<{ ev: object; subject: string }>;
}

function fixtures(n: number, inFlight: number, batch: number, s: Subjects): Fixture[] {
  const t0 = Date.now();
  const pod = (i: number) => `pod-${i % PODS}`;
  const charge = (i: number): ChargeEvent => ({ type: "charge", id: i.toString(36), gateway: PEER, model: MODEL, pod: pod(i), ts: t0 + i, ttlMs: 600_000, promptTokens: 300 + (i % 200), maxTokens: 128, user: `user-${i % 50}` });
  const release = (i: number): ReleaseEvent => ({ type: "release", id: i.toString(36), gateway: PEER, model: MODEL, pod: pod(i), ts: t0 + i + 500, outcome: "completed", promptTokens: 310, chargedPromptTokens: 300 + (i % 200), chargedAt: t0 + i, completionTokens: 120, user: `user-${i % 50}` });
  // Batch i holds releases i*batch .. i*batch+batch-1, all of one pod (as a gateway batches them).
  // Request numbers on pod i % PODS, so batch i's charges and releases share that pod.
  const batchedIndex = (i: number, k: number) => (i * batch + k) * PODS + (i % PODS);
  const releasesOf = (i: number): ReleaseBatch => ({
    type: "releases", gateway: PEER, model: MODEL, pod: pod(i),
    releases: Array.from({ length: batch }, (_, k) => {
      const { type: _t, gateway: _g, model: _m, pod: _p, ...item } = release(batchedIndex(i, k));
      return { ...item, afterCharge: i * batch + k };
    }),
  });
  const nBatches = Math.max(2, Math.floor(n / batch));
  // `turnover` new charges per beat: inFlight = every listed charge new (an upper bound: each is
  // added, then dropped at the next beat); inFlight / 8 = each request listed in 8 beats (D = 8 H,
  // the steady state of LLM-long requests: most listed charges are known and stay).
  const heartbeatOf = (turnover: number) => (i: number): GatewayHeartbeat => ({
    type: "heartbeat", gateway: PEER, ts: t0 + i * 1000, intervalMs: 1000, startedAt: t0, state: "up", chargeTtlMs: 600_000, beat: i,
    outstanding: Array.from({ length: inFlight }, (_, k) => ({ id: (i * turnover + k).toString(36), model: MODEL, pod: pod(i * turnover + k), promptTokens: 300, ts: t0 + i * 1000 }))
  });
  const heartbeat = heartbeatOf(inFlight);
  const heartbeatSteady = heartbeatOf(Math.max(1, Math.round(inFlight / 8)));
  const load = (i: number): LoadSample => ({
    type: "load", model: MODEL, pod: pod(i), ts: t0 + i, stale: false, scrapeMs: 1.2,
    load: { running: 12, waiting: 3, kvCacheUsage: 0.42, prefixCacheQueries: 1e6 + i, prefixCacheHits: 4e5 + i, cacheHitRate: null, promptTokens: 2e6 + i, generationTokens: 1e6 + i, genThroughput: null, preemptions: 0, blockSize: 16, numGpuBlocks: 4096, runningLoras: [], waitingLoras: [], maxLora: null,
      histograms: { ttft: { sum: 12.5, count: 100 }, itl: { sum: 1.5, count: 1000 }, queue: { sum: 0.5, count: 100 }, prefill: { sum: 5, count: 100 }, decode: { sum: 50, count: 100 }, e2e: { sum: 60, count: 100 }, promptTokens: { sum: 30000, count: 100 }, generationTokens: { sum: 12000, count: 100 } } },
  });
  // One engine step's batch: one request's 4 new blocks stored (a typical decode-time step).
  const kv = (i: number): KvBatch => ({
    type: "kv", model: MODEL, pod: pod(i), epoch: "e1", seq: Math.floor(i / PODS), ts: t0 + i,
    events: [{ kind: "stored", engineHashes: [0, 1, 2, 3].map((k) => hex(i * 4 + k + 1)), routerHashes: [0, 1, 2, 3].map((k) => hex(i * 4 + k + 7)), parentEngineHash: i > 0 ? hex(i * 4) : null, blockSize: 16, medium: "GPU", lora: null }],
  });
  const podEv = (i: number): PodEvent => ({ type: "pod", action: "upsert", model: MODEL, pod: pod(i), address: `10.0.0.${i % PODS}:8000`, ready: i % 7 !== 0, engine: "vllm", role: "combined", ts: t0 + i });
  const pods = Array.from({ length: PODS }, (_, i) => ({ ev: podEv(i * 7 + 1), subject: s.pod(MODEL, pod(i)) }));
  const range = <T,>(f: (i: number) => T): T[] => Array.from({ length: n }, (_, i) => f(i));
  return [
    { family: "charge", type: "charge", stream: "charges", subjects: range((i) => s.charges(MODEL, pod(i))), events: range(charge), setup: pods },
    { family: "release", type: "release", stream: "charges", subjects: range((i) => s.releases(MODEL, pod(i))), events: range(release), setup: [...pods, ...range((i) => ({ ev: charge(i) as object, subject: s.charges(MODEL, pod(i)) }))] },
    {
      family: "releases", type: "releases", stream: "charges",
      subjects: Array.from({ length: nBatches }, (_, i) => s.releases(MODEL, pod(i))), events: Array.from({ length: nBatches }, (_, i) => releasesOf(i)),
      setup: [...pods, ...Array.from({ length: nBatches * batch }, (_, j) => batchedIndex(Math.floor(j / batch), j % batch)).map((i) => ({ ev: charge(i) as object, subject: s.charges(MODEL, pod(i)) }))],
    },
    { family: "heartbeat", type: "heartbeat", stream: "charges", subjects: range(() => s.heartbeat(PEER)), events: range(heartbeat), setup: pods },
    { family: "heartbeat-steady", type: "heartbeat", stream: "charges", subjects: range(() => s.heartbeat(PEER)), events: range(heartbeatSteady), setup: pods },
    { family: "load", type: "load", stream: "load", subjects: range((i) => s.load(MODEL, pod(i))), events: range(load), setup: pods },
    { family: "kv", type: "kv", stream: "kv", subjects: range((i) => s.kv(MODEL, pod(i))), events: range(kv), setup: pods },
    { family: "pod", type: "pod", stream: "pods", subjects: range((i) => s.pod(MODEL, pod(i))), events: range(podEv), setup: [] },
  ];
}

const STREAM_KEY: Record<Fixture["stream"], StreamKey> = { pods: "PODS", load: "LOAD", charges: "CHARGES", kv: "KV" };

async function deliveryUs(nats: NatsHandles, stream: string, filter: string, n: number): Promise<number> {
  const consumer = await nats.js.consumers.get(stream, { filter_subjects: filter, deliver_policy: DeliverPolicy.All });
  let got = 0;
  let sink = 0;
  let start = 0;
  let end = 0;
  await new Promise<void>((resolve) => {
    void consumer.consume({
      max_messages: 2048,
      callback: (m) => {
        if (got === 0) start = cpuUs();
        // What StreamFollower.handle touches besides the payload.
        sink += m.seq + m.subject.length + m.data.length + m.info.timestampNanos + m.info.pending;
        if (++got === n) {
          end = cpuUs();
          resolve();
        }
      },
    }).then((msgs) => {
      const t = setInterval(() => {
        if (got >= n) {
          clearInterval(t);
          void msgs.close();
        }
      }, 5);
    });
  });
  if (sink < 0) progress("unreachable");
  // The first message's own cost is not in the window: n - 1 messages measured.
  return (end - start) / (n - 1);
}

/**
 * Charges and releases applied as a live replica sees them: about `inFlight` of the peer's charges
 * outstanding at any time. Chunks of `inFlight` charges alternate with the releases of the chunk
 * before; only the family's own events are timed. (Applying all N charges first, as before, timed
 * a ledger growing to N entries: 2-3 µs per charge instead of ~0.5.)
 */
function steadyApplyUs(state: GatewayState, f: Fixture, parsed: unknown[], inFlight: number, metaOf: (stream: StateStream, subject: string) => { stream: StateStream; subject: string; seq: number; serverTs: number }): number {
  const timed = f.family;
  const s = new Subjects();
  const charges = f.family === "charge" ? parsed : f.setup.filter((x) => (x.ev as { type: string }).type === "charge").map((x) => x.ev);
  const releases = f.family === "release" ? parsed : [];
  // Release events of the charge family's own charges (the same ids), untimed.
  const releaseOf = (c: ChargeEvent): ReleaseEvent => ({ type: "release", id: c.id, gateway: c.gateway, model: c.model, pod: c.pod, ts: c.ts + 500, outcome: "completed" });
  // The release family's setup already applied every charge: take them back out first, untimed.
  if (timed === "release") for (const c of charges) state.apply(releaseOf(c as ChargeEvent), metaOf("charges", s.releases(MODEL, (c as ChargeEvent).pod)));
  let us = 0;
  let n = 0;
  const chunk = Math.max(1, inFlight);
  for (let i = 0; i < charges.length; i += chunk) {
    const cs = charges.slice(i, i + chunk) as ChargeEvent[];
    const rs = timed === "release" ? (releases.slice(i, i + chunk) as ReleaseEvent[]) : cs.map(releaseOf);
    // Metadata made outside the timed loops, as the follower hands it over ready.
    const cm = cs.map((c) => metaOf("charges", s.charges(MODEL, c.pod)));
    const rm = rs.map((r) => metaOf("charges", s.releases(MODEL, r.pod)));
    let t = cpuUs();
    for (let k = 0; k < cs.length; k++) state.apply(cs[k] as never, cm[k] as EventMeta);
    if (timed === "charge") {
      us += cpuUs() - t;
      n += cs.length;
    }
    t = cpuUs();
    for (let k = 0; k < rs.length; k++) state.apply(rs[k] as never, rm[k] as EventMeta);
    if (timed === "release") {
      us += cpuUs() - t;
      n += rs.length;
    }
  }
  return us / Math.max(1, n);
}

export async function runFoldBench(opts: FoldBenchOptions = {}): Promise<FoldBenchResult> {
  const o: Required<FoldBenchOptions> = { events: opts.events ?? 20_000, rounds: opts.rounds ?? 3, inFlight: opts.inFlight ?? 32, foreignRate: opts.foreignRate ?? 1_000, releaseBatch: opts.releaseBatch ?? 8 };
  const server = await startNatsServer();
  const nats = await connectNats(server.url, "jetroute-bench-fold");
  const s = new Subjects();
  await applyStreams(nats.nc, nats.jsm);
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  const detail = {} as Record<FoldFamily, FamilyCost>;
  try {
    const families = fixtures(o.events, o.inFlight, o.releaseBatch, s);
    // The first family measured pays ~5 µs more delivery per message than it does later in the
    // run, whichever family it is (charge read 7.9-13.7 µs first, 2.3 second; release 7.9 first,
    // 2.6 second): the process's warm-up, which one untimed pass of the same family did not absorb.
    // So the first family is measured twice and its first result thrown away.
    for (const [k, f] of [families[0] as Fixture, ...families].entries()) {
      const payloads = f.events.map((e) => encoder.encode(JSON.stringify(e)));
      for (const e of f.events) {
        const c = checkEvent(f.type, e);
        if (!c.ok) throw new Error(`fold bench fixture ${f.family} does not validate: ${c.reason}`);
      }
      // Every family gets a stream of its own name's messages under a distinct token, so one filter selects exactly them.
      const stream = streamName(s.prefix, STREAM_KEY[f.stream]);
      const base = f.subjects[0] as string;
      const filter = `${base.split(".").slice(0, 2).join(".")}.>`;
      await nats.jsm.streams.purge(stream);
      let pending: Promise<unknown>[] = [];
      for (let i = 0; i < payloads.length; i++) {
        pending.push(nats.js.publish(f.subjects[i] as string, payloads[i] as Uint8Array));
        if (pending.length >= 512) {
          await Promise.all(pending);
          pending = [];
        }
      }
      await Promise.all(pending);
      const stored = Math.min(payloads.length, (await nats.jsm.streams.info(stream)).state.messages);
      if (stored < 2) throw new Error(`fold bench: the ${stream} stream kept ${stored} of ${payloads.length} ${f.family} messages`);
      const cost = { delivery: [] as number[], parse: [] as number[], validate: [] as number[], apply: [] as number[] };
      for (let r = 0; r < o.rounds; r++) {
        // PODS keeps 5 messages per subject: delivery is timed over what the stream still holds.
        cost.delivery.push(await deliveryUs(nats, stream, filter, stored));
        let t = cpuUs();
        const parsed: unknown[] = new Array(payloads.length);
        for (let i = 0; i < payloads.length; i++) parsed[i] = JSON.parse(decoder.decode(payloads[i] as Uint8Array));
        cost.parse.push((cpuUs() - t) / payloads.length);
        t = cpuUs();
        let okCount = 0;
        for (let i = 0; i < parsed.length; i++) if (checkEvent(f.type, parsed[i]).ok) okCount++;
        cost.validate.push((cpuUs() - t) / parsed.length);
        if (okCount !== parsed.length) throw new Error(`${f.family}: ${parsed.length - okCount} events failed validation`);
        const state = new GatewayState({ self: SELF });
        let seq = 0;
        const now = Date.now();
        const metaOf = (stream: StateStream, subject: string) => ({ stream, subject, seq: ++seq, serverTs: now });
        for (const x of f.setup) state.apply(x.ev as never, metaOf(x.subject.includes(".pods.") ? "pods" : "charges", x.subject));
        if (f.family === "charge" || f.family === "release") {
          cost.apply.push(steadyApplyUs(state, f, parsed, o.inFlight, metaOf));
          continue;
        }
        t = cpuUs();
        for (let i = 0; i < parsed.length; i++) state.apply(parsed[i] as never, metaOf(f.stream, f.subjects[i] as string));
        cost.apply.push((cpuUs() - t) / parsed.length);
      }
      const c: FamilyCost = {
        delivery_us: round(median(cost.delivery)),
        parse_us: round(median(cost.parse)),
        validate_us: round(median(cost.validate)),
        apply_us: round(median(cost.apply)),
        total_us: 0,
        bytes: Math.round(payloads.reduce((a, p) => a + p.length, 0) / payloads.length),
      };
      c.total_us = round(c.delivery_us + c.parse_us + c.validate_us + c.apply_us);
      // A batch is reported per release it carries (its bytes stay per message).
      if (f.family === "releases") for (const k of ["delivery_us", "parse_us", "validate_us", "apply_us", "total_us"] as const) c[k] = round(c[k] / o.releaseBatch);
      if (k === 0) {
        progress(`${f.family} (warm-up, not reported): ${JSON.stringify(c)}`);
        continue;
      }
      detail[f.family] = c;
      progress(`${f.family}: ${JSON.stringify(c)}`);
    }
  } finally {
    await nats.nc.close();
    await server.stop();
  }
  const families = Object.fromEntries(FOLD_FAMILIES.map((f) => [f, detail[f].total_us])) as Record<FoldFamily, number>;
  const perListed = detail["heartbeat-steady"].total_us / o.inFlight;
  const perRequest = detail.charge.total_us + detail.release.total_us + detail.heartbeat.total_us / o.foreignRate;
  const perRequestBatched = detail.charge.total_us + detail.releases.total_us + detail.heartbeat.total_us / o.foreignRate;
  return { bench: "fold", per_request_us: round(perRequest), per_request_batched_us: round(perRequestBatched), heartbeat_per_listed_us: round(perListed, 3), families, detail, options: o };
}
