/**
 * `POST /debug/explain` on the admin port: an OpenAI request body (and the routing headers of the
 * HTTP request) in, the decision the gateway would make out — candidates with their prefix match
 * per tier, load, scores, the strategy and the pick — without charging anything.
 *
 * Ties are broken by a random sequence seeded from the request (its `x-request-id`, else its
 * body), so two caught-up replicas explain the same request identically. (Live routing instead
 * staggers ties by replica: see TieOrder in strategies/types.ts.)
 */
import { createHash } from "node:crypto";
import type { Director } from "./director.js";
import type { GatewayViews } from "./director.js";
import { RouteError, routeErrorBody } from "./errors.js";
import { tokenLoad } from "../views/charge-ledger.js";
import { mulberry32 } from "../shared/seeded-random.js";
import type { FlowExplanation } from "./flow/controller.js";
import { classify } from "./flow/settings.js";
import type { SemanticOutcome } from "./stages/semantic.js";
import type { ModelRewrite } from "./context.js";
import { latencyFeaturesOf } from "./strategies/predicted-latency.js";
import type { LatencyFeatures } from "../views/latency-model.js";

export interface Explanation {
  model: string;
  strategy: string;
  tokenizer?: string;
  promptTokens: number;
  prefix?: { queriedBlocks: number; blockSize: number };
  pick: { pod: string; address: string };
  better: "lower" | "higher";
  fallback?: string;
  /** Flow control (absent: off for the model): whether the request would be held, and behind what. */
  flow?: FlowExplanation;
  /** A virtual model's classification: every decision's rule evaluation, the signals, the winner and the runner-up. */
  semantic?: SemanticOutcome;
  /** The InferenceModelRewrite that applied: the model asked for (`model` is the one routed for), the rule and its pool. */
  rewrite?: ModelRewrite;
  candidates: Array<{
    pod: string;
    address: string;
    score: number | null;
    inFlight: number;
    promptTokensInFlight: number;
    /** Prompt tokens of requests still in prefill. */
    prefillTokensInFlight: number;
    /** AIBrix's token load: prefill tokens + 0.3 x KV (prompt) tokens. */
    tokenLoad: number;
    load: { running: number | null; waiting: number | null; kvCacheUsage: number | null } | null;
    prefix?: { indexBlocks: number; indexGpuBlocks: number; indexWeighted: number; routedBlocks: number };
    /** The latency model's prediction for this request on the pod, and the features it used; `source: "prior"` = no outcome seen yet. */
    predicted?: { ttftMs: number; tpotMs: number; source: "class" | "pooled" | "prior"; samples: number; podClass: string | null; features: LatencyFeatures };
  }>;
}

const round2 = (x: number) => Math.round(x * 100) / 100;

/** Tie-breaks seeded from the request, so every replica breaks ties the same way. */
function seededRandom(seed: string): () => number {
  return mulberry32(createHash("sha1").update(seed).digest().readUInt32LE(0));
}

export async function explain(director: Director, views: GatewayViews, headers: Record<string, string>, body: Buffer): Promise<{ status: number; body: unknown; headers?: Readonly<Record<string, string>> }> {
  try {
    const input = { headers, body };
    const prepared = await director.prepare(input);
    const sel = director.select(prepared, seededRandom(headers["x-request-id"] || body.toString("utf8")), false);
    const detail = new Map((sel.prefixMatch?.detail ?? []).map((d) => [d.pod, d]));
    const scores = new Map(sel.pick.candidates.map((c) => [c.pod.pod, c.score]));
    const candidates = views.pods.readyPods(prepared.parsed.model);
    const fs = director.flow.settingsFor(prepared.parsed.model);
    const flow = fs ? director.flow.explain(prepared.parsed.model, classify(fs, headers, undefined, headers.user || undefined, sel.now), fs) : undefined;
    const out: Explanation = {
      model: prepared.parsed.model,
      strategy: prepared.strategy.name,
      ...(prepared.tokenizerMode ? { tokenizer: prepared.tokenizerMode } : {}),
      promptTokens: prepared.tokens?.length ?? prepared.parsed.promptTokens,
      ...(sel.prefixMatch ? { prefix: { queriedBlocks: sel.prefixMatch.info.queried, blockSize: sel.prefixMatch.info.blockSize } } : {}),
      pick: { pod: sel.pick.pod.pod, address: sel.pick.pod.address },
      better: sel.pick.better ?? "lower",
      ...(sel.pick.fallback ? { fallback: sel.pick.fallback } : {}),
      ...(flow ? { flow } : {}),
      ...(prepared.semantic ? { semantic: prepared.semantic } : {}),
      ...(prepared.rewrite ? { rewrite: prepared.rewrite } : {}),
      candidates: candidates.map((p) => {
        const o = views.ledger.outstanding(p.model, p.pod);
        const l = views.load.fresh(p.model, p.pod, sel.now);
        const d = detail.get(p.pod);
        const features = latencyFeaturesOf(views, p, prepared.tokens?.length ?? prepared.parsed.promptTokens, sel.prefixMatch?.info, sel.now);
        const pr = views.latency?.predict(p.model, p.podClass, features, sel.now);
        return {
          pod: p.pod,
          address: p.address,
          score: scores.get(p.pod) ?? null,
          inFlight: o.requests,
          promptTokensInFlight: o.promptTokens,
          prefillTokensInFlight: o.prefillTokens,
          tokenLoad: tokenLoad(o),
          load: l ? { running: l.running, waiting: l.waiting, kvCacheUsage: l.kvCacheUsage } : null,
          ...(d ? { prefix: { indexBlocks: d.indexBlocks, indexGpuBlocks: d.indexGpuBlocks, indexWeighted: d.indexWeighted, routedBlocks: d.routedBlocks } } : {}),
          ...(pr ? { predicted: { ttftMs: round2(pr.ttftMs), tpotMs: round2(pr.tpotMs), source: pr.source, samples: pr.samples, podClass: p.podClass ?? null, features } } : {}),
        };
      }),
    };
    return { status: 200, body: out };
  } catch (err) {
    // The error's headers too: a 421's `x-jetroute-pool`, a 429's rate-limit headers.
    if (err instanceof RouteError) return { status: err.status, body: routeErrorBody(err), headers: err.headers };
    throw err;
  }
}
