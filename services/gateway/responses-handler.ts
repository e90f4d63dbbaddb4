/**
 * The gateway's Responses API state handling (docs/stateful-apis.md), used by the ext_proc
 * adapter:
 * - `route`: the routes under `/v1/responses/{id}`. `GET` and `cancel` go to the pod holding the
 *   response (the location view, for the caller's tenant), not to every pod; `GET` of a response
 *   whose pod is gone, `DELETE` and `input_items` are answered from the response store (vLLM and
 *   SGLang have neither of the last two).
 * - `finished`: a routed `POST /v1/responses` ended with the engine's reply: its id and the pod
 *   that produced it are recorded (every replica folds it), its items stored unless `store: false`.
 * - `recover`: a pinned continuation's pod answered 404 (its engine's store is off, vLLM's
 *   default, or it restarted): the chain is expanded from the store and sent to the same pod,
 *   whose prefix cache holds the conversation; the client sees that answer, not the 404.
 */
import { isResponseId, tenantDigest } from "../../schemas/responses.js";
import {
  ANONYMOUS_TENANT,
  deletedResponseObject,
  expandedBody,
  expandInput,
  inputItems,
  inputItemsPage,
  ListingError,
  type ResponseRoute,
  type ResponseState,
  RouteError,
  type RoutedRequest,
  storedResponseObject,
  walkChain,
} from "../routing/mod.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { Logger } from "../shared/log.js";
import { LogRate } from "../shared/log-rate.js";
import { PdHttpClient } from "./pd-client.js";
import type { CapturedResponse } from "./response-capture.js";
import type { ResponseStore } from "./response-store.js";

/** What the adapter does with a route under `/v1/responses/{id}`. */
export type ResponseRouteResult = { kind: "answer"; status: number; body: unknown } | { kind: "error"; error: RouteError } | { kind: "forward"; address: string };

/** The recovered answer of a pinned continuation. */
export interface RecoveredAnswer {
  status: number;
  contentType: string;
  body: Buffer;
}

export interface ResponsesHandlerCounters {
  recorded: number;
  recordFailures: number;
  /** Replies without a response id the gateway could record. */
  unrecorded: number;
  recoveries: number;
  recoveryFailures: number;
  forwarded: number;
  answeredFromStore: number;
}

const notFound = (id: string) => new RouteError("responseNotFound", `Response with id '${id.slice(0, 128)}' not found.`);

export class ResponsesHandler {
  readonly counters: ResponsesHandlerCounters = { recorded: 0, recordFailures: 0, unrecorded: 0, recoveries: 0, recoveryFailures: 0, forwarded: 0, answeredFromStore: 0 };
  private readonly client: PdHttpClient;
  private readonly logRate = new LogRate(10, 60_000);

  constructor(
    private readonly o: {
      store: ResponseStore;
      state: GatewayState;
      gatewayId: string;
      log: Logger;
      now: () => number;
      engineApiKey?: string;
      /** Longest a recovery's call to the engine may take (a whole generation). */
      recoveryTimeoutMs?: number;
      /** How long an id nobody knows yet is given to be recorded (its predecessor's reply just ended). */
      recordGraceMs?: number;
    },
  ) {
    this.client = new PdHttpClient({ maxAnswerBytes: 16 * 1024 * 1024, ...(o.engineApiKey ? { engineApiKey: o.engineApiKey } : {}) });
  }

