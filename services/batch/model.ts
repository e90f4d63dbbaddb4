/**
 * The OpenAI Batch API's pure parts: input-file validation, the batch lifecycle folded from job
 * events, output assembly with de-duplication, and the OpenAI object and error shapes. No I/O:
 * services/batch/store.ts, api.ts and worker.ts are the shells.
 *
 * Bounds (OpenAI's): an input file holds at most MAX_LINES requests and MAX_FILE_BYTES bytes. One
 * line travels as one work-queue message, so a line is also bounded (MAX_LINE_BYTES, under the
 * NATS server's default 1 MiB max_payload).
 */

export const MAX_FILE_BYTES = 200 * 1024 * 1024;
export const MAX_LINES = 50_000;
export const MAX_LINE_BYTES = 900 * 1024;
export const MAX_CUSTOM_ID = 512;
export const MAX_FILENAME = 255;
export const COMPLETION_WINDOW_MS = 24 * 3600 * 1000;
export const ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"] as const;
export type Endpoint = (typeof ENDPOINTS)[number];

const FILE_ID = /^file-[0-9a-f]{24}(-output|-errors)?$/;
const BATCH_ID = /^batch_[0-9a-f]{24}$/;
export const isFileId = (s: string): boolean => FILE_ID.test(s);
export const isBatchId = (s: string): boolean => BATCH_ID.test(s);
/** The hex part of a batch id (also the token of its subjects). */
export const batchHex = (id: string): string => id.slice("batch_".length);
export const outputFileId = (batchId: string): string => `file-${batchHex(batchId)}-output`;
export const errorFileId = (batchId: string): string => `file-${batchHex(batchId)}-errors`;

// ---------------------------------------------------------------------------------------------
// Errors, as OpenAI answers them.

export interface ApiError {
  status: number;
  error: { message: string; type: string; param: string | null; code: string | null };
}

export function apiError(status: number, message: string, code: string | null = null, param: string | null = null): ApiError {
  const type = status === 401 ? "authentication_error" : status === 404 ? "invalid_request_error" : status >= 500 ? "server_error" : "invalid_request_error";
  return { status, error: { message, type, param, code } };
}

// ---------------------------------------------------------------------------------------------
// Input validation, line by line.

export interface InputLine {
  /** 0-based line index among the non-empty lines. */
  line: number;
  custom_id: string;
  url: Endpoint;
  /** The line's text, as uploaded (what a worker sends the body of). */
  raw: string;
}

export interface LineError {
  code: string;
  message: string;
  param: string | null;
  /** 1-based, as OpenAI reports it. */
  line: number | null;
}

export type Validation = { ok: true; lines: InputLine[] } | { ok: false; errors: LineError[] };

/** At most this many errors are reported per file (the first ones). */
export const MAX_REPORTED_ERRORS = 100;

/**
 * Validates a batch input file: JSONL, each line `{custom_id, method: "POST", url, body}` with a
 * unique custom_id, a routed url, a body with a model and no streaming; every url equal to
 * `endpoint` when one is given (batch creation); every `body.model` in `models` when given (the
 * caller's API key's allow-list: the worker runs items under its own key, so the owner's list is
 * checked here). Empty lines are skipped.
 */
