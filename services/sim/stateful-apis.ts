/**
 * The Responses API (`POST /v1/responses`) and the Anthropic Messages API (`POST /v1/messages`) on
 * a simulated pod: the request rendered to chat messages (services/tokenizer/api-messages.ts, the
 * conversion the gateway's tokenizer uses too), the previous response's chain prepended from the
 * pod's store, and the answers in each API's own shapes, JSON or SSE (event names and fields as
 * vLLM sends them). Generation itself is the chat path's: same engine, timing and prefix cache.
 */
import { randomUUID } from "node:crypto";
import type { ServerResponse } from "node:http";
import { type AnthropicErrorBody, anthropicError } from "../routing/mod.js";
import { ApiShapeError, messagesToChat, type RenderedChat, type RenderedMessage, responsesInstructions, responsesToChat } from "../tokenizer/api-messages.js";
import { tokenizeChat } from "../tokenizer/sim-tokenizer.js";
import type { FinishReason } from "./engine.js";
import { ApiError, badRequest } from "./errors.js";
import type { GenerationResponse, ResponseWriter } from "./generate.js";
import type { GenerationVocab } from "./real-tokenizer.js";
import { asObject, checkModel, type GenerationRequest, generationFields, optionalBool, type ServedModel } from "./requests.js";
import type { SimResponseStore, StoredResponse } from "./response-store.js";
import { tokenText } from "./textgen.js";

type Body = Record<string, unknown>;

/** A real tokenizer's ids for a rendered prompt (sim --tokenizer hf:); undefined: the built-in tokenizer's. */
export type RealChatTokens = (chat: RenderedChat) => Promise<number[] | undefined>;

const hexId = (): string => randomUUID().replaceAll("-", "");

/** vLLM's answer to a response id its store does not hold (`_make_not_found_error`): 404, `param: response_id`. */
export function responseNotFound(id: string): ApiError {
  return new ApiError(404, "invalid_request_error", `Response with id '${id}' not found.`, "response_id");
}

function shapeError(err: unknown): never {
  if (err instanceof ApiShapeError) throw badRequest(err.message, err.param);
  throw err;
}

/** A parsed `/v1/responses` request: what the engine runs, and what the answer and the store need. */
export interface ResponsesCall {
  gen: GenerationRequest;
  /** The rendered prompt (instructions first). */
  chat: RenderedChat;
  /** This request's chain without instructions: the store's `history` for it. */
  history: RenderedMessage[];
  id: string;
  store: boolean;
  instructions: string | undefined;
  previousResponseId: string | undefined;
  /** Request fields echoed in the response object. */
  echo: Body;
}

/**
 * `/v1/responses` -> the chat prompt and generation fields. `previous_response_id` must name a
 * response this pod's store holds (else vLLM's 404); `background: true` is refused (the simulator
 * has no background mode). `realTokens`: a real tokenizer's ids for `render(chat)`.
 */
export async function parseResponsesRequest(raw: unknown, served: ServedModel, store: SimResponseStore, realTokens?: RealChatTokens): Promise<ResponsesCall> {
  const body = asObject(raw);
  const model = checkModel(body, served);
  if (body.background === true) throw badRequest("background mode is not supported by the simulator; send background: false", "background");
  const prev = body.previous_response_id;
  if (prev !== undefined && prev !== null && typeof prev !== "string") throw badRequest("previous_response_id: Input should be a valid string", "previous_response_id");
  let previous: StoredResponse | undefined;
  if (typeof prev === "string") {
    previous = store.get(prev);
    if (!previous) throw responseNotFound(prev);
  }
  const before: RenderedMessage[] = previous ? [...previous.history, { role: "assistant", content: previous.outputText }] : [];
  let chat: RenderedChat;
  let instructions: string | undefined;
  try {
    instructions = responsesInstructions(body);
    chat = responsesToChat(body, before);
  } catch (err) {
    shapeError(err);
  }
  const history = instructions !== undefined ? chat.messages.slice(1) : chat.messages;
  const promptTokens = (await realTokens?.(chat)) ?? tokenizeChat(chat.messages, { addGenerationPrompt: true });
  const gen = generationFields(body, served, model, promptTokens, ["max_output_tokens"]);
  const requestId = body.request_id;
  const id = typeof requestId === "string" && requestId !== "" ? requestId : `resp_${hexId()}`;
  const echo: Body = {};
  for (const k of ["metadata", "temperature", "top_p", "tool_choice", "tools", "user", "parallel_tool_calls", "text", "truncation", "reasoning"]) {
    if (body[k] !== undefined) echo[k] = body[k];
  }
  return { gen, chat, history, id, store: optionalBool(body, "store", true), instructions, previousResponseId: previous?.id, echo };
}

