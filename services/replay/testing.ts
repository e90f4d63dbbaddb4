/**
 * Test fixtures for the replay engine (used by *.test.ts only): a synthetic recording made by
 * simulated gateways, each a real Director (services/routing/director.ts) on a GatewayState of its
 * own (self = its id, with a delivery lag) and a virtual clock. Its sink publishes the charges,
 * releases and decision records the director makes onto the simulated streams, so the recording
 * holds exactly what the gateway's request path writes. A correct engine reproduces every pick.
 *
 * No NATS, no clock: the messages come out merged by server time as the sources merge them
 * (ties: config, pods, load, charges, kv, decisions; then sequence).
 */
import { MinHeap } from "../shared/min-heap.js";
import type { DecisionRecord, EngineLoadFields, EventType, GatewayHeartbeat, LoadSample, PodEvent, } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { Director, type RoutedRequest, RouteError, chargeIdOf, chargeSeqOf, validateModelConfig } from "../routing/mod.js";
import { GatewayState, type StateEvent } from "../views/gateway-state.js";
import { type ReplayMessage, type ReplayOptions, type ReplayStream, ReplayEngine } from "./engine.js";
import { sample } from "../routing/strategies/testing.js";
import { mulberry32 } from "../shared/seeded-random.js";
import type { ReplayReport } from "./report-types.js";
import { STATE_STREAM_TYPES } from "./message-log.js";

export const MODEL = "org/model";
export const T0 = 1_700_000_000_000;
export const CHARGE_TTL_MS = 600_000;

/** A tiny seeded PRNG. */
export const seeded = mulberry32;

/** One request as the workload sends it. */
export interface SynthRequest {
  readonly id: string;
  /** Arrival (routing) time, ms. */
  readonly at: number;
  readonly gateway: string;
  readonly strategy: string;
  readonly durationMs: number;
  /** Time to first token (< durationMs), or none. */
  readonly ttftMs?: number;
  readonly promptTokens: number;
  readonly user?: string;
  /** How long after the release its decision record is published (Infinity: never). Default 0. */
  readonly decisionDelayMs?: number;
}

/** A message published at `at` by someone other than the simulated gateways (pod-watcher, scraper, a broken publisher). */
export interface Injected {
  readonly at: number;
  readonly stream: ReplayStream;
  readonly data: unknown;
  /** Marks the payload as not JSON (then `data` is the raw text). */
  readonly invalid?: string;
  readonly subject?: string;
}

export interface SynthOptions {
  seed?: number;
  /** Gateways that route. Default ["g1", "g2"]. */
  gateways?: readonly string[];
  /** Gateways that only publish heartbeats (never route). */
  idle?: readonly string[];
  /** When a gateway starts (heartbeats and routing); default T0. Requests sent to it earlier go to the first gateway. */
  startAt?: Readonly<Record<string, number>>;
  /** Delivery lag per gateway (ms) of every stream message to its fold. Default: 0 for the first gateway, 3 for the others. */
  lagMs?: Readonly<Record<string, number>>;
  pods?: number;
  /** Requests sent. */
  requests: number;
  /** Requests per burst (same millisecond). Default 1. */
  burst?: number;
  /** Time between bursts: fixed, or uniform in [min, max]. Default [0, 20]. */
  gapMs?: number | readonly [number, number];
  /** First burst time. Default T0 + 1_250. */
  startMs?: number;
  /** Durations, uniform in [min, max]. Default [20, 400]. */
  durationMs?: readonly [number, number];
  /** Recorded strategies, chosen at random per request. Default ["least-request", "random"]. */
  strategies?: readonly string[];
  heartbeatMs?: number;
  /** Load samples of every present pod this often; false: none. Default 500. */
  loadEveryMs?: number | false;
  /** `waiting` in a pod's load sample at time t. Default: a random 0..3. */
  waiting?: (pod: string, t: number) => number;
  inject?: readonly Injected[];
  /** Rewrites request i (after it was drawn). */
  request?: (i: number, r: SynthRequest) => SynthRequest;
  /** Nothing after this time is recorded (requests still running then have no release and no record). */
  untilMs?: number;
  /** The gateways' `--pod-source-timeout-ms`: a source's liveness is judged at each routing decision. Default 0 (never). */
  podSourceTimeoutMs?: number;
  /** Streamed requests (`stream: true`): their releases carry latency samples the latency model learns. Default false. */
  stream?: boolean;
  /** Where a first token falls among the routing decisions of its millisecond. Default "before". */
  firstTokens?: "before" | "after";
}

