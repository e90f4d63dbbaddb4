/**
 * `npm run bench -- semantic`: semantic model selection's cost on the request path, and its
 * routing accuracy on the project's labelled prompts (loadtest/workloads/semantic-prompts.ts).
 *
 * 1. keyword: 1,000 requests of mixed size (short prompts, 20-turn conversations, 40 KB messages
 *    classified on their 4,096-character prefix), keyword + regex rules over five domains: µs per request of
 *    classification (texts, signals, decision), p50 and p99; the rewrite (the action applied and
 *    the body serialised once, which grows with the body) is printed on stderr, and is inside
 *    the end-to-end comparison (4).
 * 2. embedding, cached: the same with similarity rules whose embeddings are all in the gateway's
 *    cache (EmbeddingClient.cached) — µs per request, p50.
 * 3. embedding, uncached: each request's text new to the cache, embedded by a simulated pod over
 *    HTTP (one call), then classified; ms p50, next to a bare `/v1/embeddings` call's p50.
 * 4. virtual vs plain: real gRPC ext_proc exchanges (request headers + body, answered with the
 *    routing reply) against one Director, alternating a virtual-model request and the same body
 *    for a real model; the p50 difference (ms).
 * 5. accuracy: the labelled prompts routed by keyword rules, by similarity rules on the
 *    simulator's embeddings, and by the same similarity rules on the lexical fallback.
 * Also (stderr): the embedding cache's measured bytes per entry (needs `node --expose-gc`).
 */
import * as grpc from "@grpc/grpc-js";
import type { ModelConfig } from "../../schemas/config.js";
import type { SemanticConfig } from "../../schemas/semantic.js";
import { ExtProcClient } from "../../services/extproc/envoy-client.js";
import { EXT_PROC_SERVER_OPTIONS, loadExtProc } from "../../services/extproc/protos.js";
import { EmbeddingClient, VectorCache } from "../../services/gateway/embeddings.js";
import { createExtProcHandler } from "../../services/gateway/extproc-server.js";
import { Director, parseRequestBody, applyAction, classify, requestTexts, compileRules, embeddingTextsOf } from "../../services/routing/mod.js";
import { putModelConfig, semanticState } from "../../services/routing/semantic/testing.js";
import { createLogger } from "../../services/shared/log.js";
import { mulberry32 } from "../../services/shared/seeded-random.js";
import { startSimFleet } from "../../services/sim/fleet.js";
import { DOMAIN_EXAMPLES, DOMAIN_KEYWORDS, LABELLED_PROMPTS, SEMANTIC_DOMAINS, type SemanticDomain } from "../workloads/semantic-prompts.js";

const EMBED = "bench/embed";
const modelOf = (d: SemanticDomain) => `bench/${d}`;
const DOMAINS = SEMANTIC_DOMAINS.filter((d): d is Exclude<SemanticDomain, "general"> => d !== "general");

/** Keyword rules: one keywords signal per domain (plus a code-fence regex), priorities in domain order. */
export function keywordRules(): SemanticConfig {
  return {
    signals: { ...Object.fromEntries(DOMAINS.map((d) => [d, { type: "keywords" as const, keywords: [...DOMAIN_KEYWORDS[d]] }])), fence: { type: "regex", pattern: "```|\\bdef\\s+\\w+\\(|;\\s*$" } },
    decisions: DOMAINS.map((d, i) => ({ name: d, priority: DOMAINS.length - i, when: d === "code" ? { any: ["code", "fence"] } : d, action: { model: modelOf(d) } })),
    default: { model: modelOf("general") },
  };
}

/**
 * Similarity rules: one similarity signal per domain over its example utterances, in one group
 * (the closest domain wins). Thresholds: 0.25 on embeddings, 0.1 on the lexical fallback.
 */
export function similarityRules(embeddingModel?: string): SemanticConfig {
  return {
    signals: Object.fromEntries(DOMAINS.map((d) => [d, { type: "similarity" as const, examples: [...DOMAIN_EXAMPLES[d]], threshold: 0.25, lexicalThreshold: 0.1, group: "domain" }])),
    decisions: DOMAINS.map((d, i) => ({ name: d, priority: DOMAINS.length - i, when: d, action: { model: modelOf(d) } })),
    default: { model: modelOf("general") },
    ...(embeddingModel ? { embeddingModel, embeddingTimeoutMs: 1_000 } : {}),
  };
}

const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
const pct = (xs: number[], p: number) => {
  const s = sorted(xs);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))] as number;
};
const r3 = (x: number) => Math.round(x * 1000) / 1000;
const r1 = (x: number) => Math.round(x * 10) / 10;

