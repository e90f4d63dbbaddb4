/**
 * Property: for every event family a gateway folds (pod, load, charge, release, heartbeat, kv,
 * kv-cleared, kv-routed, usage, response-location), no payload can stop or corrupt the fold. `decodeEvent` never throws and
 * agrees with the schema; `GatewayState.apply` never throws on a schema-valid event and keeps its
 * views within their bounds (no negative outstanding charges, ledger and prefix index under their
 * caps); and on a real nats-server every invalid message is dead-lettered exactly once per
 * consuming gateway, with its decode reason, while valid ones are applied and the gateways stay
 * ready. Why: events come from other processes (and, on a misconfigured cluster, from anyone who
 * can publish); one poisoned message must cost one dead letter, never a stuck or crashed replica.
 *
 * Pure part: 10,000 generated cases per family for the decoder and 10,000 per family for the
 * fold. Real-NATS part: 500 messages per family through two gateways. JETROUTE_SOAK=1 raises both.
 */
import { createHash } from "node:crypto";
import { DeliverPolicy } from "@nats-io/jetstream";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EVENT_SCHEMAS, type EventType } from "../../schemas/events.js";
import { locationDigest, tenantDigest } from "../../schemas/responses.js";
import { checkEvent, decodeEvent } from "../../schemas/validate.js";
import type { GatewayHandle } from "../../services/gateway/gateway.js";
import { DlqHeaders } from "../../services/shared/dead-letter.js";
import { type EventMeta, GatewayState, type StateEvent } from "../../services/views/gateway-state.js";
import { streamName } from "../../streams/definitions.js";
import type { Family } from "../../streams/subjects.js";
import { startTestEnv, type TestEnv, waitFor } from "../harness/env.js";

const SOAK = process.env.JETROUTE_SOAK;
// 2,000 cases per property in the suite (10,000 took most of a minute per family and passed the
// 30 s test timeout on a loaded host); JETROUTE_SOAK=1 runs 200,000.
const PURE_RUNS = SOAK ? 200_000 : 2_000;
const NATS_PER_FAMILY = SOAK ? 5_000 : 500;

/** The event types the gateway fold reads (decisions and autoscaling recommendations are for replay and operators). */
type GatewayFamily = Exclude<EventType, "decision" | "autoscale" | "adapter" | "stored-response">;
const FAMILIES: readonly GatewayFamily[] = ["pod", "pod-source", "load", "charge", "release", "releases", "heartbeat", "kv", "kv-cleared", "kv-routed", "usage", "response-location"];

// ---- schema-valid generators ---------------------------------------------------------------

