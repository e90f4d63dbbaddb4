/**
 * The charge stage, last of the commit section: the picked pod is charged in this replica's
 * ledger (and published, unless a strict committer publishes it itself), in the same synchronous
 * step as the select stage read the ledger. Builds the routed request with its decision inputs
 * (decision-inputs.ts) and, after routing, the prompt's blocks for its record when the strategy
 * did not need them.
 */
import type { ChargeEvent } from "../../../schemas/events.js";
import type { PodInfo } from "../../views/pod-set.js";
import { rateUserOf } from "../../views/rate-view.js";
import type { LatencyPrediction } from "../../views/latency-model.js";
import { promptInputOf, type TokenIds } from "../../tokenizer/prompt-tokens.js";
import { isSelected, promptTokensOf, upstreamBodyOf, type SelectedContext } from "../context.js";
import type { DecisionInputs } from "../decision-inputs.js";
import type { SectionStage, StageEnv } from "../pipeline.js";
import type { RecordedPrediction, RoutedRequest } from "../request.js";
import { featureVector, latencyFeaturesOf } from "../strategies/predicted-latency.js";
import { pdPlanOf } from "../strategies/pd.js";
import { refuseBatch } from "./pd-bodies.js";
import { DECISION_HEADER } from "./semantic.js";

const round2 = (x: number) => Math.round(x * 100) / 100;

export const recordedPrediction = (p: LatencyPrediction, pod: PodInfo): RecordedPrediction => ({ ttftMs: round2(p.ttftMs), tpotMs: round2(p.tpotMs), source: p.source, ...(pod.podClass ? { podClass: pod.podClass } : {}) });

/** The decision's inputs as its record keeps them (decision-inputs.ts). */
function inputsOf(ctx: SelectedContext, env: StageEnv, strict: boolean): DecisionInputs {
  const { parsed, prefixMatch } = ctx;
  return {
    cursors: ctx.cursors,
    ...(ctx.rank ? { rank: ctx.rank } : {}),
    ...(ctx.routingRequest.session ? { session: ctx.routingRequest.session } : {}),
    ...(ctx.subset ? { subset: ctx.subset } : {}),
    ...(prefixMatch && prefixMatch.hashes.length > 0 ? { blocks: { size: prefixMatch.info.blockSize, mode: ctx.tokenizerMode === "approximate" ? "approximate" : "precise", hashes: prefixMatch.hashes } } : {}),
    ...(ctx.profile && ctx.profile.length <= 256 ? { profile: ctx.profile } : {}),
    ...(ctx.strategyParams ? { strategyParams: ctx.strategyParams } : {}),
    ...(strict ? { consistency: "strict" as const } : env.consistency === "off" ? { consistency: "off" as const } : {}),
    ...(ctx.slo ? { slo: ctx.slo } : {}),
    ...(ctx.flow ? { flow: ctx.flow } : {}),
    ...(ctx.semantic ? { semantic: ctx.semantic } : {}),
    ...(ctx.rewrite ? { rewrite: ctx.rewrite } : {}),
    ...ctx.engineFields,
    ...(ctx.responseTurn?.affinity ? { responseAffinity: ctx.responseTurn.affinity } : {}),
    ...(parsed.maxTokens !== undefined && Number.isSafeInteger(parsed.maxTokens) && parsed.maxTokens >= 0 ? { maxTokens: parsed.maxTokens } : {}),
  };
}

