import { describe, expect, it } from "vitest";
import {
  answerLimitBytes,
  applyJobEvent,
  assembleOutput,
  type BatchRecord,
  batchObject,
  DEFAULT_FILE_EXPIRY_S,
  fileExpired,
  type FileRecord,
  fileObject,
  type JobEvent,
  MAX_LINES,
  onPublishFailure,
  paginate,
  parseCreateBatch,
  parseExpiresAfter,
  requestLineId,
  RESULT_ENVELOPE_BYTES,
  type ResultEvent,
  resultFits,
  resultOk,
  tooLargeResult,
  unrecordableResult,
  validateInput,
} from "./model.js";
import { BatchView, progressLine } from "./view.js";

const line = (custom_id: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ custom_id, method: "POST", url: "/v1/chat/completions", body: { model: "m", messages: [{ role: "user", content: "hi" }] }, ...extra });

describe("batch input validation - line by line, as OpenAI does", () => {
  it("accepts a valid file, skipping blank lines and CRLF endings", () => {
    const v = validateInput(`${line("a")}\r\n\n${line("b")}\n`);
    expect(v.ok).toBe(true);
    if (v.ok) expect(v.lines.map((l) => [l.line, l.custom_id])).toEqual([[0, "a"], [1, "b"]]);
  });

  it("names the line and the parameter of each error", () => {
    const v = validateInput([line("a"), line("a"), "{not json", line("c", { method: "GET" }), line("d", { url: "/v1/other" }), line("e", { body: { messages: [] } }), line("f", { body: { model: "m", stream: true } }), JSON.stringify({ method: "POST" })].join("\n"));
    expect(v.ok).toBe(false);
    if (v.ok) return;
    expect(v.errors.map((e) => [e.line, e.code, e.param])).toEqual([
      [2, "duplicate_custom_id", "custom_id"],
      [3, "invalid_json_line", null],
      [4, "invalid_method", "method"],
      [5, "invalid_url", "url"],
      [6, "missing_required_parameter", "body.model"],
      [7, "invalid_value", "body.stream"],
      [8, "missing_required_parameter", "custom_id"],
    ]);
  });

  it("checks every url against the batch endpoint at creation", () => {
    const v = validateInput(`${line("a")}\n${line("b", { url: "/v1/embeddings" })}`, "/v1/chat/completions");
    expect(v.ok).toBe(false);
    if (!v.ok) expect(v.errors).toEqual([expect.objectContaining({ line: 2, code: "mismatched_url" })]);
  });

  it("refuses an empty file and more than 50,000 requests", () => {
    const empty = validateInput("\n\n");
    expect(empty.ok === false && empty.errors[0]?.code).toBe("empty_file");
    const many = Array.from({ length: MAX_LINES + 1 }, (_, i) => line(`r${i}`)).join("\n");
    const v = validateInput(many);
    expect(v.ok === false && v.errors[0]).toMatchObject({ code: "too_many_requests", line: MAX_LINES + 1 });
  });
});

describe("batch creation body and pagination", () => {
  it("requires the fields, one of the routed endpoints, the 24h window, bounded metadata", () => {
    expect(parseCreateBatch({ input_file_id: "f", endpoint: "/v1/chat/completions", completion_window: "24h", metadata: { a: "b" } })).toMatchObject({ endpoint: "/v1/chat/completions", metadata: { a: "b" } });
    expect(parseCreateBatch({ endpoint: "/v1/chat/completions", completion_window: "24h" })).toMatchObject({ status: 400, error: { param: "input_file_id" } });
    expect(parseCreateBatch({ input_file_id: "f", endpoint: "/v1/images", completion_window: "24h" })).toMatchObject({ status: 400, error: { param: "endpoint" } });
    expect(parseCreateBatch({ input_file_id: "f", endpoint: "/v1/completions", completion_window: "1h" })).toMatchObject({ status: 400, error: { param: "completion_window" } });
    const meta = Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"]));
    expect(parseCreateBatch({ input_file_id: "f", endpoint: "/v1/completions", completion_window: "24h", metadata: meta })).toMatchObject({ status: 400, error: { param: "metadata" } });
  });

  it("pages after an id, limit 1-100", () => {
    const items = ["a", "b", "c"].map((id) => ({ id }));
    expect(paginate(items, undefined, "2")).toEqual({ page: [{ id: "a" }, { id: "b" }], has_more: true });
    expect(paginate(items, "b", "2")).toEqual({ page: [{ id: "c" }], has_more: false });
    expect(paginate(items, undefined, "101")).toMatchObject({ status: 400 });
  });
});

