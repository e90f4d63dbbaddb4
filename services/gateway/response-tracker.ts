/**
 * Watches a streamed response body for the engine's usage report: SSE `data:` lines (the last
 * chunk carries `usage` when `stream_options.include_usage` is set) or a plain JSON body.
 * Holds at most one partial line (SSE) or a bounded body (JSON), never the whole stream.
 *
 * Each API reports in its own shape, all read here: chat and completions `usage.prompt_tokens` /
 * `completion_tokens`; the Responses API `usage.input_tokens` / `output_tokens`, at the top of a
 * JSON body or in `response.usage` of the terminal event (`response.completed`, `.incomplete`,
 * `.failed`; no `[DONE]` follows); the Messages API `usage.input_tokens` / `output_tokens` at the
 * top of a JSON body, or `message.usage` in `message_start` and the running `usage.output_tokens`
 * of `message_delta`. The first token is the first body bytes for chat and completions; for the two
 * others it is the first event past the stream's preamble (`response.created`/`in_progress`/
 * `queued`, sent before any token; `message_start`, `content_block_start`, `ping`).
 *
 * The engine's numbers are not trusted: a count that is not a whole number in the events' range
 * (`completion_tokens: 1e12`, `1.5`, `-3`) is clamped into it and flagged, so one bad response can
 * neither make peers dead-letter a release batch nor lock its user out of a token limit.
 */
import { MAX_COUNT } from "../../schemas/events.js";
import { isModelName, MAX_RESPONSE_ID_LENGTH, type RequestApi } from "../routing/mod.js";

export interface Usage {
  promptTokens?: number;
  completionTokens?: number;
  /** Set when an engine count was out of range or fractional and was clamped. */
  clamped?: true;
}

/**
 * An engine-reported token count as the events carry it: an integer in [0, MAX_COUNT] (fractions
 * rounded down, beyond the range clamped to its end); `undefined` for a value that is not a number.
 */
export function engineCount(v: unknown): { value: number; clamped: boolean } | undefined {
  if (typeof v !== "number" || Number.isNaN(v)) return undefined;
  const value = Math.min(MAX_COUNT, Math.max(0, Math.floor(v)));
  return { value, clamped: value !== v };
}

const MAX_JSON_BODY = 1 << 20;
/** The longest SSE line kept whole; a longer one keeps its tail (where a Responses event's `usage` sits). */
const MAX_LINE = 65_536;

/** Stream events sent before any token is generated. */
const PREAMBLE: Partial<Record<RequestApi, ReadonlySet<string>>> = {
  responses: new Set(["response.created", "response.in_progress", "response.queued"]),
  messages: new Set(["message_start", "content_block_start", "ping"]),
};

const TYPE_FIELD = /"type"\s*:\s*"([^"]{1,64})"/;

export class ResponseTracker {
  usage: Usage = {};
  /** A generated token has been seen in the body (see the module comment). */
  tokenSeen = false;
  /**
   * Responses API: the response's id, from the first event (`response.created`) or the JSON body;
   * only a printable string of at most MAX_RESPONSE_ID_LENGTH characters is taken.
   */
  responseId: string | undefined;
  private partial = "";
  /** `partial` is the tail of a longer line. */
  private cut = false;
  private json: Buffer[] | undefined;
  private jsonBytes = 0;
  private readonly preamble: ReadonlySet<string> | undefined;

  constructor(
    contentType: string | undefined,
    private readonly api: RequestApi = "chat",
  ) {
    if (contentType?.includes("application/json")) this.json = [];
    else this.preamble = PREAMBLE[api];
  }