const MODELS = ["org/Llama-3.1-8B", "m/b", "Qwen/Qwen3-0.6B"];
const PODS = Array.from({ length: 8 }, (_, i) => `pod-${i}`);
const GATEWAYS = ["gw-a", "gw-b", "gw-c"];
/** The fold's own id: its echoes must be ignored, never applied twice. */
const SELF = "gw-self";
const pick = (xs: readonly string[]) => fc.oneof({ weight: 10, arbitrary: fc.constantFrom(...xs) }, { weight: 1, arbitrary: fc.string({ minLength: 1, maxLength: 253 }) });
const model = pick(MODELS);
const pod = pick(PODS);
const gateway = fc.oneof({ weight: 10, arbitrary: fc.constantFrom(...GATEWAYS) }, { weight: 1, arbitrary: fc.constant(SELF) }, { weight: 1, arbitrary: fc.string({ minLength: 1, maxLength: 40 }).map((s) => `x${s}`) });
const name = fc.string({ minLength: 1, maxLength: 253 });
const id = fc.oneof({ weight: 5, arbitrary: fc.integer({ min: 0, max: 50 }).map((n) => `c${n}`) }, { weight: 1, arbitrary: name });
const address = fc.tuple(fc.oneof(fc.ipV4(), fc.domain(), fc.stringMatching(/^[^\s:]{1,20}$/)), fc.integer({ min: 0, max: 99_999 })).map(([h, p]) => `${h}:${p}`);
const T0 = 1_750_000_000_000;
const millis = fc.oneof({ weight: 10, arbitrary: fc.integer({ min: T0 - 600_000, max: T0 + 600_000 }) }, { weight: 1, arbitrary: fc.constantFrom(0, Number.MAX_SAFE_INTEGER, 1e300, 0.5) });
// Token counts stay below 2^31 here: larger schema-valid counts break the ledger's totals
// (ledger-precision.bug.test.ts).
const count = fc.oneof({ weight: 10, arbitrary: fc.nat({ max: 100_000 }) }, { weight: 1, arbitrary: fc.constantFrom(0, 2 ** 31 - 1) });
const posInt = fc.oneof({ weight: 10, arbitrary: fc.integer({ min: 1, max: 600_000 }) }, { weight: 1, arbitrary: fc.constantFrom(1, Number.MAX_SAFE_INTEGER) });
const hash = fc.oneof({ weight: 10, arbitrary: fc.integer({ min: 1, max: 400 }).map((n) => n.toString(16)) }, { weight: 1, arbitrary: fc.stringMatching(/^[0-9a-f]{1,64}$/) });
const num = fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), fc.integer());
const nullableNum = fc.option(num, { nil: null });
const user = fc.oneof(fc.constantFrom("alice", "bob"), fc.string({ maxLength: 256 }));

