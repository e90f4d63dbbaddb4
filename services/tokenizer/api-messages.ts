/**
 * The Responses API (`/v1/responses`) and the Anthropic Messages API (`/v1/messages`) rendered as
 * the chat messages and tools an engine builds from them before its chat template runs (vLLM
 * serves both by converting to its chat path). One conversion, used by the simulated engines and by
 * the gateway's tokenizer, so both see the same prompt and prefix matching works on these APIs as
 * on chat. Pure; every shape mistake is an ApiShapeError naming the field.
 *
 * Responses: `instructions` -> one system message first, then the previous turns (the caller's
 * `history`: earlier inputs and outputs, without their instructions, which the API does not carry
 * over), then `input` (a string is one user message; items: messages with text parts,
 * `function_call` -> an assistant tool call, `function_call_output` -> a tool message, `reasoning`
 * skipped). Function tools -> chat tools; built-in tools (web search, ...) render nothing.
 *
 * Messages: `system` (a string or text blocks, concatenated) -> one system message, then each
 * message (text blocks -> text parts, `image` -> a part without text, `tool_use` -> an assistant
 * tool call, `tool_result` -> a tool message, `thinking` skipped). Tools `{name, description,
 * input_schema}` -> chat tools.
 */
import type { ChatMessage, ContentPart } from "./sim-tokenizer.js";

export class ApiShapeError extends Error {
  override name = "ApiShapeError";
  constructor(
    message: string,
    readonly param: string,
  ) {
    super(message);
  }
}

/** A chat message as rendered from these APIs (tool calls and tool results included). */
export interface RenderedMessage extends ChatMessage {
  tool_calls?: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }>;
  tool_call_id?: string;
}