/** What the recording knows about each request (for assertions). */
export interface RoutedInfo {
  readonly request: SynthRequest;
  readonly chargeId: string;
  readonly chargeSeq: number;
  readonly pod: string | null;
  readonly record?: DecisionRecord;
  readonly releaseTs?: number;
  /** Server time at which the record was published. */
  readonly recordTs?: number;
}

export interface Recording {
  /** Every message, merged by server time as a source delivers them. */
  readonly messages: ReplayMessage[];
  /** Decision records in publish (DECISIONS) order. */
  readonly records: DecisionRecord[];
  /** Per request, in arrival order. */
  readonly routed: RoutedInfo[];
  /** The routing window of all requests. */
  readonly fromMs: number;
  readonly toMs: number;
  readonly pods: readonly string[];
}

const STREAM_ORDER: Record<ReplayStream, number> = { config: 0, pods: 1, load: 2, charges: 3, kv: 4, decisions: 5 };

export function loadFields(waiting: number): EngineLoadFields {
  return sample({ running: 0, waiting, kvCacheUsage: 0 });
}

export const podEvent = (pod: string, ts: number, o: Partial<PodEvent> = {}): PodEvent => ({
  type: "pod",
  action: "upsert",
  model: MODEL,
  pod,
  address: `10.0.0.${Number(pod.replace(/\D/g, "")) + 1}:8000`,
  ready: true,
  engine: "vllm",
  ts,
  ...o,
});

interface Action {
  at: number;
  /** Lower first among actions at the same time. */
  prio: number;
  n: number;
  run: () => void;
}

/** Actions in (at, prio, n) order. */
class Queue {
  private readonly heap = new MinHeap<Action>((a, b) => (a.at !== b.at ? a.at < b.at : a.prio !== b.prio ? a.prio < b.prio : a.n < b.n));
  private n = 0;
  push(at: number, run: () => void, prio = 1): void {
    this.heap.push({ at, prio, n: this.n++, run });
  }
  pop(): Action | undefined {
    return this.heap.pop();
  }
  get size(): number {
    return this.heap.size;
  }
}

type MutableInfo = { -readonly [K in keyof RoutedInfo]: RoutedInfo[K] };

interface SimGateway {
  id: string;
  state: GatewayState;
  director: Director;
  lag: number;
  /** Next message (index into `published`) to deliver to its fold. */
  next: number;
}

/** The simulated streams: every message in publish order, stamped with the shared virtual time `now`. */
class SynthStreams {
  now = T0 - 1_000;
  readonly published: ReplayMessage[] = [];
  /** Decision records in publish order. */
  readonly records: DecisionRecord[] = [];
  /** Pods upserted ready and not removed, as the published pod events say. */
  readonly present = new Set<string>();
  private readonly seqs: Record<ReplayStream, number> = { pods: 0, load: 0, charges: 0, kv: 0, config: 0, decisions: 0 };

  publish(stream: ReplayStream, subject: string, data: unknown, invalid?: string): void {
    this.published.push({ stream, subject, seq: ++this.seqs[stream], serverTs: this.now, data, ...(invalid !== undefined ? { invalid } : {}) });
    if (stream === "decisions" && invalid === undefined) this.records.push(data as DecisionRecord);
  }

  notePod(data: unknown): void {
    const c = checkEvent("pod", data);
    if (!c.ok) return;
    if (c.event.action === "upsert" && c.event.ready) this.present.add(c.event.pod);
    else this.present.delete(c.event.pod);
  }

  /** The gateway's followers: everything published up to `now - lag`, in order, through the fold (invalid messages only move the cursor). */
  deliver(g: SimGateway): void {
    while (g.next < this.published.length) {
      const m = this.published[g.next] as ReplayMessage;
      if (m.serverTs > this.now - g.lag) break;
      g.next++;
      if (m.stream === "decisions") continue;
      const meta = { stream: m.stream, subject: m.subject, seq: m.seq, serverTs: m.serverTs };
      if (m.invalid !== undefined) {
        g.state.skip(meta);
        continue;
      }
      const type = (m.data as { type?: unknown } | null)?.type;
      const ok = typeof type === "string" && (STATE_STREAM_TYPES[m.stream] as readonly string[]).includes(type) && checkEvent(type as EventType, m.data).ok;
      if (ok) g.state.apply(m.data as StateEvent, meta);
      else g.state.skip(meta);
    }
  }