const ev = {
  pod: fc.record(
    {
      type: fc.constant("pod" as const),
      action: fc.constantFrom("upsert" as const, "remove" as const),
      model,
      pod,
      address,
      ready: fc.boolean(),
      engine: fc.constantFrom("vllm" as const, "sglang" as const),
      role: fc.constantFrom("combined" as const, "prefill" as const, "decode" as const),
      roleset: name,
      metricsAddress: address,
      kvEvents: fc.record({ endpoint: fc.string(), replayEndpoint: fc.string(), topic: fc.string() }, { requiredKeys: ["endpoint"] }),
      adapters: fc.array(name, { maxLength: 4 }),
      labels: fc.dictionary(fc.string({ maxLength: 10 }), fc.string({ maxLength: 10 }), { maxKeys: 3 }),
      ts: millis,
    },
    { requiredKeys: ["type", "action", "model", "pod", "address", "ready", "engine", "ts"] },
  ),
  load: fc.record(
    {
      type: fc.constant("load" as const),
      model,
      pod,
      ts: millis,
      stale: fc.boolean(),
      scrapeMs: fc.double({ min: 0, noNaN: true, noDefaultInfinity: true }),
      error: fc.string(),
      load: fc.option(
        fc.record({
          running: nullableNum, waiting: nullableNum, kvCacheUsage: nullableNum, prefixCacheQueries: nullableNum, prefixCacheHits: nullableNum,
          cacheHitRate: nullableNum, promptTokens: nullableNum, generationTokens: nullableNum, genThroughput: nullableNum, preemptions: nullableNum,
          blockSize: nullableNum, numGpuBlocks: nullableNum, runningLoras: fc.array(fc.string(), { maxLength: 3 }), waitingLoras: fc.array(fc.string(), { maxLength: 3 }),
          maxLora: nullableNum, histograms: fc.dictionary(fc.string({ maxLength: 12 }), fc.record({ sum: num, count: fc.double({ min: 0, noNaN: true, noDefaultInfinity: true }) }), { maxKeys: 3 }),
        }),
        { nil: null },
      ),
    },
    { requiredKeys: ["type", "model", "pod", "ts", "stale", "load"] },
  ),
  charge: fc.record(
    {
      type: fc.constant("charge" as const), id, gateway, model, pod, ts: millis, ttlMs: posInt, promptTokens: count, maxTokens: count, user,
      phase: fc.constantFrom("combined" as const, "prefill" as const, "decode" as const),
    },
    { requiredKeys: ["type", "id", "gateway", "model", "pod", "ts", "ttlMs", "promptTokens"] },
  ),
  release: fc.record(
    {
      type: fc.constant("release" as const), id, gateway, model, pod, ts: millis,
      outcome: fc.constantFrom("completed" as const, "error" as const, "cancelled" as const, "shutdown" as const),
      promptTokens: count, completionTokens: count, chargedPromptTokens: count, chargedAt: millis, user,
    },
    { requiredKeys: ["type", "id", "gateway", "model", "pod", "ts", "outcome"] },
  ),
  releases: fc.record({
    type: fc.constant("releases" as const), gateway, model, pod,
    releases: fc.array(
      fc.record(
        {
          id, ts: millis, outcome: fc.constantFrom("completed" as const, "error" as const, "cancelled" as const, "shutdown" as const),
          promptTokens: count, completionTokens: count, chargedPromptTokens: count, chargedAt: millis, user,
        },
        { requiredKeys: ["id", "ts", "outcome"] },
      ),
      { minLength: 1, maxLength: 8 },
    ),
  }),
  "pod-source": fc.record({ type: fc.constant("pod-source" as const), source: name, watcher: name, pods: count, intervalMs: fc.integer({ min: 1, max: 600_000 }), ts: millis }),
  heartbeat: fc.record(
    {
      type: fc.constant("heartbeat" as const), gateway, ts: millis, intervalMs: posInt, startedAt: millis, state: fc.constantFrom("up" as const, "down" as const),
      chargeTtlMs: posInt,
      outstanding: fc.array(fc.record({ id, model, pod, promptTokens: count, ts: millis, decoding: fc.boolean() }, { requiredKeys: ["id", "model", "pod", "promptTokens", "ts"] }), { maxLength: 12 }),
      truncated: fc.boolean(),
      beat: fc.nat({ max: 20 }),
      part: fc.nat({ max: 4 }),
      parts: fc.integer({ min: 1, max: 4 }),
    },
    { requiredKeys: ["type", "gateway", "ts", "intervalMs", "startedAt", "state"] },
  ),
  kv: fc.record(
    {
      type: fc.constant("kv" as const), model, pod, epoch: fc.oneof(fc.constantFrom("e1", "e2"), name), seq: fc.nat({ max: 1_000 }), ts: millis,
      dpRank: fc.option(fc.nat({ max: 8 }), { nil: null }),
      events: fc.array(
        fc.oneof(
          { weight: 4, arbitrary: fc.integer({ min: 1, max: 6 }).chain((n) => fc.record({ kind: fc.constant("stored" as const), engineHashes: fc.array(hash, { minLength: n, maxLength: n }), routerHashes: fc.array(hash, { minLength: 1, maxLength: 8 }), parentEngineHash: fc.option(hash, { nil: null }), blockSize: fc.integer({ min: 1, max: 64 }), medium: fc.option(fc.constantFrom("GPU", "CPU", "STORAGE", "x"), { nil: null }), lora: fc.option(fc.string({ maxLength: 10 }), { nil: null }) })) },
          { weight: 2, arbitrary: fc.record({ kind: fc.constant("removed" as const), engineHashes: fc.array(hash, { minLength: 1, maxLength: 8 }), medium: fc.option(fc.constantFrom("GPU", "CPU"), { nil: null }) }) },
          { weight: 1, arbitrary: fc.constant({ kind: "all-cleared" as const }) },
        ),
        { maxLength: 6 },
      ),
    },
    { requiredKeys: ["type", "model", "pod", "epoch", "seq", "ts", "events"] },
  ),
  "kv-cleared": fc.record({
    type: fc.constant("kv-cleared" as const), model, pod, epoch: fc.oneof(fc.constantFrom("e1", "e2"), name),
    reason: fc.constantFrom("engine-restart" as const, "gap-unrepairable" as const, "replay-unavailable" as const, "bridge-start" as const), ts: millis,
  }),
  "kv-routed": fc.record(
    { type: fc.constant("kv-routed" as const), model, pod, gateway, hashes: fc.array(hash, { minLength: 1, maxLength: 32 }), ts: millis, ttlMs: posInt, charge: id },
    { requiredKeys: ["type", "model", "pod", "gateway", "hashes", "ts", "ttlMs"] },
  ),
  usage: fc.record(
    {
      type: fc.constant("usage" as const), gateway, pool: fc.constantFrom("a", "b", "c-1"), startedAt: millis,
      // Whole minutes around T0 (the fold drops minutes long over), or the epoch's first.
      window: fc.oneof({ weight: 10, arbitrary: fc.integer({ min: Math.floor(T0 / 60_000) - 20, max: Math.floor(T0 / 60_000) + 20 }) }, { weight: 1, arbitrary: fc.constant(0) }).map((m) => m * 60_000),
      ts: millis, users: fc.array(fc.tuple(user.filter((u) => u.length > 0), count, count), { maxLength: 20 }), truncated: count,
    },
    { requiredKeys: ["type", "gateway", "startedAt", "window", "ts", "users"] },
  ),
  "response-location": fc.record(
    {
      type: fc.constant("response-location" as const), action: fc.constantFrom("stored" as const, "deleted" as const),
      id: fc.oneof({ weight: 5, arbitrary: fc.integer({ min: 0, max: 50 }).map((n) => `resp_${n}`) }, { weight: 1, arbitrary: fc.stringMatching(/^[A-Za-z0-9_-]{1,128}$/) }),
      tenant: fc.constantFrom("a", "b", "c").map(tenantDigest), gateway, ts: millis, model, pod, expiresAt: millis, stored: fc.boolean(),
    },
    { requiredKeys: ["type", "action", "id", "tenant", "gateway", "ts"] },
  ),
} satisfies Record<GatewayFamily, fc.Arbitrary<StateEvent>>;

