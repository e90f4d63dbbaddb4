/**
 * The request at the edges of the request path: what the proxy sent (RouteInput) and what routing
 * charged (RoutedRequest, with the decision inputs its record keeps). In between, the stages
 * share one RequestContext (context.ts).
 */
import type { RouteError } from "./errors.js";
import type { PdPlan } from "./strategies/pd.js";
import type { ChargeEvent } from "../../schemas/events.js";
import type { OwnAdmission } from "../views/gateway-state.js";
import type { PodInfo } from "../views/pod-set.js";
import type { DecisionInputs, ResponseAffinityRecord } from "./decision-inputs.js";

export type { ResponseAffinityRecord } from "./decision-inputs.js";

export type { FlowRecord } from "./decision-inputs.js";
import type { Pick, Scored } from "./strategies/types.js";

export interface RouteInput {
  /** Lower-cased request headers. */
  headers: Readonly<Record<string, string>>;
  body: Uint8Array;
  /** Endpoints the proxy allows (Inference Extension subset hint); undefined = no restriction. */
  subset?: readonly string[];
  /** Aborted when the client is gone: work on its behalf (a P/D prefill leg, a held request) stops. */
  signal?: AbortSignal;
  /** Flow control: the objective the request's API key carries (it wins over the header). */
  keyObjective?: string;
  /**
   * The authenticated tenant's cache salt (its API key's `cacheSalt`): the request runs under it
   * (stages/parse.ts tenantCacheSalt), at the engine and in the router's block hashes.
   */
  tenantSalt?: string;
  /** The authenticated API key's class (a virtual model's `user` signal may test it). */
  keyClass?: string;
  /** The models the authenticated API key may use (absent: every model); checked on the model a virtual model chose too. */
  keyModels?: readonly string[];
  /**
   * The authenticated API key's owner (its `user`): the Responses API's tenant, whose responses
   * alone the request may continue or read. Absent (`--auth off`): every request is one tenant.
   */
  tenant?: string;
}

/** A Responses API request's turn, as the response-affinity stage saw it (stages/response-affinity.ts). */
export interface ResponseTurn {
  /** The tenant owner (`RouteInput.tenant`, else `anonymous`). */
  readonly owner: string;
  /** `store` not false: the reply's items go to the response store. */
  readonly store: boolean;
  /** The turn's own input items (not the expansion) and instructions, as the store keeps them. */
  readonly input: ReadonlyArray<Record<string, unknown>>;
  readonly instructions?: string | ReadonlyArray<Record<string, unknown>>;
  readonly previousResponseId?: string;
  /** The affinity verdict for `previousResponseId` (absent without one). */
  readonly affinity?: ResponseAffinityRecord;
}



export interface RoutedRequest {
  readonly chargeId: string;
  /** The charge as recorded in this replica's ledger (and published unless the caller commits it). */
  readonly charge: ChargeEvent;
  readonly requestId: string;
  readonly model: string;
  readonly pod: PodInfo;
  readonly strategy: string;
  readonly candidates: readonly Scored[];
  readonly better?: Pick["better"];
  readonly fallback?: string;
  /** Headers the strategy wants on the response (e.g. `x-session-id`). */
  readonly responseHeaders?: Readonly<Record<string, string>>;
  readonly user?: string;
  readonly startedAt: number;
  readonly promptTokens: number;
  /** When the request was counted in the rate windows (its first attempt, for a strict retry). */
  readonly countedAt: number;
  /** The own admission the burst guard remembers for it (only where a limit applies). */
  readonly admission?: OwnAdmissionKey;
  /** What the decision record keeps so replay can re-decide the request. */
  readonly inputs: DecisionInputs;
  /** The prompt's blocks, computed after routing for a strategy that did not need them (recorded for counterfactuals). */
  recordedBlocks?: PromptBlocks;
  firstChunkAt?: number;
  /** The director's count of charges made when the first bytes arrived (the record's `firstTokenAfterCharge`). */
  firstTokenAfterCharge?: number;
  finished: boolean;
  /** The client asked for a streamed answer (the P/D decode watchdog watches only those). */
  readonly stream?: boolean;
  /** P/D: the prefill leg of a disaggregated request (absent: an ordinary request). */
  pd?: PdRouted;
  /** The picked pod's latency features at decision time (its release carries them with the outcome). */
  readonly latency?: { readonly x: number[]; readonly cls?: string };
  /**
   * The latency model's prediction for the picked pod when it was picked (made again when a
   * strategy that did not tokenize had the prompt tokenized just after routing).
   */
  prediction?: RecordedPrediction;
  /** A body the upstream request is sent with instead of the client's (a tenant's cache salt written in; P/D's decode leg). */
  body?: Buffer;
  /** A Responses API request: what its reply is recorded with (stages/response-affinity.ts). */
  readonly responses?: ResponseTurn;
}

/** The prefill leg of a disaggregated request, as the director and the legs stage track it. */
export interface PdRouted {
  readonly plan: Extract<PdPlan, { kind: "pd" }>;
  /** The prefill pod of the current attempt. */
  prefillPod: PodInfo;
  /** The current attempt's prefill charge, until its release (none when the decider skipped the leg). */
  prefillCharge?: ChargeEvent;
  /** Prefill pods tried so far (retries go to another one). */
  readonly tried: Set<string>;
  attempts: number;
  prefillStartedAt?: number;
  prefillMs?: number;
  /** The current prefill attempt's engine priority (the value written, or why none was), for a request with a band. */
  prefillPriority?: number | "fcfs-pod" | "off";
  /** SGLang: the request id both legs carry, for /abort_request. */
  rid?: string;
  /** Set when the prefill leg failed for good: the decode is ended with this error. */
  failure?: RouteError;
  /** Why the prefill failed (bounded code for the decision record). */
  failureReason?: string;
  /** Called once when the prefill leg fails after the decode was routed (SGLang), so the adapter can end the request. */
  onFailure?: (err: RouteError) => void;
  /** Ends the prefill leg still in flight (client gone, decode failed). */
  cancelPrefill?: () => void;
  /** A completed prefill leg's decision record, deferred until after the reply (stages/pd-coordinator.ts `defer`). */
  publishPrefill?: () => void;
}

/** The latency model's prediction for a picked pod, as its decision record keeps it (docs/latency-model.md). */
export interface RecordedPrediction {
  ttftMs: number;
  tpotMs: number;
  source: "class" | "pooled" | "prior";
  podClass?: string;
}


/** Which own-admission entries (rate-view.ts) a routed request holds. */
export type OwnAdmissionKey = OwnAdmission;

/** How a routed request ended, as the adapter saw it. */
export interface FinishInfo {
  status: number;
  /** The gateway's own error code, when it ended the request (e.g. `decode_timeout`). */
  errorCode?: string;
  promptTokens?: number;
  completionTokens?: number;
}

/** A prompt's router block hashes as one pod's engine keys them. */
export interface PromptBlocks {
  readonly size: number;
  readonly mode: "precise" | "approximate";
  readonly hashes: bigint[];
}
