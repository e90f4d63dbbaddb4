/**
 * Property: whatever body and headers a client sends through Envoy, the gateway answers every
 * ext_proc exchange with either a routing CONTINUE naming one of its pods or an immediate,
 * OpenAI-shaped JSON error whose status is one of the documented ones (400, 404, 413, 429, 503 —
 * never another 5xx, never a broken stream); once the exchanges end, nothing stays charged or in
 * flight; and Prometheus' `strategy` label stays bounded however many strategy specs clients
 * invent. Why: Envoy runs with `failure_mode_allow: false`, so a crash or a stream error here is a
 * 500 for a real user, and an unbounded label is a slow memory leak in every scraper.
 *
 * Real nats-server, in-process gateway, Envoy-faithful client; 10,000 exchanges by default,
 * JETROUTE_SOAK=1 (or JETROUTE_SOAK=<n>) for more.
 */
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient, type PhaseResult } from "../../services/extproc/envoy-client.js";
import type { GatewayHandle } from "../../services/gateway/gateway.js";
import { Kvm } from "@nats-io/kv";
import { configBucketName } from "../../streams/definitions.js";
import { cachedSpecCount, strategyNames } from "../../services/routing/strategies/registry.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "../harness/env.js";

const SOAK = process.env.JETROUTE_SOAK;
const CASES = SOAK ? Math.max(100_000, Number(SOAK) || 0) : 10_000;
const BATCH = 32;
const DOCUMENTED = new Set([400, 404, 413, 429, 503]);
const MAX_BODY = 4 * 1024 * 1024;
const ADDRESSES = Array.from({ length: 4 }, (_, i) => `127.0.0.1:${8100 + i}`);

// ---- generators ----------------------------------------------------------------------------

