/**
 * Gateway replicas for the multi-replica benchmarks (herding, rate-limit): as child processes
 * (separate event loops, deciding in parallel as real replicas do; read through /debug/state) or
 * in-process (one event loop; faster, a different race), behind one interface.
 */
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { startGateway } from "../services/gateway/gateway.js";
import type { StrictStats } from "../services/gateway/strict-commit.js";
import { createLogger } from "../services/shared/log.js";
import { connectNats, type NatsHandles } from "../services/shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../services/shared/processes.js";
import { acked } from "../services/shared/publish.js";
import { applyStreams } from "../streams/apply.js";
import { Subjects } from "../streams/subjects.js";

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
      ...(process.env.JR_FOLD_PACE_MS ? ["--fold-pace-ms", process.env.JR_FOLD_PACE_MS] : []),
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
    ...(process.env.JR_FOLD_PACE_MS ? { foldPaceMs: Number(process.env.JR_FOLD_PACE_MS) } : {}),
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

export interface ReplicaCellOptions {
  model: string;
  pods: number;
  /** Pod i is published at 127.0.0.1:(basePort + i) (never contacted: nothing is forwarded). */
  basePort: number;
  replicas: number;
  mode: ConsistencyMode;
  inProcess: boolean;
  heartbeatMs: number;
  /** Replica ids are `${idPrefix}-${i}`. */
  idPrefix: string;
  /** Runs after the streams exist and before the replicas start (e.g. writing config). */
  before?: (h: NatsHandles) => Promise<void>;
}

/** A fresh nats-server with the pods published, R ready replicas that know each other, and a client per replica. */
export interface ReplicaCell {
  replicas: Replica[];
  clients: ExtProcClient[];
  stop(): Promise<void>;
}

export async function startReplicaCell(o: ReplicaCellOptions): Promise<ReplicaCell> {
  let nats: NatsServerHandle | undefined;
  let h: NatsHandles | undefined;
  const replicas: Replica[] = [];
  const clients: ExtProcClient[] = [];
  const stop = async () => {
    for (const c of clients) c.close();
    await Promise.allSettled(replicas.map((r) => r.stop()));
    await h?.nc.close();
    await nats?.stop();
  };
  try {
    nats = await startNatsServer();
    h = await connectNats(nats.url);
    await applyStreams(h.nc, h.jsm);
    const s = new Subjects();
    for (let i = 0; i < o.pods; i++) {
      const pod = `pod-${i}`;
      await acked(h.js, s.pod(o.model, pod), { type: "pod", action: "upsert", model: o.model, pod, address: `127.0.0.1:${o.basePort + i}`, ready: true, engine: "vllm", ts: Date.now() });
    }
    await o.before?.(h);
    const start = o.inProcess ? inProcessReplica : processReplica;
    const natsUrl = nats.url;
    const started = await Promise.allSettled(Array.from({ length: o.replicas }, (_, i) => start(`${o.idPrefix}-${i}`, natsUrl, o.mode, o.heartbeatMs)));
    for (const r of started) if (r.status === "fulfilled") replicas.push(r.value);
    const failed = started.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
    await pollAll(replicas, (st) => st.ready && st.pods === o.pods, READY_TIMEOUT_MS, "replicas ready with every pod");
    // Sharing modes: every replica has heard every other's heartbeat, as in a running deployment
    // (a replica that knows no peers breaks ties at random, like `off`).
    if (o.mode !== "off") await pollAll(replicas, (st) => st.gateways === o.replicas, READY_TIMEOUT_MS, "replicas to see each other's heartbeats");
    for (const r of replicas) clients.push(new ExtProcClient(`127.0.0.1:${r.port}`, { messageTimeoutMs: 10_000, closeMode: "reset" }));
    return { replicas, clients, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