export function validateInput(text: string, endpoint?: string, models?: readonly string[]): Validation {
  const errors: LineError[] = [];
  const lines: InputLine[] = [];
  const seen = new Set<string>();
  const err = (code: string, message: string, line: number | null, param: string | null = null) => {
    if (errors.length < MAX_REPORTED_ERRORS) errors.push({ code, message, param, line });
  };
  let n = 0;
  let start = 0;
  for (let lineNo = 1; start <= text.length; lineNo++) {
    let end = text.indexOf("\n", start);
    if (end < 0) end = text.length;
    const raw = text.slice(start, end).replace(/\r$/, "");
    start = end + 1;
    if (raw.trim() === "") {
      if (end === text.length) break;
      continue;
    }
    if (++n > MAX_LINES) {
      err("too_many_requests", `The input file has more than ${MAX_LINES} requests.`, lineNo);
      break;
    }
    if (Buffer.byteLength(raw) > MAX_LINE_BYTES) {
      err("line_too_large", `A request line may be at most ${MAX_LINE_BYTES} bytes.`, lineNo);
      continue;
    }
    let v: unknown;
    try {
      v = JSON.parse(raw);
    } catch {
      err("invalid_json_line", "This line is not parseable as valid JSON.", lineNo);
      continue;
    }
    if (!v || typeof v !== "object" || Array.isArray(v)) {
      err("invalid_request", "Each line must be a JSON object.", lineNo);
      continue;
    }
    const o = v as Record<string, unknown>;
    if (typeof o.custom_id !== "string" || o.custom_id.length === 0) {
      err("missing_required_parameter", "Missing required parameter: 'custom_id'.", lineNo, "custom_id");
      continue;
    }
    if (o.custom_id.length > MAX_CUSTOM_ID) {
      err("invalid_value", `custom_id may be at most ${MAX_CUSTOM_ID} characters.`, lineNo, "custom_id");
      continue;
    }
    if (seen.has(o.custom_id)) {
      err("duplicate_custom_id", "The custom_id for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch.", lineNo, "custom_id");
      continue;
    }
    seen.add(o.custom_id);
    if (o.method !== "POST") {
      err("invalid_method", "The method for this request is not supported: only POST is.", lineNo, "method");
      continue;
    }
    if (typeof o.url !== "string" || !(ENDPOINTS as readonly string[]).includes(o.url)) {
      err("invalid_url", `The url for this request is not supported: one of ${ENDPOINTS.join(", ")}.`, lineNo, "url");
      continue;
    }
    if (endpoint !== undefined && o.url !== endpoint) {
      err("mismatched_url", "The url provided for this request does not match the batch endpoint.", lineNo, "url");
      continue;
    }
    const body = o.body;
    if (!body || typeof body !== "object" || Array.isArray(body)) {
      err("missing_required_parameter", "Missing required parameter: 'body'.", lineNo, "body");
      continue;
    }
    const b = body as Record<string, unknown>;
    if (typeof b.model !== "string" || b.model.length === 0) {
      err("missing_required_parameter", "Missing required parameter: 'body.model'.", lineNo, "body.model");
      continue;
    }
    if (models && !models.includes(b.model)) {
      err("model_not_allowed", `This API key may not use the model ${JSON.stringify(b.model.slice(0, 256))}.`, lineNo, "body.model");
      continue;
    }
    if (b.stream === true) {
      err("invalid_value", "Streaming is not supported in a batch: body.stream must not be true.", lineNo, "body.stream");
      continue;
    }
    lines.push({ line: lines.length, custom_id: o.custom_id, url: o.url as Endpoint, raw });
  }
  if (errors.length > 0) return { ok: false, errors };
  if (lines.length === 0) return { ok: false, errors: [{ code: "empty_file", message: "The input file contains no requests.", param: null, line: null }] };
  return { ok: true, lines };
}

// ---------------------------------------------------------------------------------------------
// Files.

export interface FileRecord {
  id: string;
  bytes: number;
  created_at: number;
  filename: string;
  purpose: "batch" | "batch_output";
  /** The tenant (API key user, or "anonymous" without auth). Never shown to clients. */
  owner: string;
  /** Requests in an input file. */
  lines?: number;
  /** Unix seconds after which the file answers 404 and the closer deletes it (absent: never, files stored before expiry existed). */
  expires_at?: number;
}

export function fileObject(f: FileRecord): Record<string, unknown> {
  return { id: f.id, object: "file", bytes: f.bytes, created_at: f.created_at, filename: f.filename, purpose: f.purpose, status: "processed", status_details: null, expires_at: f.expires_at ?? null };
}

/** OpenAI's bounds of `expires_after.seconds` (1 hour to 30 days), and the default of batch input and output files (30 days). */
export const FILE_EXPIRY_MIN_S = 3_600;
export const FILE_EXPIRY_MAX_S = 2_592_000;
export const DEFAULT_FILE_EXPIRY_S = 2_592_000;

