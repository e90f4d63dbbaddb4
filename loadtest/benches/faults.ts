/**
 * `node --expose-gc dist/loadtest/bench.js faults`: faults under load (hardening issue "Faults
 * under load"). Each case returns `{case, requests, failed, acked_events_lost, heal_ms, ...}`.
 *
 * The load is an open-loop paced driver in this process (ExtProcClient, grpc-js): `rate` requests
 * per second, round-robin over the live gateways; each request sends its headers and body (the
 * routing decision and the charge), is held `holdMs` (an LLM request in flight), then gets its
 * response headers and last body chunk (the release). The closed-loop generator
 * (loadtest/extproc-load.ts) has no response delay, so it cannot keep requests in flight at a
 * known rate; it is not used here. "Failed" is a request that got a transport/stream error; an
 * immediate response (e.g. 503 while no pod is known) is counted apart as `immediate`.
 *
 * Heal times are measured with probe requests on a separate model (one pod, `probe/model`) held
 * open on every gateway: "charges flow again" = every gateway's ledger holds every gateway's probe
 * charge (whether it arrived as a charge message or via a heartbeat's reconciliation). That keeps
 * the measurement out of the noise of the main load.
 *
 * Cases:
 * - kill-gateway: 3 gateway processes; SIGKILL one under load. The victim is removed from the
 *   driver's rotation at the kill (what the L4 balancer / Envoy's health check does: the time to
 *   detect it is the balancer's, not jetroute's). heal_ms = kill until no survivor lists the victim
 *   (its charges dropped with its lapsed heartbeat).
 * - kill-nats-node-eventual / -strict: 3-node cluster, R3 streams, 3 in-process gateways (in
 *   process so the strict compare-and-set acks can be recorded); SIGKILL the CHARGES stream leader.
 *   acked_events_lost (strict) = committed charges whose ack sequence is absent from CHARGES
 *   afterwards. Eventual charges are fire-and-forget (never acked): for both modes the charges
 *   published vs held by the stream is reported as `charges_published` / `charges_missing`.
 * - kill-nats-node-batch: 3-node cluster, R3 streams, batch-api and two batch-workers in process
 *   (each worker connected to another node first), sim pods as the workers' target; a batch of
 *   `batchItems` items, SIGKILL of the work queue's (JR_BATCH_WORK) leader once a quarter of the
 *   items have results. lost = input lines without an output line, duplicated = output lines past
 *   one per custom_id; heal_ms = kill until the batch is completed.
 * - nats-down-30s: single node, SIGKILL it for `outageMs`, keep routing (2 gateway processes),
 *   record /readyz and gRPC health during the outage, restart nats-server on the same port and
 *   store dir. heal_ms = restart until the probes opened during the outage are in every ledger.
 * - kill-kv-bridge: sim fleet with KV events, the kv-bridge as a process, SIGKILL it mid-workload,
 *   restart it; heal_ms = restart until an in-process gateway's index agrees with the engines'
 *   caches (>= 99% of the blocks, as test/prefix-routing.test.ts).
 * - clock-skew: in-process gateways (the `clock` option exists only in process), one with its clock
 *   +5 s, then -5 s, one peer; count samples where the skewed gateway holds the peer as dead, and
 *   check its own charges are released everywhere after the load.
 *
 * `runFaultsBench` runs each case in a process of its own under a time limit (loadtest/case-process.ts):
 * a case past it is stopped with every process and server it started, and the others still run; a
 * case's leftovers (an open connection, a timer) cannot keep the bench alive after its last line.
 * Inside a case every wait has a deadline (`until`, `withDeadline`, HTTP timeouts, bounded closes).
 */
import { DeliverPolicy } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { ExtProcClient, type ExtProcExchange } from "../../services/extproc/envoy-client.js";
import { apiKeyBucketKey, generateApiKey, hashApiKey } from "../../services/gateway/auth.js";
import type { GatewayHandle, } from "../../services/gateway/gateway.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { freePort, type NatsServerHandle, startNatsCluster, startNatsServer } from "../../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import { type SimFleet, startSimFleet } from "../../services/sim/fleet.js";
import { routerHashesOf } from "../../services/sim/router-hashes.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { applyStreams } from "../../streams/apply.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { runCaseProcess, stopCasesOnSignals } from "../case-process.js";
import { createLogger } from "../../services/shared/log.js";
import { type BatchApiHandle, startBatchApi } from "../../services/batch/api.js";
import { type BatchWorkerHandle, startBatchWorker } from "../../services/batch/worker.js";
import { compiledScript } from "../child.js";

export type FaultCaseName = "kill-gateway" | "kill-nats-node-eventual" | "kill-nats-node-strict" | "kill-nats-node-batch" | "nats-down-30s" | "kill-kv-bridge" | "clock-skew";
export const FAULT_CASES: readonly FaultCaseName[] = ["kill-gateway", "kill-nats-node-eventual", "kill-nats-node-strict", "kill-nats-node-batch", "nats-down-30s", "kill-kv-bridge", "clock-skew"];

export interface FaultCaseResult {
  case: FaultCaseName;
  requests: number;
  failed: number;
  acked_events_lost: number;
  heal_ms: number;
  [detail: string]: unknown;
}

/** A case stopped at its time limit (every process it started killed). */
export interface FaultCaseTimedOut {
  case: FaultCaseName;
  timed_out: true;
  elapsed_ms: number;
}

/** A case that threw (its message), or whose process ended without a result. */
export interface FaultCaseFailed {
  case: FaultCaseName;
  error: string;
  elapsed_ms: number;
}

export type FaultCaseOutcome = (FaultCaseResult & { elapsed_ms: number }) | FaultCaseTimedOut | FaultCaseFailed;

