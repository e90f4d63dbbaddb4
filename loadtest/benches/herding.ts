/**
 * `node --expose-gc dist/loadtest/bench.js herding`: how evenly a simultaneous burst lands on the
 * pods when several gateway replicas route it (issue "Consistent load across gateway replicas";
 * AIBrix issue 2422: bursts land on the same pod between selection and accounting).
 *
 * Per cell (replica count R x consistency mode): a fresh nats-server, `pods` pods published to
 * PODS (never contacted: nothing is forwarded), R gateway replicas with least-request. Each burst
 * opens `requests` ext_proc streams spread over the replicas, sends every stream's request headers
 * and waits for their replies, then sends every body in one synchronous loop so the selections
 * race (or `staggerMs` apart). The pod each request went to is read from the reply's
 * `x-gateway-destination-endpoint`; `max_over_mean` = the busiest pod's count / (requests / pods).
 * All streams are then cancelled and the bench waits until every replica's ledger is empty
 * before the next burst.
 *
 * Reading the figures: a replica charges its own pick synchronously, so it never stacks its own
 * requests. With the default round-robin spread every replica gets requests/R of a burst from an
 * idle state and least-request spreads those evenly by itself: `off` is 1.000 by construction,
 * whatever R. Herding needs replicas with unequal shares (`spread: "random"`) or pre-existing load
 * one replica cannot see; and `eventual` can only help with what has propagated, so bodies sent
 * at once (inside the charge lag) leave it about as blind as `off`; `staggerMs` above the lag
 * shows the difference.
 *
 * Replicas are separate processes by default so that they decide in parallel (two cores), as real
 * replicas do; `inProcess` runs them on this process's event loop instead, where a replica's
 * bodies and other replicas' charge deliveries are serialised by one loop — a different race.
 * A fresh nats-server per cell keeps one cell's stream history out of the next cell's replay.
 */
import type { ExtProcClient, PhaseResult } from "../../services/extproc/envoy-client.js";
import type { StrictStats } from "../../services/gateway/strict-commit.js";
import { type ConsistencyMode, DRAIN_TIMEOUT_MS, pollAll, type ReplicaState, startReplicaCell } from "../replicas.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";

export type HerdingMode = ConsistencyMode;

export interface HerdingBenchOptions {
  /** Replica counts to test (default 1, 2, 4, 8). */
  replicas?: number[];
  modes?: HerdingMode[];
  /** Bursts per cell (default 5). */
  bursts?: number;
  /** Requests per burst (default 64). */
  requests?: number;
  /** Pods of the one model (default 8). */
  pods?: number;
  /**
   * How a burst's requests are assigned to replicas: `round-robin` (request i to replica i mod R,
   * every replica gets the same share) or `random` (independent uniform picks, as an L4 balancer
   * in front of the replicas would make; shares differ from burst to burst). Default round-robin.
   */
  spread?: "round-robin" | "random";
  /** Replicas on this process's event loop instead of child processes (faster, different race). */
  inProcess?: boolean;
  /** Seed for the `random` spread (the gateways' own tie-breaking is not seeded). */
  seed?: number;
  /** Heartbeat interval of the replicas (default 200 ms). */
  heartbeatMs?: number;
  /**
   * Gap between consecutive bodies (default 0: all in one synchronous loop). Above the charge
   * propagation lag (see the charge-lag bench) each replica sees the others' earlier charges, so
   * this separates "blind during the lag" from "blind for good" (off).
   */
  staggerMs?: number;
}

export interface HerdingRow {
  replicas: number;
  mode: HerdingMode;
  /** Mean over the bursts of max-per-pod / (requests / pods). */
  max_over_mean: number;
  /** Worst burst. */
  max_over_mean_worst: number;
  /** Strict mode only: lost compare-and-sets and charges published without one, over the cell. */
  strict_conflicts?: number;
  strict_fallbacks?: number;
}

export interface HerdingResult {
  bench: "herding";
  spread: "round-robin" | "random";
  replica_kind: "process" | "in-process";
  stagger_ms: number;
  bursts: number;
  requests: number;
  pods: number;
  results: HerdingRow[];
}

const MODEL = "bench/herding";
const ENDPOINT_HEADER = "x-gateway-destination-endpoint";
const HEADERS = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "bench", "content-type": "application/json" };
const BODY = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello there" }], stream: true }));
interface BurstOutcome {
  perPod: Map<string, number>;
  maxOverMean: number;
}

