/**
 * The legs stage of a disaggregated request: runs the prefill leg the `pd` plan chose and hands
 * back the body the decode leg goes out with. Speaks HTTP only through an injected `LegClient`
 * (services/gateway/pd-client.ts in the gateway, anything in tests); charges and releases go
 * through the director (`PdChargeSteps`), so every replica sees both legs' load.
 *
 * vLLM: the prefill leg is sent and awaited before Envoy is told where decode goes; 502/503/504
 * and connection failures are retried on another prefill pod of the roleset (`maxRetries`), a
 * timeout or the engine's own refusal is not. SGLang: the prefill leg is fired at the same time as
 * decode (decode waits for the bootstrap handoff); a failed prefill aborts the decode on its pod
 * (`POST /abort_request`) and ends the client's request with an OpenAI error — at once, not after
 * SGLang's 300 s bootstrap timeout.
 */
import { randomUUID } from "node:crypto";
import type { PodInfo } from "../../views/pod-set.js";
import { bodyForLeg, enginePriorityFor, type EnginePrioritySetting, recordedEnginePriority } from "../engine-priority.js";
import type { RouteError } from "../errors.js";
import type { PdRouted, RoutedRequest, RouteInput } from "../request.js";
import {
  bootstrapRoom,
  type LegFailure,
  prefillFailureError,
  retryPrefill,
  SGLANG_DEFAULT_BOOTSTRAP_PORT,
  sglangBody,
  vllmDecodeBody,
  vllmPrefillBody,
  vllmTransferParams,
} from "./pd-bodies.js";

/**
 * A banded request's engine priority for its prefill leg (issue 36): the body the legs get carries
 * the decode pod's; each prefill attempt's pod gets its own (engine-priority.ts `bodyForLeg`).
 */
export interface LegPriority {
  readonly band: number;
  readonly setting: EnginePrioritySetting;
  /** The client's body before the engine-fields stage wrote the decode pod's priority. */
  readonly client: Readonly<Record<string, unknown>>;
}

/** The prefill leg's body for `pod`, and what its decision record keeps; the body as is without a band. */
export function prefillLegBody(body: Readonly<Record<string, unknown>>, pod: PodInfo, lp: LegPriority | undefined): { body: Readonly<Record<string, unknown>>; recorded?: number | "fcfs-pod" | "off" } {
  if (!lp) return { body };
  const decision = enginePriorityFor(lp.band, pod, lp.setting);
  const recorded = recordedEnginePriority(decision);
  return { body: bodyForLeg(body, lp.client, decision), ...(recorded !== undefined ? { recorded } : {}) };
}

export interface LegAnswer {
  status: number;
  body: Buffer;
}

/** One HTTP POST to a pod. Rejects with a `LegFailure`-shaped `LegError` for anything but an answer. */
export interface LegClient {
  post(address: string, path: string, body: Buffer, headers: Readonly<Record<string, string>>, o: { signal?: AbortSignal; timeoutMs: number }): Promise<LegAnswer>;
}

export class LegError extends Error {
  override name = "LegError";
  constructor(readonly failure: Exclude<LegFailure, { kind: "status" }>) {
    super(failure.kind === "connect" ? `connection failed: ${failure.code}` : failure.kind);
  }
}

/** What the legs stage needs from the director. */
export interface PdChargeSteps {
  /** Ends the current prefill charge (once) and records the prefill leg; `afterReply`: its publishing may follow the reply to the proxy. */
  endPrefill(r: RoutedRequest, outcome: "completed" | "error" | "cancelled", status: number, afterReply?: boolean): void;
  /** Charges another prefill pod of the roleset for a retry; false when none is left. */
  retryPrefill(r: RoutedRequest): boolean;
  /** Ends the whole request (decode charge included) with an error. */
  fail(r: RoutedRequest, err: RouteError): void;
  now(): number;
}

export interface PdLegOptions {
  /** Per vLLM prefill attempt (AIBrix: AIBRIX_PREFILL_REQUEST_TIMEOUT, 30 s). */
  prefillTimeoutMs: number;
  /**
   * All vLLM attempts together: the leg runs inside Envoy's request-body phase, so this must stay
   * below the ext_proc `messageTimeout` (60 s in deploy/), or Envoy answers with its own error.
   */
  prefillBudgetMs: number;
  /** An SGLang prefill answers only once its decode took the KV, so it waits for the decode too (SGLang's own bound: 300 s). */
  sglangPrefillTimeoutMs: number;
  /** Retries on other prefill pods after 502/503/504 or a connection failure. */
  maxRetries: number;
  /** How long a `/abort_request` call may take. */
  abortTimeoutMs: number;
}