export interface FaultsResult {
  bench: "faults";
  cases: FaultCaseOutcome[];
  /** The whole suite, wall time. */
  total_ms: number;
}

export interface FaultsOptions {
  cases?: FaultCaseName[];
  /** Requests per second of the driver (default 500 for kill-gateway, 200 in process). */
  rate?: number;
  /** In-process cases (NATS node, clock skew): the driver shares the loop with the gateways. */
  inProcessRate?: number;
  /** How long each request is held between its routing and its release (default 200 ms). */
  holdMs?: number;
  /** Load before and after the fault (default 5 s each). */
  phaseMs?: number;
  /** NATS outage of nats-down-30s (default 30 s). */
  outageMs?: number;
  /** Gateways' heartbeat interval (default 200 ms; timeout 3x). */
  heartbeatMs?: number;
  /** Skews of clock-skew (default +5 s and -5 s). */
  skewsMs?: number[];
  /** kill-kv-bridge: chat requests before and after the kill (default 60 each). */
  kvRequests?: number;
  /** kill-nats-node-batch: items of the batch (default 400). */
  batchItems?: number;
  /** Time limit of every case, or per case (default 0: each case's own, `faultCaseLimitMs`). */
  caseTimeoutMs?: number | Partial<Record<FaultCaseName, number>>;
}

import { applyWithRetry, Load, closeAll, finish, type Gw, HEADERS, HTTP_TIMEOUT_MS, inProcessGw, lastProbeRoutedMsOf, log, MODEL, openProbe, PROBE_MODEL, PROBE_POD, probesEverywhere, processGw, publishPods, silent, sleep, type Target, until, waitMesh, } from "./faults-fleet.js";

const round = (x: number) => Math.round(x);

// ---------------------------------------------------------------- kill-gateway

export async function killGatewayCase(o: Required<FaultsOptions>): Promise<FaultCaseResult> {
  const nats = await startNatsServer();
  const h = await connectNats(nats.url);
  const gws: Gw[] = [];
  let load: Load | undefined;
  try {
    await applyStreams(h.nc, h.jsm);
    await publishPods(h, 8);
    gws.push(...(await Promise.all([0, 1, 2].map((i) => processGw(`kg-${i}`, [nats.url], { mode: "eventual", heartbeatMs: o.heartbeatMs })))));
    await waitMesh(gws);
    const [victim, ...survivors] = gws as [Gw, Gw, Gw];
    load = new Load(gws, o.rate, o.holdMs);
    load.start();
    await sleep(o.phaseMs);
    const victimTarget = load.targets.find((t) => t.id === victim.id) as Target;
    const chargesAtSurvivors = await Promise.all(survivors.map(async (s) => (await s.peers()).get(victim.id) ?? 0));
    const failedBefore = load.stats.failed;
    // Out of the rotation first, then killed: what is in flight at it now is all that may fail.
    load.remove(victim.id);
    const inFlightAtVictim = victimTarget.inFlight;
    const killedAt = performance.now();
    await victim.kill();
    const heal = await until(async () => (await Promise.all(survivors.map((s) => s.peers()))).every((p) => !p.has(victim.id)) || undefined, 30_000, "the victim's charges to leave every survivor's ledger", 10);
    void heal;
    const healMs = performance.now() - killedAt;
    await sleep(Math.max(0, o.phaseMs - healMs));
    const stats = await load.stop();
    // After the load: nothing of anyone left in the survivors' ledgers.
    const drainStart = performance.now();
    await until(async () => (await Promise.all(survivors.map((s) => s.counts()))).every((c) => c.charges === 0 && c.inFlight === 0) || undefined, 10_000, "survivors' ledgers to drain");
    const r: FaultCaseResult = {
      case: "kill-gateway",
      requests: stats.requests,
      failed: stats.failed - failedBefore,
      acked_events_lost: 0,
      heal_ms: round(healMs),
      failed_before_kill: failedBefore,
      in_flight_at_victim: inFlightAtVictim,
      victim_charges_at_survivors: chargesAtSurvivors,
      heartbeat_timeout_ms: 3 * o.heartbeatMs,
      rate: o.rate,
      hold_ms: o.holdMs,
      routed: stats.routed,
      immediate: stats.immediate,
      drain_ms: round(performance.now() - drainStart),
      ...(stats.firstError ? { first_error: stats.firstError } : {}),
    };
    log(`kill-gateway: ${r.requests} requests at ${o.rate}/s, ${r.failed} failed (${inFlightAtVictim} in flight at the victim), victim's charges gone from the survivors after ${r.heal_ms} ms (timeout ${3 * o.heartbeatMs} ms)`);
    return r;
  } finally {
    load?.close();
    await closeAll(gws);
    await h.nc.close();
    await nats.stop();
  }
}

// ---------------------------------------------------------------- kill-nats-node

interface AckRecord {
  gateway: string;
  seq: number;
  subject: string;
}

/** Records the sequence of every acked compare-and-set publish (the strict commits) of `gw`. */
function recordStrictAcks(gw: GatewayHandle, into: AckRecord[]): void {
  const js = gw.nats.js as unknown as { publish: (subject: string, data: unknown, opts?: { expect?: { lastSubjectSequence?: number } }) => Promise<{ seq: number }> };
  const orig = js.publish.bind(js);
  js.publish = async (subject, data, opts) => {
    const ack = await orig(subject, data, opts);
    if (opts?.expect?.lastSubjectSequence !== undefined) into.push({ gateway: gw.id, seq: ack.seq, subject });
    return ack;
  };
}