  /** Every message, merged by server time as a source delivers them. */
  merged(): ReplayMessage[] {
    const order = this.published.map((m, i) => ({ m, i }));
    order.sort((a, b) => a.m.serverTs - b.m.serverTs || STREAM_ORDER[a.m.stream] - STREAM_ORDER[b.m.stream] || a.i - b.i);
    return order.map((x) => x.m);
  }
}

/** What the parts of a synthetic recording share while it runs. */
interface Synth {
  readonly o: SynthOptions;
  readonly streams: SynthStreams;
  readonly q: Queue;
  /** Per request id, what the recording knows (the sink fills in the decision record). */
  readonly infos: Map<string, MutableInfo>;
  readonly sims: Map<string, SimGateway>;
}

/** Builds a synthetic recording (see the file comment). */
export function synthRecording(o: SynthOptions): Recording {
  const rnd = seeded(o.seed ?? 1);
  const gateways = o.gateways ?? ["g1", "g2"];
  const hbMs = o.heartbeatMs ?? 1_000;
  const podNames = Array.from({ length: o.pods ?? 4 }, (_, i) => `p${i}`);
  const startOf = (g: string) => o.startAt?.[g] ?? T0;

  const requests = drawWorkload(o, rnd, gateways, startOf);
  let lastEnd = T0;
  for (const r of requests) {
    const delay = r.decisionDelayMs ?? 0;
    lastEnd = Math.max(lastEnd, r.at + r.durationMs + (Number.isFinite(delay) ? delay : 0));
  }
  const endMs = o.untilMs ?? lastEnd + hbMs;

  const streams = new SynthStreams();
  for (const p of podNames) {
    const ev = podEvent(p, streams.now);
    streams.notePod(ev);
    streams.publish("pods", `jr.pods.${p}`, ev);
  }
  const s: Synth = { o, streams, q: new Queue(), infos: new Map(), sims: new Map() };
  gateways.forEach((g, i) => {
    s.sims.set(g, simGateway(s, g, i));
  });
  scheduleHeartbeats(s, [...gateways, ...(o.idle ?? [])], startOf, hbMs, endMs);
  scheduleLoadSamples(s, podNames, o.waiting ?? (() => Math.floor(rnd() * 4)), endMs);
  for (const inj of o.inject ?? []) {
    s.q.push(inj.at, () => {
      if (inj.stream === "pods" && inj.invalid === undefined) streams.notePod(inj.data);
      streams.publish(inj.stream, inj.subject ?? `jr.${inj.stream}.injected`, inj.data, inj.invalid);
    });
  }
  const routed = scheduleRequests(s, requests);

  for (let a = s.q.pop(); a !== undefined; a = s.q.pop()) {
    if (a.at > endMs) break;
    streams.now = a.at;
    a.run();
  }

  return {
    messages: streams.merged(),
    records: streams.records,
    routed,
    fromMs: requests.reduce((a, r) => Math.min(a, r.at), Number.POSITIVE_INFINITY),
    toMs: requests.reduce((a, r) => Math.max(a, r.at), Number.NEGATIVE_INFINITY),
    pods: podNames,
  };
}

/** The requests the workload sends, drawn from `rnd` (then rewritten by `o.request`). */
function drawWorkload(o: SynthOptions, rnd: () => number, gateways: readonly string[], startOf: (g: string) => number): SynthRequest[] {
  const first = gateways[0] as string;
  const [dMin, dMax] = o.durationMs ?? [20, 400];
  const strategies = o.strategies ?? ["least-request", "random"];
  const burst = o.burst ?? 1;
  const gap = o.gapMs ?? [0, 20];
  const requests: SynthRequest[] = [];
  let t = o.startMs ?? T0 + 1_250;
  for (let i = 0; i < o.requests; i++) {
    if (i > 0 && i % burst === 0) t += typeof gap === "number" ? gap : gap[0] + Math.floor(rnd() * (gap[1] - gap[0] + 1));
    let gateway = gateways[Math.floor(rnd() * gateways.length)] as string;
    if (t < startOf(gateway)) gateway = first;
    const durationMs = dMin + Math.floor(rnd() * (dMax - dMin + 1));
    let r: SynthRequest = {
      id: `req-${i}`,
      at: t,
      gateway,
      strategy: strategies[Math.floor(rnd() * strategies.length)] as string,
      durationMs,
      ...(durationMs > 10 ? { ttftMs: Math.floor(durationMs * 0.3) } : {}),
      promptTokens: 50 + Math.floor(rnd() * 500),
      user: `u${Math.floor(rnd() * 3)}`,
    };
    if (o.request) r = o.request(i, r);
    requests.push(r);
  }
  return requests;
}