export const DEFAULT_PD_LEG_OPTIONS: Readonly<PdLegOptions> = { prefillTimeoutMs: 30_000, prefillBudgetMs: 50_000, sglangPrefillTimeoutMs: 300_000, maxRetries: 2, abortTimeoutMs: 1_000 };

export interface PdLegStats {
  prefillAttempts: number;
  prefillRetries: number;
  prefillFailures: number;
  /** A vLLM prefill answered without usable `kv_transfer_params`: decode computes the prefill itself. */
  paramsMissing: number;
  decodeAborts: number;
}

const hostOf = (address: string) => address.slice(0, address.lastIndexOf(":"));
const legId = () => `jr-${randomUUID()}`;

export class PdLegs {
  readonly stats: PdLegStats = { prefillAttempts: 0, prefillRetries: 0, prefillFailures: 0, paramsMissing: 0, decodeAborts: 0 };
  private readonly o: PdLegOptions;

  constructor(
    private readonly client: LegClient,
    private readonly steps: PdChargeSteps,
    o: Partial<PdLegOptions> = {},
  ) {
    this.o = { ...DEFAULT_PD_LEG_OPTIONS, ...o };
  }

  /**
   * Runs the prefill leg (vLLM: awaited; SGLang: started) and sets `r.body` to the decode leg's
   * body. Rejects with the client's RouteError after ending the request (decode charge released).
   */
  run(r: RoutedRequest, input: RouteInput, body: Readonly<Record<string, unknown>>, path: string, priority?: LegPriority): RoutedRequest | Promise<RoutedRequest> {
    const pd = r.pd as PdRouted;
    if (!pd.prefillCharge) return r; // the decider skipped the leg: decode computes the prompt
    return pd.plan.engine === "sglang" ? this.startSglang(r, body, path, priority) : this.runVllm(r, input, body, path, priority);
  }

  private async runVllm(r: RoutedRequest, input: RouteInput, body: Readonly<Record<string, unknown>>, path: string, priority: LegPriority | undefined): Promise<RoutedRequest> {
    const pd = r.pd as PdRouted;
    // The engines key the handoff by this id: minted, never the client's (two clients sending one id must not collide).
    const headers = { "content-type": "application/json", "x-request-id": legId() };
    const deadline = Date.now() + this.o.prefillBudgetMs;
    let retries = 0;
    for (;;) {
      const pod = pd.prefillPod;
      // Per attempt: a retry's pod may schedule otherwise than the first one.
      const leg = prefillLegBody(body, pod, priority);
      pd.prefillPriority = leg.recorded;
      const prefillBody = vllmPrefillBody(leg.body);
      this.stats.prefillAttempts++;
      pd.prefillStartedAt ??= this.steps.now();
      let failure: LegFailure;
      try {
        const timeoutMs = Math.max(1, Math.min(this.o.prefillTimeoutMs, deadline - Date.now()));
        const a = await this.client.post(pod.address, path, prefillBody, headers, { ...(input.signal ? { signal: input.signal } : {}), timeoutMs });
        if (a.status >= 200 && a.status < 300) {
          pd.prefillMs = this.steps.now() - pd.prefillStartedAt;
          // Its decision record is published after Envoy got the decode leg (not on the request's path); its release at once.
          this.steps.endPrefill(r, "completed", a.status, true);
          const params = vllmTransferParams(a.body);
          if (!params.ok) {
            // The pod is not a KV producer (or answered oddly): decode still gets a correct
            // answer by computing the prompt itself. Counted, since it defeats P/D.
            this.stats.paramsMissing++;
            return r;
          }
          r.body = vllmDecodeBody(body, params.params, hostOf(pod.address));
          return r;
        }
        failure = { kind: "status", status: a.status, body: a.body };
      } catch (err) {
        failure = err instanceof LegError ? err.failure : { kind: "connect", code: (err as Error).message };
      }
      if (input.signal?.aborted) failure = { kind: "cancelled" };
      this.steps.endPrefill(r, failure.kind === "cancelled" ? "cancelled" : "error", failure.kind === "status" ? failure.status : failure.kind === "timeout" ? 504 : failure.kind === "cancelled" ? 499 : 502);
      if (retryPrefill(failure, retries, this.o.maxRetries) && this.steps.retryPrefill(r)) {
        retries++;
        this.stats.prefillRetries++;
        continue;
      }
      const err = prefillFailureError(failure, pod.pod);
      if (failure.kind !== "cancelled") this.stats.prefillFailures++;
      pd.failure = err;
      pd.failureReason = failure.kind === "status" ? `status-${failure.status}` : failure.kind;
      this.steps.fail(r, err);
      throw err;
    }
  }