/** Anything that can stand where a field's proper value should: every JSON type, odd numbers. */
const wrong = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.integer(),
  fc.double(),
  fc.constantFrom(-1, 0, 1.5, 2 ** 53, -(2 ** 60), 1e308),
  fc.string({ maxLength: 20 }),
  fc.array(fc.jsonValue({ maxDepth: 2 }), { maxLength: 4 }),
  fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 4 }),
);
/** Mostly the proper value, sometimes a wrong one: a request usually breaks in one place at most. */
const field = <T>(ok: fc.Arbitrary<T>) => fc.oneof({ weight: 12, arbitrary: ok }, { weight: 1, arbitrary: wrong });
const text = fc.oneof({ weight: 4, arbitrary: fc.string({ maxLength: 64 }) }, { weight: 1, arbitrary: fc.string({ unit: "grapheme", maxLength: 64 }) }, { weight: 1, arbitrary: fc.integer({ min: 1, max: 20_000 }).map((n) => "x".repeat(n)) });
const modelName = fc.oneof(
  { weight: 20, arbitrary: fc.constant(MODEL) },
  { weight: 1, arbitrary: fc.constant("sleepy/model") },
  { weight: 1, arbitrary: fc.string({ maxLength: 300 }) },
  { weight: 1, arbitrary: fc.string({ unit: "grapheme", minLength: 1, maxLength: 40 }) },
);
const part = fc.oneof(
  { weight: 20, arbitrary: fc.record({ type: fc.constantFrom("text", "input_text"), text }) },
  { weight: 5, arbitrary: fc.record({ type: fc.constantFrom("image_url", "input_audio", "file", "refusal"), image_url: fc.record({ url: fc.webUrl() }) }) },
  { weight: 1, arbitrary: fc.constant(null) },
  { weight: 1, arbitrary: fc.record({ type: wrong, text: wrong }, { requiredKeys: [] }) },
  { weight: 1, arbitrary: wrong },
);
const message = fc.oneof(
  { weight: 30, arbitrary: fc.record({ role: fc.constantFrom("system", "user", "assistant", "tool"), content: fc.oneof({ weight: 4, arbitrary: text }, { weight: 1, arbitrary: fc.array(part, { maxLength: 3 }) }, { weight: 1, arbitrary: fc.constant(null) }) }) },
  { weight: 1, arbitrary: fc.record({ role: wrong, content: wrong }, { requiredKeys: [] }) },
  { weight: 1, arbitrary: wrong },
);
const tokenIds = fc.oneof({ weight: 8, arbitrary: fc.array(fc.nat({ max: 200_000 }), { maxLength: 300 }) }, { weight: 1, arbitrary: fc.array(fc.oneof(fc.nat({ max: 200_000 }), fc.constantFrom(-1, 1.5, 2 ** 53, "7")), { maxLength: 30 }) });
const prompt = fc.oneof({ weight: 3, arbitrary: text }, { weight: 1, arbitrary: fc.array(text, { maxLength: 4 }) }, { weight: 2, arbitrary: tokenIds }, { weight: 1, arbitrary: fc.array(tokenIds, { maxLength: 3 }) }, { weight: 1, arbitrary: wrong });
/** Optional fields of a request, each either proper or of a wrong type/range. */
const options = fc.record(
  {
    stream: field(fc.boolean()),
    max_tokens: field(fc.integer({ min: 1, max: 100_000 })),
    max_completion_tokens: field(fc.integer({ min: 1, max: 100_000 })),
    n: field(fc.integer({ min: 1, max: 8 })),
    temperature: field(fc.double({ min: 0, max: 2, noNaN: true })),
    user: field(fc.string({ maxLength: 300 })),
    input: field(prompt),
  },
  { requiredKeys: [] },
);
const chat = fc.record({ model: field(modelName), messages: field(fc.array(message, { maxLength: 6 })), options }).map(({ options: o, ...b }) => ({ ...b, ...o }));
const completion = fc.record({ model: field(modelName), prompt, options }).map(({ options: o, ...b }) => ({ ...b, ...o }));
/** A body nested `depth` levels deep inside an otherwise valid request (the parser must not recurse). */
const deep = fc.tuple(fc.integer({ min: 1, max: 5_000 }), fc.boolean()).map(([depth, arr]) => Buffer.from(`{"model":${JSON.stringify(MODEL)},"prompt":"x","meta":${arr ? "[".repeat(depth) + "]".repeat(depth) : '{"a":'.repeat(depth) + "1" + "}".repeat(depth)}}`));
const huge = fc.constantFrom(MAX_BODY - 200, MAX_BODY + 1, MAX_BODY * 2).map((n) => Buffer.from(`{"model":${JSON.stringify(MODEL)},"prompt":"${"y".repeat(Math.max(0, n - 40 - MODEL.length))}"}`));
const json = (a: fc.Arbitrary<unknown>) => a.map((v) => Buffer.from(JSON.stringify(v) ?? "null"));
const body: fc.Arbitrary<Buffer> = fc.oneof(
  { weight: 10, arbitrary: json(chat) },
  { weight: 6, arbitrary: json(completion) },
  { weight: 2, arbitrary: json(fc.jsonValue({ maxDepth: 6 })) },
  { weight: 1, arbitrary: json(fc.object({ maxDepth: 3 })) },
  { weight: 2, arbitrary: fc.uint8Array({ maxLength: 512 }).map((u) => Buffer.from(u)) },
  { weight: 1, arbitrary: json(chat).chain((b) => fc.nat({ max: b.length }).map((n) => b.subarray(0, n))) },
  { weight: 1, arbitrary: deep },
  { weight: 1, arbitrary: fc.constant(Buffer.alloc(0)) },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 99 }).map((n) => (n === 0 ? "huge" : "small")).chain((k) => (k === "huge" ? huge : json(chat))) },
);

