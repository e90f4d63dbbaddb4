/**
 * `node --expose-gc dist/loadtest/bench.js charge-lag`: how long after gateway A decides a request
 * gateway B's ledger counts it (the window in which B can still herd onto A's pod).
 *
 * Two in-process gateways, A and B, on one nats-server; an Envoy-faithful ext_proc client sends A
 * one request at a time, paced at `rate` per second for `durationMs` (after an unmeasured warm-up),
 * and cancels each stream once routed so the ledgers stay small.
 *
 * Method: both ends are hooks on the gateways' ledger objects, read with `performance.now()` (one
 * monotonic clock, sub-microsecond resolution, shared because A and B live in this process):
 * - decision: A's `ledger.charge` is wrapped; `Director.route` calls it synchronously right after
 *   selecting the pod and before the charge is handed to the outbox (eventual) or the
 *   compare-and-set (strict);
 * - arrival: B's `ledger.charge` is wrapped; B's CHARGES follower calls it (through
 *   `applyFromStream`) when A's charge is applied, so the time is taken when B's ledger contains
 *   it. Heartbeat reconciliation also calls it; only the first successful call per charge counts.
 * No polling, so the figure has no sampling error and costs no CPU; what it includes: A's outbox
 * (one setImmediate), the publish, nats-server storing the message in the file stream, delivery
 * to B's ordered consumer, decoding and schema validation, and any wait for this shared event
 * loop (the client and both gateways run on it; at a modest rate it is mostly idle).
 *
 * Two intermediate points split the lag (reported under `breakdown`, same clock):
 * - `publish`: decision -> A's connection `publish()` of the charge subject (A's `nc.publish` is
 *   wrapped; in strict mode the compare-and-set publish goes through it too, as the JetStream
 *   client's request calls it);
 * - `core_nats`: decision -> a plain core-NATS subscription (the bench's own connection) on the
 *   charge subjects receives it: the broker's routing without JetStream storage and consumer.
 * So `core_nats` vs the headline is what JetStream storage and the ordered consumer add.
 */
import { DEFAULT_FOLD_PACE_MS } from "../../services/gateway/config.js";
import { ExtProcClient } from "../../services/extproc/envoy-client.js";
import { type GatewayHandle, startGateway } from "../../services/gateway/gateway.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../../services/shared/nats-server.js";
import { acked } from "../../services/shared/publish.js";
import type { ChargeLedger } from "../../services/views/charge-ledger.js";
import { applyStreams } from "../../streams/apply.js";
import { Subjects } from "../../streams/subjects.js";

export interface ChargeLagBenchOptions {
  /** Requests per second sent to A, one at a time (default 200). */
  rate?: number;
  /** Measured window (default 10 s). */
  durationMs?: number;
  /** Unmeasured warm-up at the same rate (default 1 s). */
  warmupMs?: number;
  /** Consistency mode of both gateways (default eventual). */
  mode?: "eventual" | "strict";
  /** Pods of the one model (default 4). */
  pods?: number;
  /** Both gateways' `--fold-pace-ms` (default: the gateway's). */
  foldPaceMs?: number;
}

export interface ChargeLagResult {
  bench: "charge-lag";
  mode: "eventual" | "strict";
  p50_ms: number;
  p99_ms: number;
  max_ms: number;
  mean_ms: number;
  samples: number;
  /** The gateways' `--fold-pace-ms`: B reads A's charges in batches this far apart while they flow. */
  fold_pace_ms: number;
  /** Measured charges that never reached B within the grace period after the run. */
  missing: number;
  /** Decision -> intermediate points (see the file comment); p50/p99 in ms. */
  breakdown: Record<"publish" | "core_nats", { p50_ms: number; p99_ms: number; samples: number }>;
}

const MODEL = "bench/charge-lag";
const HEADERS = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "bench", "content-type": "application/json" };
const BODY = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello there" }], stream: true }));

/** Calls `onCharged(id, now)` after every charge `ledger` accepts from `gateway` (the object itself is patched). */
function hookCharges(ledger: ChargeLedger, gateway: string, onCharged: (id: string, t: number) => void): void {
  const original = ledger.charge.bind(ledger);
  ledger.charge = (ev, now) => {
    const added = original(ev, now);
    if (added && ev.gateway === gateway) onCharged(ev.id, performance.now());
    return added;
  };
}

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))] ?? 0;
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

function summary(xs: number[]): { p50_ms: number; p99_ms: number; samples: number } {
  const sorted = Float64Array.from(xs).sort();
  return { p50_ms: round3(percentile(sorted, 0.5)), p99_ms: round3(percentile(sorted, 0.99)), samples: xs.length };
}

/** The charge id in a charge event's JSON (the bench only looks at its own model's charges). */
function chargeIdOf(data: Uint8Array): string | undefined {
  try {
    const ev = JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("utf8")) as { type?: string; id?: string };
    return ev.type === "charge" ? ev.id : undefined;
  } catch {
    return undefined;
  }
}