// ---- invalid and mutated payloads ----------------------------------------------------------

const wrong = fc.oneof(fc.constant(null), fc.boolean(), fc.constantFrom(-1, 1.5, -1e9, 2 ** 64, ""), fc.string({ maxLength: 10 }), fc.array(fc.integer(), { maxLength: 3 }), fc.object({ maxDepth: 1 }));
const required = (f: GatewayFamily): string[] => (EVENT_SCHEMAS[f] as unknown as { required?: string[] }).required ?? [];

/** What a payload is and whether it is known to be invalid whatever the decoder says. */
interface Payload {
  bytes: Uint8Array;
  how: string;
  mustFail: boolean;
}
const enc = new TextEncoder();
const asPayload = (how: string, mustFail: boolean) => (text: string | Uint8Array): Payload => ({ bytes: typeof text === "string" ? enc.encode(text) : text, how, mustFail });

function payloads(f: GatewayFamily): fc.Arbitrary<Payload> {
  const valid = ev[f] as fc.Arbitrary<Record<string, unknown>>;
  const keys = required(f).filter((k) => k !== "type");
  return fc.oneof(
    { weight: 6, arbitrary: valid.map((e) => asPayload("valid", false)(JSON.stringify(e))) },
    { weight: 2, arbitrary: fc.tuple(valid, fc.constantFrom(...keys)).map(([e, k]) => { const c = { ...e }; delete c[k]; return asPayload(`missing ${k}`, true)(JSON.stringify(c)); }) },
    { weight: 1, arbitrary: fc.tuple(valid, fc.jsonValue({ maxDepth: 1 })).map(([e, v]) => asPayload("extra field", true)(JSON.stringify({ ...e, zzExtra: v }))) },
    { weight: 3, arbitrary: fc.tuple(valid, fc.constantFrom(...Object.keys(EVENT_SCHEMAS[f].properties)), wrong).map(([e, k, v]) => asPayload(`wrong ${k}`, false)(JSON.stringify({ ...e, [k]: v }))) },
    { weight: 1, arbitrary: fc.tuple(valid, fc.constantFrom(-1, -0.001, 1.5, Number.POSITIVE_INFINITY, Number.MAX_SAFE_INTEGER + 2)).map(([e, n]) => asPayload("out of range", false)(JSON.stringify(e).replace(/:(\d+)([,}])/, `:${n}$2`))) },
    { weight: 1, arbitrary: fc.tuple(valid, fc.constantFrom(...FAMILIES, "decision", "", "POD")).map(([e, t]) => asPayload(`type ${t}`, false)(JSON.stringify({ ...e, type: t }))) },
    { weight: 1, arbitrary: valid.chain((e) => { const s = JSON.stringify(e); return fc.integer({ min: 0, max: s.length - 1 }).map((n) => asPayload("truncated", true)(s.slice(0, n))); }) },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 200 }).map(asPayload("random bytes", false)) },
    { weight: 1, arbitrary: fc.constantFrom("", "null", "[]", "{}", '"pod"', "1", "\u00ff\u00fe", "{\"type\":\"pod\"}").map(asPayload("odd JSON", true)) },
    { weight: 1, arbitrary: valid.map((e) => asPayload("invalid UTF-8", true)(Buffer.concat([Buffer.from(JSON.stringify(e)), Buffer.from([0xff, 0xc0])]))) },
    { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => asPayload("random JSON", false)(JSON.stringify(v) ?? "null")) },
  );
}