/** A parsed `/v1/messages` request. */
export interface MessagesCall {
  gen: GenerationRequest;
  chat: RenderedChat;
  id: string;
}

/** `/v1/messages` -> the chat prompt and generation fields; `max_tokens` is required, as in Anthropic's API and vLLM's. */
export async function parseMessagesRequest(raw: unknown, served: ServedModel, realTokens?: RealChatTokens): Promise<MessagesCall> {
  const body = asObject(raw);
  const model = checkModel(body, served);
  if (body.max_tokens === undefined || body.max_tokens === null) throw badRequest("max_tokens: Field required", "max_tokens");
  let chat: RenderedChat;
  try {
    chat = messagesToChat(body);
  } catch (err) {
    shapeError(err);
  }
  const promptTokens = (await realTokens?.(chat)) ?? tokenizeChat(chat.messages, { addGenerationPrompt: true });
  const gen = generationFields(body, served, model, promptTokens, ["max_tokens"]);
  return { gen, chat, id: `msg_${hexId()}` };
}

/** Anthropic's error body for a status (the same type-by-status mapping the gateway uses). */
export function anthropicErrorBody(status: number, message: string): AnthropicErrorBody {
  return anthropicError(status, message);
}

const sseEvent = (event: string, data: object): string => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;

function startStream(res: ServerResponse, requestId: string): void {
  res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-request-id": requestId });
  res.flushHeaders();
}

const asApiError = (err: unknown): ApiError => (err instanceof ApiError ? err : new ApiError(500, "InternalServerError", String((err as Error)?.message ?? err)));

/**
 * The Responses answer: the response object (JSON), or the event stream response.created,
 * response.in_progress (at once), then with the first token output_item.added and
 * content_part.added, output_text.delta per token, and at the end output_text.done,
 * content_part.done, output_item.done, response.completed with `usage`. A finished response is
 * kept in the store unless `store: false`. The simulator has no end-of-sequence token, so a
 * response ends at `max_output_tokens`; it is reported `completed` all the same.
 */
export function responsesWriter(call: ResponsesCall, store: SimResponseStore): ResponseWriter {
  return (res: ServerResponse, gen: GenerationRequest, requestId: string, vocab: GenerationVocab | undefined): GenerationResponse => {
    const createdAt = Math.floor(Date.now() / 1000);
    const itemId = `msg_${hexId()}`;
    let text = "";
    let generated = 0;
    let seq = 0;
    const over = (): boolean => res.writableEnded || res.destroyed;
    const send = (type: string, fields: object): void => void res.write(sseEvent(type, { type, sequence_number: seq++, ...fields }));
    const outputItem = (status: string) => ({ id: itemId, type: "message", role: "assistant", status, content: status === "in_progress" ? [] : [{ type: "output_text", text, annotations: [], logprobs: [] }] });
    const usage = () => ({
      input_tokens: gen.promptTokens.length,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: generated,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: gen.promptTokens.length + generated,
    });
    // Field order as vLLM's ResponsesResponse: `usage` near the end.
    const response = (status: string, output: object[], withUsage: boolean): Record<string, unknown> => ({
      id: call.id,
      object: "response",
      created_at: createdAt,
      model: gen.model,
      status,
      error: null,
      incomplete_details: status === "incomplete" ? { reason: "max_output_tokens" } : null,
      instructions: call.instructions ?? null,
      max_output_tokens: gen.maxTokens,
      metadata: {},
      output,
      parallel_tool_calls: true,
      previous_response_id: call.previousResponseId ?? null,
      reasoning: null,
      store: call.store,
      temperature: 1.0,
      text: { format: { type: "text" } },
      tool_choice: "auto",
      tools: [],
      top_p: 1.0,
      truncation: "disabled",
      background: false,
      ...call.echo,
      usage: withUsage ? usage() : null,
      user: null,
    });
    if (gen.stream) {
      startStream(res, requestId);
      send("response.created", { response: response("in_progress", [], false) });
      send("response.in_progress", { response: response("in_progress", [], false) });
    }
    return {
      over,
      token(tokenId: number, index: number, _finish: FinishReason | undefined) {
        generated = index + 1;
        const piece = vocab ? vocab.text(tokenId) : tokenText(tokenId);
        text += piece;
        if (!gen.stream) return;
        if (index === 0) {
          send("response.output_item.added", { output_index: 0, item: outputItem("in_progress") });
          send("response.content_part.added", { item_id: itemId, output_index: 0, content_index: 0, part: { type: "output_text", text: "", annotations: [], logprobs: [] } });
        }
        send("response.output_text.delta", { item_id: itemId, output_index: 0, content_index: 0, delta: piece, logprobs: [] });
      },
      answer(finish: "length" | "abort") {
        if (over()) return;
        const status = finish === "abort" ? "incomplete" : "completed";
        const final = response(status, [outputItem("completed")], true);
        if (finish !== "abort" && call.store) store.put({ id: call.id, response: final, history: call.history, outputText: text });
        if (!gen.stream) {
          res.writeHead(200, { "content-type": "application/json", "x-request-id": requestId }).end(JSON.stringify(final));
          return;
        }
        if (generated > 0) {
          send("response.output_text.done", { item_id: itemId, output_index: 0, content_index: 0, text, logprobs: [] });
          send("response.content_part.done", { item_id: itemId, output_index: 0, content_index: 0, part: { type: "output_text", text, annotations: [], logprobs: [] } });
          send("response.output_item.done", { output_index: 0, item: outputItem("completed") });
        }
        send(finish === "abort" ? "response.incomplete" : "response.completed", { response: final });
        res.end();
      },
      error(err: unknown) {
        if (over()) return;
        const e = asApiError(err);
        if (res.headersSent) {
          res.end(sseEvent("error", { type: "error", sequence_number: seq++, code: e.type, message: e.message, param: e.param }));
          return;
        }
        res.writeHead(e.status, { "content-type": "application/json", "x-request-id": requestId }).end(JSON.stringify(e.body()));
      },
    };
  };
}