/** Every message of CHARGES: sequence -> (subject, gateway). */
async function readCharges(h: NatsHandles): Promise<Map<number, { subject: string; gateway: string }>> {
  const stream = streamName("jr", "CHARGES");
  const last = (await h.jsm.streams.info(stream)).state.last_seq;
  const out = new Map<number, { subject: string; gateway: string }>();
  if (last === 0) return out;
  const c = await h.js.consumers.get(stream, { deliver_policy: DeliverPolicy.All });
  let seq = 0;
  while (seq < last) {
    const batch = await c.fetch({ max_messages: 10_000, expires: 2_000 });
    let got = 0;
    for await (const m of batch) {
      got++;
      seq = m.seq;
      let gateway = "";
      try {
        gateway = (m.json() as { gateway?: string }).gateway ?? "";
      } catch {
        /* not an event */
      }
      out.set(m.seq, { subject: m.subject, gateway });
    }
    if (got === 0) break;
  }
  return out;
}

export async function killNatsNodeCase(mode: "eventual" | "strict", o: Required<FaultsOptions>): Promise<FaultCaseResult> {
  const cluster = await startNatsCluster(3);
  let h: NatsHandles | undefined;
  const gws: Gw[] = [];
  let load: Load | undefined;
  const probes: ExtProcExchange[] = [];
  try {
    h = await applyWithRetry(cluster.urls, 3);
    await publishPods(h, 8);
    const urls = cluster.urls;
    // The config watch: the load's key, and a key revoked after the failover (auth required).
    const kv = await new Kvm(h.nc).open(configBucketName("jr"));
    const loadKey = generateApiKey();
    await kv.put(apiKeyBucketKey(hashApiKey(loadKey)), JSON.stringify({ user: "load", createdAt: Date.now() }));
    const key = generateApiKey();
    const hash = hashApiKey(key);
    await kv.put(apiKeyBucketKey(hash), JSON.stringify({ user: "eve", createdAt: Date.now() }));
    const auth = { authorization: `Bearer ${loadKey}` };
    // Each gateway lists every node, starting on a different one.
    for (let i = 0; i < 3; i++) gws.push(await inProcessGw(`nn-${mode}-${i}`, [...urls.slice(i), ...urls.slice(0, i)], { consistency: mode, heartbeatIntervalMs: o.heartbeatMs, auth: "required" }));
    await waitMesh(gws);
    const acks: AckRecord[] = [];
    for (const g of gws) recordStrictAcks(g.handle as GatewayHandle, acks);
    await until(() => gws.every((g) => g.handle?.apiKeys.get(hash) !== undefined) || undefined, 10_000, "the key at every gateway");
    const statusWith = async (g: Gw, k: string) => {
      const c = new ExtProcClient(`127.0.0.1:${g.port}`);
      const ex = c.open();
      try {
        const r = await ex.requestHeaders({ ...HEADERS, authorization: `Bearer ${k}` });
        return r.kind === "immediate" ? r.status : 200;
      } finally {
        ex.cancel();
        c.close();
      }
    };
    const statusBefore = await Promise.all(gws.map((g) => statusWith(g, key)));

    load = new Load(gws, o.inProcessRate, o.holdMs, auth);
    load.start();
    await sleep(o.phaseMs);
    const stream = streamName("jr", "CHARGES");
    const leader = (await h.jsm.streams.info(stream)).cluster?.leader ?? "";
    const victim = cluster.servers.find((s) => leader === `jr-node-${cluster.servers.indexOf(s)}`) ?? (cluster.servers[0] as NatsServerHandle);
    const victimName = `jr-node-${cluster.servers.indexOf(victim)}`;
    const gatewaysOnVictim = gws.filter((g) => g.handle?.nats.nc.getServer().includes(String(victim.port))).map((g) => g.id);
    const failedBefore = load.stats.failed;
    const killedAt = performance.now();
    await victim.kill();
    const clients = load.targets.map((t) => t.client);
    probes.push(...(await probesEverywhere(gws, clients, 60_000, auth)));
    const healMs = performance.now() - killedAt;
    const probesRoutedMs = lastProbeRoutedMsOf();
    // Revoke the key through a surviving node, after the failover; the gateways must refuse it.
    await until(async () => {
      try {
        await kv.put(apiKeyBucketKey(hash), JSON.stringify({ user: "eve", createdAt: 1, disabled: true, revokedAt: Date.now() }));
        return true;
      } catch {
        return undefined;
      }
    }, 30_000, "the revocation to be written", 250);
    const revokedAt = performance.now();
    // A gateway whose config watch was on the killed node reads the revocation once its watch has
    // noticed the stall and been recreated on a survivor: on a loaded 2-core host, past 30 s.
    await until(() => gws.every((g) => g.handle?.apiKeys.get(hash)?.disabled === true) || undefined, 60_000, "the revocation at every gateway");
    const revocationMs = performance.now() - revokedAt;
    const statusAfter = await Promise.all(gws.map((g) => statusWith(g, key)));
    const refused = statusBefore.every((x) => x === 200) && statusAfter.every((x) => x === 401);
    await sleep(Math.max(0, o.phaseMs - healMs));
    const stats = await load.stop();
    for (const p of probes.splice(0)) await finish(p);
    const strictStats = gws.map((g) => ({ ...g.handle?.strict?.stats }));
    // Everything acked must be in the stream (read through a surviving node).
    await sleep(500);
    const admin = h;
    let readError = "";
    const held = await until(
      () =>
        readCharges(admin).catch((err: unknown) => {
          readError = String(err);
          return undefined;
        }),
      30_000,
      "CHARGES to be readable",
      250,
    ).catch(() => undefined);
    // Unreadable CHARGES (seen once under load on this machine): reported as null, not as 0.
    const lostAcks = held ? acks.filter((a) => held.get(a.seq)?.subject !== a.subject || held.get(a.seq)?.gateway !== a.gateway) : undefined;
    const chargePrefix = new Subjects().charges(MODEL, "x").slice(0, -1);
    const heldCharges = held ? [...held.values()].filter((m) => m.subject.startsWith(chargePrefix)).length : Number.NaN;
    const r: FaultCaseResult = {
      case: mode === "strict" ? "kill-nats-node-strict" : "kill-nats-node-eventual",
      requests: stats.requests,
      failed: stats.failed - failedBefore,
      acked_events_lost: lostAcks ? lostAcks.length : Number.NaN,
      ...(held ? {} : { read_error: readError }),
      heal_ms: round(healMs),
      probes_routed_ms: round(probesRoutedMs),
      killed: victimName,
      killed_was_charges_leader: leader === victimName,
      gateways_on_killed_node: gatewaysOnVictim,
      rate: o.inProcessRate,
      routed: stats.routed,
      immediate: stats.immediate,
      strict_acks: acks.length,
      strict: strictStats,
      charges_published: stats.routed,
      charges_in_stream: heldCharges,
      charges_missing: Math.max(0, stats.routed - heldCharges),
      revoked_key_refused: refused,
      revoked_key_status: { before: statusBefore, after: statusAfter },
      revocation_applied_ms: round(revocationMs),
      ...(stats.firstError ? { first_error: stats.firstError } : {}),
    };
    log(
      `${r.case}: killed ${victimName} (CHARGES leader: ${r.killed_was_charges_leader}); ${r.requests} requests, ${r.failed} failed; charges flow again after ${r.heal_ms} ms; ${acks.length} strict acks, ${lostAcks?.length ?? "?"} lost; charges published ${stats.routed}, in the stream ${heldCharges}; revoked key refused: ${refused} (${r.revocation_applied_ms} ms)`,
    );
    return r;
  } finally {
    for (const p of probes) p.cancel();
    load?.close();
    await closeAll(gws);
    await h?.nc.close();
    await cluster.stop();
  }
}

