/**
 * Watches a streamed response body for the engine's usage report: SSE `data:` lines (the last
 * chunk carries `usage` when `stream_options.include_usage` is set) or a plain JSON body.
 * Holds at most one partial line (SSE) or a bounded body (JSON), never the whole stream.
 */

export interface Usage {
  promptTokens?: number;
  completionTokens?: number;
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
      if (typeof u.prompt_tokens === "number") this.usage.promptTokens = u.prompt_tokens;
      if (typeof u.completion_tokens === "number") this.usage.completionTokens = u.completion_tokens;
    } catch {
      /* not JSON: not a usage chunk */
    }
  }
}