  private startSglang(r: RoutedRequest, body: Readonly<Record<string, unknown>>, path: string, priority: LegPriority | undefined): RoutedRequest {
    const pd = r.pd as PdRouted;
    const pod = pd.prefillPod;
    const rid = legId();
    pd.rid = rid;
    const bootstrap = { host: hostOf(pod.address), port: pod.bootstrapPort ?? SGLANG_DEFAULT_BOOTSTRAP_PORT, room: bootstrapRoom(), rid };
    // One room and rid for both legs; the prefill leg's priority is its own pod's.
    const leg = prefillLegBody(body, pod, priority);
    pd.prefillPriority = leg.recorded;
    r.body = sglangBody(body, bootstrap);
    const legBody = leg.body === body ? r.body : sglangBody(leg.body, bootstrap);
    // Not tied to the ext_proc stream's signal: grpc-js reports "cancelled" after clean ends too,
    // and a prefill whose decode already finished must still complete. A client that leaves ends
    // the request (Director.finish), which cancels this leg.
    const ctl = new AbortController();
    pd.cancelPrefill = () => {
      ctl.abort();
      // The prefill engine may be holding the KV for a decode that will never come.
      void this.abort(pod.address, rid);
    };
    this.stats.prefillAttempts++;
    pd.prefillStartedAt = this.steps.now();
    const failed = (failure: LegFailure) => {
      const cancelled = failure.kind === "cancelled" || ctl.signal.aborted;
      this.steps.endPrefill(r, cancelled ? "cancelled" : "error", failure.kind === "status" ? failure.status : cancelled ? 499 : failure.kind === "timeout" ? 504 : 502);
      if (cancelled || r.finished) return;
      this.stats.prefillFailures++;
      const err = prefillFailureError(failure, pod.pod);
      pd.failure = err;
      pd.failureReason = failure.kind === "status" ? `status-${failure.status}` : failure.kind;
      // Decode is waiting for a handoff that will not come: free it now, and end the client's request.
      this.stats.decodeAborts++;
      void this.abort(r.pod.address, rid);
      pd.onFailure?.(err);
    };
    this.client
      .post(pod.address, path, legBody, { "content-type": "application/json", "x-request-id": rid }, { signal: ctl.signal, timeoutMs: this.o.sglangPrefillTimeoutMs })
      .then(
        (a) => {
          if (a.status >= 200 && a.status < 300) {
            pd.prefillMs = this.steps.now() - (pd.prefillStartedAt as number);
            this.steps.endPrefill(r, "completed", a.status);
          } else failed({ kind: "status", status: a.status, body: a.body });
        },
        (err: unknown) => failed(err instanceof LegError ? err.failure : { kind: "connect", code: (err as Error).message }),
      );
    return r;
  }

  /** SGLang's `POST /abort_request {rid}`: best effort, bounded by `abortTimeoutMs`. */
  abort(address: string, rid: string): Promise<void> {
    return this.client.post(address, "/abort_request", Buffer.from(JSON.stringify({ rid, abort_all: false })), { "content-type": "application/json" }, { timeoutMs: this.o.abortTimeoutMs }).then(
      () => undefined,
      () => undefined,
    );
  }

  /** The decode watchdog fired: SGLang's decode is told to stop (vLLM has no such call; its request ends with the stream). */
  abortDecode(r: RoutedRequest): Promise<void> {
    const pd = r.pd;
    if (pd?.plan.engine !== "sglang" || !pd.rid) return Promise.resolve();
    this.stats.decodeAborts++;
    return this.abort(r.pod.address, pd.rid);
  }
}