const builtins = strategyNames();
const strategy = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(...builtins) },
  { weight: 2, arbitrary: fc.uniqueArray(fc.tuple(fc.constantFrom(...builtins), fc.oneof(fc.constant(""), fc.integer({ min: -2, max: 9 }).map((w) => `:${w}`), fc.double({ noNaN: false }).map((w) => `:${w}`), fc.string({ maxLength: 4 }).map((w) => `:${w}`))), { minLength: 2, maxLength: 5, selector: ([n]) => n }).map((ps) => ps.map(([n, w]) => n + w).join(",")) },
  { weight: 2, arbitrary: fc.string({ maxLength: 40 }) },
  { weight: 1, arbitrary: fc.string({ unit: "grapheme", maxLength: 40 }) },
  { weight: 1, arbitrary: fc.integer({ min: 500, max: 3_000 }).map((n) => `least-request:1,${"x".repeat(n)}`) },
);
const headerText = fc.oneof(fc.string({ maxLength: 40 }), fc.string({ unit: "grapheme", maxLength: 40 }), fc.integer({ min: 100, max: 8_000 }).map((n) => "h".repeat(n)), fc.base64String({ maxLength: 40 }));
const sessionId = fc.oneof(fc.constantFrom(...ADDRESSES).map((a) => Buffer.from(a).toString("base64")), headerText);
const wildHeaders = fc.record(
  {
    "routing-strategy": strategy,
    user: headerText,
    "x-request-id": fc.oneof(fc.uuid(), headerText),
    "x-session-id": sessionId,
    "x-aibrix-session-key": headerText,
    "config-profile": headerText,
    authorization: fc.oneof(headerText, headerText.map((t) => `Bearer ${t}`)),
    "x-gateway-destination-endpoint": fc.constant("6.6.6.6:1"),
  },
  { requiredKeys: [] },
);
/** Clean headers (a real client's) most of the time, wild ones otherwise. */
const cleanHeaders = fc.record({ "routing-strategy": fc.constantFrom(...builtins), user: fc.oneof(fc.string({ minLength: 1, maxLength: 20 }), fc.constantFrom("limited", "tokens-limited")), "x-request-id": fc.uuid() }, { requiredKeys: [] });
const headers = fc.oneof({ weight: 2, arbitrary: cleanHeaders }, { weight: 1, arbitrary: wildHeaders });
const path = fc.oneof({ weight: 30, arbitrary: fc.constantFrom("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/completions?x=1") }, { weight: 1, arbitrary: fc.constantFrom("/v1/rerank", "/", "/v1/models", "") }, { weight: 1, arbitrary: fc.string({ maxLength: 30 }) });
const request = fc.record({ path, headers, body });
type Req = typeof request extends fc.Arbitrary<infer T> ? T : never;

// ---- the property --------------------------------------------------------------------------

interface Seen {
  statuses: Map<number, number>;
  codes: Map<string, number>;
  routed: number;
}

function checkReply(r: PhaseResult, req: Req, seen: Seen): void {
  if (r.kind === "continue") {
    const endpoint = r.headerMutation.set["x-gateway-destination-endpoint"];
    if (!endpoint || !ADDRESSES.includes(endpoint)) throw new Error(`CONTINUE without a known pod: ${JSON.stringify(r.headerMutation.set)}`);
    seen.routed++;
    return;
  }
  seen.statuses.set(r.status, (seen.statuses.get(r.status) ?? 0) + 1);
  if (!DOCUMENTED.has(r.status)) throw new Error(`undocumented status ${r.status}: ${r.body.toString().slice(0, 300)} for ${describeReq(req)}`);
  if (r.headers["content-type"] !== "application/json") throw new Error(`status ${r.status} without JSON content type`);
  const parsed = JSON.parse(r.body.toString("utf8")) as { error?: Record<string, unknown> };
  const e = parsed.error;
  if (!e || typeof e !== "object") throw new Error(`not OpenAI-shaped: ${r.body.toString().slice(0, 300)}`);
  if (typeof e.message !== "string" || e.message.length === 0) throw new Error("error.message missing");
  if (typeof e.type !== "string" || e.type.length === 0) throw new Error("error.type missing");
  if (typeof e.code !== "string" && typeof e.code !== "number") throw new Error("error.code missing");
  seen.codes.set(`${r.status} ${String(e.code)} ${String(e.param).replace(/\[\d+\]/g, "[]")}`, (seen.codes.get(`${r.status} ${String(e.code)} ${String(e.param).replace(/\[\d+\]/g, "[]")}`) ?? 0) + 1);
  if (!("param" in e) || (e.param !== null && typeof e.param !== "string")) throw new Error("error.param must be a string or null");
}