export async function runChargeLagBench(opts: ChargeLagBenchOptions = {}): Promise<ChargeLagResult> {
  const rate = opts.rate ?? 200;
  const durationMs = opts.durationMs ?? 10_000;
  const warmupMs = opts.warmupMs ?? 1_000;
  const mode = opts.mode ?? "eventual";
  const podCount = opts.pods ?? 4;
  const log = createLogger("bench-charge-lag", "silent");
  let nats: NatsServerHandle | undefined;
  let h: NatsHandles | undefined;
  const gateways: GatewayHandle[] = [];
  let client: ExtProcClient | undefined;
  try {
    nats = await startNatsServer();
    h = await connectNats(nats.url);
    await applyStreams(h.nc, h.jsm);
    const s = new Subjects();
    for (let i = 0; i < podCount; i++) {
      const pod = `pod-${i}`;
      await acked(h.js, s.pod(MODEL, pod), { type: "pod", action: "upsert", model: MODEL, pod, address: `127.0.0.1:${19100 + i}`, ready: true, engine: "vllm", ts: Date.now() });
    }
    const common = { nats: nats.url, port: 0, host: "127.0.0.1", adminPort: -1, log, consistency: mode, heartbeatIntervalMs: 200, shutdownGraceMs: 300, ...(opts.foldPaceMs !== undefined ? { foldPaceMs: opts.foldPaceMs } : {}) } as const;
    const a = await startGateway({ ...common, id: "lag-a" });
    gateways.push(a);
    const b = await startGateway({ ...common, id: "lag-b" });
    gateways.push(b);
    await Promise.all([a.whenReady(), b.whenReady()]);

    const decidedAt = new Map<string, number>();
    /** Kept for the breakdown after `decidedAt` lost the entry (the core subscriber may come second). */
    const decisions = new Map<string, number>();
    const lags: number[] = [];
    const toPublish: number[] = [];
    const toCoreSub: number[] = [];
    let measuring = false;
    hookCharges(a.views.ledger, a.id, (id, t) => {
      if (!measuring) return;
      decidedAt.set(id, t);
      decisions.set(id, t);
    });
    const chargePrefix = s.all("charges").replace(/>$/, "");
    const sinceDecision = (into: number[], data: Uint8Array) => {
      const t = performance.now();
      const id = chargeIdOf(data);
      const t0 = id === undefined ? undefined : decisions.get(id);
      if (t0 !== undefined) into.push(t - t0);
    };
    const nc = a.nats.nc;
    const publish = nc.publish.bind(nc);
    nc.publish = (subject, payload, options) => {
      if (subject.startsWith(chargePrefix) && payload instanceof Uint8Array) sinceDecision(toPublish, payload);
      publish(subject, payload, options);
    };
    const coreSub = h.nc.subscribe(s.all("charges"), { callback: (_err, m) => sinceDecision(toCoreSub, m.data) });
    await h.nc.flush();
    hookCharges(b.views.ledger, a.id, (id, t) => {
      const t0 = decidedAt.get(id);
      if (t0 === undefined) return;
      decidedAt.delete(id);
      lags.push(t - t0);
    });

    client = new ExtProcClient(`127.0.0.1:${a.port}`, { closeMode: "reset" });
    const c = client;
    const routeOne = async () => {
      const ex = c.open();
      try {
        const hr = await ex.requestHeaders(HEADERS);
        if (hr.kind !== "continue") throw new Error(`request headers refused (${hr.status})`);
        const br = await ex.requestBody(BODY);
        if (br.kind !== "continue") throw new Error(`request not routed: ${br.status} ${br.body.toString().slice(0, 200)}`);
      } finally {
        // The client leaves: A releases the charge, so neither ledger grows over the run.
        ex.cancel();
      }
    };

    console.error(`charge-lag: A -> B, ${mode}, ${rate} req/s one at a time, ${warmupMs} ms warm-up + ${durationMs} ms measured`);
    const interval = 1000 / rate;
    const t0 = performance.now();
    const end = t0 + warmupMs + durationMs;
    let sent = 0;
    for (let i = 0; ; i++) {
      const due = t0 + i * interval;
      if (due >= end) break;
      const wait = due - performance.now();
      // Open loop on a schedule; a late request goes at once rather than shifting the rest.
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      measuring = due >= t0 + warmupMs;
      if (measuring) sent++;
      await routeOne();
    }
    measuring = false;
    // Give the last charges time to arrive; anything still missing after that is reported.
    const graceEnd = performance.now() + 2_000;
    while (decidedAt.size > 0 && performance.now() < graceEnd) await new Promise((r) => setTimeout(r, 5));
    // The plain core subscriber may come second (a loaded machine): let its breakdown catch up too.
    while (toCoreSub.length < lags.length && performance.now() < graceEnd) await new Promise((r) => setTimeout(r, 5));

    const sorted = Float64Array.from(lags).sort();
    const result: ChargeLagResult = {
      bench: "charge-lag",
      mode,
      p50_ms: round3(percentile(sorted, 0.5)),
      p99_ms: round3(percentile(sorted, 0.99)),
      max_ms: round3(sorted.length ? (sorted[sorted.length - 1] ?? 0) : 0),
      mean_ms: round3(lags.length ? lags.reduce((x, y) => x + y, 0) / lags.length : 0),
      samples: lags.length,
      fold_pace_ms: opts.foldPaceMs ?? DEFAULT_FOLD_PACE_MS,
      missing: decidedAt.size,
      breakdown: { publish: summary(toPublish), core_nats: summary(toCoreSub) },
    };
    coreSub.unsubscribe();
    const bd = result.breakdown;
    console.error(
      `sent ${sent}, arrived ${result.samples}, missing ${result.missing} | lag p50 ${result.p50_ms} ms, p99 ${result.p99_ms} ms, max ${result.max_ms} ms, mean ${result.mean_ms} ms\n` +
        `  decision -> A publishes: p50 ${bd.publish.p50_ms} ms, p99 ${bd.publish.p99_ms} ms (${bd.publish.samples}) | decision -> core-NATS subscriber: p50 ${bd.core_nats.p50_ms} ms, p99 ${bd.core_nats.p99_ms} ms (${bd.core_nats.samples})`,
    );
    return result;
  } finally {
    client?.close();
    await Promise.allSettled(gateways.map((g) => g.close()));
    await h?.nc.close();
    await nats?.stop();
  }
}