/** 1,000 request bodies of mixed size for the virtual model `auto`. */
function mixedBodies(n: number): Buffer[] {
  const rnd = mulberry32(21);
  const out: Buffer[] = [];
  for (let i = 0; i < n; i++) {
    const p = LABELLED_PROMPTS[Math.floor(rnd() * LABELLED_PROMPTS.length)]?.text as string;
    let messages: Array<{ role: string; content: string }>;
    if (i % 20 === 0) messages = [{ role: "user", content: `${p} ${"Here is more context for the question. ".repeat(1_000)}` }];
    else if (i % 5 === 0) messages = Array.from({ length: 20 }, (_, t) => ({ role: t % 2 ? "assistant" : "user", content: t === 19 ? p : `${LABELLED_PROMPTS[(i + t) % LABELLED_PROMPTS.length]?.text} `.repeat(4) }));
    else messages = [{ role: "system", content: "You are a helpful assistant." }, { role: "user", content: p }];
    out.push(Buffer.from(JSON.stringify({ model: "auto", messages, max_tokens: 64 })));
  }
  return out;
}

/**
 * µs per request of classification (texts, signals, cached embeddings, decision), and separately
 * of the rewrite (the action applied and the body serialised once), after a warm-up pass.
 */
function stageMicros(rules: SemanticConfig, bodies: Buffer[], embeddings?: EmbeddingClient): { classify: number[]; rewrite: number[] } {
  const compiled = compileRules("auto", rules);
  const parsed = bodies.map((b) => parseRequestBody(b));
  const pass = () => {
    const c: number[] = [];
    const w: number[] = [];
    for (const p of parsed) {
      const t0 = performance.now();
      const texts = requestTexts(compiled, p);
      const need = embeddings ? embeddingTextsOf(compiled, texts) : [];
      const emb = embeddings && compiled.embeddingModel ? embeddings.cached(compiled.embeddingModel, need) : undefined;
      const o = classify(compiled, p, { headers: {}, ...(emb ? { embeddings: emb } : {}) }, texts);
      const t1 = performance.now();
      Buffer.from(JSON.stringify(applyAction(p, o.action).body));
      c.push((t1 - t0) * 1000);
      w.push((performance.now() - t1) * 1000);
    }
    return { classify: c, rewrite: w };
  };
  pass();
  return pass();
}

function accuracy(rules: SemanticConfig, embeddings?: ReadonlyMap<string, ArrayLike<number>>): number {
  const compiled = compileRules("auto", rules);
  let ok = 0;
  for (const { text, domain } of LABELLED_PROMPTS) {
    const p = parseRequestBody(Buffer.from(JSON.stringify({ model: "auto", messages: [{ role: "user", content: text }] })));
    if (classify(compiled, p, { headers: {}, ...(embeddings ? { embeddings } : {}) }).action.model === modelOf(domain)) ok++;
  }
  return r3(ok / LABELLED_PROMPTS.length);
}

/** Bytes one cache entry costs beyond its vector (heap + array buffers over 50,000 entries). */
export function cacheEntryOverhead(): number | undefined {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) return undefined;
  const measure = () => {
    const c = new VectorCache(1e12);
    const keys = Array.from({ length: 50_000 }, (_, i) => `k${i}`.padEnd(24, "x"));
    // Twice: one collection can leave an earlier measurement's cache (and its buffers) behind.
    gc();
    gc();
    const before = process.memoryUsage();
    for (const k of keys) c.set(k, new Float32Array(256));
    gc();
    gc();
    const after = process.memoryUsage();
    // `c.size` after the measurement keeps the cache alive through the second collection.
    return (after.heapUsed + after.arrayBuffers - before.heapUsed - before.arrayBuffers) / c.size - 1024;
  };
  measure();
  return Math.round(measure());
}

async function virtualVsPlain(requests: number): Promise<{ virtualP50: number; plainP50: number }> {
  const state = semanticState([...SEMANTIC_DOMAINS.map(modelOf)], 4, "bench-gw");
  putModelConfig(state, "auto", { semantic: keywordRules() } as ModelConfig, 1_000);
  const sink = { charge() {}, release() {}, decision() {} };
  const director = new Director({ gatewayId: "bench-gw", defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink, config: state.configs });
  const server = new grpc.Server(EXT_PROC_SERVER_OPTIONS);
  server.addService(loadExtProc().service, { Process: createExtProcHandler({ log: createLogger("bench", "silent"), isReady: () => true, listModels: () => [], router: director }) });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  const client = new ExtProcClient(`127.0.0.1:${port}`);
  const headers = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json" };
  const bodyFor = (model: string, i: number) => Buffer.from(JSON.stringify({ model, messages: [{ role: "system", content: "You are a helpful assistant." }, { role: "user", content: LABELLED_PROMPTS[i % LABELLED_PROMPTS.length]?.text }], max_tokens: 64 }));
  const one = async (body: Buffer) => {
    const ex = client.open();
    const t0 = performance.now();
    await ex.requestHeaders(headers);
    const r = await ex.requestBody(body);
    const ms = performance.now() - t0;
    if (r.kind !== "continue") throw new Error("bench request was refused");
    // The response ends the request (its charge released): the pods stay equally loaded.
    await ex.responseHeaders(200, { "content-type": "application/json" });
    await ex.responseBodyChunk(Buffer.from("{}"), true);
    await ex.end();
    return ms;
  };
  const virtual: number[] = [];
  const plain: number[] = [];
  for (let i = 0; i < requests + 200; i++) {
    const v = await one(bodyFor("auto", i));
    const p = await one(bodyFor(modelOf("general"), i));
    if (i >= 200) {
      virtual.push(v);
      plain.push(p);
    }
  }
  client.close();
  server.forceShutdown();
  return { virtualP50: pct(virtual, 0.5), plainP50: pct(plain, 0.5) };
}

