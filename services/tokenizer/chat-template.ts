/**
 * A Hugging Face model's chat template rendered the way vLLM's `/v1/chat/completions` and chat
 * `/tokenize` do: messages normalised as vLLM normalises them for a "string content" template
 * (text parts joined by newlines, missing content as "", tool-call arguments parsed from JSON),
 * the tokenizer's special tokens passed as template variables (as transformers'
 * `apply_chat_template` does), `add_generation_prompt` defaulting to true, and `trim_blocks` /
 * `lstrip_blocks` on. Pure: the template text comes from the caller.
 */
import { Template } from "@huggingface/jinja";
import { InexactToolJsonError, normaliseTool, normaliseToolCalls, parsedJsonProblem } from "./tool-json.js";

export interface HfChatMessage {
  role: string;
  content?: unknown;
  name?: unknown;
  tool_calls?: unknown;
  tool_call_id?: unknown;
}

export interface RenderChatOptions {
  /** Open the assistant's turn (vLLM's default: true). */
  addGenerationPrompt?: boolean;
  /** OpenAI `tools`, passed to the template as `tools` (and selecting a `tool_use` template if the model has one). */
  tools?: readonly unknown[];
  /** vLLM's `chat_template_kwargs` (e.g. `enable_thinking`): extra template variables; only scalars are taken. */
  templateKwargs?: Readonly<Record<string, unknown>>;
  /**
   * Refuse (ChatTemplateError) tools and tool calls whose JSON a JavaScript parse prints
   * differently from Python (tool-json.ts); default true. `rawToolJsonProblem`: what the caller
   * found in the raw request text (integer-valued floats such as `20.0` are invisible once parsed).
   */
  exactJson?: boolean;
  rawToolJsonProblem?: string;
  /**
   * vLLM's `continue_final_message`: the prompt ends inside the last message (transformers renders,
   * then cuts right after the last occurrence of that message's stripped content). Refused with
   * `addGenerationPrompt` true, as vLLM refuses it.
   */
  continueFinalMessage?: boolean;
}

/** The error a template raised (or a message it could not render): the caller falls back, it never crashes. */
export class ChatTemplateError extends Error {
  override name = "ChatTemplateError";
}

/** A token in tokenizer_config.json is a string or a serialised AddedToken `{content, ...}`. */
export function tokenContent(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string") return (v as { content: string }).content;
  return undefined;
}

const SPECIAL_TOKEN_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"] as const;

/** Template variables transformers adds from the tokenizer: its special tokens, as strings. */
export function specialTokenVariables(config: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of SPECIAL_TOKEN_KEYS) {
    const v = tokenContent(config[k]);
    if (v !== undefined) out[k] = v;
  }
  const extra = config.additional_special_tokens;
  if (Array.isArray(extra)) out.additional_special_tokens = extra.map(tokenContent).filter((t) => t !== undefined);
  return out;
}

function contentText(content: unknown): string {
  if (content === undefined || content === null) return "";
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw new ChatTemplateError("message content must be a string or a list of parts");
  const texts: string[] = [];
  for (const part of content) {
    if (part && typeof part === "object" && (part as { type?: unknown }).type === "text" && typeof (part as { text?: unknown }).text === "string") {
      texts.push((part as { text: string }).text);
    } else {
      // Images, audio and other parts change the engine's prompt (placeholders, multimodal ids):
      // the gateway cannot compute those ids, so it must not pretend to.
      throw new ChatTemplateError("only text content parts can be tokenized locally");
    }
  }
  return texts.join("\n");
}

/**
 * vLLM's conversation as the template sees it. `exact` (default): refuse tool-call JSON a
 * JavaScript parse would print differently from Python's (tool-json.ts).
 */
export function normaliseMessages(messages: readonly HfChatMessage[], exact = true): Record<string, unknown>[] {
  return messages.map((m) => {
    if (!m || typeof m !== "object" || typeof m.role !== "string") throw new ChatTemplateError("every message needs a string role");
    const out: Record<string, unknown> = { role: m.role, content: contentText(m.content) };
    if (typeof m.name === "string") out.name = m.name;
    if (typeof m.tool_call_id === "string") out.tool_call_id = m.tool_call_id;
    if (m.tool_calls !== undefined && m.tool_calls !== null) out.tool_calls = m.role === "assistant" ? normaliseToolCalls(m.tool_calls, exact) : m.tool_calls;
    return out;
  });
}

/** Which template to render and with what: all a renderer (this thread or a worker) needs. */
export interface RenderJob {
  name: string;
  context: Record<string, unknown>;
  /** continue_final_message: the text the render is cut after (finishRender). */
  cutAfter?: string;
}

// CPython's str.strip() whitespace (JavaScript's trim() differs: it strips U+FEFF, keeps U+001C-U+001F).
const PY_SPACE = "[\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const PY_STRIP = new RegExp(`^${PY_SPACE}+|${PY_SPACE}+$`, "g");

/** Python's `s.strip()`. */
export function pythonStrip(s: string): string {
  return s.replace(PY_STRIP, "");
}