/**
 * The Messages answer: the message object (JSON), or, with the first token (as vLLM sends it,
 * converted from its chat stream), message_start, content_block_start and ping, then
 * content_block_delta per token, and at the end content_block_stop, message_delta (stop reason and
 * `usage.output_tokens`) and message_stop.
 */
export function messagesWriter(call: MessagesCall): ResponseWriter {
  return (res: ServerResponse, gen: GenerationRequest, requestId: string, vocab: GenerationVocab | undefined): GenerationResponse => {
    let text = "";
    let generated = 0;
    let started = false;
    const over = (): boolean => res.writableEnded || res.destroyed;
    const message = (content: object[], stopReason: string | null) => ({
      id: call.id,
      type: "message",
      role: "assistant",
      content,
      model: gen.model,
      stop_reason: stopReason,
      stop_sequence: null,
      usage: { input_tokens: gen.promptTokens.length, output_tokens: generated },
    });
    const open = (): void => {
      if (started) return;
      started = true;
      startStream(res, requestId);
      res.write(sseEvent("message_start", { type: "message_start", message: message([], null) }));
      res.write(sseEvent("content_block_start", { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } }));
      res.write(sseEvent("ping", { type: "ping" }));
    };
    return {
      over,
      token(tokenId: number, index: number) {
        generated = index + 1;
        const piece = vocab ? vocab.text(tokenId) : tokenText(tokenId);
        text += piece;
        if (!gen.stream) return;
        open();
        res.write(sseEvent("content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: piece } }));
      },
      answer(finish: "length" | "abort") {
        if (over()) return;
        const stopReason = finish === "abort" ? "end_turn" : "max_tokens";
        if (!gen.stream) {
          res.writeHead(200, { "content-type": "application/json", "x-request-id": requestId }).end(JSON.stringify(message([{ type: "text", text }], stopReason)));
          return;
        }
        open();
        res.write(sseEvent("content_block_stop", { type: "content_block_stop", index: 0 }));
        res.write(sseEvent("message_delta", { type: "message_delta", delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: generated } }));
        res.end(sseEvent("message_stop", { type: "message_stop" }));
      },
      error(err: unknown) {
        if (over()) return;
        const e = asApiError(err);
        if (res.headersSent) {
          res.end(sseEvent("error", anthropicErrorBody(e.status, e.message)));
          return;
        }
        res.writeHead(e.status, { "content-type": "application/json", "x-request-id": requestId }).end(JSON.stringify(anthropicErrorBody(e.status, e.message)));
      },
    };
  };
}