  /**
   * The routing core's port: a stored turn of one tenant. A turn is recorded when its reply ends,
   * which is when the client may send the next one: an id neither the store nor the view knows is
   * read once more after `recordGraceMs`, so a continuation racing its predecessor's record is
   * not refused (an unknown id costs that wait before its 404).
   */
  readonly port: ResponseState = {
    stored: async (owner, id) => {
      let r = await this.o.store.get(owner, id);
      // Polled in short steps up to the grace: the record usually lands within a few ms.
      const grace = this.o.recordGraceMs ?? 100;
      for (let waited = 0; !r && waited < grace && this.o.state.responses.get(id, this.o.now()) === undefined; waited += 20) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        r = await this.o.store.get(owner, id);
      }
      return r && { id: r.id, model: r.model, input: r.input, output: r.output, ...(r.pod !== undefined ? { pod: r.pod } : {}), ...(r.previousResponseId !== undefined ? { previousResponseId: r.previousResponseId } : {}) };
    },
  };

  /** The pod address holding `id` for `owner`, if it is in the pod set and ready. */
  private holder(owner: string, id: string): string | undefined {
    const loc = this.o.state.responses.get(id, this.o.now());
    if (!loc || loc.tenant !== tenantDigest(owner)) return undefined;
    const pod = this.o.state.pods.get(loc.model, loc.pod);
    return pod?.ready ? pod.address : undefined;
  }

  async route(route: ResponseRoute, owner: string | undefined): Promise<ResponseRouteResult> {
    const tenant = owner ?? ANONYMOUS_TENANT;
    const id = route.id;
    if (!isResponseId(id)) return { kind: "error", error: notFound(id) };
    if (route.kind === "retrieve" || route.kind === "cancel") {
      const address = this.holder(tenant, id);
      if (address) {
        this.counters.forwarded++;
        return { kind: "forward", address };
      }
    }
    const rec = await this.o.store.get(tenant, id);
    if (!rec) return { kind: "error", error: notFound(id) };
    this.counters.answeredFromStore++;
    switch (route.kind) {
      case "retrieve":
        return { kind: "answer", status: 200, body: storedResponseObject(rec) };
      case "cancel":
        // Its pod is gone: nothing runs any more, and a stored response is a finished one.
        return { kind: "error", error: new RouteError("invalidBody", "Cannot cancel a synchronous response.") };
      case "delete":
        await this.o.store.delete(tenant, id, this.o.gatewayId);
        return { kind: "answer", status: 200, body: deletedResponseObject(id) };
      case "input-items":
        try {
          return { kind: "answer", status: 200, body: inputItemsPage(rec, route.query) };
        } catch (err) {
          if (err instanceof ListingError) return { kind: "error", error: new RouteError("invalidBody", err.message, err.param) };
          throw err;
        }
    }
  }

  /** A `GET /v1/responses/{id}` forwarded to a pod that answered 404: the stored response, if any. */
  async retrieveStored(owner: string | undefined, id: string): Promise<unknown | undefined> {
    const rec = await this.o.store.get(owner ?? ANONYMOUS_TENANT, id);
    if (!rec) return undefined;
    this.counters.answeredFromStore++;
    return storedResponseObject(rec);
  }

  /** A routed request's reply named its id (a stream's first event): its location, at once (fire and forget). */
  started(routed: RoutedRequest, id: string): void {
    const turn = routed.responses;
    if (!turn) return;
    this.o.store.recordStarted({ id, owner: turn.owner, model: routed.model, pod: routed.pod.pod, gateway: this.o.gatewayId, createdAt: routed.startedAt }).catch((err: unknown) => {
      this.counters.recordFailures++;
      if (this.logRate.admit(this.o.now()).log) this.o.log.warn({ err, id }, "could not record where a Responses API response lives");
    });
  }

  /** Records a routed request's reply (fire and forget: failures are counted and logged). */
  finished(routed: RoutedRequest, captured: CapturedResponse | undefined): void {
    const turn = routed.responses;
    if (!turn) return;
    if (!captured || (captured.status !== undefined && captured.status !== "completed" && captured.status !== "incomplete")) {
      this.counters.unrecorded++;
      return;
    }
    const stored = turn.store && captured.output !== undefined;
    this.o.store
      .record({
        id: captured.id,
        owner: turn.owner,
        model: routed.model,
        pod: routed.pod.pod,
        gateway: this.o.gatewayId,
        createdAt: routed.startedAt,
        store: stored,
        ...(turn.previousResponseId !== undefined ? { previousResponseId: turn.previousResponseId } : {}),
        ...(turn.instructions !== undefined ? { instructions: turn.instructions as string } : {}),
        input: [...turn.input],
        output: captured.output ?? [],
      })
      .then(
        () => void this.counters.recorded++,
        (err: unknown) => {
          this.counters.recordFailures++;
          if (this.logRate.admit(this.o.now()).log) this.o.log.warn({ err, id: captured.id }, "could not record a Responses API response; its continuation loses affinity and store expansion");
        },
      );
  }

  /**
   * A pinned continuation answered 404 by its pod: expands the chain from the store and sends it to
   * the same pod. Undefined when the chain is not stored (the engine's 404 then stands).
   */
  async recover(routed: RoutedRequest, clientBody: Buffer, signal?: AbortSignal): Promise<RecoveredAnswer | undefined> {
    const turn = routed.responses;
    const prev = turn?.previousResponseId;
    if (!turn || prev === undefined) return undefined;
    try {
      const walk = await walkChain(prev, (id) => this.port.stored(turn.owner, id));
      if (!walk.ok) return undefined;
      let body: Record<string, unknown>;
      try {
        body = JSON.parse((routed.body ?? clientBody).toString("utf8")) as Record<string, unknown>;
      } catch {
        return undefined;
      }
      const expansion = expandInput(walk.turns, inputItems(body.input) ?? []);
      if (!expansion) return undefined;
      const sent = Buffer.from(JSON.stringify(expandedBody(body, expansion)));
      const answer = await this.client.post(routed.pod.address, "/v1/responses", sent, { "content-type": "application/json", "x-request-id": routed.requestId }, { timeoutMs: this.o.recoveryTimeoutMs ?? 300_000, ...(signal ? { signal } : {}) });
      this.counters.recoveries++;
      return { status: answer.status, contentType: body.stream === true ? "text/event-stream" : "application/json", body: answer.body };
    } catch (err) {
      this.counters.recoveryFailures++;
      if (this.logRate.admit(this.o.now()).log) this.o.log.warn({ err, pod: routed.pod.pod }, "a continuation the pod did not know could not be expanded from the response store");
      return undefined;
    }
  }

  /** Every count for the metrics (snake_case figures). */
  figures(): Record<string, number> {
    const loc = this.o.state.responses;
    const s = this.o.store.counters;
    const c = this.counters;
    return {
      locations: loc.size, locations_evicted: loc.evicted, locations_expired: loc.expired, locations_conflicts: loc.conflicts, locations_invalid: loc.invalid,
      stored: s.stored, too_large: s.tooLarge, store_reads: s.reads, store_hits: s.hits, store_malformed: s.malformed, deleted: s.deleted,
      recorded: c.recorded, record_failures: c.recordFailures, unrecorded: c.unrecorded, recoveries: c.recoveries, recovery_failures: c.recoveryFailures, forwarded: c.forwarded, answered_from_store: c.answeredFromStore,
    };
  }

  close(): Promise<void> {
    return this.client.close();
  }
}