async function burst(clients: ExtProcClient[], assign: (i: number) => number, requests: number, pods: number, staggerMs: number): Promise<BurstOutcome> {
  const exchanges = Array.from({ length: requests }, (_, i) => (clients[assign(i)] as ExtProcClient).open());
  try {
    const heads = await Promise.all(exchanges.map((ex) => ex.requestHeaders(HEADERS)));
    const refused = heads.find((h) => h.kind !== "continue");
    if (refused) throw new Error(`request headers refused: ${describe(refused)}`);
    let pending: Array<Promise<PhaseResult>>;
    if (staggerMs <= 0) {
      // One synchronous loop: every body is written before any reply can be handled here.
      pending = exchanges.map((ex) => ex.requestBody(BODY));
    } else {
      // On a fixed schedule from the first body, so timer lateness does not accumulate; but never
      // closer than half the spacing to the previous body: a loop that fell behind (a loaded host)
      // catches up at half pace instead of firing the late bodies as one burst, which would test
      // the simultaneous case instead of this one.
      pending = [];
      const t0 = performance.now();
      let last = Number.NEGATIVE_INFINITY;
      for (const [i, ex] of exchanges.entries()) {
        const wait = Math.max(t0 + i * staggerMs, last + staggerMs / 2) - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        last = performance.now();
        const reply = ex.requestBody(BODY);
        // Handled by Promise.all below; until then a failure must not count as unhandled.
        reply.catch(() => {});
        pending.push(reply);
      }
    }
    const replies = await Promise.all(pending);
    const perPod = new Map<string, number>();
    for (const r of replies) {
      const endpoint = r.kind === "continue" ? r.headerMutation.set[ENDPOINT_HEADER] : undefined;
      if (endpoint === undefined) throw new Error(`a request was not routed: ${describe(r)}`);
      perPod.set(endpoint, (perPod.get(endpoint) ?? 0) + 1);
    }
    const max = Math.max(...perPod.values());
    return { perPod, maxOverMean: max / (requests / pods) };
  } finally {
    // Client gone, as Envoy reports it: every replica releases its charges.
    for (const ex of exchanges) ex.cancel();
  }
}

function describe(r: PhaseResult): string {
  return r.kind === "immediate" ? `immediate ${r.status} ${r.body.toString().slice(0, 200)}` : `continue without ${ENDPOINT_HEADER}`;
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

async function runCell(replicaCount: number, mode: HerdingMode, o: Required<HerdingBenchOptions>, cellIndex: number): Promise<HerdingRow> {
  const cell = await startReplicaCell({
    model: MODEL, pods: o.pods, basePort: 19000, replicas: replicaCount, mode, inProcess: o.inProcess, heartbeatMs: o.heartbeatMs, idPrefix: `herd-${mode}-${replicaCount}`,
  });
  const { replicas, clients } = cell;
  try {
    const rand = mulberry32(o.seed + cellIndex);
    const assign = o.spread === "round-robin" ? (i: number) => i % replicaCount : () => Math.floor(rand() * replicaCount);
    const before = await Promise.all(replicas.map((r) => r.state()));
    const ratios: number[] = [];
    for (let b = 0; b < o.bursts; b++) {
      const out = await burst(clients, assign, o.requests, o.pods, o.staggerMs);
      ratios.push(out.maxOverMean);
      await pollAll(replicas, (st) => st.charges === 0 && st.inFlight === 0, DRAIN_TIMEOUT_MS, "every ledger to drain after a burst");
    }
    const after = await Promise.all(replicas.map((r) => r.state()));
    const row: HerdingRow = {
      replicas: replicaCount,
      mode,
      max_over_mean: round3(ratios.reduce((a, x) => a + x, 0) / ratios.length),
      max_over_mean_worst: round3(Math.max(...ratios)),
    };
    if (mode === "strict") {
      const sum = (st: ReplicaState[], k: keyof StrictStats) => st.reduce((a, x) => a + (x.strict?.[k] ?? 0), 0);
      row.strict_conflicts = sum(after, "conflicts") - sum(before, "conflicts");
      row.strict_fallbacks = sum(after, "fallbacks") - sum(before, "fallbacks");
    }
    const strictNote = mode === "strict" ? `  (strict: ${row.strict_conflicts} conflicts, ${row.strict_fallbacks} fallbacks)` : "";
    console.error(
      `R=${String(replicaCount).padStart(2)} ${mode.padEnd(8)}  max/mean ${row.max_over_mean.toFixed(3)} (worst ${row.max_over_mean_worst.toFixed(3)})  bursts: ${ratios.map((x) => x.toFixed(3)).join(" ")}${strictNote}`,
    );
    return row;
  } finally {
    await cell.stop();
  }
}

export async function runHerdingBench(opts: HerdingBenchOptions = {}): Promise<HerdingResult> {
  const o: Required<HerdingBenchOptions> = {
    replicas: opts.replicas ?? [1, 2, 4, 8],
    modes: opts.modes ?? ["off", "eventual", "strict"],
    bursts: opts.bursts ?? 5,
    requests: opts.requests ?? 64,
    pods: opts.pods ?? 8,
    spread: opts.spread ?? "round-robin",
    inProcess: opts.inProcess ?? false,
    seed: opts.seed ?? 1,
    heartbeatMs: opts.heartbeatMs ?? 200,
    staggerMs: opts.staggerMs ?? 0,
  };
  console.error(
    `herding: ${o.requests} requests per burst over ${o.pods} pods, least-request, ${o.bursts} bursts per cell, ${o.spread} spread, ${o.staggerMs ? `bodies ${o.staggerMs} ms apart` : "bodies at once"}, replicas as ${o.inProcess ? "in-process gateways" : "processes"}`,
  );
  const results: HerdingRow[] = [];
  let cell = 0;
  for (const r of o.replicas) for (const mode of o.modes) results.push(await runCell(r, mode, o, cell++));
  return {
    bench: "herding",
    spread: o.spread,
    replica_kind: o.inProcess ? "in-process" : "process",
    stagger_ms: o.staggerMs,
    bursts: o.bursts,
    requests: o.requests,
    pods: o.pods,
    results,
  };
}