/**
 * An upload's `expires_after` (multipart fields `expires_after[anchor]`, `expires_after[seconds]`,
 * as the openai SDK sends them): seconds after `created_at`, or the error to answer. Absent: the
 * 30-day default.
 */
export function parseExpiresAfter(anchor: string | undefined, seconds: string | undefined): { seconds: number } | { message: string; param: string } {
  if (anchor === undefined && seconds === undefined) return { seconds: DEFAULT_FILE_EXPIRY_S };
  if (anchor !== "created_at") return { message: `Invalid 'expires_after.anchor': ${JSON.stringify(String(anchor ?? "").slice(0, 32))}. Expected 'created_at'.`, param: "expires_after.anchor" };
  const n = seconds !== undefined && /^\d{1,10}$/.test(seconds.trim()) ? Number(seconds.trim()) : Number.NaN;
  if (!Number.isInteger(n) || n < FILE_EXPIRY_MIN_S || n > FILE_EXPIRY_MAX_S) {
    return { message: `Invalid 'expires_after.seconds': ${JSON.stringify(String(seconds ?? "").slice(0, 32))}. Expected an integer from ${FILE_EXPIRY_MIN_S} (1 hour) to ${FILE_EXPIRY_MAX_S} (30 days).`, param: "expires_after.seconds" };
  }
  return { seconds: n };
}

/** Whether the file has expired at `nowMs` (expired files answer 404 and are deleted by the closer). */
export function fileExpired(f: FileRecord, nowMs: number): boolean {
  return f.expires_at !== undefined && nowMs >= f.expires_at * 1000;
}

// ---------------------------------------------------------------------------------------------
// Batches: job events and the lifecycle they fold into.

export type BatchStatus = "validating" | "failed" | "in_progress" | "finalizing" | "completed" | "expired" | "cancelling" | "cancelled";

/**
 * Phases as events (one subject per batch, published with the previous sequence expected, so
 * exactly one replica wins each transition):
 * - created: validated and accepted; the items are being queued (status validating);
 * - queued: every item is on the work queue (in_progress);
 * - rejected: validation failed (failed);
 * - finalizing / expiring / cancelling: the output is being assembled (claimed by one replica;
 *   re-claimed by another if it stays too long);
 * - completed / expired / cancelled: final, with the output files.
 */
export type JobEvent =
  | { type: "batch"; event: "created"; batch: BatchCreate; at: number }
  | { type: "batch"; event: "queued"; at: number }
  | { type: "batch"; event: "rejected"; errors: LineError[]; at: number }
  | { type: "batch"; event: "finalizing" | "expiring" | "cancelling"; at: number; by: string }
  | { type: "batch"; event: "completed" | "expired" | "cancelled"; at: number; counts: RequestCounts; output_file_id: string | null; error_file_id: string | null };

export interface BatchCreate {
  id: string;
  owner: string;
  /**
   * SHA-256 of the API key that created the batch (batch-api --auth required): workers send it as
   * `x-jetroute-on-behalf-of`, so the items run under that key's settings. Never shown to clients.
   */
  owner_key?: string;
  endpoint: Endpoint;
  input_file_id: string;
  completion_window: string;
  metadata: Record<string, string> | null;
  total: number;
  created_at: number;
  expires_at: number;
}

export interface RequestCounts {
  total: number;
  completed: number;
  failed: number;
}

export interface BatchRecord extends BatchCreate {
  status: BatchStatus;
  /** Internal: which assembly is under way (finalizing/expiring/cancelling), and since when. */
  closing?: { kind: "finalizing" | "expiring" | "cancelling"; since: number; by: string };
  errors: LineError[] | null;
  in_progress_at: number | null;
  finalizing_at: number | null;
  completed_at: number | null;
  failed_at: number | null;
  expired_at: number | null;
  cancelling_at: number | null;
  cancelled_at: number | null;
  output_file_id: string | null;
  error_file_id: string | null;
  /** Final counts (set by the final event); live counts come from the results fold. */
  final_counts: RequestCounts | null;
  /** Stream sequence of the batch's last job event: what the next transition expects. */
  seq: number;
}

