/**
 * A simulated pod's HTTP routes: vLLM's OpenAI API (models, chat and completions, tokenize), its
 * metrics and dev endpoints, LoRA adapter loading, SGLang's /abort_request, and the simulator's
 * own /debug endpoints.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { detokenize } from "../tokenizer/sim-tokenizer.js";
import type { SimEngine } from "./engine.js";
import { embeddingsRoute } from "./embeddings.js";
import { ApiError, badRequest } from "./errors.js";
import { type FaultState, parseFaults } from "./faults.js";
import { type ResponseWriter, serveGeneration } from "./generate.js";
import type { SimLora } from "./lora.js";
import type { EngineKind, PodMetrics } from "./metrics.js";
import { type PdPod, pdHooks } from "./pd-legs.js";
import { type PdStats, renderPdMetrics } from "./pd-stats.js";
import { type Handler, readJson, readJsonText, type Routes, sendJson } from "./pod-http.js";
import { realPromptTokens, realTokenize, type SimRealTokenizer } from "./real-tokenizer.js";
import {
  asObject,
  checkModel,
  type GenerationRequest,
  parseChatRequest,
  parseCompletionRequest,
  parseDetokenizeRequest,
  parseTokenizeRequest,
  type ServedModel,
} from "./requests.js";
import type { ApiKind } from "./responses.js";
import type { GenerationSessions } from "./sessions.js";
import type { SimResponseStore } from "./response-store.js";
import { anthropicErrorBody, messagesWriter, parseMessagesRequest, parseResponsesRequest, type RealChatTokens, responseNotFound, responsesWriter } from "./stateful-apis.js";

/** What the routes need from their pod. */
export interface PodRouteContext {
  name: string;
  model: string;
  engine: EngineKind;
  maxModelLen: number;
  served: ServedModel;
  /** A real model's tokenizer, when the pod has one. */
  real: SimRealTokenizer | undefined;
  lora: SimLora;
  faults: FaultState;
  pd: PdPod;
  sessions: GenerationSessions;
  /** The Responses API store (emptied by a restart). */
  responses: SimResponseStore;
  /** SGLang with `--abort-on-priority-when-disabled` and no priority scheduling: a body `priority` is a 503. */
  refusesPriority: boolean;
  /** The current engine and what counts for it; a restart swaps them. */
  current(): { engine: SimEngine; metrics: PodMetrics; pdStats: PdStats };
  /** `/debug/state`'s body. */
  state(): object;
  /** `/debug/cache`'s body. */
  cacheListing(): object;
  restart(): void;
}

export function podRoutes(pod: PodRouteContext): Routes {
  return { ...apiRoutes(pod), ...debugRoutes(pod) };
}

/** What vLLM (and, for /abort_request, SGLang) serve. */
function apiRoutes(pod: PodRouteContext): Routes {
  const { real, served } = pod;
  return {
    "/health": { GET: (_req, res) => void res.writeHead(200).end() },
    "/v1/models": { GET: (_req, res) => sendJson(res, 200, modelList(pod)) },
    ...pod.lora.routes(readJson),
    "/v1/chat/completions": { POST: generationRoute(pod, "chat") },
    "/v1/completions": { POST: generationRoute(pod, "completion") },
    "/v1/embeddings": { POST: embeddingsRoute(served) },
    "/v1/responses": { POST: responsesRoute(pod) },
    // vLLM serves retrieve and cancel; no DELETE, no input_items (405/404 as FastAPI answers).
    "/v1/responses/*": { GET: retrieveResponse(pod), POST: cancelResponse(pod) },
    "/v1/messages": { POST: anthropicErrors(messagesRoute(pod)) },
    "/tokenize": {
      POST: async (req, res) => {
        const body = await readJson(req);
        let tokens: number[] | undefined;
        if (real) {
          checkModel(asObject(body), served);
          tokens = await realTokenize(body, real.tokenizer);
        }
        tokens ??= parseTokenizeRequest(body, served);
        sendJson(res, 200, { count: tokens.length, max_model_len: pod.maxModelLen, tokens, token_strs: null });
      },
    },
    "/detokenize": {
      POST: async (req, res) => {
        const ids = parseDetokenizeRequest(await readJson(req), served);
        sendJson(res, 200, { prompt: real ? await real.tokenizer.decode(ids) : detokenize(ids) });
      },
    },
    "/metrics": { GET: (_req, res) => sendMetrics(pod, res) },
    // vLLM serves this in dev mode; 200 even when refused, as vLLM does.
    "/reset_prefix_cache": {
      POST: (_req, res) => {
        pod.current().engine.resetPrefixCache();
        res.writeHead(200).end();
      },
    },
    // SGLang's abort endpoint; 200 whether or not the rid matched anything, as SGLang answers.
    "/abort_request": {
      POST: async (req, res) => {
        const body = asObject(await readJson(req));
        if (body.rid !== undefined && body.rid !== null && typeof body.rid !== "string") throw badRequest("rid must be a string", "rid");
        if (body.abort_all === true) pod.sessions.cancelAll();
        else pod.sessions.cancel(String(body.rid ?? ""));
        res.writeHead(200).end();
      },
    },
  };
}

