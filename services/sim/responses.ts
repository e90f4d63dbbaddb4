/** Response bodies in the shapes vLLM's OpenAI server returns (fields clients commonly read, nulls included). */
import type { FinishReason } from "./engine.js";

export type ApiKind = "chat" | "completion";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export interface ResponseMeta {
  kind: ApiKind;
  id: string;
  created: number;
  model: string;
}

export function usage(promptTokens: number, completionTokens: number): Usage {
  return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
}

export function fullResponse(meta: ResponseMeta, text: string, finish: FinishReason, u: Usage): object {
  if (meta.kind === "chat") {
    return {
      id: meta.id,
      object: "chat.completion",
      created: meta.created,
      model: meta.model,
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: text, tool_calls: [] },
          logprobs: null,
          finish_reason: finish,
          stop_reason: null,
        },
      ],
      usage: u,
      prompt_logprobs: null,
    };
  }
  return {
    id: meta.id,
    object: "text_completion",
    created: meta.created,
    model: meta.model,
    choices: [{ index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null, prompt_logprobs: null }],
    usage: u,
  };
}

function chunk(meta: ResponseMeta, choices: object[], extra: object = {}): object {
  const object = meta.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  return { id: meta.id, object, created: meta.created, model: meta.model, choices, ...extra };
}

/** vLLM opens a chat stream with an empty assistant delta, sent together with the first token. */
export function roleChunk(meta: ResponseMeta): object {
  return chunk(meta, [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }]);
}

export function tokenChunk(meta: ResponseMeta, text: string, finish: FinishReason | undefined): object {
  const finishReason = finish ?? null;
  if (meta.kind === "chat") {
    return chunk(meta, [{ index: 0, delta: { content: text }, logprobs: null, finish_reason: finishReason, stop_reason: null }]);
  }
  return chunk(meta, [{ index: 0, text, logprobs: null, finish_reason: finishReason, stop_reason: null }]);
}

export function usageChunk(meta: ResponseMeta, u: Usage): object {
  return chunk(meta, [], { usage: u });
}

export function sse(data: object | string): string {
  return `data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`;
}