export const FINAL: ReadonlySet<BatchStatus> = new Set(["failed", "completed", "expired", "cancelled"]);
/** Statuses whose items workers still execute. */
export const RUNNING: ReadonlySet<BatchStatus> = new Set(["validating", "in_progress"]);

/** Seconds, as OpenAI's timestamps are. */
const sec = (ms: number) => Math.floor(ms / 1000);

/**
 * Applies one job event to a batch (undefined: not created yet). Returns the new record, or a
 * reason the event does not apply (out of order: it is ignored, the record unchanged).
 */
export function applyJobEvent(b: BatchRecord | undefined, ev: JobEvent, seq: number): BatchRecord | string {
  if (ev.event === "created") {
    if (b) return "created twice";
    return {
      ...ev.batch,
      status: "validating",
      errors: null,
      in_progress_at: null,
      finalizing_at: null,
      completed_at: null,
      failed_at: null,
      expired_at: null,
      cancelling_at: null,
      cancelled_at: null,
      output_file_id: null,
      error_file_id: null,
      final_counts: null,
      seq,
    };
  }
  if (!b) return `${ev.event} before created`;
  if (FINAL.has(b.status)) return `${ev.event} after ${b.status}`;
  switch (ev.event) {
    case "queued":
      if (b.status !== "validating") return `queued while ${b.status}`;
      return { ...b, status: "in_progress", in_progress_at: sec(ev.at), seq };
    case "rejected":
      if (b.status !== "validating") return `rejected while ${b.status}`;
      return { ...b, status: "failed", errors: ev.errors, failed_at: sec(ev.at), final_counts: { total: 0, completed: 0, failed: 0 }, seq };
    case "finalizing":
      if (b.status !== "in_progress" && b.closing?.kind !== "finalizing") return `finalizing while ${b.status}`;
      return { ...b, status: "finalizing", closing: { kind: "finalizing", since: ev.at, by: ev.by }, finalizing_at: b.finalizing_at ?? sec(ev.at), seq };
    case "expiring":
      if (!RUNNING.has(b.status) && b.closing?.kind !== "expiring") return `expiring while ${b.status}`;
      return { ...b, status: "finalizing", closing: { kind: "expiring", since: ev.at, by: ev.by }, finalizing_at: b.finalizing_at ?? sec(ev.at), seq };
    case "cancelling":
      if (!RUNNING.has(b.status) && b.closing?.kind !== "cancelling") return `cancelling while ${b.status}`;
      return { ...b, status: "cancelling", closing: { kind: "cancelling", since: ev.at, by: ev.by }, cancelling_at: b.cancelling_at ?? sec(ev.at), seq };
    case "completed":
    case "expired":
    case "cancelled": {
      const want = ev.event === "completed" ? "finalizing" : ev.event === "expired" ? "expiring" : "cancelling";
      if (b.closing?.kind !== want) return `${ev.event} without ${want}`;
      const { closing: _closing, ...rest } = b;
      const at = sec(ev.at);
      return {
        ...rest,
        status: ev.event,
        ...(ev.event === "completed" ? { completed_at: at } : ev.event === "expired" ? { expired_at: at } : { cancelled_at: at }),
        output_file_id: ev.output_file_id,
        error_file_id: ev.error_file_id,
        final_counts: ev.counts,
        seq,
      };
    }
  }
}

/** The OpenAI batch object. `live`: the results fold's counts while the batch runs. */
export function batchObject(b: BatchRecord, live: { completed: number; failed: number } | undefined): Record<string, unknown> {
  const counts = b.final_counts ?? { total: b.total, completed: live?.completed ?? 0, failed: live?.failed ?? 0 };
  return {
    id: b.id,
    object: "batch",
    endpoint: b.endpoint,
    errors: b.errors ? { object: "list", data: b.errors } : null,
    input_file_id: b.input_file_id,
    completion_window: b.completion_window,
    status: b.status,
    output_file_id: b.output_file_id,
    error_file_id: b.error_file_id,
    created_at: sec(b.created_at),
    in_progress_at: b.in_progress_at,
    expires_at: sec(b.expires_at),
    finalizing_at: b.finalizing_at,
    completed_at: b.completed_at,
    failed_at: b.failed_at,
    expired_at: b.expired_at,
    cancelling_at: b.cancelling_at,
    cancelled_at: b.cancelled_at,
    request_counts: counts,
    metadata: b.metadata,
  };
}