/** The simulator's own endpoints: state, injected faults, cache contents, restart. */
function debugRoutes(pod: PodRouteContext): Routes {
  return {
    "/debug/state": { GET: (_req, res) => sendJson(res, 200, pod.state()) },
    "/debug/faults": {
      GET: (_req, res) => sendJson(res, 200, pod.faults.current),
      POST: async (req, res) => {
        pod.faults.set(parseFaults(await readJson(req)));
        sendJson(res, 200, pod.faults.current);
      },
    },
    "/debug/cache": { GET: (_req, res) => sendJson(res, 200, pod.cacheListing()) },
    "/debug/restart": {
      POST: (_req, res) => {
        pod.restart();
        sendJson(res, 200, { restarted: true, pod: pod.name });
      },
    },
  };
}

/** `/v1/models`: the base model, then the loaded LoRA adapters. */
function modelList(pod: PodRouteContext): object {
  return {
    object: "list",
    data: [
      {
        id: pod.model,
        object: "model",
        created: Math.floor(Date.now() / 1000),
        owned_by: pod.engine,
        root: pod.model,
        parent: null,
        max_model_len: pod.maxModelLen,
        permission: [],
      },
      ...pod.lora.modelEntries(pod.engine, pod.maxModelLen),
    ],
  };
}

function sendMetrics(pod: PodRouteContext, res: ServerResponse): void {
  const { engine, metrics, pdStats } = pod.current();
  res
    .writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" })
    .end(metrics.render(engine.snapshot()) + renderPdMetrics(pod.engine, pod.model, pdStats.snapshot(engine.snapshot().heldRequests)) + pod.lora.metricsText());
}

/** Chat or completion: injected faults first, then the request parsed and handed to the engine (and the P/D legs). */
function generationRoute(pod: PodRouteContext, kind: ApiKind): Handler {
  const { real, served, lora } = pod;
  return async (req, res) => {
    const { body, raw } = await readJsonText(req);
    if (!(await passFaults(pod, res))) return;
    // A request naming a loaded adapter runs on the base model with the adapter's blocks.
    const adapter = lora.adapterOf(body);
    const forBase = adapter ? { ...(body as object), model: pod.model } : body;
    // With a real tokenizer: the model is checked first (404 before any tokenizing), as vLLM does.
    let ids: number[] | undefined;
    if (real) {
      checkModel(asObject(forBase), served);
      ids = await realPromptTokens(kind, forBase, real.tokenizer);
    }
    const gen = kind === "chat" ? parseChatRequest(forBase, served, ids) : parseCompletionRequest(forBase, served, ids);
    if (pod.refusesPriority && gen.priority !== undefined) throw priorityDisabledError();
    if (adapter) {
      lora.track(adapter, res);
      gen.model = adapter;
      gen.loraName = adapter;
    }
    const obj = asObject(body);
    const rid = typeof obj.rid === "string" && obj.rid !== "" ? obj.rid : undefined;
    const requestId = requestIdOf(req.headers["x-request-id"], rid);
    const hooks = pdHooks(pod.pd, obj, raw, gen, requestId);
    const session = serveGeneration(res, pod.current().engine, gen, kind, requestId, hooks, real?.vocab);
    pod.sessions.track(rid ? [requestId, rid] : [requestId], session);
  };
}

/** Injected faults: a status is thrown, a hang waits until cleared; false when the client left meanwhile. */
async function passFaults(pod: PodRouteContext, res: ServerResponse): Promise<boolean> {
  const fault = pod.faults.next();
  if (fault.kind === "status") throw injectedStatusError(fault.status);
  if (fault.kind === "hang") {
    const left = new AbortController();
    res.on("close", () => left.abort());
    try {
      await pod.faults.waitUnhung(left.signal);
    } catch {
      return false;
    }
  }
  return true;
}

/**
 * `/v1/responses` or `/v1/messages`: faults, the body rendered to a chat prompt (stateful-apis.ts),
 * then the engine as for chat (no P/D legs: a prefill/decode pod computes these locally).
 */