function describeReq(req: Req): string {
  return JSON.stringify({ path: req.path, headers: Object.fromEntries(Object.entries(req.headers).map(([k, v]) => [k, String(v).slice(0, 80)])), body: req.body.subarray(0, 300).toString() });
}

describe("properties - ext_proc bodies and headers", () => {
  let env: TestEnv;
  let gw: GatewayHandle;
  let client: ExtProcClient;
  beforeAll(async () => {
    env = await startTestEnv();
    for (const [i, address] of ADDRESSES.entries()) await env.publishPod({ pod: `pod-${i}.ns`, address });
    await env.publishPod({ model: "sleepy/model", pod: "down-0", address: "127.0.0.1:8200", ready: false });
    // Two users with tiny limits, so 429 is among the answers.
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put("limits", JSON.stringify({ users: { limited: { rpm: 1 }, "tokens-limited": { tpm: 10 } } }));
    gw = await env.gateway({ id: "gw-prop-extproc", adminPort: 0 });
    client = new ExtProcClient(`127.0.0.1:${gw.port}`, { messageTimeoutMs: 10_000 });
    await waitFor(() => gw.views.pods.size >= 5, 5_000, "pods");
  });
  afterAll(async () => {
    client?.close();
    await env?.stop();
  });

  it(`${CASES} generated exchanges: CONTINUE or a documented OpenAI error; nothing left charged; bounded labels`, { timeout: 600_000 }, async () => {
    const seen: Seen = { statuses: new Map(), codes: new Map(), routed: 0 };
    let cases = 0;
    const t0 = performance.now();
    const one = async (req: Req) => {
      const ex = client.open();
      try {
        const h = await ex.requestHeaders({ ":method": "POST", ":path": req.path || "/", ":authority": "gw", "content-type": "application/json", ...req.headers });
        if (h.kind !== "continue") throw new Error(`request headers answered ${h.kind}`);
        checkReply(await ex.requestBody(req.body), req, seen);
      } finally {
        ex.cancel();
      }
    };
    await fc.assert(
      fc.asyncProperty(fc.array(request, { minLength: BATCH, maxLength: BATCH }), async (reqs) => {
        cases += reqs.length;
        await Promise.all(reqs.map(one));
      }),
      { numRuns: Math.ceil(CASES / BATCH) },
    );
    const elapsed = performance.now() - t0;
    await waitFor(() => gw.views.ledger.size === 0 && gw.director.inFlight.size === 0, 10_000, "every charge released, nothing in flight");

    // Bounded label cardinality, read from the admin port as a scraper would.
    const metrics = await (await fetch(`http://127.0.0.1:${gw.adminPort}/metrics`)).text();
    const labels = new Set<string>();
    for (const line of metrics.split("\n")) {
      if (!line.startsWith("jetroute_gateway_requests_total{")) continue;
      const m = /strategy="((?:[^"\\]|\\.)*)"/.exec(line);
      if (m?.[1] !== undefined) labels.add(m[1]);
    }
    expect(labels.size).toBeGreaterThan(0);
    expect(labels.size).toBeLessThanOrEqual(builtins.length + 2);
    for (const l of labels) expect([...builtins, "invalid", "combination"]).toContain(l);
    expect(cachedSpecCount()).toBeLessThanOrEqual(10_000);
    expect(gw.ready()).toBe(true);
    const summary = { cases, seconds: +(elapsed / 1000).toFixed(1), perSecond: Math.round(cases / (elapsed / 1000)), routed: seen.routed, statuses: Object.fromEntries(seen.statuses), codes: Object.fromEntries([...seen.codes].sort((a, b) => b[1] - a[1]).slice(0, 12)), labels: [...labels] };
    console.log(`extproc properties: ${JSON.stringify(summary)}`);
    expect(cases).toBeGreaterThanOrEqual(CASES);
    expect(seen.routed).toBeGreaterThan(CASES / 10);
  });
});