const ID = "batch_0123456789abcdef01234567";
const created = (total: number, at = 1_000_000): JobEvent => ({
  type: "batch",
  event: "created",
  at,
  batch: { id: ID, owner: "u", endpoint: "/v1/chat/completions", input_file_id: "file-x", completion_window: "24h", metadata: null, total, created_at: at, expires_at: at + 86_400_000 },
});

function fold(events: JobEvent[]): BatchRecord | string {
  let b: BatchRecord | undefined;
  let seq = 0;
  for (const ev of events) {
    const next = applyJobEvent(b, ev, ++seq);
    if (typeof next === "string") return next;
    b = next;
  }
  return b as BatchRecord;
}

describe("batch lifecycle - the state machine folded from job events", () => {
  it("validating -> in_progress -> finalizing -> completed, with timestamps in seconds", () => {
    const b = fold([created(2), { type: "batch", event: "queued", at: 1_001_000 }, { type: "batch", event: "finalizing", at: 1_002_000, by: "r1" }, { type: "batch", event: "completed", at: 1_003_000, counts: { total: 2, completed: 2, failed: 0 }, output_file_id: "file-o", error_file_id: null }]);
    expect(typeof b).toBe("object");
    const o = batchObject(b as BatchRecord, undefined);
    expect(o).toMatchObject({ status: "completed", created_at: 1000, in_progress_at: 1001, finalizing_at: 1002, completed_at: 1003, expires_at: 87_400, request_counts: { total: 2, completed: 2, failed: 0 }, output_file_id: "file-o" });
  });

  it("validation failure, cancel and expiry paths; nothing after a final status", () => {
    expect(fold([created(0), { type: "batch", event: "rejected", errors: [{ code: "x", message: "m", param: null, line: 1 }], at: 2_000_000 }])).toMatchObject({ status: "failed", failed_at: 2000 });
    const cancelled = fold([created(3), { type: "batch", event: "queued", at: 1 }, { type: "batch", event: "cancelling", at: 2_000_000, by: "r" }, { type: "batch", event: "cancelled", at: 3_000_000, counts: { total: 3, completed: 1, failed: 0 }, output_file_id: "o", error_file_id: "e" }]);
    expect(cancelled).toMatchObject({ status: "cancelled", cancelling_at: 2000, cancelled_at: 3000 });
    expect(fold([created(3), { type: "batch", event: "expiring", at: 5_000_000, by: "r" }])).toMatchObject({ status: "finalizing" });
    expect(fold([created(3), { type: "batch", event: "expiring", at: 5_000_000, by: "r" }, { type: "batch", event: "expired", at: 6_000_000, counts: { total: 3, completed: 0, failed: 0 }, output_file_id: null, error_file_id: "e" }])).toMatchObject({ status: "expired", expired_at: 6000 });
    // Out of order or after the end: refused with a reason.
    expect(fold([created(1), { type: "batch", event: "completed", at: 1, counts: { total: 1, completed: 1, failed: 0 }, output_file_id: null, error_file_id: null }])).toMatch(/without finalizing/);
    expect(fold([created(1), { type: "batch", event: "rejected", errors: [], at: 1 }, { type: "batch", event: "queued", at: 2 }])).toMatch(/after failed/);
    expect(fold([created(1), { type: "batch", event: "queued", at: 1 }, { type: "batch", event: "queued", at: 2 }])).toMatch(/queued while in_progress/);
    // A stale closing is re-claimed by another replica: the same kind may be published again.
    expect(fold([created(1), { type: "batch", event: "queued", at: 1 }, { type: "batch", event: "finalizing", at: 2, by: "a" }, { type: "batch", event: "finalizing", at: 3, by: "b" }])).toMatchObject({ closing: { by: "b" } });
  });
});

const result = (l: number, status = 200, custom_id = `c${l}`): ResultEvent => ({ type: "batch-result", batch: ID, line: l, custom_id, response: { status_code: status, request_id: "r", body: { ok: l } }, error: null, at: 0 });