async function statefulGeneration(
  pod: PodRouteContext,
  req: IncomingMessage,
  res: ServerResponse,
  parse: (body: unknown, realTokens: RealChatTokens | undefined) => Promise<{ gen: GenerationRequest; writer: ResponseWriter }>,
): Promise<void> {
  const { real, served, lora } = pod;
  const body = await readJson(req);
  if (!(await passFaults(pod, res))) return;
  // A request naming a loaded adapter runs on the base model with the adapter's blocks.
  const adapter = lora.adapterOf(body);
  const forBase = adapter ? { ...(body as object), model: pod.model } : body;
  let realTokens: RealChatTokens | undefined;
  if (real) {
    // The model is checked first (404 before any tokenizing), as vLLM does.
    checkModel(asObject(forBase), served);
    realTokens = (chat) => realPromptTokens("chat", { messages: chat.messages, ...(chat.tools ? { tools: chat.tools } : {}) }, real.tokenizer);
  }
  let { gen, writer } = await parse(forBase, realTokens);
  if (pod.refusesPriority && gen.priority !== undefined) throw priorityDisabledError();
  if (adapter) {
    lora.track(adapter, res);
    gen = { ...gen, model: adapter, loraName: adapter };
  }
  const requestId = requestIdOf(req.headers["x-request-id"], undefined);
  const session = serveGeneration(res, pod.current().engine, gen, "chat", requestId, {}, real?.vocab, writer);
  pod.sessions.track([requestId], session);
}

function responsesRoute(pod: PodRouteContext): Handler {
  return (req, res) =>
    statefulGeneration(pod, req, res, async (body, realTokens) => {
      const call = await parseResponsesRequest(body, pod.served, pod.responses, realTokens);
      return { gen: call.gen, writer: responsesWriter(call, pod.responses) };
    });
}

function messagesRoute(pod: PodRouteContext): Handler {
  return (req, res) =>
    statefulGeneration(pod, req, res, async (body, realTokens) => {
      const call = await parseMessagesRequest(body, pod.served, realTokens);
      return { gen: call.gen, writer: messagesWriter(call) };
    });
}

/** `/v1/messages` answers its errors in Anthropic's shape, `{"type":"error","error":{type,message}}`. */
function anthropicErrors(handler: Handler): Handler {
  return async (req, res) => {
    try {
      await handler(req, res);
    } catch (err) {
      if (!(err instanceof ApiError) || res.headersSent || res.destroyed) throw err;
      sendJson(res, err.status, anthropicErrorBody(err.status, err.message));
    }
  };
}

const responseIdOf = (req: IncomingMessage): string => decodeURIComponent(((req.url ?? "").split("?")[0] ?? "").slice("/v1/responses/".length));

/** `GET /v1/responses/{id}`: the stored response, or vLLM's 404. */
function retrieveResponse(pod: PodRouteContext): Handler {
  return (req, res) => {
    const id = responseIdOf(req);
    const stored = pod.responses.get(id);
    if (!stored) throw responseNotFound(id);
    sendJson(res, 200, stored.response);
  };
}

/** `POST /v1/responses/{id}/cancel`: only background responses can be cancelled (vLLM); the simulator has none. */
function cancelResponse(pod: PodRouteContext): Handler {
  return (req, res) => {
    const path = responseIdOf(req);
    if (!path.endsWith("/cancel")) return sendJson(res, 405, { detail: "Method Not Allowed" });
    const id = path.slice(0, -"/cancel".length);
    if (!pod.responses.get(id)) throw responseNotFound(id);
    throw badRequest("Cannot cancel a synchronous response.");
  };
}

/** SGLang's abort of a request carrying `priority` on a server without priority scheduling (`--abort-on-priority-when-disabled`). */
function priorityDisabledError(): ApiError {
  return new ApiError(503, "ServiceUnavailableError", "Using priority is disabled for this server. Please send a new request without a priority.", "priority");
}

/** The answer to an injected `status` fault, with the error type vLLM gives that status. */
function injectedStatusError(status: number): ApiError {
  const type = status === 400 ? "BadRequestError" : status === 404 ? "NotFoundError" : "InternalServerError";
  return new ApiError(status, type, `Injected fault: HTTP ${status}`);
}

/** A request's id: the x-request-id header, else SGLang's rid, else a fresh one. */
function requestIdOf(header: string | string[] | undefined, rid: string | undefined): string {
  return typeof header === "string" && header !== "" ? header : (rid ?? randomUUID().replaceAll("-", ""));
}