/** Gateway `g` (the `i`th): a real Director on a fold of its own, whose sink publishes onto the simulated streams. */
function simGateway(s: Synth, g: string, i: number): SimGateway {
  const { o, streams } = s;
  const state = new GatewayState({ self: g, checkModelConfig: validateModelConfig, podSourceTimeoutMs: o.podSourceTimeoutMs ?? 0 });
  const director = new Director({
    gatewayId: g,
    defaultStrategy: "least-request",
    chargeTtlMs: CHARGE_TTL_MS,
    state,
    now: () => streams.now,
    clock: { now: () => streams.now, setTimeout: () => { throw new Error("the synthetic recording sets no rate limits"); } },
    recordPromptBlocks: false,
    sink: {
      charge: (ev) => streams.publish("charges", `jr.charge.${ev.pod}`, ev),
      release: (ev) => streams.publish("charges", `jr.release.${ev.pod}`, ev),
      decision: (rec) => {
        const info = s.infos.get(rec.id);
        const delay = info?.request.decisionDelayMs ?? 0;
        const send = () => {
          streams.publish("decisions", `jr.decisions.${g}`, rec);
          if (info) {
            info.record = rec;
            info.recordTs = streams.now;
          }
        };
        if (delay === 0) send();
        else if (Number.isFinite(delay)) s.q.push(streams.now + delay, send);
      },
    },
  });
  return { id: g, state, director, lag: o.lagMs?.[g] ?? (i === 0 ? 0 : 3), next: 0 };
}

/** Heartbeats of every gateway (idle ones too) from its start, each listing the charges its director holds. */
function scheduleHeartbeats(s: Synth, allGw: readonly string[], startOf: (g: string) => number, hbMs: number, endMs: number): void {
  const { streams } = s;
  allGw.forEach((g, j) => {
    const startedAt = startOf(g);
    for (let at = startedAt + Math.floor((j * hbMs) / allGw.length); at <= endMs; at += hbMs) {
      s.q.push(at, () => {
        const sim = s.sims.get(g);
        const outstanding: NonNullable<GatewayHeartbeat["outstanding"]> = [];
        for (const r of sim?.director.holdingCharges() ?? []) {
          const c = r.charge;
          outstanding.push({ id: c.id, model: c.model, pod: c.pod, promptTokens: c.promptTokens, ts: c.ts, ...(r.firstChunkAt !== undefined ? { decoding: true } : {}) });
        }
        const hb: GatewayHeartbeat = { type: "heartbeat", gateway: g, ts: streams.now, intervalMs: hbMs, startedAt, state: "up", chargeTtlMs: CHARGE_TTL_MS, outstanding };
        streams.publish("charges", `jr.hb.${g}`, hb);
      });
    }
  });
}

/** Load samples of every present pod every `o.loadEveryMs`. */
function scheduleLoadSamples(s: Synth, podNames: readonly string[], waiting: (pod: string, t: number) => number, endMs: number): void {
  const loadEvery = s.o.loadEveryMs ?? 500;
  if (loadEvery === false) return;
  const { streams } = s;
  for (let at = T0; at <= endMs; at += loadEvery) {
    s.q.push(at, () => {
      for (const p of podNames) {
        if (!streams.present.has(p)) continue;
        const sample: LoadSample = { type: "load", model: MODEL, pod: p, ts: streams.now, stale: false, load: loadFields(waiting(p, streams.now)) };
        streams.publish("load", `jr.load.${p}`, sample);
      }
    });
  }
}

