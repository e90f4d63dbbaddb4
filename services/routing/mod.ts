/**
 * The routing core's public surface: what the shells (the gateway, replay, the dev front, the
 * admin and autoscaler commands, the benches) may import. Everything else under services/routing/
 * is internal; `npm run check:deps` refuses a deep import from outside (tests excepted).
 */

// The core and its request path.
export { Director, type DirectorOptions } from "./director.js";
export { DEFAULT_TURN_BUDGET_MS, immediateYield, shouldYieldTurn, type TurnSlicing } from "./turn-budget.js";
export type { EmbeddingSource, EventSink, GatewayViews, ModelRewrites, PoolIdentity, PrefixSupport, ResponseState, StoredTurn } from "./ports.js";
export type { FinishInfo, FlowRecord, OwnAdmissionKey, PdRouted, PromptBlocks, RecordedPrediction, ResponseAffinityRecord, ResponseTurn, RoutedRequest, RouteInput } from "./request.js";
export { type ChainTurn, expandedBody, expandInput, inputItems, walkChain } from "./responses/chain.js";
export { deletedResponseObject, inputItemsPage, ListingError, type ResponseRoute, responseRouteOf, storedResponseObject } from "./responses/listing.js";
export { ANONYMOUS_TENANT } from "./stages/response-affinity.js";
export type { CommitMode, ModelRewrite, PlannedContext, RequestContext } from "./context.js";
export { type DecisionInputs, inputsOfRecord, recordedInputs } from "./decision-inputs.js";
export { type AnyStage, type Committer, type CommitPort, type Phase, type RequestPath, stagesOf } from "./pipeline.js";
export { REQUEST_PATH } from "./request-path.js";
export { RequestLifecycle } from "./lifecycle.js";
export { explain, type Explanation } from "./explain.js";

// Errors and records.
export { type AnthropicErrorBody, anthropicError, anthropicErrorType, ErrorCodes, errorBodyFor, errorType, type OpenAIErrorBody, openAIError, type Refusal, RouteError, reshapeError, routeErrorBody } from "./errors.js";
export { publishDecision, rejectedRecord, routedRecord, semanticRecordOf, type UnrecordedReason } from "./decision-record.js";
export { chargeIdOf, chargeSeqOf, isPrefillLegCharge } from "./charge-id.js";
export { validateModelConfig } from "./config-check.js";
export { enginePriorityFor } from "./engine-priority.js";
export { PredictionDrift } from "./latency-drift.js";
export { apiOfPath, isModelName, MAX_RESPONSE_ID_LENGTH, parseRequestBody, type RequestApi, ROUTED_PATHS } from "./request-body.js";
export { MAX_REQUEST_ID_LENGTH, MAX_USER_LENGTH } from "./stages/parse.js";

// Scheduling, as replay re-runs it.
export { decisionRandom, type PrefixMatchResult, type SchedulingInput, schedule } from "./stages/scheduling.js";
export { matchPrefix } from "./stages/prefix-match.js";
export { parseStrategy, strategyLabel, strategyNames, strategyTraits } from "./strategies/registry.js";
export type { PrefixMatchInfo, RoutingContext, RoutingRequest, Strategy } from "./strategies/types.js";
export { featureVector, latencyFeaturesOf } from "./strategies/predicted-latency.js";
export { configureSessionSigning } from "./strategies/session-affinity.js";

// P/D legs (the gateway's leg client implements LegClient).
export { DEFAULT_PD_LEG_OPTIONS, type LegAnswer, type LegClient, LegError } from "./stages/pd-legs.js";
export { vllmPrefillBody } from "./stages/pd-bodies.js";

// Flow control across replicas.
export { checkSummary, DEFAULT_SUMMARY_INTERVAL_MS, FleetQueues, parseSummary, type ReplicaSummary, type SummaryRefusal, summaryOf } from "./flow/fleet.js";
export { FLOW_LIMIT_DEFAULTS, type FlowController, type FlowLimits } from "./flow/controller.js";

// Semantic model selection (replay --rules, the admin command, the bench).
export { applyAction, classify, decide, requestTexts } from "./stages/semantic.js";
export { type CompiledRules, compileRules, targetModels } from "./semantic/rules.js";
export { applyGroups, embeddingTextsOf, judgeRecorded } from "./semantic/signals.js";
