/**
 * The fleet and probes the fault cases share: gateways in this process or as processes, the pods
 * they route to, the ext_proc probes held open across a fault, and a paced load generator.
 */
import { ExtProcClient, type ExtProcExchange } from "../../services/extproc/envoy-client.js";
import { type GatewayHandle, type GatewayOptions, startGateway } from "../../services/gateway/gateway.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { type ServiceProcess, spawnJetroute } from "../../services/shared/processes.js";
import { acked } from "../../services/shared/publish.js";
import { applyStreams } from "../../streams/apply.js";
import { Subjects } from "../../streams/subjects.js";

export const MODEL = "bench/faults";
export const PROBE_MODEL = "probe/model";
export const PROBE_POD = "probe-0";
export const HEADERS = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "bench", "content-type": "application/json" };
const bodyOf = (model: string) => Buffer.from(JSON.stringify({ model, messages: [{ role: "user", content: "hold on" }], stream: true }));
const BODY = bodyOf(MODEL);
const PROBE_BODY = bodyOf(PROBE_MODEL);
export const silent = createLogger("bench-faults", "silent");
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
export const log = (s: string) => console.error(s);

/** `p`, or a rejection naming `what` once `ms` have passed (`p` itself is left to settle unobserved). */
function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${Math.round(ms)} ms waiting for ${what}`)), Math.max(0, ms));
  });
  p.catch(() => undefined);
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** Polls `fn` until it returns a value; an attempt that hangs counts against the same deadline. */
export async function until<T>(fn: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs: number, what: string, everyMs = 20): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const v = await withDeadline(Promise.resolve(fn()), deadline - performance.now(), what);
    if (v !== undefined && v !== false) return v;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** Closes gateways (or anything with `close`) at once, none waited on for more than `ms`. */
export async function closeAll(xs: Array<{ close(): Promise<void> } | undefined>, ms = 15_000): Promise<void> {
  await Promise.allSettled(xs.map((x) => (x ? withDeadline(x.close(), ms, "a close") : undefined)));
}

/** An HTTP call of the bench (admin endpoints, the simulator) never waits more than this. */
export const HTTP_TIMEOUT_MS = 10_000;

// ---------------------------------------------------------------- gateways, either kind

/** What the cases read of a gateway, in process or as a process (through /debug/state). */
export interface Gw {
  id: string;
  port: number;
  /** Requests charged on (model, pod) in this gateway's ledger, every gateway's together. */
  outstanding(model: string, pod: string): Promise<number>;
  /** Live gateways this one knows (itself excluded) with their charges. */
  peers(): Promise<Map<string, number>>;
  /** Own requests in flight, and the ledger's size. */
  counts(): Promise<{ inFlight: number; charges: number; ready: boolean }>;
  kill(): Promise<void>;
  close(): Promise<void>;
  handle?: GatewayHandle;
  adminPort?: number;
}

interface DebugState {
  ready: boolean;
  inFlight: number;
  ledger: { charges: number; liveGateways: Array<{ gateway: string; charges: number }>; outstanding: Array<{ model: string; pod: string; requests: number }> };
}

export async function processGw(id: string, nats: string[], o: { mode: "eventual" | "strict"; heartbeatMs: number }): Promise<Gw> {
  const proc: ServiceProcess = spawnJetroute(
    id,
    ["gateway", "--nats", nats.join(","), "--id", id, "--port", "0", "--admin-port", "0", "--host", "127.0.0.1", "--heartbeat-ms", String(o.heartbeatMs), "--consistency", o.mode, "--shutdown-grace-ms", "300", "--no-snapshots"],
    { env: { JETROUTE_LOG_LEVEL: "warn" } },
  );
  const line = await proc.waitForLine<{ port: number; adminPort: number }>((v) => typeof v.port === "number", 30_000);
  const base = `http://127.0.0.1:${line.adminPort}`;
  const state = async () => (await (await fetch(`${base}/debug/state`, { signal: AbortSignal.timeout(HTTP_TIMEOUT_MS) })).json()) as DebugState;
  return {
    id,
    port: line.port,
    adminPort: line.adminPort,
    outstanding: async (model, pod) => (await state()).ledger.outstanding.find((x) => x.model === model && x.pod === pod)?.requests ?? 0,
    peers: async () => new Map((await state()).ledger.liveGateways.filter((g) => g.gateway !== id).map((g) => [g.gateway, g.charges])),
    counts: async () => {
      const s = await state();
      return { inFlight: s.inFlight, charges: s.ledger.charges, ready: s.ready };
    },
    kill: () => proc.kill(),
    close: () => proc.stop(),
  };
}