describe("output assembly - one line per item however often it ran", () => {
  it("drops re-executions, splits 2xx from the rest, keeps input order", () => {
    const a = assembleOutput(ID, 4, [result(2), result(0), result(2, 500), result(1, 400), result(0)]);
    expect(a.counts).toEqual({ total: 4, completed: 2, failed: 1 });
    expect(a.duplicates).toBe(2);
    const out = a.output.trim().split("\n").map((l) => JSON.parse(l));
    expect(out.map((o) => o.custom_id)).toEqual(["c0", "c2"]);
    expect(out[0]).toEqual({ id: requestLineId(ID, 0), custom_id: "c0", response: { status_code: 200, request_id: "r", body: { ok: 0 } }, error: null });
    expect(a.errors.trim().split("\n").map((l) => JSON.parse(l).custom_id)).toEqual(["c1"]);
  });

  it("writes an error line for each item that never ran when the batch expired or was cancelled", () => {
    const a = assembleOutput(ID, 3, [result(1)], { code: "batch_expired", message: "x" }, ["c0", "c1", "c2"]);
    expect(a.counts).toEqual({ total: 3, completed: 1, failed: 0 });
    expect(a.errors.trim().split("\n").map((l) => JSON.parse(l))).toEqual([
      { id: requestLineId(ID, 0), custom_id: "c0", response: null, error: { code: "batch_expired", message: "x" } },
      { id: requestLineId(ID, 2), custom_id: "c2", response: null, error: { code: "batch_expired", message: "x" } },
    ]);
  });

  it("ignores results of other batches and out-of-range lines", () => {
    const other = { ...result(0), batch: "batch_ffffffffffffffffffffffff" };
    expect(assembleOutput(ID, 1, [other, result(5)]).counts).toEqual({ total: 1, completed: 0, failed: 0 });
  });
});

describe("batch view - live counts and bounds", () => {
  it("counts each item once, also when results arrive before the batch is folded", () => {
    const v = new BatchView();
    v.applyResult(ID, 0, true);
    v.applyJobEvent(ID, created(3), 1);
    v.applyResult(ID, 1, false);
    v.applyResult(ID, 1, true);
    v.applyResult(ID, 9, true);
    expect(v.live.get(ID)).toMatchObject({ completed: 1, failed: 1, duplicates: 1 });
    expect(v.stats.invalid).toBe(1);
    expect(v.isDone(ID, 1)).toBe(true);
    expect(v.isDone(ID, 2)).toBe(false);
    const b = v.batches.get(ID) as BatchRecord;
    expect(progressLine(b, v.live.get(ID), b.created_at + 3_600_000)).toBe(`${ID} validating 2/3 (66.7%) completed 1 failed 1 expires in 23h00m`);
  });

  it("forgets the oldest final batches past its bound, never a running one", () => {
    const v = new BatchView({ maxBatches: 2 });
    const ids = ["batch_000000000000000000000001", "batch_000000000000000000000002", "batch_000000000000000000000003"];
    let seq = 0;
    for (const id of ids) {
      const ev = created(1);
      if (ev.event === "created") ev.batch.id = id;
      v.applyJobEvent(id, ev, ++seq);
    }
    expect(v.batches.size).toBe(3); // all running: none is dropped
    v.applyJobEvent(ids[1] as string, { type: "batch", event: "rejected", errors: [], at: 1 }, ++seq);
    const ev = created(1);
    if (ev.event === "created") ev.batch.id = "batch_000000000000000000000004";
    v.applyJobEvent("batch_000000000000000000000004", ev, ++seq);
    expect([...v.batches.keys()]).not.toContain(ids[1]);
    expect(v.batches.size).toBe(3);
  });
});