/** A rendered prompt as the job wants it: cut after the final message for continue_final_message. Throws ChatTemplateError. */
export function finishRender(job: RenderJob, text: string): string {
  if (job.cutAfter === undefined) return text;
  const at = text.lastIndexOf(job.cutAfter);
  // transformers raises: the final message does not appear in the rendered chat.
  if (at < 0) throw new ChatTemplateError("continue_final_message: the final message's content does not appear in the rendered prompt");
  return text.slice(0, at + job.cutAfter.length);
}

/**
 * Whether a template iterates over a message's content as a list of parts (`{% for part in
 * message['content'] %}`, `message.content`, optionally through a filter): vLLM's
 * `_detect_content_format` then passes OpenAI-style part lists, even for string content, which
 * this renderer does not reproduce. A textual check over the template source.
 */
const CONTENT_LOOP = /\{%-?\s*for\s+[\w\s,()]+\s+in\s+\(?\s*\w+\s*(?:\[\s*['"]content['"]\s*\]|\.content\b)/;
export function iteratesContentParts(source: string): boolean {
  return CONTENT_LOOP.test(source);
}

/** The template(s) of a model: `chat_template` is a string or a list of `{name, template}`. */
export class ChatTemplates {
  private readonly byName = new Map<string, Template>();
  /** Template sources by name (what a render worker compiles). */
  readonly sources = new Map<string, string>();
  private readonly variables: Record<string, unknown>;

  constructor(chatTemplate: unknown, config: Readonly<Record<string, unknown>>) {
    const sources = this.sources;
    if (typeof chatTemplate === "string") sources.set("default", chatTemplate);
    else if (Array.isArray(chatTemplate)) {
      for (const t of chatTemplate) {
        const name = (t as { name?: unknown })?.name;
        const template = (t as { template?: unknown })?.template;
        if (typeof name === "string" && typeof template === "string") sources.set(name, template);
      }
    }
    if (!sources.has("default")) throw new ChatTemplateError("no chat_template (a string, or a list with a \"default\" entry)");
    for (const [name, src] of sources) {
      try {
        this.byName.set(name, new Template(src));
      } catch (err) {
        throw new ChatTemplateError(`chat_template ${JSON.stringify(name)} does not parse: ${(err as Error).message}`);
      }
    }
    this.variables = specialTokenVariables(config);
    for (const [name, src] of sources) if (iteratesContentParts(src)) this.contentParts.add(name);
  }

  /** A template's syntax tree (@huggingface/jinja's), for analyses such as message-local.ts. */
  parsed(name: string): unknown {
    return this.byName.get(name)?.parsed;
  }

  /** Templates (by name) that want content as a list of parts (iteratesContentParts): requests on them are refused. */
  readonly contentParts = new Set<string>();

  /** The template and variables for a conversation (cheap; throws ChatTemplateError on messages it cannot take). */
  job(messages: readonly HfChatMessage[], o: RenderChatOptions = {}): RenderJob {
    const exact = o.exactJson ?? true;
    let tools: Record<string, unknown>[] | undefined;
    let normalised: Record<string, unknown>[];
    try {
      if (exact && o.rawToolJsonProblem) throw new InexactToolJsonError(o.rawToolJsonProblem);
      if (o.tools && o.tools.length > 0) {
        const problem = exact ? parsedJsonProblem(o.tools) : undefined;
        if (problem) throw new InexactToolJsonError(`tools: ${problem}`);
        tools = o.tools.map(normaliseTool);
      }
      normalised = normaliseMessages(messages, exact);
      if (exact) {
        for (const m of normalised) {
          const problem = m.tool_calls === undefined ? undefined : parsedJsonProblem(m.tool_calls);
          if (problem) throw new InexactToolJsonError(`tool_calls: ${problem}`);
        }
      }
    } catch (err) {
      if (err instanceof InexactToolJsonError) throw new ChatTemplateError(err.message);
      throw err;
    }
    const name = tools && this.byName.has("tool_use") ? "tool_use" : "default";
    if (this.contentParts.has(name)) throw new ChatTemplateError(`chat_template ${JSON.stringify(name)} iterates over message content parts (vLLM's "openai" content format), not rendered here`);
    const extra: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(o.templateKwargs ?? {})) {
      if (k !== "messages" && (typeof v === "boolean" || typeof v === "number" || typeof v === "string" || v === null)) extra[k] = v;
    }
    let cutAfter: string | undefined;
    if (o.continueFinalMessage) {
      if (o.addGenerationPrompt ?? true) throw new ChatTemplateError("continue_final_message and add_generation_prompt cannot both be true");
      const last = normalised[normalised.length - 1];
      if (!last) throw new ChatTemplateError("continue_final_message needs a final message");
      cutAfter = pythonStrip(last.content as string);
    }
    return {
      name,
      ...(cutAfter !== undefined ? { cutAfter } : {}),
      context: { ...this.variables, ...extra, messages: normalised, tools: tools ?? null, add_generation_prompt: o.addGenerationPrompt ?? true },
    };
  }

  /** Renders a job on this thread. */
  renderJob(job: RenderJob): string {
    let text: string;
    try {
      text = (this.byName.get(job.name) as Template).render(job.context);
    } catch (err) {
      throw new ChatTemplateError(`chat template failed: ${(err as Error).message}`);
    }
    return finishRender(job, text);
  }

  render(messages: readonly HfChatMessage[], o: RenderChatOptions = {}): string {
    return this.renderJob(this.job(messages, o));
  }
}