export async function inProcessGw(id: string, nats: string[], o: Partial<GatewayOptions>): Promise<Gw> {
  const gw = await startGateway({ nats, id, port: 0, host: "127.0.0.1", adminPort: -1, log: silent, heartbeatIntervalMs: 200, shutdownGraceMs: 300, snapshots: false, ...o });
  await withDeadline(gw.whenReady(), 60_000, `gateway ${id} to be ready`).catch(async (err: unknown) => {
    await closeAll([gw]);
    throw err;
  });
  return {
    id,
    port: gw.port,
    handle: gw,
    outstanding: async (model, pod) => gw.views.ledger.outstanding(model, pod).requests,
    peers: async () => new Map(gw.views.ledger.liveGateways(Date.now()).filter((g) => g !== id).map((g) => [g, gw.views.ledger.chargesOf(g)])),
    counts: async () => ({ inFlight: gw.director.inFlight.size, charges: gw.views.ledger.size, ready: gw.ready() }),
    kill: () => gw.close(),
    close: () => gw.close(),
  };
}

export async function publishPods(h: NatsHandles, pods: number): Promise<void> {
  const s = new Subjects();
  const pod = (model: string, name: string, port: number) => acked(h.js, s.pod(model, name), { type: "pod", action: "upsert", model, pod: name, address: `127.0.0.1:${port}`, ready: true, engine: "vllm", ts: Date.now() });
  for (let i = 0; i < pods; i++) await pod(MODEL, `pod-${i}`, 19_500 + i);
  await pod(PROBE_MODEL, PROBE_POD, 19_499);
}

/** Applies the streams, retrying while a fresh cluster elects its meta leader. */
export async function applyWithRetry(urls: string[], replicas: number): Promise<NatsHandles> {
  const deadline = Date.now() + 30_000;
  let h: NatsHandles | undefined;
  for (;;) {
    try {
      h ??= await connectNats(urls);
      await applyStreams(h.nc, h.jsm, { replicas });
      return h;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await sleep(250);
    }
  }
}

export async function waitMesh(gws: Gw[], timeoutMs = 30_000): Promise<void> {
  await until(async () => (await Promise.all(gws.map((g) => g.peers()))).every((p) => p.size === gws.length - 1) || undefined, timeoutMs, "gateways to see each other");
}

// ---------------------------------------------------------------- the load driver

export interface Target {
  id: string;
  client: ExtProcClient;
  live: boolean;
  inFlight: number;
}

interface LoadStats {
  requests: number;
  routed: number;
  immediate: number;
  failed: number;
  completed: number;
  /** Routed (= charges published) per gateway id. */
  routedBy: Record<string, number>;
  failedBy: Record<string, number>;
  firstError?: string;
}

/** Open-loop paced requests over the live targets, round robin; each held `holdMs`. */
export class Load {
  readonly targets: Target[];
  readonly stats: LoadStats = { requests: 0, routed: 0, immediate: 0, failed: 0, completed: 0, routedBy: {}, failedBy: {} };
  private timer: NodeJS.Timeout | undefined;
  private started = 0;
  private launched = 0;
  private next = 0;
  private readonly pending = new Set<Promise<void>>();

  private readonly headers: Record<string, string>;

  constructor(
    gws: Gw[],
    private readonly rate: number,
    private readonly holdMs: number,
    extraHeaders: Record<string, string> = {},
  ) {
    this.headers = { ...HEADERS, ...extraHeaders };
    this.targets = gws.map((g) => ({ id: g.id, client: new ExtProcClient(`127.0.0.1:${g.port}`, { messageTimeoutMs: 10_000, closeMode: "reset" }), live: true, inFlight: 0 }));
  }