// ---------------------------------------------------------------- nats-down

async function grpcHealth(port: number): Promise<string> {
  // The gRPC health service of the ext_proc port, asked with grpc-js directly.
  const grpc = await import("@grpc/grpc-js");
  const { protoPath } = await import("grpc-health-check");
  const loader = await import("@grpc/proto-loader");
  const def = loader.loadSync(protoPath, { keepCase: true });
  const pkg = grpc.loadPackageDefinition(def) as unknown as { grpc: { health: { v1: { Health: new (addr: string, creds: unknown) => { check(req: { service: string }, opts: { deadline: number }, cb: (err: Error | null, res?: { status: string }) => void): void; close(): void } } } } };
  const client = new pkg.grpc.health.v1.Health(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  try {
    return await new Promise<string>((resolve) => client.check({ service: "" }, { deadline: Date.now() + 2_000 }, (err, res) => resolve(err ? `error: ${err.message}` : String(res?.status))));
  } finally {
    client.close();
  }
}

export async function natsDownCase(o: Required<FaultsOptions>): Promise<FaultCaseResult> {
  const port = await freePort();
  let nats = await startNatsServer({ port });
  const storeDir = nats.storeDir;
  let h: NatsHandles | undefined;
  const gws: Gw[] = [];
  let load: Load | undefined;
  const probes: ExtProcExchange[] = [];
  try {
    h = await connectNats(nats.url);
    await applyStreams(h.nc, h.jsm);
    await publishPods(h, 8);
    await h.nc.close();
    h = undefined;
    gws.push(...(await Promise.all([0, 1].map((i) => processGw(`nd-${i}`, [nats.url], { mode: "eventual", heartbeatMs: o.heartbeatMs })))));
    await waitMesh(gws);
    load = new Load(gws, o.rate, o.holdMs);
    load.start();
    await sleep(o.phaseMs);
    const before = { ...load.stats };
    await nats.kill();
    const downAt = performance.now();
    await sleep(Math.min(2_000, o.outageMs / 2));
    // What readiness says during the outage (reported, not judged).
    const readyz = await Promise.all(gws.map(async (g) => (await fetch(`http://127.0.0.1:${g.adminPort}/readyz`, { signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) })).status));
    const health = await Promise.all(gws.map((g) => grpcHealth(g.port)));
    // Probes opened during the outage: their charges never reached the broker.
    for (const c of load.targets.map((t) => t.client)) {
      const p = await openProbe(c);
      if (p) probes.push(p);
    }
    const probesDuringOutage = probes.length;
    await sleep(Math.max(0, o.outageMs - (performance.now() - downAt)));
    const during = { requests: load.stats.requests - before.requests, routed: load.stats.routed - before.routed, failed: load.stats.failed - before.failed, immediate: load.stats.immediate - before.immediate };
    nats = await startNatsServer({ port, storeDir });
    const upAt = performance.now();
    await until(async () => (await Promise.all(gws.map((g) => g.outstanding(PROBE_MODEL, PROBE_POD)))).every((n) => n >= probesDuringOutage) || undefined, 60_000, "the outage probes in every ledger");
    const healMs = performance.now() - upAt;
    // New charges flow too (a probe opened after the restart).
    probes.push(...(await probesEverywhere(gws, load.targets.map((t) => t.client), 30_000)));
    await sleep(o.phaseMs);
    const stats = await load.stop();
    for (const p of probes.splice(0)) await finish(p);
    const drainStart = performance.now();
    await until(async () => (await Promise.all(gws.map((g) => g.counts()))).every((c) => c.charges === 0 && c.inFlight === 0) || undefined, 20_000, "ledgers to drain after recovery");
    const drainMs = performance.now() - drainStart;
    const r: FaultCaseResult = {
      case: "nats-down-30s",
      requests: stats.requests,
      failed: stats.failed,
      acked_events_lost: 0,
      heal_ms: round(healMs),
      outage_ms: o.outageMs,
      during_outage: during,
      readyz_during_outage: readyz,
      grpc_health_during_outage: health,
      probes_opened_during_outage: probesDuringOutage,
      drain_ms: round(drainMs),
      rate: o.rate,
      restarted_on_same_port_and_store: true,
      ...(stats.firstError ? { first_error: stats.firstError } : {}),
    };
    log(
      `nats-down: ${o.outageMs} ms outage; during it ${during.routed}/${during.requests} routed, ${during.failed} failed; /readyz ${readyz.join(",")}, gRPC health ${health.join(",")}; ledgers hold the outage's charges ${r.heal_ms} ms after the restart; drained ${r.drain_ms} ms after the load`,
    );
    return r;
  } finally {
    for (const p of probes) p.cancel();
    load?.close();
    await closeAll(gws);
    await h?.nc.close();
    await nats.stop();
    const { rmSync } = await import("node:fs");
    rmSync(storeDir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- kill-kv-bridge

const BLOCK = 16;


/** Blocks of the engines' caches found in the gateway's index, as test/prefix-routing.test.ts compares. */
function agreement(fleet: SimFleet, gw: GatewayHandle, model: string): { compared: number; agreed: number; extra: number } {
  let compared = 0;
  let agreed = 0;
  let extra = 0;
  for (const p of fleet.pods) {
    const listing = fleet.cacheListing(p.name);
    const routerHash = routerHashesOf(listing, model, BLOCK);
    for (const b of listing.blocks) {
      const rh = routerHash(b.hash);
      if (rh === null) continue;
      compared++;
      if (gw.prefixIndex.holders(model, rh).some((x) => x.pod === p.name)) agreed++;
    }
    extra += Math.max(0, gw.prefixIndex.podEntries(model, p.name) - listing.blocks.length);
  }
  return { compared, agreed, extra };
}

export async function killKvBridgeCase(o: Required<FaultsOptions>): Promise<FaultCaseResult> {
  const nats = await startNatsServer();
  const h = await connectNats(nats.url);
  let fleet: SimFleet | undefined;
  let bridge: ServiceProcess | undefined;
  let gw: Gw | undefined;
  const model = MODEL;
  try {
    await applyStreams(h.nc, h.jsm);
    fleet = await startSimFleet({ pods: 4, model, timeScale: 50, kvCacheBlocks: 40, blockSize: BLOCK, kvEventsEncoding: ["map", "array"], logger: silent });
    const s = new Subjects();
    for (const p of fleet.pods) await acked(h.js, s.pod(model, p.name), { type: "pod", action: "upsert", model, pod: p.name, address: p.address, ready: true, engine: "vllm", ts: Date.now(), ...(p.kvEvents ? { kvEvents: p.kvEvents } : {}) });
    const startBridge = async () => {
      const b = spawnJetroute("kv-bridge", ["kv-bridge", "--nats", nats.url], { env: { JETROUTE_LOG_LEVEL: "warn" } });
      await b.waitForLine((v: Record<string, unknown>) => typeof v.kvBridge === "string", 15_000);
      return b;
    };
    bridge = await startBridge();
    gw = await inProcessGw("kvb-gw", [nats.url], { tokenizerMode: "local" });
    const g = gw.handle as GatewayHandle;
    const f = fleet;
    await sleep(500);
    const systemPrompts = Array.from({ length: 5 }, (_, i) => `System prompt ${i}: ${"you are a careful assistant who answers briefly and cites sources. ".repeat(16 + 3 * i)}`);
    const r = mulberry32(42);
    let requests = 0;
    let failed = 0;
    const chat = async () => {
      const pod = f.pods[Math.floor(r() * f.pods.length)];
      requests++;
      try {
        const res = await fetch(`http://${pod?.address}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model, messages: [{ role: "system", content: systemPrompts[Math.floor(r() * systemPrompts.length)] }, { role: "user", content: `question ${Math.floor(r() * 8)}` }], max_tokens: 8 }),
          signal: AbortSignal.timeout(HTTP_TIMEOUT_MS),
        });
        await res.arrayBuffer();
        if (res.status !== 200) failed++;
      } catch {
        failed++;
      }
    };
    // Half the workload, the bridge killed in the middle of the second quarter.
    const half = Math.floor(o.kvRequests / 2);
    for (let i = 0; i < half; i++) await chat();
    const killing = (async () => {
      await sleep(50);
      await bridge?.kill();
    })();
    for (let i = 0; i < half; i++) await chat();
    await killing;
    const kvStream = streamName("jr", "KV");
    const lastBeforeRestart = (await h.jsm.streams.info(kvStream)).state.last_seq;
    const whileDown = agreement(f, g, model);
    bridge = await startBridge();
    const upAt = performance.now();
    // The rest of the workload with the new bridge.
    for (let i = 0; i < o.kvRequests; i++) await chat();
    const healed = await until(
      async () => {
        if (!f.pods.every((p) => f.cacheListing(p.name).pendingEvents === 0)) return undefined;
        const a = agreement(f, g, model);
        return a.compared > 0 && a.agreed / a.compared >= 0.99 && a.extra === 0 ? a : undefined;
      },
      60_000,
      "the index to agree with the engines' caches",
      100,
    ).catch((err: unknown) => ({ error: String(err), ...agreement(f, g, model) }));
    const healMs = performance.now() - upAt;
    const streamLast = (await h.jsm.streams.info(kvStream)).state.last_seq;
    await until(() => (g.kvLastSeq() >= streamLast ? true : undefined), 10_000, "the gateway to catch up with KV").catch(() => false);
    const res: FaultCaseResult = {
      case: "kill-kv-bridge",
      requests,
      failed,
      // KV events the stream acknowledged that the gateway has not applied.
      acked_events_lost: Math.max(0, streamLast - g.kvLastSeq()),
      heal_ms: round(healMs),
      agreement_while_bridge_down: whileDown.compared ? Math.round((whileDown.agreed / whileDown.compared) * 1000) / 1000 : null,
      agreement_after: "compared" in healed && healed.compared ? Math.round((healed.agreed / healed.compared) * 1000) / 1000 : null,
      blocks_compared: healed.compared,
      extra_index_entries: healed.extra,
      kv_seq_before_restart: lastBeforeRestart,
      kv_seq_after: streamLast,
      ...("error" in healed ? { error: healed.error } : {}),
      note: "heal_ms includes the post-restart workload (the new bridge takes fresh events); see the docs",
    };
    log(`kill-kv-bridge: ${requests} chats, ${failed} failed; agreement while down ${res.agreement_while_bridge_down}, after ${res.agreement_after} (${res.heal_ms} ms after restart)`);
    return res;
  } finally {
    await bridge?.kill();
    await closeAll([gw, fleet]);
    await h.nc.close();
    await nats.stop();
  }
}

// ---------------------------------------------------------------- clock-skew

export async function clockSkewCase(o: Required<FaultsOptions>): Promise<FaultCaseResult> {
  const nats = await startNatsServer();
  const h = await connectNats(nats.url);
  const rows: Array<Record<string, unknown>> = [];
  let requests = 0;
  let failed = 0;
  let healMax = 0;
  try {
    await applyStreams(h.nc, h.jsm);
    await publishPods(h, 8);
    for (const skew of o.skewsMs) {
      const tag = skew >= 0 ? "ahead" : "behind";
      const skewed = await inProcessGw(`skew-${tag}`, [nats.url], { clock: () => Date.now() + skew, heartbeatIntervalMs: o.heartbeatMs });
      const peer = await inProcessGw(`peer-${tag}`, [nats.url], { heartbeatIntervalMs: o.heartbeatMs });
      const gws = [skewed, peer];
      const load = new Load(gws, o.inProcessRate, o.holdMs);
      try {
        await waitMesh(gws);
        const sg = skewed.handle as GatewayHandle;
        const pg = peer.handle as GatewayHandle;
        const expired0 = { skewed: sg.views.ledger.expired, peer: pg.views.ledger.expired };
        load.start();
        let samples = 0;
        let peerDeadAtSkewed = 0;
        let skewedDeadAtPeer = 0;
        const t0 = performance.now();
        while (performance.now() - t0 < o.phaseMs) {
          samples++;
          if (!sg.views.ledger.liveGateways(Date.now()).includes(peer.id)) peerDeadAtSkewed++;
          if (!pg.views.ledger.liveGateways(Date.now()).includes(skewed.id)) skewedDeadAtPeer++;
          await sleep(20);
        }
        const peerChargesAtSkewed = sg.views.ledger.chargesOf(peer.id);
        const skewedChargesAtPeer = pg.views.ledger.chargesOf(skewed.id);
        const stats = await load.stop();
        const stopAt = performance.now();
        await until(() => (sg.views.ledger.size === 0 && pg.views.ledger.size === 0 && sg.director.inFlight.size === 0 && pg.director.inFlight.size === 0) || undefined, 10_000, "own and peer charges released everywhere").catch(() => undefined);
        const drainMs = performance.now() - stopAt;
        const row = {
          skew_ms: skew,
          requests: stats.requests,
          failed: stats.failed,
          routed: stats.routed,
          samples,
          peer_dead_at_skewed_samples: peerDeadAtSkewed,
          skewed_dead_at_peer_samples: skewedDeadAtPeer,
          // Charges dropped by liveness or TTL during the load (should be 0: every one was released).
          expired_at_skewed: sg.views.ledger.expired - expired0.skewed,
          expired_at_peer: pg.views.ledger.expired - expired0.peer,
          peer_charges_at_skewed_mid_load: peerChargesAtSkewed,
          skewed_charges_at_peer_mid_load: skewedChargesAtPeer,
          left_after_ms: { skewed_ledger: sg.views.ledger.size, peer_ledger: pg.views.ledger.size },
          drain_ms: round(drainMs),
        };
        rows.push(row);
        requests += stats.requests;
        failed += stats.failed;
        healMax = Math.max(healMax, drainMs);
        log(`clock-skew ${skew} ms: ${stats.requests} requests, peer dead at the skewed gateway in ${peerDeadAtSkewed}/${samples} samples, expired ${row.expired_at_skewed}/${row.expired_at_peer}; every charge released ${row.drain_ms} ms after the load`);
      } finally {
        load.close();
        await closeAll([skewed, peer]);
      }
    }
    return {
      case: "clock-skew",
      requests,
      failed,
      acked_events_lost: 0,
      heal_ms: round(healMax),
      peer_charges_dropped: rows.reduce((a, r) => a + (r.expired_at_skewed as number) + (r.peer_dead_at_skewed_samples as number), 0),
      skews: rows,
      gateway_kind: "in-process (the `clock` option has no CLI flag)",
    };
  } finally {
    await h.nc.close();
    await nats.stop();
  }
}

// ---------------------------------------------------------------- kill-nats-node-batch

export async function killNatsNodeBatchCase(o: Required<FaultsOptions>): Promise<FaultCaseResult> {
  const cluster = await startNatsCluster(3);
  let h: NatsHandles | undefined;
  let fleet: SimFleet | undefined;
  let api: BatchApiHandle | undefined;
  const workers: BatchWorkerHandle[] = [];
  try {
    h = await applyWithRetry(cluster.urls, 3);
    const urls = cluster.urls;
    // The engines the workers send items to (straight to the pods: the routing plane is not under test).
    fleet = await startSimFleet({ pods: 2, model: MODEL, decodeMsPerStep: 2, maxBatch: 32, logger: silent });
    const pods = fleet.pods.map((p) => p.address);
    api = await startBatchApi({ nats: urls, port: 0, log: process.env.FAULTS_DEBUG ? createLogger("nnb-api", "warn") : silent, id: "nnb-api", tickMs: 200, reclaimAfterMs: 5_000 });
    const base = `http://127.0.0.1:${api.port}`;
    const n = o.batchItems;
    const jsonl = `${Array.from({ length: n }, (_, i) => JSON.stringify({ custom_id: `item-${i}`, method: "POST", url: "/v1/chat/completions", body: { model: MODEL, messages: [{ role: "user", content: `batch item ${i}` }], max_tokens: 8 } })).join("\n")}\n`;
    const form = new FormData();
    form.set("purpose", "batch");
    form.set("file", new Blob([jsonl]), "faults.jsonl");
    const file = (await (await fetch(`${base}/v1/files`, { method: "POST", body: form, signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) })).json()) as { id: string };
    const created = (await (await fetch(`${base}/v1/batches`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ input_file_id: file.id, endpoint: "/v1/chat/completions", completion_window: "24h" }), signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) })).json()) as { id: string };
    // Two workers, each on another node first, each sending to its own pod.
    for (let i = 0; i < 2; i++) workers.push(await startBatchWorker({ nats: [...urls.slice(i + 1), ...urls.slice(0, i + 1)], target: `http://${pods[i % pods.length]}`, log: silent, id: `nnb-worker-${i}`, concurrency: 4, ackWaitMs: 3_000, maxAttempts: 50 }));
    const progress = () => api?.store.view.live.get(created.id);
    await until(() => ((progress()?.completed ?? 0) + (progress()?.failed ?? 0) >= n / 4 ? true : undefined), 60_000, "a quarter of the batch's items done", 20);
    const stream = streamName("jr", "BATCH_WORK");
    const leader = (await h.jsm.streams.info(stream)).cluster?.leader ?? "";
    const victim = cluster.servers.find((s) => leader === `jr-node-${cluster.servers.indexOf(s)}`) ?? (cluster.servers[0] as NatsServerHandle);
    const victimName = `jr-node-${cluster.servers.indexOf(victim)}`;
    const doneAtKill = (progress()?.completed ?? 0) + (progress()?.failed ?? 0);
    const killedAt = performance.now();
    await victim.kill();
    const dbg = process.env.FAULTS_DEBUG ? setInterval(() => log(`nnb: ${JSON.stringify({ t: round(performance.now() - killedAt), live: { c: progress()?.completed, f: progress()?.failed }, status: api?.store.view.batches.get(created.id)?.status, workers: workers.map((w) => w.stats) })}`), 1_000) : undefined;
    const final = await until(
      async () => {
        try {
          const b = (await (await fetch(`${base}/v1/batches/${created.id}`, { signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) })).json()) as { status: string; output_file_id: string | null; error_file_id: string | null; request_counts: { total: number; completed: number; failed: number } };
          return b.status === "completed" || b.status === "failed" || b.status === "expired" || b.status === "cancelled" ? b : undefined;
        } catch {
          return undefined;
        }
      },
      60_000,
      "the batch to complete after the kill",
      100,
    );
    const healMs = performance.now() - killedAt;
    if (dbg) clearInterval(dbg);
    const lines: Array<{ custom_id: string }> = [];
    const unreadable: string[] = [];
    let contentRetries = 0;
    for (const id of [final.output_file_id, final.error_file_id]) {
      if (!id) continue;
      // As a client does: a 503 (the file store's stream still electing a leader) is retried.
      const { res, text } = await until(
        async () => {
          const res = await fetch(`${base}/v1/files/${id}/content`, { signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) });
          const text = await res.text();
          if (res.status === 503) {
            contentRetries++;
            return undefined;
          }
          return { res, text };
        },
        30_000,
        `reading ${id}`,
        250,
      );
      if (res.status !== 200) {
        unreadable.push(`${id}: ${res.status} ${text.slice(0, 200)}`);
        continue;
      }
      for (const l of text.split("\n")) if (l.trim()) lines.push(JSON.parse(l) as { custom_id: string });
    }
    const ids = new Set(lines.map((l) => l.custom_id));
    const lost = Array.from({ length: n }, (_, i) => `item-${i}`).filter((c) => !ids.has(c)).length;
    const stats = workers.map((w) => ({ ...w.stats }));
    const r: FaultCaseResult = {
      case: "kill-nats-node-batch",
      requests: n,
      failed: final.request_counts.failed,
      acked_events_lost: 0,
      heal_ms: round(healMs),
      status: final.status,
      completed: final.request_counts.completed,
      lost,
      duplicated: lines.length - ids.size,
      done_at_kill: doneAtKill,
      killed_node: victimName,
      work_stream_leader: leader,
      retried: stats.reduce((a, s) => a + s.retried, 0),
      publish_failed: stats.reduce((a, s) => a + s.publishFailed, 0),
      skipped_done: stats.reduce((a, s) => a + s.skippedDone, 0),
      fold_reopens: api.store.foldReopens + workers.reduce((a, w) => a + w.store.foldReopens, 0),
      content_503_retries: contentRetries,
      ...(unreadable.length ? { unreadable_files: unreadable } : {}),
    };
    log(`kill-nats-node-batch: ${n} items, killed ${victimName} (the work queue's leader) at ${doneAtKill} done; batch ${final.status} ${round(healMs)} ms later: ${r.completed} completed, ${r.failed} failed, ${lost} lost, ${r.duplicated} duplicated`);
    return r;
  } finally {
    for (const w of workers) await w.close().catch(() => undefined);
    await api?.close().catch(() => undefined);
    await fleet?.close();
    await h?.nc.close().catch(() => undefined);
    await cluster.stop();
  }
}

