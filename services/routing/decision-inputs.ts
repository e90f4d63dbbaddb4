/**
 * The decision inputs: everything a pick depends on beyond the views, as one type. The charge
 * stage fills it, the decision record serialises it (`recordedInputs`), and `jetroute replay`
 * rebuilds it from a record (`inputsOfRecord`) to re-decide the pick with `schedule()`. Adding an
 * input touches this type, the stage that produces it, and the record's schema (schemas/events.ts);
 * decision-inputs.test.ts fails when one of the two directions misses a field.
 */
import type { DecisionRecord } from "../../schemas/events.js";
import type { StateStream } from "../views/gateway-state.js";
import type { SemanticOutcome, SemanticTag } from "./stages/semantic.js";
import type { Rank } from "./stages/scheduling.js";
import type { StrategyParams } from "./strategies/registry.js";
import type { SessionHint, SloTargets } from "./strategies/types.js";

/** An InferenceModelRewrite that applied to the request (stages/model-rewrite.ts). */
export interface ModelRewrite {
  /** The model the client asked for. */
  readonly from: string;
  /** The model the request is routed and sent for instead. */
  readonly to: string;
  /** `<InferenceModelRewrite name>#<rule index>`. */
  readonly rule: string;
  /** The pool whose rule it was (`namespace/name`). */
  readonly pool: string;
}

/** A flow-controlled request's place in the queues, as its decision record keeps it. */
export interface FlowRecord {
  readonly band: number;
  readonly objective?: string;
  readonly enqueuedAt: number;
  readonly waitMs: number;
}

/**
 * The per-pod engine fields written into the body (stages/engine-fields.ts): the `priority` given
 * (a number) or why none was (`fcfs-pod`: the pod does not schedule by priority; `off`: the
 * model's `flowControl.enginePriority`), recorded for a request with a band only; the `model` an
 * SGLang pod got for a managed adapter (`base:adapter`).
 */
export interface EngineFields {
  readonly enginePriority?: number | "fcfs-pod" | "off";
  readonly engineModel?: string;
}

/** What the decision record keeps of a Responses API affinity verdict (stages/response-affinity.ts). */
export interface ResponseAffinityRecord {
  readonly action: "pin" | "expand";
  readonly reason: string;
  /** The pod that held the previous response, when known. */
  readonly owner?: string;
  /** An expansion: turns prepended and items dropped (encrypted reasoning). */
  readonly turns?: number;
  readonly dropped?: number;
}

export interface DecisionInputs {
  readonly cursors: Readonly<Record<StateStream, number>>;
  readonly rank?: Rank;
  readonly session?: SessionHint;
  readonly subset?: readonly string[];
  readonly blocks?: { readonly size: number; readonly mode: "precise" | "approximate"; readonly hashes: readonly bigint[] };
  readonly profile?: string;
  readonly strategyParams?: Readonly<Record<string, StrategyParams>>;
  readonly slo?: SloTargets;
  readonly maxTokens?: number;
  readonly consistency?: "strict" | "off";
  /** Flow control: the request's band and how long it was held (absent: flow control off for the model). */
  readonly flow?: FlowRecord;
  /** Semantic model selection: the virtual model, its decision and the signals that decided it. */
  readonly semantic?: SemanticOutcome | SemanticTag;
  /** The InferenceModelRewrite that applied (absent: none). */
  readonly rewrite?: ModelRewrite;
  /** The engine's `priority` written (or why none was), for a request with a band. */
  readonly enginePriority?: EngineFields["enginePriority"];
  /** The body's model as written for the picked pod's engine (an adapter on SGLang: `base:adapter`). */
  readonly engineModel?: string;
  /** Responses API: the affinity verdict for `previous_response_id` (a pin is also the recorded `subset`). */
  readonly responseAffinity?: ResponseAffinityRecord;
}

/** The fields of a decision record that carry its inputs (blocks excepted: they are packed with the record's own). */
export type RecordedInputs = Pick<DecisionRecord, "cursors" | "rank" | "session" | "subset" | "profile" | "strategyParams" | "slo" | "maxTokens" | "consistency" | "flow" | "semantic" | "rewrite" | "enginePriority" | "engineModel" | "responseAffinity">;

/** A semantic outcome as its decision record keeps it: no evaluations (replay recomputes them), no action. */
export function semanticRecordOf(o: SemanticTag): NonNullable<DecisionRecord["semantic"]> {
  return { virtualModel: o.virtualModel, decision: o.decision, ...(o.runnerUp ? { runnerUp: o.runnerUp } : {}), signals: o.signals };
}

/** The decision record's fields for these inputs (the record's `blocks` are packed by decision-record.ts). */
export function recordedInputs(c: DecisionInputs): RecordedInputs {
  return {
    cursors: c.cursors,
    ...(c.rank ? { rank: c.rank } : {}),
    ...(c.session ? { session: c.session } : {}),
    ...(c.subset ? { subset: c.subset.filter((a) => a.length <= 300).slice(0, 256) } : {}),
    ...(c.profile ? { profile: c.profile } : {}),
    ...(c.strategyParams ? { strategyParams: c.strategyParams } : {}),
    ...(c.slo ? { slo: c.slo } : {}),
    ...(c.maxTokens !== undefined ? { maxTokens: c.maxTokens } : {}),
    ...(c.consistency ? { consistency: c.consistency } : {}),
    ...(c.flow ? { flow: { band: c.flow.band, ...(c.flow.objective !== undefined ? { objective: c.flow.objective } : {}), enqueuedAt: c.flow.enqueuedAt, waitMs: c.flow.waitMs } } : {}),
    ...(c.semantic ? { semantic: semanticRecordOf(c.semantic) } : {}),
    ...(c.rewrite ? { rewrite: { from: c.rewrite.from, rule: c.rewrite.rule, pool: c.rewrite.pool } } : {}),
    ...(c.enginePriority !== undefined ? { enginePriority: c.enginePriority } : {}),
    ...(c.engineModel !== undefined ? { engineModel: c.engineModel } : {}),
    ...(c.responseAffinity ? { responseAffinity: { ...c.responseAffinity, reason: c.responseAffinity.reason.slice(0, 32) } } : {}),
  };
}

/** The inputs a recorded decision was made with, as replay hands them to `schedule()` (blocks: decoded by the caller). */
export function inputsOfRecord(d: DecisionRecord): DecisionInputs {
  const zero = { pods: 0, load: 0, charges: 0, kv: 0, config: 0 };
  return {
    cursors: d.cursors ?? zero,
    ...(d.rank ? { rank: d.rank } : {}),
    ...(d.session ? { session: d.session } : {}),
    ...(d.subset ? { subset: d.subset } : {}),
    ...(d.profile ? { profile: d.profile } : {}),
    ...(d.strategyParams ? { strategyParams: d.strategyParams } : {}),
    ...(d.slo ? { slo: d.slo } : {}),
    ...(d.maxTokens !== undefined ? { maxTokens: d.maxTokens } : {}),
    ...(d.consistency ? { consistency: d.consistency } : {}),
    ...(d.flow ? { flow: d.flow } : {}),
    ...(d.semantic ? { semantic: d.semantic } : {}),
    ...(d.rewrite ? { rewrite: { from: d.rewrite.from, to: d.model, rule: d.rewrite.rule, pool: d.rewrite.pool } } : {}),
    ...(d.enginePriority !== undefined ? { enginePriority: d.enginePriority } : {}),
    ...(d.engineModel !== undefined ? { engineModel: d.engineModel } : {}),
    ...(d.responseAffinity ? { responseAffinity: d.responseAffinity } : {}),
  };
}