  start(): void {
    this.started = performance.now();
    this.launched = 0;
    this.timer = setInterval(() => {
      const due = Math.floor(((performance.now() - this.started) / 1000) * this.rate);
      for (; this.launched < due; this.launched++) this.launch();
    }, 5);
  }

  /** Stops launching; resolves when every request in flight has ended. */
  async stop(): Promise<LoadStats> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await Promise.allSettled([...this.pending]);
    return this.stats;
  }

  remove(id: string): Target | undefined {
    const t = this.targets.find((x) => x.id === id);
    if (t) t.live = false;
    return t;
  }

  /** Stops launching (a case that failed mid-load gets here without `stop`) and closes the clients. */
  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    for (const t of this.targets) t.client.close();
  }

  private launch(): void {
    const live = this.targets.filter((t) => t.live);
    if (live.length === 0) return;
    const t = live[this.next++ % live.length] as Target;
    const p = this.one(t);
    this.pending.add(p);
    p.finally(() => this.pending.delete(p));
  }

  private async one(t: Target): Promise<void> {
    const s = this.stats;
    s.requests++;
    t.inFlight++;
    let ex: ExtProcExchange | undefined;
    try {
      ex = t.client.open();
      const h = await ex.requestHeaders(this.headers);
      if (h.kind === "immediate") {
        s.immediate++;
        return;
      }
      const b = await ex.requestBody(BODY);
      if (b.kind === "immediate") {
        s.immediate++;
        return;
      }
      s.routed++;
      s.routedBy[t.id] = (s.routedBy[t.id] ?? 0) + 1;
      await sleep(this.holdMs);
      await ex.responseHeaders(200, { "content-type": "text/event-stream" });
      await ex.responseBodyChunk(Buffer.from("data: [DONE]\n\n"), true);
      await ex.end();
      s.completed++;
    } catch (err) {
      s.failed++;
      s.failedBy[t.id] = (s.failedBy[t.id] ?? 0) + 1;
      s.firstError ??= err instanceof Error ? err.message : String(err);
      ex?.cancel();
    } finally {
      t.inFlight--;
    }
  }
}

/** A request on the probe model, held until `end()`; undefined if it was not routed. */
export async function openProbe(client: ExtProcClient, extraHeaders: Record<string, string> = {}): Promise<ExtProcExchange | undefined> {
  const ex = client.open();
  try {
    const h = await ex.requestHeaders({ ...HEADERS, ...extraHeaders });
    if (h.kind !== "continue") return undefined;
    const b = await ex.requestBody(PROBE_BODY);
    if (b.kind !== "continue") return undefined;
    return ex;
  } catch {
    ex.cancel();
    return undefined;
  }
}

export async function finish(ex: ExtProcExchange): Promise<void> {
  try {
    await ex.responseHeaders(200, { "content-type": "text/event-stream" });
    await ex.responseBodyChunk(Buffer.from("data: [DONE]\n\n"), true);
    await ex.end();
  } catch {
    ex.cancel();
  }
}

/**
 * Opens one probe per gateway (retrying until each is routed) and waits until every gateway's
 * ledger holds all of them: charges flow between every pair again. Returns the probes.
 */
export async function probesEverywhere(gws: Gw[], clients: ExtProcClient[], timeoutMs: number, extraHeaders: Record<string, string> = {}): Promise<ExtProcExchange[]> {
  const probes: ExtProcExchange[] = [];
  const t0 = performance.now();
  probes.push(...(await Promise.all(clients.map((c) => until(() => openProbe(c, extraHeaders), timeoutMs, "a probe to be routed", 50)))));
  lastProbeRoutedMs = performance.now() - t0;
  await until(async () => (await Promise.all(gws.map((g) => g.outstanding(PROBE_MODEL, PROBE_POD)))).every((n) => n >= probes.length) || undefined, timeoutMs, "every probe charge in every ledger");
  return probes;
}

/** How long the last `probesEverywhere` took to get every probe routed (strict: committed or fallen back). */
let lastProbeRoutedMs = 0;
/** How long the last `probesEverywhere` took (ms). */
export function lastProbeRoutedMsOf(): number {
  return lastProbeRoutedMs;
}