/** Routing, first tokens, ends: the director's route(), firstToken() and finish(). Returns what is known per request, filled in as the run goes. */
function scheduleRequests(s: Synth, requests: readonly SynthRequest[]): RoutedInfo[] {
  const { o, streams, q } = s;
  const routed: RoutedInfo[] = [];
  const finish = (g: SimGateway, r: RoutedRequest, info: MutableInfo) => {
    streams.deliver(g);
    info.releaseTs = streams.now;
    g.director.finish(r, "completed", { status: 200, promptTokens: r.promptTokens, completionTokens: 8 + (r.promptTokens % 50) });
  };
  const route = (r: SynthRequest) => {
    const g = s.sims.get(r.gateway);
    if (!g) throw new Error(`unknown gateway ${r.gateway}`);
    streams.deliver(g);
    if (o.podSourceTimeoutMs) g.state.pods.sweepSources(streams.now, o.podSourceTimeoutMs);
    const headers: Record<string, string> = { ":path": "/v1/completions", "x-request-id": r.id, "routing-strategy": r.strategy, ...(r.user ? { user: r.user } : {}) };
    // A prompt of token ids: the director counts exactly `promptTokens` of them.
    const body = Buffer.from(JSON.stringify({ model: MODEL, prompt: Array.from({ length: r.promptTokens }, (_, i) => i % 1000), ...(o.stream ? { stream: true } : {}) }));
    const info: MutableInfo = { request: r, chargeId: "", chargeSeq: 0, pod: null };
    s.infos.set(r.id, info);
    routed.push(info);
    let routedRequest: RoutedRequest;
    try {
      const out = g.director.route({ headers, body });
      if (out instanceof Promise) throw new Error("the synthetic recording routes synchronously (no tokenization, no rate limits)");
      routedRequest = out;
    } catch (err) {
      if (!(err instanceof RouteError)) throw err;
      // Refused before charging: the director records a rejection (no charge, no cursors).
      info.chargeSeq = g.director.chargesMade;
      info.chargeId = chargeIdOf(info.chargeSeq);
      g.director.reject(headers, MODEL, err);
      return;
    }
    info.chargeId = routedRequest.chargeId;
    info.chargeSeq = g.director.chargesMade;
    info.pod = routedRequest.pod.pod;
    if (r.ttftMs !== undefined && r.ttftMs < r.durationMs) {
      // First bytes before anything else of that millisecond, or after its routing decisions.
      q.push(streams.now + r.ttftMs, () => g.director.firstToken(routedRequest, streams.now), o.firstTokens === "after" ? 2 : 0);
    }
    q.push(streams.now + r.durationMs, () => finish(g, routedRequest, info));
  };
  for (const r of requests) q.push(r.at, () => route(r));
  return routed;
}

/** Feeds `messages` to a new engine (calling `each` after every offer) and finishes it. */
export function replay(messages: readonly ReplayMessage[], o: Partial<ReplayOptions> & Pick<ReplayOptions, "fromMs" | "toMs">, each?: (engine: ReplayEngine, m: ReplayMessage) => void): { report: ReplayReport; engine: ReplayEngine } {
  const engine = new ReplayEngine({ strategies: [], ...o });
  for (const m of messages) {
    engine.offer(m);
    each?.(engine, m);
  }
  return { report: engine.finish("2024-01-01T00:00:00.000Z"), engine };
}

/** The messages without those matching `drop`. */
export const without = (messages: readonly ReplayMessage[], drop: (m: ReplayMessage) => boolean): ReplayMessage[] => messages.filter((m) => !drop(m));

/** The messages with those matching `at` replaced (same stream, sequence and server time). */
export const replacing = (messages: readonly ReplayMessage[], at: (m: ReplayMessage) => boolean, by: (m: ReplayMessage) => Partial<ReplayMessage>): ReplayMessage[] =>
  messages.map((m) => (at(m) ? { ...m, ...by(m) } : m));

/** Decision records that arrived after a record of the same gateway with a greater charge id (out of routing order). */
export function outOfOrder(records: readonly DecisionRecord[]): number {
  const maxSeen = new Map<string, number>();
  let n = 0;
  for (const r of records) {
    if (!r.charge) continue;
    const cs = chargeSeqOf(r.charge) ?? 0;
    if ((maxSeen.get(r.gateway) ?? 0) > cs) n++;
    maxSeen.set(r.gateway, Math.max(maxSeen.get(r.gateway) ?? 0, cs));
  }
  return n;
}
