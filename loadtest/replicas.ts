/**
 * Gateway replicas for the multi-replica benchmarks (herding, rate-limit): as child processes
 * (separate event loops, deciding in parallel as real replicas do; read through /debug/state) or
 * in-process (one event loop; faster, a different race), behind one interface.
 */
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startGateway } from "../services/gateway/gateway.js";
import type { StrictStats } from "../services/gateway/strict-commit.js";
import { createLogger } from "../services/shared/log.js";
import { type ServiceProcess, spawnJetroute } from "../services/shared/processes.js";

/** How a replica shares charges (`--consistency`). */
export type ConsistencyMode = "off" | "eventual" | "strict";

/** Upper bound for a replica to become ready, and for ledgers to drain after a burst. */
export const READY_TIMEOUT_MS = 30_000;
export const DRAIN_TIMEOUT_MS = 10_000;

/** What the bench needs to see of a replica, whichever way it runs. */
export interface ReplicaState {
  ready: boolean;
  pods: number;
  /** Entries in the replica's ledger (its own charges, plus other replicas' unless mode is off). */
  charges: number;
  inFlight: number;
  /** Live gateways this replica knows of, itself included (what its tie-break stagger is based on). */
  gateways: number;
  strict?: StrictStats;
}

export interface Replica {
  id: string;
  port: number;
  state(): Promise<ReplicaState>;
  stop(): Promise<void>;
}

interface DebugState {
  ready: boolean;
  pods: unknown[];
  ledger: { charges: number; liveGateways: Array<{ gateway: string }> };
  inFlight: number;
  strict?: StrictStats;
}

export async function processReplica(id: string, natsUrl: string, mode: ConsistencyMode, heartbeatMs: number, strategy = "least-request"): Promise<Replica> {
  // The admin port (not -1) is on so the bench can see readiness and the ledger drain between bursts.
  const proc: ServiceProcess = spawnJetroute(
    id,
    [
      "gateway", "--nats", natsUrl, "--id", id, "--port", "0", "--admin-port", "0", "--host", "127.0.0.1",
      "--heartbeat-ms", String(heartbeatMs), "--strategy", strategy, "--consistency", mode, "--shutdown-grace-ms", "500", ...(process.env.JR_RATE_CONFIRM_MS ? ["--rate-confirm-ms", process.env.JR_RATE_CONFIRM_MS] : []),
    ],
    { env: { JETROUTE_LOG_LEVEL: "warn" } },
  );
  try {
    const line = await proc.waitForLine<{ port: number; adminPort: number }>((v) => typeof v.port === "number", READY_TIMEOUT_MS);
    const url = `http://127.0.0.1:${line.adminPort}/debug/state`;
    return {
      id,
      port: line.port,
      async state() {
        const s = (await (await fetch(url)).json()) as DebugState;
        const gateways = new Set([id, ...s.ledger.liveGateways.map((g) => g.gateway)]).size;
        return { ready: s.ready, pods: s.pods.length, charges: s.ledger.charges, inFlight: s.inFlight, gateways, ...(s.strict ? { strict: s.strict } : {}) };
      },
      stop: () => proc.stop(),
    };
  } catch (err) {
    await proc.stop();
    throw err;
  }
}

const silent = createLogger("bench-replica", "silent");

export async function inProcessReplica(id: string, natsUrl: string, mode: ConsistencyMode, heartbeatMs: number, strategy = "least-request"): Promise<Replica> {
  const gw: GatewayHandle = await startGateway({
    nats: natsUrl, id, port: 0, host: "127.0.0.1", adminPort: -1, log: silent, defaultStrategy: strategy,
    consistency: mode, heartbeatIntervalMs: heartbeatMs, shutdownGraceMs: 500, ...(process.env.JR_RATE_CONFIRM_MS ? { rateConfirmMs: Number(process.env.JR_RATE_CONFIRM_MS) } : {}),
  });
  return {
    id,
    port: gw.port,
    state: async () => ({
      ready: gw.ready(),
      pods: gw.views.pods.size,
      charges: gw.views.ledger.size,
      inFlight: gw.director.inFlight.size,
      gateways: gw.views.ledger.rank(Date.now()).count,
      ...(gw.strict ? { strict: { ...gw.strict.stats } } : {}),
    }),
    stop: () => gw.close(),
  };
}

export async function pollAll(replicas: Replica[], ok: (s: ReplicaState) => boolean, timeoutMs: number, what: string): Promise<ReplicaState[]> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const states = await Promise.all(replicas.map((r) => r.state()));
    if (states.every(ok)) return states;
    if (performance.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${JSON.stringify(states.map((s, i) => ({ id: replicas[i]?.id, ...s })))}`);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
}