  /** Takes one body chunk; returns whether a generated token has been seen so far. */
  push(chunk: Uint8Array): boolean {
    if (chunk.length > 0 && !this.preamble) this.tokenSeen = true;
    if (this.json) {
      if (this.jsonBytes + chunk.length <= MAX_JSON_BODY) this.json.push(Buffer.from(chunk));
      this.jsonBytes += chunk.length;
      return this.tokenSeen;
    }
    const text = this.partial + Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).toString("utf8");
    const lines = text.split("\n");
    const rest = lines.pop() ?? "";
    const wasCut = this.cut;
    for (const [i, l] of lines.entries()) {
      if (i === 0 && wasCut) this.cutLine(l);
      else this.line(l);
    }
    this.cut = (wasCut && lines.length === 0) || rest.length > MAX_LINE;
    this.partial = rest.length > MAX_LINE ? rest.slice(-MAX_LINE) : rest;
    return this.tokenSeen;
  }

  /** A line whose start was dropped (longer than MAX_LINE): only its tail's usage can be read. */
  private cutLine(line: string): void {
    if (line.includes('"usage"')) this.take(line);
  }

  end(): Usage {
    if (this.partial && this.cut) this.cutLine(this.partial);
    else if (this.partial) this.line(this.partial);
    this.partial = "";
    this.cut = false;
    if (this.json && this.jsonBytes <= MAX_JSON_BODY) this.take(Buffer.concat(this.json).toString("utf8"));
    return this.usage;
  }

  private noteResponseId(v: unknown): void {
    if (this.responseId !== undefined || this.api !== "responses" || !v || typeof v !== "object") return;
    const o = v as { id?: unknown; object?: unknown; type?: unknown; response?: { id?: unknown } | null };
    const id = o.type === "response.created" ? o.response?.id : o.object === "response" ? o.id : undefined;
    if (typeof id === "string" && id.length <= MAX_RESPONSE_ID_LENGTH && isModelName(id)) this.responseId = id;
  }

  /** The last `event:` line named the event whose `data:` line comes next. */
  private named = false;

  private line(line: string): void {
    if (!this.tokenSeen && this.preamble) this.event(line);
    if (this.responseId === undefined && this.api === "responses" && line.startsWith("data:") && line.includes('"response.created"') && !line.includes('"usage"')) {
      try {
        this.noteResponseId(JSON.parse(line.slice(5).trim()));
      } catch {
        /* not JSON */
      }
    }
    if (!line.startsWith("data:") || !line.includes('"usage"')) return;
    this.take(line.slice(5).trim());
  }

  /**
   * An `event:` line's name, or a `data:` line's `type`: past the preamble, a token was generated.
   * The data line of an event already named by its `event:` line is not read again: its first
   * `"type"` may be a nested one (a `response.created` lists the request's tools first).
   */
  private event(line: string): void {
    let name: string | undefined;
    if (line.startsWith("event:")) {
      name = line.slice(6).trim();
      this.named = true;
    } else if (line.startsWith("data:")) {
      if (this.named) {
        this.named = false;
        return;
      }
      name = TYPE_FIELD.exec(line.slice(0, 256))?.[1];
    }
    if (name && !this.preamble?.has(name)) this.tokenSeen = true;
  }

  private take(text: string): void {
    let u: UsageFields | null | undefined;
    try {
      const v: unknown = JSON.parse(text);
      this.noteResponseId(v);
      u = usageIn(v);
    } catch {
      // Not JSON: a line cut to its tail (a long Responses output) may still end with its usage.
      u = trailingUsage(text);
    }
    if (!u) return;
    const prompt = engineCount(u.prompt_tokens ?? u.input_tokens);
    const completion = engineCount(u.completion_tokens ?? u.output_tokens);
    if (prompt) this.usage.promptTokens = prompt.value;
    if (completion) this.usage.completionTokens = completion.value;
    if (prompt?.clamped || completion?.clamped) this.usage.clamped = true;
  }
}

interface UsageFields {
  prompt_tokens?: unknown;
  completion_tokens?: unknown;
  input_tokens?: unknown;
  output_tokens?: unknown;
}

/** `usage` at the top (chat, completions, JSON bodies, message_delta) or in a Responses event's `response` / message_start's `message`. */
export function usageIn(v: unknown): UsageFields | undefined {
  if (!v || typeof v !== "object") return undefined;
  const o = v as { usage?: unknown; response?: { usage?: unknown } | null; message?: { usage?: unknown } | null };
  const u = o.usage ?? o.response?.usage ?? o.message?.usage;
  return u && typeof u === "object" ? (u as UsageFields) : undefined;
}

/** The last `"usage":{...}` object of a JSON text that does not parse whole (its start cut off). */
export function trailingUsage(text: string): UsageFields | undefined {
  const at = text.lastIndexOf('"usage"');
  if (at < 0) return undefined;
  const open = text.indexOf("{", at);
  if (open < 0) return undefined;
  let depth = 0;
  for (let i = open; i < text.length && i < open + 4096; i++) {
    const c = text[i];
    if (c === "{") depth++;
    else if (c === "}" && --depth === 0) {
      try {
        return JSON.parse(text.slice(open, i + 1)) as UsageFields;
      } catch {
        return undefined;
      }
    }
  }
  return undefined;
}
