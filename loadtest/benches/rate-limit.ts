/**
 * `npm run bench -- rate-limit`: how far a per-user limit shared by R gateway replicas can be
 * overshot (issue "Consistent load": "a user cannot get N x the limit by spreading over N
 * replicas; state the allowed overshoot and measure it").
 *
 * Per cell (replica count R x gap between requests): a fresh nats-server, 4 pods, R gateway
 * replicas (processes by default), a per-user limit of `limit` requests per minute (config key
 * `limits`, `users.default`). Each burst is a new user sending `requests` requests spread
 * round-robin over the replicas: all streams opened and headers sent first, then the bodies at
 * once (`gapMs` 0: every replica decides before any other replica's charge can reach it) or
 * `gapMs` apart. Admitted = requests routed (not 429). Overshoot = admitted - limit. One
 * unmeasured burst per cell warms the replicas up.
 *
 * What to expect: with bodies at once each replica sees only its own admissions, so up to
 * min(requests / R, limit) per replica get through: R x the limit in the worst case. With gaps
 * above the charge propagation delay (see the charge-lag bench) every replica counts every
 * other's admissions and the overshoot is what is admitted inside one delay.
 */
import type { ExtProcClient } from "../../services/extproc/envoy-client.js";
import { configBucketName } from "../../streams/definitions.js";
import { Kvm } from "@nats-io/kv";
import { RATE_LIMITS_KEY } from "../../schemas/config.js";
import { type ConsistencyMode, DRAIN_TIMEOUT_MS, pollAll, startReplicaCell } from "../replicas.js";

export interface RateLimitBenchOptions {
  replicas?: number[];
  /** Gaps between consecutive bodies of a burst, ms (0 = all at once). */
  gapsMs?: number[];
  /** Requests per minute allowed per user. */
  limit?: number;
  /** Requests per burst (one new user per burst). */
  requests?: number;
  bursts?: number;
  mode?: ConsistencyMode;
  inProcess?: boolean;
}

export interface RateLimitRow {
  replicas: number;
  gap_ms: number;
  /** Mean admitted per burst. */
  admitted: number;
  admitted_worst: number;
  /** Mean admitted - limit. */
  overshoot: number;
  overshoot_worst: number;
}

const MODEL = "bench/rate-limit";
const HEADERS = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "bench", "content-type": "application/json" };
const BODY = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello" }], stream: true }));

async function burst(clients: ExtProcClient[], user: string, requests: number, gapMs: number): Promise<number> {
  const exchanges = Array.from({ length: requests }, (_, i) => (clients[i % clients.length] as ExtProcClient).open());
  try {
    const heads = await Promise.all(exchanges.map((ex) => ex.requestHeaders({ ...HEADERS, user })));
    if (heads.some((h) => h.kind !== "continue")) throw new Error("request headers refused");
    const pending = [];
    const t0 = performance.now();
    for (const [i, ex] of exchanges.entries()) {
      if (gapMs > 0) {
        const wait = t0 + i * gapMs - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      }
      const reply = ex.requestBody(BODY);
      reply.catch(() => {});
      pending.push(reply);
    }
    let admitted = 0;
    for (const r of await Promise.all(pending)) {
      if (r.kind === "continue") admitted++;
      else if (r.status !== 429) throw new Error(`unexpected ${r.status}: ${r.body.toString().slice(0, 200)}`);
    }
    return admitted;
  } finally {
    for (const ex of exchanges) ex.cancel();
  }
}

async function runCell(replicaCount: number, gapMs: number, o: Required<RateLimitBenchOptions>): Promise<RateLimitRow> {
  const cell = await startReplicaCell({
    model: MODEL, pods: 4, basePort: 19100, replicas: replicaCount, mode: o.mode, inProcess: o.inProcess, heartbeatMs: 200, idPrefix: `rl-${replicaCount}-${gapMs}`,
    before: async (h) => {
      const kv = await new Kvm(h.nc).open(configBucketName("jr"));
      await kv.put(RATE_LIMITS_KEY, JSON.stringify({ users: { default: { rpm: o.limit } } }));
    },
  });
  const { replicas, clients } = cell;
  try {
    // One unmeasured burst first (another user): a replica's first burst runs on cold code and
    // fresh connections, several times slower than a running replica's.
    await burst(clients, `warm-${replicaCount}-${gapMs}`, o.requests, gapMs);
    await pollAll(replicas, (st) => st.inFlight === 0, DRAIN_TIMEOUT_MS, "every replica to release the warm-up burst");
    const admitted: number[] = [];
    for (let b = 0; b < o.bursts; b++) {
      // A burst must not straddle a minute boundary (the window would reset inside it).
      const intoMinute = Date.now() % 60_000;
      if (intoMinute > 58_000) await new Promise((r) => setTimeout(r, 60_000 - intoMinute + 20));
      admitted.push(await burst(clients, `user-${replicaCount}-${gapMs}-${b}`, o.requests, gapMs));
      await pollAll(replicas, (st) => st.inFlight === 0, DRAIN_TIMEOUT_MS, "every replica to release the burst");
    }
    const mean = admitted.reduce((a, x) => a + x, 0) / admitted.length;
    const worst = Math.max(...admitted);
    const row: RateLimitRow = {
      replicas: replicaCount,
      gap_ms: gapMs,
      admitted: Math.round(mean * 100) / 100,
      admitted_worst: worst,
      overshoot: Math.round((mean - o.limit) * 100) / 100,
      overshoot_worst: worst - o.limit,
    };
    console.error(`R=${String(replicaCount).padStart(2)} gap ${String(gapMs).padStart(2)} ms  admitted ${row.admitted} (worst ${worst}) of ${o.requests}, limit ${o.limit}: overshoot ${row.overshoot} (worst ${row.overshoot_worst})  bursts: ${admitted.join(" ")}`);
    return row;
  } finally {
    await cell.stop();
  }
}

export async function runRateLimitBench(opts: RateLimitBenchOptions = {}): Promise<Record<string, unknown>> {
  const o: Required<RateLimitBenchOptions> = {
    replicas: opts.replicas ?? [1, 2, 4],
    gapsMs: opts.gapsMs ?? [0, 2],
    limit: opts.limit ?? 20,
    requests: opts.requests ?? 60,
    bursts: opts.bursts ?? 5,
    mode: opts.mode ?? "eventual",
    inProcess: opts.inProcess ?? false,
  };
  console.error(`rate-limit: ${o.requests} requests per burst from one user, limit ${o.limit}/min, round-robin over the replicas, ${o.bursts} bursts per cell, ${o.mode} consistency, replicas as ${o.inProcess ? "in-process gateways" : "processes"}`);
  const results: RateLimitRow[] = [];
  for (const r of o.replicas) for (const g of o.gapsMs) results.push(await runCell(r, g, o));
  return { bench: "rate-limit", limit: o.limit, requests: o.requests, bursts: o.bursts, mode: o.mode, replica_kind: o.inProcess ? "in-process" : "process", results };
}