export interface RenderedChat {
  messages: RenderedMessage[];
  /** Chat-shaped tools (`{type: "function", function: {name, description, parameters}}`), absent when none. */
  tools?: unknown[];
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const bad = (message: string, param: string): ApiShapeError => new ApiShapeError(message, param);
/** Part types that carry no text to render (images, audio, files). */
const NON_TEXT_PARTS = new Set(["input_image", "input_file", "input_audio", "image", "document", "image_url"]);

/** Responses content: a string, or parts (`input_text`/`output_text`/`text` with `text`, `refusal`, media without text). */
function responsesContent(content: unknown, at: string): string | ContentPart[] {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw bad(`${at} must be a string or an array of content parts`, at);
  return content.map((p, j): ContentPart => {
    const pat = `${at}[${j}]`;
    if (!isObject(p) || typeof p.type !== "string") throw bad(`${pat} must be a content part object with a string type`, pat);
    if (p.type === "input_text" || p.type === "output_text" || p.type === "text") {
      if (typeof p.text !== "string") throw bad(`${pat}.text must be a string`, `${pat}.text`);
      return { type: "text", text: p.text };
    }
    if (p.type === "refusal") return { type: "text", text: typeof p.refusal === "string" ? p.refusal : "" };
    if (NON_TEXT_PARTS.has(p.type)) return { type: p.type };
    throw bad(`${pat}.type ${JSON.stringify(p.type.slice(0, 64))} is not a known content part type`, `${pat}.type`);
  });
}

const RESPONSES_ROLES = new Set(["user", "assistant", "system", "developer"]);

/** A Responses `input` (a string, or a list of items) as chat messages. */
export function responsesInputMessages(input: unknown, param = "input"): RenderedMessage[] {
  if (typeof input === "string") return [{ role: "user", content: input }];
  if (!Array.isArray(input)) throw bad(`\`${param}\` must be a string or an array of input items`, param);
  const out: RenderedMessage[] = [];
  input.forEach((item, i) => {
    const at = `${param}[${i}]`;
    if (!isObject(item)) throw bad(`${at} must be an object`, at);
    const type = item.type ?? "message";
    if (type === "message") {
      if (typeof item.role !== "string" || !RESPONSES_ROLES.has(item.role)) throw bad(`${at}.role must be one of user, assistant, system, developer`, `${at}.role`);
      out.push({ role: item.role, content: responsesContent(item.content, `${at}.content`) });
    } else if (type === "function_call") {
      if (typeof item.name !== "string" || typeof item.call_id !== "string") throw bad(`${at} (function_call) needs string \`name\` and \`call_id\``, at);
      const args = typeof item.arguments === "string" ? item.arguments : "";
      out.push({ role: "assistant", content: null, tool_calls: [{ id: item.call_id, type: "function", function: { name: item.name, arguments: args } }] });
    } else if (type === "function_call_output") {
      if (typeof item.call_id !== "string") throw bad(`${at} (function_call_output) needs a string \`call_id\``, `${at}.call_id`);
      out.push({ role: "tool", tool_call_id: item.call_id, content: responsesContent(item.output ?? "", `${at}.output`) });
    } else if (type === "reasoning") {
      // Reasoning is not sent back to the model (vLLM skips it too).
    } else throw bad(`${at}.type ${JSON.stringify(String(type).slice(0, 64))} is not a supported input item type (message, function_call, function_call_output, reasoning)`, `${at}.type`);
  });
  return out;
}

/** Responses function tools as chat tools; built-in tools have no schema to render. */
function responsesTools(tools: unknown): unknown[] | undefined {
  if (tools === undefined || tools === null) return undefined;
  if (!Array.isArray(tools)) throw bad("`tools` must be an array", "tools");
  const out: unknown[] = [];
  tools.forEach((t, i) => {
    if (!isObject(t) || typeof t.type !== "string") throw bad(`tools[${i}] must be an object with a string type`, `tools[${i}]`);
    if (t.type !== "function") return;
    if (typeof t.name !== "string") throw bad(`tools[${i}].name must be a string`, `tools[${i}].name`);
    out.push({ type: "function", function: { name: t.name, ...(typeof t.description === "string" ? { description: t.description } : {}), ...(t.parameters !== undefined ? { parameters: t.parameters } : {}) } });
  });
  return out.length > 0 ? out : undefined;
}

/** `instructions`: a string, or absent/null. */
export function responsesInstructions(body: Readonly<Record<string, unknown>>): string | undefined {
  const v = body.instructions;
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw bad("`instructions` must be a string", "instructions");
  return v;
}

/**
 * A Responses request as the engine renders it: instructions, then `history` (the previous
 * response's chain, already as messages), then this request's input.
 */
export function responsesToChat(body: Readonly<Record<string, unknown>>, history: readonly RenderedMessage[] = []): RenderedChat {
  if (body.input === undefined || body.input === null) throw bad("`input` is required", "input");
  const instructions = responsesInstructions(body);
  const messages: RenderedMessage[] = [...(instructions !== undefined ? [{ role: "system", content: instructions }] : []), ...history, ...responsesInputMessages(body.input)];
  const tools = responsesTools(body.tools);
  return { messages, ...(tools ? { tools } : {}) };
}

/** Anthropic `system`: a string or text blocks (concatenated), or absent. */
function anthropicSystem(system: unknown): string | undefined {
  if (system === undefined || system === null) return undefined;
  if (typeof system === "string") return system;
  if (!Array.isArray(system)) throw bad("`system` must be a string or an array of text blocks", "system");
  return system
    .map((b, i) => {
      if (!isObject(b) || b.type !== "text" || typeof b.text !== "string") throw bad(`system[${i}] must be a text block ({"type":"text","text":...})`, `system[${i}]`);
      return b.text;
    })
    .join("");
}

/** A tool_result's content: a string or text/image blocks. */
function toolResultContent(content: unknown, at: string): string | ContentPart[] {
  if (content === undefined || content === null) return "";
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw bad(`${at} must be a string or an array of blocks`, at);
  return content.map((b, j): ContentPart => {
    if (!isObject(b) || typeof b.type !== "string") throw bad(`${at}[${j}] must be a block with a string type`, `${at}[${j}]`);
    if (b.type === "text") return { type: "text", text: typeof b.text === "string" ? b.text : "" };
    return { type: b.type };
  });
}

const ANTHROPIC_ROLES = new Set(["user", "assistant"]);

/** One Anthropic message as chat messages (tool results become tool messages of their own). */
function anthropicMessage(m: unknown, i: number): RenderedMessage[] {
  const at = `messages[${i}]`;
  if (!isObject(m)) throw bad(`${at} must be an object`, at);
  if (typeof m.role !== "string" || !ANTHROPIC_ROLES.has(m.role)) throw bad(`${at}.role must be "user" or "assistant"`, `${at}.role`);
  const role = m.role;
  if (typeof m.content === "string") return [{ role, content: m.content }];
  if (!Array.isArray(m.content)) throw bad(`${at}.content must be a string or an array of content blocks`, `${at}.content`);
  const parts: ContentPart[] = [];
  const calls: NonNullable<RenderedMessage["tool_calls"]> = [];
  const results: RenderedMessage[] = [];
  m.content.forEach((b, j) => {
    const bat = `${at}.content[${j}]`;
    if (!isObject(b) || typeof b.type !== "string") throw bad(`${bat} must be a content block with a string type`, bat);
    switch (b.type) {
      case "text":
        if (typeof b.text !== "string") throw bad(`${bat}.text must be a string`, `${bat}.text`);
        parts.push({ type: "text", text: b.text });
        return;
      case "image":
      case "document":
        parts.push({ type: b.type });
        return;
      case "tool_use":
        if (typeof b.id !== "string" || typeof b.name !== "string") throw bad(`${bat} (tool_use) needs string \`id\` and \`name\``, bat);
        calls.push({ id: b.id, type: "function", function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) } });
        return;
      case "tool_result":
        if (typeof b.tool_use_id !== "string") throw bad(`${bat}.tool_use_id must be a string`, `${bat}.tool_use_id`);
        results.push({ role: "tool", tool_call_id: b.tool_use_id, content: toolResultContent(b.content, `${bat}.content`) });
        return;
      case "thinking":
      case "redacted_thinking":
        return;
      default:
        throw bad(`${bat}.type ${JSON.stringify(b.type.slice(0, 64))} is not a known content block type`, `${bat}.type`);
    }
  });
  const out: RenderedMessage[] = [...results];
  if (parts.length > 0 || calls.length > 0) out.push({ role, content: parts.length > 0 ? parts : null, ...(calls.length > 0 ? { tool_calls: calls } : {}) });
  return out;
}