export const chargeStage: SectionStage = {
  name: "charge",
  phase: "commit",
  run(c, env): undefined {
    if (!isSelected(c)) throw new Error("stage order: charge before select");
    const ctx = c;
    const mode = ctx.commitMode ?? { publish: true };
    const { parsed, strategy, pick, prefixMatch, now, chargeId, requestId } = ctx;
    const user = ctx.input.headers.user || undefined;
    const plan = pdPlanOf(pick);
    // Before anything is charged: a batch cannot be disaggregated.
    if (plan?.kind === "pd") refuseBatch(parsed.body, parsed.api);
    const promptTokens = promptTokensOf(ctx);
    // The latency model's view of the picked pod, before this request's own charge counts on it.
    const features = latencyFeaturesOf(env.views, pick.pod, promptTokens, prefixMatch?.info, now);
    const predicted = env.views.latency?.predict(pick.pod.model, pick.pod.podClass, features, now);
    const charge: ChargeEvent = {
      type: "charge",
      id: chargeId,
      gateway: env.gatewayId,
      model: pick.pod.model,
      pod: pick.pod.pod,
      ts: now,
      ttlMs: env.chargeTtlMs,
      promptTokens,
      ...(parsed.maxTokens !== undefined ? { maxTokens: parsed.maxTokens } : {}),
      ...(user ? { user } : {}),
      ...(plan?.kind === "pd" ? { phase: "decode" as const } : {}),
    };
    // A strict-mode retry (`carry`) is the same request: counted once, by its first attempt.
    const carry = mode.carry;
    const countedAt = carry?.countedAt ?? now;
    let admission = carry?.admission;
    if (!carry) {
      // Own admissions are remembered only where a limit can read them (the burst guard).
      // A request without a user is limited (and remembered) under the shared anonymous bucket.
      const userLimited = env.config?.userLimits(user) !== undefined;
      if (userLimited || ctx.rps !== undefined) {
        admission = { ...(userLimited ? { user: rateUserOf(user) } : {}), ...(ctx.rps !== undefined ? { model: charge.model } : {}), tokens: promptTokens, ts: now };
      }
    }
    env.state.ownCharge(charge, now, { ...(carry ? { counted: false } : admission ? { admission, published: mode.publish } : {}) });
    if (mode.publish) env.sink.charge(charge);
    const body = upstreamBodyOf(ctx);
    const routed: RoutedRequest = {
      chargeId,
      charge,
      requestId,
      model: parsed.model,
      pod: pick.pod,
      strategy: strategy.name,
      candidates: pick.candidates,
      ...(pick.better ? { better: pick.better } : {}),
      ...(pick.fallback ? { fallback: pick.fallback } : {}),
      ...(pick.responseHeaders || ctx.semantic ? { responseHeaders: { ...pick.responseHeaders, ...(ctx.semantic ? { [DECISION_HEADER]: ctx.semantic.decision } : {}) } } : {}),
      ...(user ? { user } : {}),
      startedAt: now,
      promptTokens,
      countedAt,
      ...(parsed.body.stream === true ? { stream: true } : {}),
      ...(admission ? { admission } : {}),
      latency: { x: featureVector(features), ...(pick.pod.podClass ? { cls: pick.pod.podClass } : {}) },
      ...(predicted ? { prediction: recordedPrediction(predicted, pick.pod) } : {}),
      ...(body ? { body } : {}),
      ...(ctx.responseTurn ? { responses: ctx.responseTurn } : {}),
      inputs: inputsOf(ctx, env, !mode.publish),
      finished: false,
    };
    if (plan) env.pd.planned(routed, plan);
    env.lifecycle.track(routed);
    ctx.routed = routed;
    // The routed prefix names the pod the charge goes to: at once when it is published now, at
    // `committed` when the committer publishes it (a strict charge may lose and be re-selected).
    if (prefixMatch && prefixMatch.hashes.length > 0) {
      if (mode.publish) env.prefix?.recordRouted(pick.pod, prefixMatch.hashes, now, chargeId);
      else env.lifecycle.holdRouted(routed, prefixMatch.hashes);
    }
    recordBlocksAfterRouting(routed, ctx, env);
    return undefined;
  },
};

/**
 * The prompt's blocks for the record of a request whose strategy did not match prefixes (so
 * replay can ask "what would prefix-cache have hit"): from its token ids at once, else tokenized
 * after the reply to the proxy has gone out. Approximate-mode hashes match only other gateways'
 * routed prefixes, which traffic under a non-prefix strategy never publishes: recording them would
 * cost every request and tell replay nothing.
 */
function recordBlocksAfterRouting(routed: RoutedRequest, ctx: SelectedContext, env: StageEnv): void {
  const prefix = env.prefix;
  if (routed.inputs.blocks || !prefix || !env.recordPromptBlocks) return;
  const { parsed, now } = ctx;
  if (parsed.promptTokenIds) {
    routed.recordedBlocks = prefix.blocks(parsed.model, routed.pod, parsed.promptTokenIds, now, "ids", parsed.cacheSalt);
    learnCached(routed, env, parsed.promptTokenIds, "ids", parsed.cacheSalt, now);
    return;
  }
  if (prefix.tokenizer.modeFor?.(parsed.model) === "approximate") return;
  const pod = routed.pod;
  const raw = ctx.input.body;
  // After the reply to Envoy has gone out: tokenizing runs synchronously up to its first await.
  setImmediate(() => {
    if (routed.finished) return;
    prefix.tokenizer.tokenize(parsed.model, promptInputOf(parsed.body, raw, parsed.api), pod.address).then(
      (t) => {
        if (routed.finished) return;
        routed.recordedBlocks = prefix.blocks(parsed.model, pod, t.tokens, now, t.mode, parsed.cacheSalt);
        learnCached(routed, env, t.tokens, t.mode, parsed.cacheSalt, now);
      },
      () => undefined,
    );
  });
}

/**
 * A strategy that did not match prefixes routed the request: its latency sample learns the
 * prompt's token count and the tokens the picked pod held from the tokenization and match made
 * after routing (a few ms later), instead of an estimate and "none cached", which would teach
 * the model that cached prompts are fast for no reason it can see.
 */
function learnCached(r: RoutedRequest, env: StageEnv, tokens: TokenIds, mode: string | undefined, salt: string | undefined, now: number): void {
  const prefix = env.prefix;
  if (!prefix || !r.latency || r.latency.x[1] !== 0) return;
  const m = prefix.match(r.model, [r.pod], tokens, now, mode, salt);
  // The tokenizer's count replaces the estimate the strategy routed with.
  const x = r.latency.x;
  x[0] = tokens.length;
  x[1] = Math.min(tokens.length, Math.floor(m.info.matched(r.pod.pod) * m.info.blockSize));
  const p = env.views.latency?.predict(r.model, r.pod.podClass, { promptTokens: x[0], cachedTokens: x[1], prefillTokens: x[2] ?? 0, decoding: x[3] ?? 0, waiting: x[4] ?? 0, kvPermille: x[5] ?? 0 }, r.startedAt);
  if (p) r.prediction = recordedPrediction(p, r.pod);
}
