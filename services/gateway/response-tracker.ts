/**
 * Watches a streamed response body for the engine's usage report: SSE `data:` lines (the last
 * chunk carries `usage` when `stream_options.include_usage` is set) or a plain JSON body.
 * Holds at most one partial line (SSE) or a bounded body (JSON), never the whole stream.
 *
 * The engine's numbers are not trusted: a count that is not a whole number in the events' range
 * (`completion_tokens: 1e12`, `1.5`, `-3`) is clamped into it and flagged, so one bad response can
 * neither make peers dead-letter a release batch nor lock its user out of a token limit.
 */
import { MAX_COUNT } from "../../schemas/events.js";

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

export class ResponseTracker {
  usage: Usage = {};
  private partial = "";
  private json: Buffer[] | undefined;
  private jsonBytes = 0;

  constructor(contentType: string | undefined) {
    if (contentType?.includes("application/json")) this.json = [];
  }

  push(chunk: Uint8Array): void {
    if (this.json) {
      if (this.jsonBytes + chunk.length <= MAX_JSON_BODY) this.json.push(Buffer.from(chunk));
      this.jsonBytes += chunk.length;
      return;
    }
    const text = this.partial + Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).toString("utf8");
    const lines = text.split("\n");
    this.partial = (lines.pop() ?? "").slice(-65536);
    for (const line of lines) this.line(line);
  }

  end(): Usage {
    if (this.partial) this.line(this.partial);
    this.partial = "";
    if (this.json && this.jsonBytes <= MAX_JSON_BODY) this.take(Buffer.concat(this.json).toString("utf8"));
    return this.usage;
  }

  private line(line: string): void {
    if (!line.startsWith("data:") || !line.includes('"usage"')) return;
    this.take(line.slice(5).trim());
  }

  private take(text: string): void {
    try {
      const u = (JSON.parse(text) as { usage?: { prompt_tokens?: unknown; completion_tokens?: unknown } | null }).usage;
      if (!u) return;
      const prompt = engineCount(u.prompt_tokens);
      const completion = engineCount(u.completion_tokens);
      if (prompt) this.usage.promptTokens = prompt.value;
      if (completion) this.usage.completionTokens = completion.value;
      if (prompt?.clamped || completion?.clamped) this.usage.clamped = true;
    } catch {
      /* not JSON: not a usage chunk */
    }
  }
}