/** Validates a create-batch body; returns the fields or an OpenAI error. */
export function parseCreateBatch(v: unknown): { input_file_id: string; endpoint: Endpoint; completion_window: string; metadata: Record<string, string> | null } | ApiError {
  if (!v || typeof v !== "object" || Array.isArray(v)) return apiError(400, "The request body must be a JSON object.", "invalid_request");
  const o = v as Record<string, unknown>;
  if (typeof o.input_file_id !== "string") return apiError(400, "Missing required parameter: 'input_file_id'.", "missing_required_parameter", "input_file_id");
  if (typeof o.endpoint !== "string") return apiError(400, "Missing required parameter: 'endpoint'.", "missing_required_parameter", "endpoint");
  if (!(ENDPOINTS as readonly string[]).includes(o.endpoint)) return apiError(400, `Invalid 'endpoint': expected one of ${ENDPOINTS.join(", ")}.`, "invalid_value", "endpoint");
  if (o.completion_window !== "24h") return apiError(400, "Invalid 'completion_window': only '24h' is supported.", "invalid_value", "completion_window");
  let metadata: Record<string, string> | null = null;
  if (o.metadata !== undefined && o.metadata !== null) {
    if (typeof o.metadata !== "object" || Array.isArray(o.metadata)) return apiError(400, "Invalid 'metadata': expected an object.", "invalid_type", "metadata");
    const entries = Object.entries(o.metadata as Record<string, unknown>);
    if (entries.length > 16) return apiError(400, "Invalid 'metadata': at most 16 key-value pairs.", "invalid_value", "metadata");
    for (const [k, val] of entries) {
      if (k.length > 64 || typeof val !== "string" || val.length > 512) return apiError(400, "Invalid 'metadata': keys are strings of at most 64 characters, values strings of at most 512.", "invalid_value", "metadata");
    }
    metadata = Object.fromEntries(entries) as Record<string, string>;
  }
  return { input_file_id: o.input_file_id, endpoint: o.endpoint as Endpoint, completion_window: o.completion_window, metadata };
}

/** Cursor pagination over items sorted newest first: `after` an id, at most `limit` (1-100). */
export function paginate<T extends { id: string }>(items: readonly T[], after: string | undefined, limitRaw: string | undefined): { page: T[]; has_more: boolean } | ApiError {
  const limit = limitRaw === undefined ? 20 : Number(limitRaw);
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) return apiError(400, "Invalid 'limit': an integer from 1 to 100.", "invalid_value", "limit");
  let start = 0;
  if (after !== undefined) {
    const i = items.findIndex((x) => x.id === after);
    start = i < 0 ? items.length : i + 1;
  }
  const page = items.slice(start, start + limit);
  return { page, has_more: start + limit < items.length };
}

// ---------------------------------------------------------------------------------------------
// Results and output assembly.

/** One executed item, as a worker records it (subject per batch, one event per attempt that ended). */
export interface ResultEvent {
  type: "batch-result";
  batch: string;
  line: number;
  custom_id: string;
  response: { status_code: number; request_id: string; body: unknown } | null;
  error: { code: string; message: string } | null;
  at: number;
}

/** Whether a result counts as completed (a 2xx answer) or failed (an error answer or no answer). */
export const resultOk = (r: Pick<ResultEvent, "response" | "error">): boolean => r.error === null && r.response !== null && r.response.status_code >= 200 && r.response.status_code < 300;

/**
 * Bytes of a result event that are not the engine's answer (type, ids, custom_id up to 512
 * characters, JSON-escaped up to six bytes each, status, request id, timestamp, headers): the answer may take the rest of the
 * connection's `max_payload`.
 */