// ---------------------------------------------------------------- the suite

/**
 * A case's time limit: its own load and outage lengths plus room for setup, heal and drain on a
 * slow 2-core host (each case's worst observed run, below the limit, in docs/benchmarks.md). With
 * the defaults every case's limit together is 620 s: the suite ends within about 10 minutes even when
 * every case is stopped at its limit.
 */
export function faultCaseLimitMs(c: FaultCaseName, o: Required<FaultsOptions>): number {
  const given = typeof o.caseTimeoutMs === "number" ? o.caseTimeoutMs : (o.caseTimeoutMs[c] ?? 0);
  if (given > 0) return given;
  switch (c) {
    case "kill-gateway":
      return 2 * o.phaseMs + 60_000;
    case "kill-nats-node-eventual":
    case "kill-nats-node-strict":
      return 2 * o.phaseMs + 110_000;
    case "nats-down-30s":
      return o.outageMs + 2 * o.phaseMs + 60_000;
    case "kill-kv-bridge":
      return 60_000;
    case "kill-nats-node-batch":
      return 90_000;
    case "clock-skew":
      return o.skewsMs.length * (o.phaseMs + 15_000) + 20_000;
  }
}

export function faultsDefaults(opts: FaultsOptions = {}): Required<FaultsOptions> {
  return {
    cases: opts.cases ?? [...FAULT_CASES],
    rate: opts.rate ?? 500,
    inProcessRate: opts.inProcessRate ?? 200,
    holdMs: opts.holdMs ?? 200,
    phaseMs: opts.phaseMs ?? 5_000,
    outageMs: opts.outageMs ?? 30_000,
    heartbeatMs: opts.heartbeatMs ?? 200,
    skewsMs: opts.skewsMs ?? [5_000, -5_000],
    kvRequests: opts.kvRequests ?? 60,
    batchItems: opts.batchItems ?? 400,
    caseTimeoutMs: opts.caseTimeoutMs ?? 0,
  };
}