/** Rare huge payloads (kept out of the 10,000-case loops, mixed into the NATS part). */
function huge(f: GatewayFamily): fc.Arbitrary<Payload> {
  return fc.tuple(ev[f] as fc.Arbitrary<Record<string, unknown>>, fc.integer({ min: 200_000, max: 2_000_000 })).map(([e, n]) => asPayload("huge", true)(JSON.stringify({ ...e, zzPad: "p".repeat(n) })));
}

// ---- pure part -----------------------------------------------------------------------------

const STREAM_OF: Record<GatewayFamily, EventMeta["stream"]> = { pod: "pods", "pod-source": "pods", load: "load", charge: "charges", release: "charges", releases: "charges", heartbeat: "charges", kv: "kv", "kv-cleared": "kv", "kv-routed": "kv", usage: "usage", "response-location": "responses" };
const ALLOWED: Record<EventMeta["stream"], readonly GatewayFamily[]> = { pods: ["pod", "pod-source"], load: ["load"], charges: ["charge", "release", "releases", "heartbeat"], kv: ["kv", "kv-cleared", "kv-routed"], config: [], usage: ["usage"], responses: ["response-location"] };

describe("properties - event decoding and the gateway fold (pure)", () => {
  for (const f of FAMILIES) {
    it(`${f}: decodeEvent never throws, agrees with the schema, and rejects what must fail (${PURE_RUNS} cases)`, () => {
      const allowed = ALLOWED[STREAM_OF[f]];
      fc.assert(
        fc.property(payloads(f), (p) => {
          const d = decodeEvent(p.bytes, allowed);
          if (!d.ok) {
            expect(typeof d.reason).toBe("string");
            expect(d.reason.length).toBeGreaterThan(0);
          }
          if (p.mustFail) expect(d.ok, p.how).toBe(false);
          if (p.how === "valid") expect(d.ok, d.ok ? "" : d.reason).toBe(true);
          // The oracle: a payload decodes iff it is UTF-8 JSON whose `type` is allowed and whose value passes the schema.
          let value: unknown;
          try {
            value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(p.bytes));
          } catch {
            expect(d.ok).toBe(false);
            return;
          }
          const t = (value as { type?: unknown } | null)?.type;
          const want = typeof t === "string" && (allowed as readonly string[]).includes(t) && checkEvent(t as GatewayFamily, value).ok;
          expect(d.ok).toBe(want);
        }),
        { numRuns: PURE_RUNS },
      );
    });

    it(`${f}: GatewayState.apply never throws on schema-valid events and keeps the views bounded (${PURE_RUNS} cases)`, () => {
      const maxCharges = 500;
      const maxEntries = 2_000;
      const maxUsage = 100;
      const state = new GatewayState({ self: SELF, pool: "b", maxCharges, heartbeatTimeoutMs: 3_000, prefixIndex: { maxEntries }, foreignUsage: { maxEntries: maxUsage, maxGateways: 8 } });
      let seq = 0;
      let now = T0;
      let foreignApplied = 0;
      fc.assert(
        fc.property(
          // Mostly this family, with the other families mixed in so their interactions (a release before
          // its charge, a heartbeat listing charges, a pod removed under its blocks) are exercised.
          fc.array(fc.oneof({ weight: 3, arbitrary: ev[f] as fc.Arbitrary<StateEvent> }, { weight: 1, arbitrary: fc.oneof(...FAMILIES.map((g) => ev[g] as fc.Arbitrary<StateEvent>)) }), { minLength: 1, maxLength: 3 }),
          fc.integer({ min: 0, max: 2_000 }),
          (events, advance) => {
            const touched = new Set<string>();
            for (const e of events) {
              const fam = e.type as GatewayFamily;
              expect(checkEvent(fam, e).ok).toBe(true);
              now += advance;
              const r = state.apply(e, { stream: STREAM_OF[fam], subject: `jr.x.${fam}`, seq: ++seq, serverTs: now });
              expect(typeof r.applied).toBe("boolean");
              if (fam === "usage" && r.applied) foreignApplied++;
              if ("model" in e && "pod" in e) touched.add(`${e.model}\u0000${e.pod}`);
              if (e.type === "heartbeat") for (const o of e.outstanding ?? []) touched.add(`${o.model}\u0000${o.pod}`);
            }
            if (advance > 1_900) state.sweep(now, { routed: true });
            expect(state.ledger.size).toBeLessThanOrEqual(maxCharges);
            expect(state.index.stats().entries).toBeLessThanOrEqual(maxEntries);
            expect(state.rates.foreignEntries).toBeLessThanOrEqual(maxUsage);
            expect(state.rates.foreignGateways).toBeLessThanOrEqual(8);
            for (const k of touched) {
              const [m, p] = k.split("\u0000") as [string, string];
              const o = state.ledger.outstanding(m, p);
              if (!(o.requests >= 0 && o.promptTokens >= 0 && o.prefillRequests >= 0 && o.prefillTokens >= 0 && o.prefillRequests <= o.requests)) {
                throw new Error(`outstanding of ${JSON.stringify(k)} went negative or inconsistent: ${JSON.stringify(o)}`);
              }
            }
          },
        ),
        { numRuns: PURE_RUNS },
      );
      // Everything expires eventually: a far-future sweep leaves no charge of another gateway.
      state.sweep(Number.MAX_SAFE_INTEGER / 2, { routed: true });
      const stream = STREAM_OF[f];
      expect(stream === "usage" ? state.usageCursor : stream === "responses" ? state.responsesCursor : state.cursors[stream]).toBeGreaterThan(0);
      // ... and no other namespace's usage summary either (some were held: the bounds above were tested).
      expect(state.rates.foreignEntries).toBe(0);
      if (f === "usage") expect(foreignApplied).toBeGreaterThan(100);
    });
  }
});