export async function runSemanticBench(o: { requests?: number } = {}): Promise<Record<string, unknown>> {
  const n = o.requests ?? 1_000;
  // First, on a fresh heap (later phases leave garbage that makes the heap delta meaningless).
  const overhead = cacheEntryOverhead();
  if (overhead !== undefined) console.error(`embedding cache: ${overhead} bytes per entry beyond the vector (bound used: 240)`);
  const bodies = mixedBodies(n);
  const kwRun = stageMicros(keywordRules(), bodies);
  const kw = kwRun.classify;
  console.error(`keyword rules: classification p50 ${r1(pct(kw, 0.5))} µs, p99 ${r1(pct(kw, 0.99))} µs per request (${n} requests of mixed size); the rewrite (action + one serialisation) p50 ${r1(pct(kwRun.rewrite, 0.5))} µs, p99 ${r1(pct(kwRun.rewrite, 0.99))} µs`);

  const fleet = await startSimFleet({ pods: 1, model: EMBED, kvEvents: false, logger: createLogger("sim", "silent") });
  const address = fleet.pods[0]?.address as string;
  const client = new EmbeddingClient({ readyPods: () => [{ model: EMBED, pod: "embed-0", address } as never] });
  try {
    const simRules = similarityRules(EMBED);
    const compiled = compileRules("auto", simRules);
    // Fill the cache with every text the mixed requests need, then measure the cached path.
    const need = [...new Set(bodies.flatMap((b) => embeddingTextsOf(compiled, requestTexts(compiled, parseRequestBody(b)))))];
    for (let i = 0; i < need.length; i += 128) await client.embed(EMBED, need.slice(i, i + 128), 10_000);
    const cached = stageMicros(simRules, bodies, client).classify;
    console.error(`embedding rules, cached: p50 ${r1(pct(cached, 0.5))} µs, p99 ${r1(pct(cached, 0.99))} µs per request`);

    // Uncached: a text the cache never saw (the examples are cached), one call each.
    const uncached: number[] = [];
    const bare: number[] = [];
    for (let i = 0; i < 300; i++) {
      const text = `${LABELLED_PROMPTS[i % LABELLED_PROMPTS.length]?.text} (variant ${i})`;
      const p = parseRequestBody(Buffer.from(JSON.stringify({ model: "auto", messages: [{ role: "user", content: text }] })));
      const t0 = performance.now();
      const texts = requestTexts(compiled, p);
      const got = await client.embed(EMBED, embeddingTextsOf(compiled, texts), 10_000);
      const out = classify(compiled, p, { headers: {}, ...(got ? { embeddings: got } : {}) }, texts);
      Buffer.from(JSON.stringify(applyAction(p, out.action).body));
      uncached.push(performance.now() - t0);
      const t1 = performance.now();
      const res = await fetch(`http://${address}/v1/embeddings`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: EMBED, input: [`${text} again`] }) });
      await res.arrayBuffer();
      bare.push(performance.now() - t1);
    }
    console.error(`embedding rules, uncached: p50 ${r3(pct(uncached, 0.5))} ms per request; a bare /v1/embeddings call p50 ${r3(pct(bare, 0.5))} ms (overhead ${r3(pct(uncached, 0.5) - pct(bare, 0.5))} ms)`);

    const vectors = new Map<string, ArrayLike<number>>();
    const allTexts = [...LABELLED_PROMPTS.map((p) => p.text), ...DOMAINS.flatMap((d) => DOMAIN_EXAMPLES[d])];
    const got = await client.embed(EMBED, allTexts, 10_000);
    for (const [t, v] of got ?? []) vectors.set(t, v);
    const acc = { keywords: accuracy(keywordRules()), embeddings: accuracy(simRules, vectors), lexical: accuracy(similarityRules()) };
    const vp = await virtualVsPlain(n);
    console.error(`ext_proc exchange p50: virtual ${r3(vp.virtualP50)} ms, plain ${r3(vp.plainP50)} ms`);
    return {
      bench: "semantic",
      keyword_p50_us: r1(pct(kw, 0.5)),
      keyword_p99_us: r1(pct(kw, 0.99)),
      embedding_cached_p50_us: r1(pct(cached, 0.5)),
      embedding_uncached_p50_ms: r3(pct(uncached, 0.5)),
      virtual_vs_plain_p50_ms: r3(vp.virtualP50 - vp.plainP50),
      accuracy: acc,
    };
  } finally {
    await fleet.close();
  }
}