/** One case, in this process. */
export function runFaultCase(c: FaultCaseName, o: Required<FaultsOptions>): Promise<FaultCaseResult> {
  switch (c) {
    case "kill-gateway":
      return killGatewayCase(o);
    case "kill-nats-node-eventual":
      return killNatsNodeCase("eventual", o);
    case "kill-nats-node-strict":
      return killNatsNodeCase("strict", o);
    case "kill-nats-node-batch":
      return killNatsNodeBatchCase(o);
    case "nats-down-30s":
      return natsDownCase(o);
    case "kill-kv-bridge":
      return killKvBridgeCase(o);
    case "clock-skew":
      return clockSkewCase(o);
  }
}

const secs = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

function summary(r: FaultCaseResult): string {
  return `${r.requests} requests, ${r.failed} failed, ${r.acked_events_lost} acked events lost, heal ${r.heal_ms} ms`;
}

export interface FaultsHooks {
  /** Each case's process group, once it runs (tests check nothing of it is left afterwards). */
  onCaseStart?: (c: FaultCaseName, pgid: number) => void;
}

/**
 * Every case in a process of its own (loadtest/benches/faults-case.ts), one after the other, each
 * under its time limit (`faultCaseLimitMs`): a case past it is stopped with everything it started
 * and reported as `{case, timed_out: true, elapsed_ms}`; one that fails as `{case, error,
 * elapsed_ms}`; the others run all the same. A line on stderr when each case starts and ends.
 */