function anthropicTools(tools: unknown): unknown[] | undefined {
  if (tools === undefined || tools === null) return undefined;
  if (!Array.isArray(tools)) throw bad("`tools` must be an array", "tools");
  const out = tools.map((t, i) => {
    if (!isObject(t) || typeof t.name !== "string") throw bad(`tools[${i}] must be an object with a string name`, `tools[${i}]`);
    return { type: "function", function: { name: t.name, ...(typeof t.description === "string" ? { description: t.description } : {}), ...(t.input_schema !== undefined ? { parameters: t.input_schema } : {}) } };
  });
  return out.length > 0 ? out : undefined;
}

/** An Anthropic Messages request as the engine renders it: the system prompt, then the messages. */
export function messagesToChat(body: Readonly<Record<string, unknown>>): RenderedChat {
  const system = anthropicSystem(body.system);
  if (body.messages === undefined) throw bad("`messages` is required", "messages");
  if (!Array.isArray(body.messages) || body.messages.length === 0) throw bad("`messages` must be a non-empty array of messages", "messages");
  const messages: RenderedMessage[] = [...(system !== undefined ? [{ role: "system", content: system }] : []), ...body.messages.flatMap(anthropicMessage)];
  const tools = anthropicTools(body.tools);
  return { messages, ...(tools ? { tools } : {}) };
}

/** Characters of text in rendered messages (the parse's prompt-size estimate before tokenizing). */
export function renderedChars(chat: RenderedChat): number {
  let n = 0;
  for (const m of chat.messages) {
    const c = m.content;
    if (typeof c === "string") n += c.length;
    else if (Array.isArray(c)) for (const p of c) n += p.text?.length ?? 0;
    for (const t of m.tool_calls ?? []) n += t.function.arguments.length + t.function.name.length;
  }
  return n;
}
