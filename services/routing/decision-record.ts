/**
 * Decision records (schemas/events.ts `DecisionRecord`), built in one place: a routed request's
 * record at its end, a P/D prefill leg's record, and a request refused before routing. Pure: the
 * director decides when a record is due and hands it to its sink.
 */
import { DECISION_MAX_BLOCKS, DECISION_RECORD_VERSION, type ChargeEvent, type DecisionRecord, type ReleaseOutcome } from "../../schemas/events.js";
import { encodeBlockHashes } from "../views/packed-hashes.js";
import { ErrorCodes, type RouteError } from "./errors.js";
import type { FinishInfo, PdRouted, RoutedRequest } from "./request.js";
import { isModelName, MAX_REQUEST_ID_LENGTH } from "./request-body.js";
import { findStrategy } from "./strategies/registry.js";
import { recordedInputs } from "./decision-inputs.js";

export { semanticRecordOf } from "./decision-inputs.js";

/** Longest strategy spec a rejected request's record keeps as it was sent. */
const MAX_RECORDED_SPEC = 512;

/** The record of a routed request that ended (`now`) with `outcome`. */
export function routedRecord(gateway: string, r: RoutedRequest, outcome: ReleaseOutcome, info: FinishInfo, now: number): DecisionRecord {
  const c = r.inputs;
  const pd = r.pd;
  const blocks = c.blocks ?? (r.recordedBlocks && r.recordedBlocks.hashes.length > 0 ? r.recordedBlocks : undefined);
  return {
    type: "decision",
    v: DECISION_RECORD_VERSION,
    id: r.requestId,
    gateway,
    model: r.model,
    ts: r.startedAt,
    strategy: r.strategy,
    candidates: r.candidates.map((x) => ({ pod: x.pod.pod, score: x.score })),
    pick: r.pod.pod,
    ...(r.better ? { better: r.better } : {}),
    ...(r.fallback ? { fallback: r.fallback } : {}),
    ...(r.user ? { user: r.user } : {}),
    status: info.status,
    outcome,
    ...(r.firstChunkAt !== undefined ? { ttftMs: Math.max(0, r.firstChunkAt - r.startedAt) } : {}),
    ...(r.firstChunkAt !== undefined && info.completionTokens !== undefined && info.completionTokens > 1
      ? { tpotMs: Math.max(0, now - r.firstChunkAt) / (info.completionTokens - 1) }
      : {}),
    durationMs: Math.max(0, now - r.startedAt),
    promptTokens: info.promptTokens ?? r.promptTokens,
    ...(info.completionTokens !== undefined ? { completionTokens: info.completionTokens } : {}),
    charge: r.chargeId,
    ...(r.firstTokenAfterCharge !== undefined ? { firstTokenAfterCharge: r.firstTokenAfterCharge } : {}),
    routedPromptTokens: r.promptTokens,
    ...recordedInputs(c),
    ...(blocks ? { blocks: { size: blocks.size, mode: blocks.mode, hashes: encodeBlockHashes(blocks.hashes, DECISION_MAX_BLOCKS), total: blocks.hashes.length } } : {}),
    ...(r.prediction ? { prediction: r.prediction } : {}),
    ...(info.errorCode ? { errorCode: info.errorCode } : pd?.failure ? { errorCode: pd.failure.code } : {}),
    ...(pd ? { pd: decodeLegOf(r, pd) } : {}),
  };
}

function decodeLegOf(r: RoutedRequest, pd: PdRouted): NonNullable<DecisionRecord["pd"]> {
  return {
    leg: "decode",
    roleset: pd.plan.roleset,
    engine: pd.plan.engine,
    prefillPod: pd.prefillPod.pod,
    decodePod: r.pod.pod,
    ...(pd.plan.skipPrefill ? { skipped: true } : {}),
    attempts: pd.attempts,
    ...(pd.prefillMs !== undefined ? { prefillMs: pd.prefillMs } : {}),
    ...(pd.plan.fastPath ? { fastPath: pd.plan.fastPath } : {}),
    ...(pd.failureReason ? { error: pd.failureReason } : {}),
  };
}

/** The record of one P/D prefill leg attempt (`charge`), ended at `now`. */
export function prefillLegRecord(gateway: string, r: RoutedRequest, pd: PdRouted, charge: ChargeEvent, outcome: ReleaseOutcome, status: number, now: number): DecisionRecord {
  return {
    type: "decision",
    v: DECISION_RECORD_VERSION,
    id: r.requestId,
    gateway,
    model: r.model,
    ts: charge.ts,
    strategy: r.strategy,
    candidates: pd.plan.prefillCandidates.map((c) => ({ pod: c.pod.pod, score: c.score })),
    pick: charge.pod,
    ...(r.user ? { user: r.user } : {}),
    status,
    outcome,
    durationMs: Math.max(0, now - charge.ts),
    promptTokens: r.promptTokens,
    charge: charge.id,
    routedPromptTokens: r.promptTokens,
    cursors: r.inputs.cursors,
    ...(pd.prefillPriority !== undefined ? { enginePriority: pd.prefillPriority } : {}),
    pd: { leg: "prefill", roleset: pd.plan.roleset, engine: pd.plan.engine, prefillPod: charge.pod, decodePod: r.pod.pod, attempts: pd.attempts, ...(pd.plan.fastPath ? { fastPath: pd.plan.fastPath } : {}) },
  };
}

/**
 * The record of a request refused before routing. Its headers are client strings: only a known
 * strategy spec, a valid model name and a request id of bounded length are kept as sent.
 */
export function rejectedRecord(o: {
  gateway: string;
  headers: Readonly<Record<string, string>>;
  model: string | undefined;
  err: RouteError;
  now: number;
  defaultStrategy: string;
  /** A request id for a request whose own id is missing or invalid. */
  newId: () => string;
}): DecisionRecord {
  const spec = o.headers["routing-strategy"];
  const strategy = spec ? (spec.length <= MAX_RECORDED_SPEC && findStrategy(spec) ? spec : "invalid") : o.defaultStrategy;
  const requestId = o.headers["x-request-id"];
  const semantic = o.err.refusal?.semantic;
  return {
    type: "decision",
    v: DECISION_RECORD_VERSION,
    // A rejected request's id may be the reason it was rejected: only a valid one is recorded.
    id: requestId && requestId.length <= MAX_REQUEST_ID_LENGTH ? requestId : o.newId(),
    gateway: o.gateway,
    model: o.model !== undefined && isModelName(o.model) ? o.model : "",
    ts: o.now,
    strategy,
    candidates: [],
    pick: null,
    status: o.err.status,
    outcome: "rejected",
    errorCode: o.err.code,
    ...(semantic ? { semantic } : {}),
  };
}

/** Why a decision record is not published: an unknown path, or over the replica's rejection budget. */
export type UnrecordedReason = "unknown_path" | "budget";

/**
 * Whether a decision record goes onto DECISIONS. Every routed request's record does; a rejection's
 * only within the replica's budget (`take`: a token bucket), and never one for a path jetroute does
 * not route, so a flood of refused or unauthenticated requests cannot push the replay history out
 * of the stream. Metrics count every request either way.
 */
export function publishDecision(rec: Pick<DecisionRecord, "outcome" | "errorCode">, take: () => boolean): true | UnrecordedReason {
  if (rec.outcome !== "rejected") return true;
  if (rec.errorCode === ErrorCodes.unsupportedPath.code) return "unknown_path";
  return take() ? true : "budget";
}