export async function runFaultsBench(opts: FaultsOptions = {}, hooks: FaultsHooks = {}): Promise<FaultsResult> {
  const o = faultsDefaults(opts);
  const script = compiledScript("benches/faults-case.js");
  const t0 = performance.now();
  const cases: FaultCaseOutcome[] = [];
  await stopCasesOnSignals(async () => {
    for (const [i, c] of o.cases.entries()) {
      const tag = `faults [${i + 1}/${o.cases.length}] ${c}`;
      const limitMs = faultCaseLimitMs(c, o);
      log(`${tag}: started (time limit ${secs(limitMs)})`);
      const run = await runCaseProcess(script, [c, JSON.stringify(o)], { limitMs, name: `faults-${c}`, onStart: (pgid) => hooks.onCaseStart?.(c, pgid) });
      const elapsed_ms = round(run.elapsedMs);
      const r = run.result as (FaultCaseResult & { error?: string }) | undefined;
      if (run.timedOut) {
        cases.push({ case: c, timed_out: true, elapsed_ms });
        log(`${tag}: TIMED OUT after ${secs(run.elapsedMs)}: stopped, ${run.killed} processes killed`);
      } else if (!r || r.case !== c || r.error !== undefined) {
        const error = r?.error ?? `the case process exited (${run.exitCode}) without a result`;
        cases.push({ case: c, error, elapsed_ms });
        log(`${tag}: FAILED after ${secs(run.elapsedMs)}: ${error}`);
      } else {
        cases.push({ ...r, elapsed_ms });
        log(`${tag}: done in ${secs(run.elapsedMs)}: ${summary(r)}`);
      }
    }
  });
  const total_ms = round(performance.now() - t0);
  log(`faults: ${cases.length} cases in ${secs(total_ms)}`);
  return { bench: "faults", cases, total_ms };
}