describe("batch results that cannot be stored - the item completes, failed, instead of running forever", () => {
  const item = { batch: "batch_00112233445566778899aabbccddeeff", line: 3, custom_id: "c3" };
  it("reads an answer up to the connection's max_payload minus the result's envelope", () => {
    expect(answerLimitBytes(1024 * 1024)).toBe(1024 * 1024 - RESULT_ENVELOPE_BYTES);
    expect(answerLimitBytes(8 * 1024 * 1024)).toBe(8 * 1024 * 1024 - RESULT_ENVELOPE_BYTES);
    // An envelope at its largest (a 512-character custom_id, every character escaped) still fits beside a full answer.
    const full = { type: "batch-result", batch: item.batch, line: 49_999, custom_id: "\u0001".repeat(512), response: { status_code: 200, request_id: "r".repeat(200), body: "" }, error: null, at: Date.now() };
    expect(JSON.stringify(full).length).toBeLessThan(RESULT_ENVELOPE_BYTES - 1024);
  });
  it("an answer that does not fit becomes a failed result with an OpenAI error line", () => {
    const max = 1024 * 1024;
    expect(resultFits(max - 2048, max)).toBe(true);
    expect(resultFits(max, max)).toBe(false);
    const r = tooLargeResult(item, answerLimitBytes(max), 5);
    expect(resultOk(r)).toBe(false);
    expect(r.response).toBeNull();
    expect(r.error?.code).toBe("response_too_large");
    expect(r.error?.message).toContain(String(answerLimitBytes(max)));
    const out = assembleOutput(item.batch, 4, [r]);
    expect(out.counts).toMatchObject({ total: 4, completed: 0, failed: 1 });
    expect(JSON.parse(out.errors.trim())).toEqual({ id: requestLineId(item.batch, 3), custom_id: "c3", response: null, error: { code: "response_too_large", message: r.error?.message } });
  });
  it("a failed publish is retried with back-off on a bounded number of attempts, then the item is given up and recorded failed", () => {
    expect(onPublishFailure(1, 10)).toEqual({ action: "nak", delayMs: 250 });
    expect(onPublishFailure(2, 10)).toEqual({ action: "nak", delayMs: 500 });
    expect(onPublishFailure(9, 10)).toEqual({ action: "nak", delayMs: 15_000 });
    expect(onPublishFailure(10, 10)).toEqual({ action: "give-up" });
    expect(onPublishFailure(11, 10)).toEqual({ action: "give-up" });
    const r = unrecordableResult(item, "maximum payload exceeded ".repeat(40), 5);
    expect(resultOk(r)).toBe(false);
    expect(r.error?.code).toBe("result_not_recorded");
    expect(r.error?.message.length).toBeLessThanOrEqual(300);
  });
});

describe("batch input validation - the API key's models", () => {
  const file = [line("a"), JSON.stringify({ custom_id: "b", method: "POST", url: "/v1/chat/completions", body: { model: "secret-model", messages: [] } })].join("\n");
  it("a line naming a model the key may not use is refused, with its line number and param", () => {
    const v = validateInput(file, undefined, ["m"]);
    expect(v.ok).toBe(false);
    if (v.ok) return;
    expect(v.errors).toEqual([{ code: "model_not_allowed", message: 'This API key may not use the model "secret-model".', param: "body.model", line: 2 }]);
  });
  it("every model allowed, or no list: the file is valid", () => {
    expect(validateInput(file, undefined, ["m", "secret-model"]).ok).toBe(true);
    expect(validateInput(file).ok).toBe(true);
  });
});

describe("file expiry (expires_after)", () => {
  it("takes OpenAI's bounds: anchor created_at, 1 hour to 30 days; absent is the 30-day default", () => {
    expect(parseExpiresAfter(undefined, undefined)).toEqual({ seconds: DEFAULT_FILE_EXPIRY_S });
    expect(parseExpiresAfter("created_at", "3600")).toEqual({ seconds: 3600 });
    expect(parseExpiresAfter("created_at", "2592000")).toEqual({ seconds: 2_592_000 });
    expect(parseExpiresAfter("created_at", "3599")).toMatchObject({ param: "expires_after.seconds" });
    expect(parseExpiresAfter("created_at", "2592001")).toMatchObject({ param: "expires_after.seconds" });
    expect(parseExpiresAfter("created_at", "1e4")).toMatchObject({ param: "expires_after.seconds" });
    expect(parseExpiresAfter("created_at", "3600.5")).toMatchObject({ param: "expires_after.seconds" });
    expect(parseExpiresAfter("created_at", undefined)).toMatchObject({ param: "expires_after.seconds" });
    expect(parseExpiresAfter("last_active_at", "3600")).toMatchObject({ param: "expires_after.anchor" });
    expect(parseExpiresAfter(undefined, "3600")).toMatchObject({ param: "expires_after.anchor" });
  });

  it("a file expires at its expires_at second; one without expires_at never does; the object shows it", () => {
    const f: FileRecord = { id: "file-1", bytes: 1, created_at: 1_000, filename: "a.jsonl", purpose: "batch", owner: "o", expires_at: 4_600 };
    expect(fileExpired(f, 4_599_999)).toBe(false);
    expect(fileExpired(f, 4_600_000)).toBe(true);
    expect(fileExpired({ ...f, expires_at: undefined }, Number.MAX_SAFE_INTEGER)).toBe(false);
    expect(fileObject(f).expires_at).toBe(4_600);
    const { expires_at: _e, ...old } = f;
    expect(fileObject(old).expires_at).toBeNull();
  });
});
