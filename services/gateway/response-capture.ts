/**
 * Captures a Responses API reply's id and output items as they stream past the gateway, for the
 * response store (docs/stateful-apis.md). Bounded: a JSON body is kept up to `maxBytes`; of an
 * SSE stream only the line being read (up to `maxBytes`), the id of the first event
 * (`response.created`) and the terminal event's response (`response.completed`, `.incomplete`,
 * `.failed`). A reply larger than the bound yields its id alone (its output is not stored: the
 * location is recorded, the chain cannot be expanded through it).
 *
 * The engine is not trusted: an id outside `RESPONSE_ID` is ignored, and output that is not a list
 * of objects is dropped.
 */
import { isResponseId, type ResponseItem } from "../../schemas/responses.js";

export interface CapturedResponse {
  id: string;
  /** The response's status as the engine reported it (`completed`, `incomplete`, `failed`, `in_progress`...). */
  status?: string;
  /** Undefined when the reply was too large to keep, or the engine sent none. */
  output?: ResponseItem[];
}

const TERMINAL = new Set(["response.completed", "response.incomplete", "response.failed"]);
const TYPE_FIELD = /"type"\s*:\s*"([^"]{1,64})"/;

export class ResponseCapture {
  private firstId: string | undefined;
  private final: CapturedResponse | undefined;
  private json: Buffer[] | undefined;
  private jsonBytes = 0;
  private partial = "";
  /** The current SSE line outgrew the bound: the rest of it is skipped. */
  private skipping = false;
  /** The event named by the last `event:` line (vLLM puts `type` last in the data). */
  private event: string | undefined;

  constructor(
    contentType: string | undefined,
    private readonly maxBytes = 1 << 20,
  ) {
    if (contentType?.includes("application/json")) this.json = [];
  }

  push(chunk: Uint8Array): void {
    if (this.json) {
      if (this.jsonBytes + chunk.length <= this.maxBytes) this.json.push(Buffer.from(chunk));
      this.jsonBytes += chunk.length;
      return;
    }
    const text = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).toString("utf8");
    let start = 0;
    for (let nl = text.indexOf("\n"); nl >= 0; nl = text.indexOf("\n", start)) {
      this.append(text.slice(start, nl));
      if (!this.skipping) this.line(this.partial);
      this.partial = "";
      this.skipping = false;
      start = nl + 1;
    }
    this.append(text.slice(start));
  }

  private append(s: string): void {
    if (this.skipping) return;
    if (this.partial.length + s.length > this.maxBytes) {
      // Too long to keep whole: its type and id may still be read from its head.
      this.line(this.partial + s.slice(0, 512), true);
      this.partial = "";
      this.skipping = true;
      return;
    }
    this.partial += s;
  }

  /** The response's id as soon as a first event (or the head of a body) named it. */
  get id(): string | undefined {
    return this.firstId;
  }

  /** What was captured once the body ended; undefined without a valid id. */
  end(): CapturedResponse | undefined {
    if (this.json) {
      if (this.jsonBytes <= this.maxBytes) this.take(Buffer.concat(this.json).toString("utf8"), true);
      else this.idFromHead(Buffer.concat(this.json).subarray(0, 1024).toString("utf8"));
      this.json = undefined;
    } else if (this.partial && !this.skipping) this.line(this.partial);
    this.partial = "";
    if (this.final) return this.final;
    return this.firstId !== undefined ? { id: this.firstId } : undefined;
  }

  private line(line: string, truncated = false): void {
    if (line.startsWith("event:")) {
      this.event = line.slice(6).trim().slice(0, 64);
      return;
    }
    if (!line.startsWith("data:")) return;
    const data = line.slice(5).trim();
    const type = this.event ?? TYPE_FIELD.exec(data.slice(0, 256))?.[1];
    this.event = undefined;
    if (truncated || (type !== undefined && !TERMINAL.has(type) && this.firstId === undefined)) {
      this.idFromHead(data.slice(0, 1024));
      return;
    }
    if (type !== undefined && TERMINAL.has(type)) this.take(data, false);
  }

  /** `"id":"resp_…"` near the start of an event or body (the response object's first fields). */
  private idFromHead(head: string): void {
    if (this.firstId !== undefined) return;
    const m = /"id"\s*:\s*"(resp[A-Za-z0-9_-]{0,124})"/.exec(head);
    if (m && isResponseId(m[1])) this.firstId = m[1];
  }

  private take(text: string, body: boolean): void {
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch {
      this.idFromHead(text.slice(0, 1024));
      return;
    }
    const r = (body ? v : (v as { response?: unknown } | null)?.response) as { id?: unknown; status?: unknown; output?: unknown } | null | undefined;
    if (!r || typeof r !== "object" || !isResponseId(r.id)) return;
    const output = Array.isArray(r.output) && r.output.every((x) => x !== null && typeof x === "object" && !Array.isArray(x)) ? (r.output as ResponseItem[]) : undefined;
    this.firstId ??= r.id;
    this.final = { id: r.id, ...(typeof r.status === "string" ? { status: r.status.slice(0, 32) } : {}), ...(output ? { output } : {}) };
  }
}