// ---- real NATS part ------------------------------------------------------------------------

const DLQ_FAMILY: Record<GatewayFamily, Family> = { pod: "pods", "pod-source": "pods", load: "load", charge: "charges", release: "charges", releases: "charges", heartbeat: "charges", kv: "kv", "kv-cleared": "kv", "kv-routed": "kv", usage: "usage", "response-location": "resploc" };
const VIEW_OF: Record<GatewayFamily, string> = { pod: "pods", "pod-source": "pods", load: "load", charge: "charges", release: "charges", releases: "charges", heartbeat: "charges", kv: "kv", "kv-cleared": "kv", "kv-routed": "kv", usage: "usage", "response-location": "responses" };

interface FollowerInfo {
  view: string;
  lastSeq: number;
  applied: number;
  invalid: number;
  caughtUp: boolean;
}

describe("properties - every event family on a real nats-server", () => {
  let env: TestEnv;
  const gws: GatewayHandle[] = [];
  beforeAll(async () => {
    env = await startTestEnv();
    for (const id of ["gw-ev-1", "gw-ev-2"]) gws.push(await env.gateway({ id, adminPort: 0, prefixMaxEntries: 50_000, maxCharges: 5_000 }));
  });
  afterAll(async () => env?.stop());

  const followers = async (gw: GatewayHandle): Promise<FollowerInfo[]> => ((await (await fetch(`http://127.0.0.1:${gw.adminPort}/debug/state`)).json()) as { followers: FollowerInfo[] }).followers;

  it(`${NATS_PER_FAMILY} generated messages per family: invalid ones counted by every consumer and dead-lettered once with their reason, valid ones applied`, { timeout: 300_000 }, async () => {
    const s = env.subjects;
    const before = new Map(await Promise.all(gws.map(async (g) => [g.id, await followers(g)] as const)));
    type Sent = { family: GatewayFamily; stream: string; seq: number; reason?: string; data: Uint8Array };
    const sent: Sent[] = [];
    let n = 0;
    for (const f of FAMILIES) {
      const gen = fc.oneof({ weight: 200, arbitrary: payloads(f) }, { weight: 1, arbitrary: huge(f) });
      const batch = fc.sample(gen, { numRuns: NATS_PER_FAMILY, seed: 4242 + n });
      const allowed = ALLOWED[STREAM_OF[f]];
      // Unique subjects: PODS keeps 5 messages per subject, and a message replaced before the
      // ordered consumer reads it would never be delivered at all.
      const subjectOf = (i: number) => {
        const p = `prop-${f}-${i}`;
        switch (f) {
          case "pod": return s.pod("m", p);
          case "pod-source": return s.podSource(p);
          case "load": return s.load("m", p);
          case "charge": return s.charges("m", p);
          case "release":
          case "releases": return s.releases("m", p);
          case "heartbeat": return s.heartbeat(`other-${i}`);
          case "usage": return s.usage("c", `other-${i}`, 1);
          case "response-location": return s.responseLocation(locationDigest(tenantDigest("t"), p));
          default: return s.kv("m", p);
        }
      };
      for (let i = 0; i < batch.length; i += 50) {
        const acks = await Promise.all(batch.slice(i, i + 50).map((p, j) => env.nats.js.publish(subjectOf(i + j), p.bytes)));
        acks.forEach((ack, j) => {
          const p = batch[i + j] as Payload;
          const d = decodeEvent(p.bytes, allowed);
          sent.push({ family: f, stream: ack.stream, seq: ack.seq, data: p.bytes, ...(d.ok ? {} : { reason: d.reason }) });
        });
      }
      n++;
    }
    const invalid = sent.filter((x) => x.reason !== undefined);
    const lastSeq = new Map<string, number>();
    for (const x of sent) lastSeq.set(VIEW_OF[x.family], Math.max(lastSeq.get(VIEW_OF[x.family]) ?? 0, x.seq));
    const expectInvalid = (view: string) => invalid.filter((x) => VIEW_OF[x.family] === view).length;
    const expectValid = (view: string) => sent.filter((x) => x.reason === undefined && VIEW_OF[x.family] === view).length;

    for (const gw of gws) {
      const base = before.get(gw.id) ?? [];
      let now: FollowerInfo[] = [];
      await waitFor(
        async () => {
          now = await followers(gw);
          return now.every((fo) => fo.lastSeq >= (lastSeq.get(fo.view) ?? 0));
        },
        30_000,
        () => `${gw.id} to catch up: ${JSON.stringify(now)}`,
        20,
      );
      expect(gw.ready()).toBe(true);
      for (const fo of now) {
        const b = base.find((x) => x.view === fo.view) as FollowerInfo;
        expect(fo.invalid - b.invalid, `${gw.id} ${fo.view} invalid`).toBe(expectInvalid(fo.view));
        // Pods, load and KV see only this test's messages; CHARGES also carries the gateways' own traffic.
        if (fo.view === "charges") expect(fo.applied - b.applied).toBeGreaterThanOrEqual(expectValid(fo.view));
        else expect(fo.applied - b.applied, `${gw.id} ${fo.view} applied`).toBe(expectValid(fo.view));
      }
      // Views within their bounds.
      expect(gw.views.ledger.size).toBeLessThanOrEqual(5_000);
      expect(gw.prefixIndex.stats().entries).toBeLessThanOrEqual(50_000);
      expect(gw.views.pods.size).toBeLessThanOrEqual(NATS_PER_FAMILY);
    }

    // The dead-letter stream: exactly one letter per invalid message, from whichever gateway read it
    // first (each letter's Msg-Id is its stream and sequence), with its reason.
    const dlqName = streamName("jr", "DLQ");
    const want = invalid.length;
    const letters: Array<{ subject: string; consumer: string; stream: string; seq: number; reason: string; size: number; digest: string; data: Uint8Array }> = [];
    await waitFor(
      async () => {
        const c = await env.nats.js.consumers.get(dlqName, { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: letters.length + 1 });
        const it = await c.fetch({ max_messages: 1_000, expires: 1_000 });
        for await (const m of it) {
          letters.push({ subject: m.subject, consumer: m.headers?.get(DlqHeaders.consumer) ?? "", stream: m.headers?.get(DlqHeaders.stream) ?? "", seq: Number(m.headers?.get(DlqHeaders.seq)), reason: m.headers?.get(DlqHeaders.reason) ?? "", size: Number(m.headers?.get(DlqHeaders.size)), digest: m.headers?.get(DlqHeaders.digest) ?? "", data: m.data });
        }
        return letters.length >= want;
      },
      30_000,
      () => `${want} dead letters (${letters.length} read)`,
    );
    expect(letters).toHaveLength(want);
    const byKey = new Map<string, (typeof letters)[number][]>();
    for (const l of letters) {
      const k = `${l.stream} ${l.seq}`;
      byKey.set(k, [...(byKey.get(k) ?? []), l]);
    }
    for (const x of invalid) {
      const k = `${x.stream} ${x.seq}`;
      const got = byKey.get(k) ?? [];
      expect(got, k).toHaveLength(1);
      const l = got[0] as (typeof letters)[number];
      expect(gws.map((gw) => `gateway-${gw.id}-${VIEW_OF[x.family]}`), k).toContain(l.consumer);
      expect(l.subject).toBe(s.deadLetter(DLQ_FAMILY[x.family]));
      expect(l.reason).toBe((x.reason as string).replace(/[\r\n]+/g, " ").slice(0, 1000));
      // The envelope only (the default): the payload's size and digest, no byte of it.
      expect(l.data).toHaveLength(0);
      expect(l.size).toBe(x.data.length);
      expect(l.digest).toBe(createHash("sha256").update(x.data).digest("hex").slice(0, 16));
    }
    const counts = Object.fromEntries(FAMILIES.map((f) => [f, { sent: sent.filter((x) => x.family === f).length, invalid: invalid.filter((x) => x.family === f).length }]));
    console.log(`events on NATS: ${JSON.stringify(counts)}`);
  });
});