export const RESULT_ENVELOPE_BYTES = 8 * 1024;

/** The largest engine answer a worker reads: what fits in one result message beside its envelope. */
export function answerLimitBytes(maxPayload: number): number {
  return Math.max(1024, maxPayload - RESULT_ENVELOPE_BYTES);
}

/**
 * The failed result recorded for an item whose answer cannot be stored (larger than one result
 * message holds): the item completes, as a failed line of the error file, instead of being
 * redelivered and re-executed without end.
 */
export function tooLargeResult(item: { batch: string; line: number; custom_id: string }, limit: number, at: number): ResultEvent {
  return { type: "batch-result", batch: item.batch, line: item.line, custom_id: item.custom_id, response: null, error: { code: "response_too_large", message: `The model's response is larger than ${limit} bytes, the most a batch result can hold.` }, at };
}

/** Whether a result event, encoded, fits in one message of `maxPayload` bytes. */
export function resultFits(encodedBytes: number, maxPayload: number): boolean {
  return encodedBytes + 1024 <= maxPayload;
}

/**
 * What a worker does when recording an item's result failed on delivery `deliveries` (1 for the
 * first): offer the item again after a back-off while attempts are left, else give up on it
 * (terminate the message) and record it failed.
 */
export function onPublishFailure(deliveries: number, maxAttempts: number): { action: "nak"; delayMs: number } | { action: "give-up" } {
  if (deliveries < maxAttempts) return { action: "nak", delayMs: Math.min(250 * 2 ** Math.max(0, deliveries - 1), 15_000) };
  return { action: "give-up" };
}

/** The failed result recorded for an item given up on after its result could not be recorded. */
export function unrecordableResult(item: { batch: string; line: number; custom_id: string }, reason: string, at: number): ResultEvent {
  return { type: "batch-result", batch: item.batch, line: item.line, custom_id: item.custom_id, response: null, error: { code: "result_not_recorded", message: `The result could not be recorded: ${reason}`.slice(0, 300) }, at };
}

/** A stable line id: the same item always gets the same id, however often it ran. */
export function requestLineId(batchId: string, line: number): string {
  return `batch_req_${batchHex(batchId)}_${line}`;
}

export interface Assembly {
  output: string;
  errors: string;
  counts: RequestCounts;
  /** Results beyond the first for an item (re-executions after a worker died): dropped. */
  duplicates: number;
}

/**
 * Builds the output and error files from the recorded results: one line per item, the first
 * result recorded for it (later ones are re-executions and are dropped), in input order. Items
 * with no result get an error line with `missing` (the batch expired or was cancelled first),
 * when given.
 */
export function assembleOutput(batchId: string, total: number, results: Iterable<ResultEvent>, missing?: { code: string; message: string }, customIds?: readonly string[]): Assembly {
  const byLine = new Map<number, ResultEvent>();
  let duplicates = 0;
  for (const r of results) {
    if (r.batch !== batchId || !Number.isInteger(r.line) || r.line < 0 || r.line >= total) continue;
    if (byLine.has(r.line)) duplicates++;
    else byLine.set(r.line, r);
  }
  const out: string[] = [];
  const err: string[] = [];
  let completed = 0;
  let failed = 0;
  for (let line = 0; line < total; line++) {
    const r = byLine.get(line);
    if (!r) {
      if (missing && customIds?.[line] !== undefined) {
        err.push(JSON.stringify({ id: requestLineId(batchId, line), custom_id: customIds[line], response: null, error: missing }));
      }
      continue;
    }
    const text = JSON.stringify({ id: requestLineId(batchId, line), custom_id: r.custom_id, response: r.response, error: r.error });
    if (resultOk(r)) {
      completed++;
      out.push(text);
    } else {
      failed++;
      err.push(text);
    }
  }
  const join = (a: string[]) => (a.length ? `${a.join("\n")}\n` : "");
  return { output: join(out), errors: join(err), counts: { total, completed, failed }, duplicates };
}
