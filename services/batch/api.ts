/**
 * `jetroute batch-api`: OpenAI's Files and Batches endpoints over JetStream. Stateless: every
 * replica folds the job-events stream into the same view (store.ts), so any replica answers any
 * call; transitions are compare-and-set on the batch's subject, so exactly one replica wins each.
 * Every replica also runs the closer (`tick`): it finalises batches whose items all have a result,
 * expires batches past their completion window, closes cancelled ones after the grace period, and
 * takes over a closing another replica left unfinished.
 */
import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Kvm, type KvWatchEntry } from "@nats-io/kv";
import client from "prom-client";
import { API_KEY_KEY_PREFIX, type ApiKeyRecord, apiKeyRecordError } from "../../schemas/config.js";
import { configBucketName } from "../../streams/definitions.js";
import { configRecordRefusal } from "../../streams/record-keys.js";
import { configRecordSubject, type RecordVerifier } from "../../streams/signatures.js";
import { ApiKeyView, type AuthMode, authFailureMessage, hashOfBucketKey } from "../gateway/auth.js";
import type { Logger } from "../shared/log.js";
import { connectNats, type NatsHandles } from "../shared/nats.js";
import {
  type ApiError,
  apiError,
  assembleOutput,
  type BatchRecord,
  batchObject,
  COMPLETION_WINDOW_MS,
  DEFAULT_FILE_EXPIRY_S,
  errorFileId,
  FINAL,
  type FileRecord,
  fileExpired,
  fileObject,
  isBatchId,
  isFileId,
  type JobEvent,
  type LineError,
  MAX_FILE_BYTES,
  MAX_FILENAME,
  outputFileId,
  parseExpiresAfter,
  paginate,
  parseCreateBatch,
  RUNNING,
  validateInput,
} from "./model.js";
import { BatchStore } from "./store.js";

export interface BatchApiOptions {
  nats: string | string[] | NatsHandles;
  prefix?: string;
  port?: number;
  host?: string;
  auth?: AuthMode;
  log: Logger;
  /** This replica's name (in claims and logs). */
  id?: string;
  now?: () => number;
  /** How often the closer runs. */
  tickMs?: number;
  /** A cancelled batch's in-flight items may still finish this long before its output is closed. */
  cancelGraceMs?: number;
  /** A closing (or queueing) left unfinished this long by its replica is taken over. */
  reclaimAfterMs?: number;
  /**
   * The operator's key set (`--config-public-key`): API key records that do not verify under it are
   * refused, as gateways refuse them (streams/record-keys.ts). Absent: records are not checked.
   */
  configPublicKey?: RecordVerifier;
}

export interface BatchApiHandle {
  port: number;
  store: BatchStore;
  /** Runs the closer once (tests drive it with their clock). */
  tick(): Promise<void>;
  close(): Promise<void>;
}

const ANONYMOUS = "anonymous";

/** Who calls: the tenant (the key's user) and, under --auth required, the key's hash and model allow-list. */
interface Caller {
  owner: string;
  /** SHA-256 of the caller's key: a batch's items run under it (the worker's x-jetroute-on-behalf-of). */
  key?: string;
  models?: readonly string[];
}
const MULTIPART_OVERHEAD = 1024 * 1024;

class HttpError extends Error {
  constructor(readonly e: ApiError) {
    super(e.error.message);
  }
}

const fail = (status: number, message: string, code: string | null = null, param: string | null = null): never => {
  throw new HttpError(apiError(status, message, code, param));
};

function send(res: http.ServerResponse, status: number, body: unknown): void {
  const data = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { "content-type": "application/json", "content-length": String(data.length) });
  res.end(data);
}

async function readBody(req: http.IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? Number.NaN);
  if (declared > limit) fail(413, `The request body exceeds ${limit} bytes.`, "content_size_limit_exceeded");
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > limit) fail(413, `The request body exceeds ${limit} bytes.`, "content_size_limit_exceeded");
    chunks.push(c);
  }
  return Buffer.concat(chunks, size);
}

async function readJson(req: http.IncomingMessage): Promise<unknown> {
  const body = await readBody(req, 1024 * 1024);
  try {
    return JSON.parse(body.toString("utf8"));
  } catch {
    return fail(400, "We could not parse the JSON body of your request.", "invalid_json");
  }
}

const newHex = () => randomBytes(12).toString("hex");

export async function startBatchApi(o: BatchApiOptions): Promise<BatchApiHandle> {
  const log = o.log;
  const now = o.now ?? Date.now;
  const me = o.id ?? `batch-api-${newHex().slice(0, 8)}`;
  const cancelGraceMs = o.cancelGraceMs ?? 30_000;
  const reclaimAfterMs = o.reclaimAfterMs ?? 60_000;
  const auth = o.auth ?? "off";
  const nats = typeof o.nats === "string" || Array.isArray(o.nats) ? await connectNats(o.nats, me) : o.nats;
  const ownsNats = typeof o.nats === "string" || Array.isArray(o.nats);
  const store = new BatchStore({ nats, ...(o.prefix ? { prefix: o.prefix } : {}), log, name: me });
  await store.start();
  const view = store.view;

  // API keys, as the gateways read them (the config bucket's apikey.<sha256> entries).
  const keys = new ApiKeyView();
  let keysRefusedSignature = 0;
  let stopKeys: (() => void) | undefined;
  if (auth === "required") {
    const bucket = configBucketName(store.subjects.prefix);
    const kv = await new Kvm(nats.nc).open(bucket);
    const apply = (e: KvWatchEntry) => {
      const hash = hashOfBucketKey(e.key);
      if (!hash) return;
      if (e.operation !== "PUT") return keys.set(hash, undefined);
      let v: unknown;
      try {
        v = e.json();
      } catch {
        v = undefined;
      }
      if (v === undefined || apiKeyRecordError(v)) {
        log.warn({ key: hash.slice(0, 12) }, "invalid API key record; the key is refused");
        return keys.set(hash, undefined);
      }
      const unsigned = o.configPublicKey ? configRecordRefusal(e.key, configRecordSubject(bucket, e.key), v, e.created.getTime(), { operator: o.configPublicKey }) : undefined;
      if (unsigned) {
        keysRefusedSignature++;
        log.warn({ key: hash.slice(0, 12), reason: unsigned }, "API key record refused: its signature does not verify under --config-public-key; the key is refused");
        return keys.set(hash, undefined);
      }
      keys.set(hash, v as ApiKeyRecord);
    };
    const w = await kv.watch({ key: `${API_KEY_KEY_PREFIX}>` });
    let initial: () => void = () => {};
    const loaded = new Promise<void>((r) => {
      initial = r;
    });
    void (async () => {
      for await (const e of w) {
        apply(e);
        if (e.delta === 0) initial();
      }
    })();
    // An empty bucket sends no entry: don't wait for one.
    const status = await kv.status();
    if (status.values === 0) initial();
    await Promise.race([loaded, new Promise((r) => setTimeout(r, 5_000))]);
    stopKeys = () => w.stop();
  }

  /** The caller's tenant and, when its key has one, the key's model allow-list. */
  const callerOf = (req: http.IncomingMessage): Caller => {
    if (auth !== "required") return { owner: ANONYMOUS };
    const header = req.headers.authorization;
    const r = keys.authenticate(Array.isArray(header) ? header[0] : header);
    if (!r.ok) fail(401, authFailureMessage(r.reason), "invalid_api_key");
    const ok = r as { user: string; hash: string; models?: readonly string[] };
    return { owner: ok.user, key: ok.hash, ...(ok.models ? { models: ok.models } : {}) };
  };

  // ------------------------------------------------------------------------- metrics
  const registry = new client.Registry();
  client.collectDefaultMetrics({ register: registry, prefix: "jetroute_batch_api_" });
  new client.Gauge({
    name: "jetroute_batch_batches",
    help: "Batches this replica's view holds, by status",
    labelNames: ["status"],
    registers: [registry],
    collect() {
      const by: Record<string, number> = { validating: 0, failed: 0, in_progress: 0, finalizing: 0, completed: 0, expired: 0, cancelling: 0, cancelled: 0 };
      for (const b of view.batches.values()) by[b.status] = (by[b.status] ?? 0) + 1;
      for (const [k, v] of Object.entries(by)) this.set({ status: k }, v);
    },
  });
  new client.Gauge({
    name: "jetroute_batch_api_keys_refused_signature",
    help: "API key records refused because their signature did not verify under --config-public-key (since start)",
    registers: [registry],
    collect() {
      this.set(keysRefusedSignature);
    },
  });
  new client.Gauge({
    name: "jetroute_batch_running_items",
    help: "Items of running batches, by state (pending: no result yet)",
    labelNames: ["state"],
    registers: [registry],
    collect() {
      let pending = 0;
      let completed = 0;
      let failed = 0;
      for (const [id, l] of view.live) {
        const b = view.batches.get(id);
        if (!b) continue;
        completed += l.completed;
        failed += l.failed;
        pending += b.total - l.completed - l.failed;
      }
      this.set({ state: "pending" }, pending);
      this.set({ state: "completed" }, completed);
      this.set({ state: "failed" }, failed);
    },
  });
  new client.Gauge({
    name: "jetroute_batch_view_events",
    help: "Events the view folded or refused, by kind",
    labelNames: ["kind"],
    registers: [registry],
    collect() {
      for (const [k, v] of Object.entries(view.stats)) this.set({ kind: k }, v);
    },
  });
  const filesExpired = new client.Counter({ name: "jetroute_batch_files_expired_total", help: "Expired files this replica deleted (their records and objects)", registers: [registry] });
  const closings = new client.Counter({ name: "jetroute_batch_closings_total", help: "Batches this replica closed, by final status", labelNames: ["status"], registers: [registry] });

  // ------------------------------------------------------------------------- files
  const ownFile = (owner: string, id: string): FileRecord => {
    const f = isFileId(id) ? view.files.get(id) : undefined;
    if (!f || f.owner !== owner || fileExpired(f, now())) return fail(404, `No such File object: ${id.slice(0, 64)}`, "file_not_found", "id");
    return f;
  };

  /** The 400 naming a file's first invalid line (OpenAI's shape: the line in the message, the field in `param`). */
  const invalidLines = (errors: readonly LineError[]): never => {
    const first = errors[0];
    return fail(400, `${first?.line ? `Line ${first.line}: ` : ""}${first?.message ?? "invalid input file"}${errors.length > 1 ? ` (and ${errors.length - 1} more errors)` : ""}`, first?.code ?? "invalid_file", first?.param ?? "file");
  };

  async function uploadFile(req: http.IncomingMessage, owner: string, models?: readonly string[]): Promise<unknown> {
    const ct = req.headers["content-type"] ?? "";
    if (!/^multipart\/form-data/i.test(ct)) fail(400, "Uploads must be multipart/form-data with a `file` and a `purpose`.", "invalid_request");
    const raw = await readBody(req, MAX_FILE_BYTES + MULTIPART_OVERHEAD);
    let form: FormData;
    try {
      form = await new Response(raw, { headers: { "content-type": ct } }).formData();
    } catch {
      return fail(400, "The multipart body could not be parsed.", "invalid_request");
    }
    const purpose = form.get("purpose");
    if (typeof purpose !== "string") fail(400, "Missing required parameter: 'purpose'.", "missing_required_parameter", "purpose");
    if (purpose !== "batch") fail(400, `Invalid 'purpose': ${JSON.stringify(String(purpose).slice(0, 32))}. This server stores files for the Batch API only: 'batch'.`, "invalid_value", "purpose");
    const file = form.get("file");
    if (!file || typeof file === "string") return fail(400, "Missing required parameter: 'file'.", "missing_required_parameter", "file");
    if (file.size > MAX_FILE_BYTES) fail(413, `The file exceeds the ${MAX_FILE_BYTES}-byte limit of batch input files.`, "content_size_limit_exceeded", "file");
    const bytes = new Uint8Array(await file.arrayBuffer());
    const v = validateInput(new TextDecoder().decode(bytes), undefined, models);
    if (!v.ok) return invalidLines(v.errors);
    const field = (k: string) => {
      const x = form.get(k);
      return typeof x === "string" ? x : undefined;
    };
    const expiry = parseExpiresAfter(field("expires_after[anchor]"), field("expires_after[seconds]"));
    if ("message" in expiry) return fail(400, expiry.message, "invalid_value", expiry.param);
    const name = ((file as File).name || "input.jsonl").slice(0, MAX_FILENAME);
    const created = Math.floor(now() / 1000);
    const rec: FileRecord = { id: `file-${newHex()}`, bytes: bytes.length, created_at: created, filename: name, purpose: "batch", owner, lines: v.lines.length, expires_at: created + expiry.seconds };
    await store.putFile(rec.id, bytes);
    await store.publishFile({ type: "file", action: "created", file: rec, at: now() });
    return fileObject(rec);
  }

  // ------------------------------------------------------------------------- batches
  const ownBatch = (owner: string, id: string): BatchRecord => {
    const b = isBatchId(id) ? view.batches.get(id) : undefined;
    if (!b || b.owner !== owner) return fail(404, `No batch found with id '${id.slice(0, 64)}'.`, "batch_not_found", "batch_id");
    return b;
  };
  const shown = (b: BatchRecord) => batchObject(b, view.live.get(b.id));

  async function createBatch(req: http.IncomingMessage, caller: Caller): Promise<unknown> {
    const { owner, models } = caller;
    const p = parseCreateBatch(await readJson(req));
    if ("status" in p) throw new HttpError(p);
    const f = view.files.get(p.input_file_id);
    if (!f || f.owner !== owner || !isFileId(p.input_file_id) || fileExpired(f, now())) return fail(400, `Invalid 'input_file_id': no such file ${p.input_file_id.slice(0, 64)}.`, "invalid_value", "input_file_id");
    if (f.purpose !== "batch") fail(400, "Invalid 'input_file_id': the file's purpose must be 'batch'.", "invalid_value", "input_file_id");
    const data = await store.getFile(f.id);
    if (!data) return fail(400, `Invalid 'input_file_id': the file ${f.id} has no content.`, "invalid_value", "input_file_id");
    const text = new TextDecoder().decode(data);
    const v = validateInput(text, p.endpoint);
    // The caller's key may be narrower than the one that uploaded the file: its models are checked
    // again here, and a line it may not run refuses the batch before anything is recorded.
    if (v.ok && models) {
      const allowed = validateInput(text, p.endpoint, models);
      if (!allowed.ok) invalidLines(allowed.errors);
    }
    const id = `batch_${newHex()}`;
    const t = now();
    const created: JobEvent = {
      type: "batch",
      event: "created",
      at: t,
      batch: { id, owner, ...(caller.key ? { owner_key: caller.key } : {}), endpoint: p.endpoint, input_file_id: f.id, completion_window: p.completion_window, metadata: p.metadata, total: v.ok ? v.lines.length : 0, created_at: t, expires_at: t + COMPLETION_WINDOW_MS },
    };
    const seq = await store.publishJob(id, created, 0);
    if (seq === undefined) return fail(500, "The batch could not be recorded; retry.", "server_error");
    if (!v.ok) {
      await store.publishJob(id, { type: "batch", event: "rejected", errors: v.errors, at: now() }, seq);
    } else {
      // Queued after the answer, as OpenAI answers `validating` at once; the closer takes the
      // queueing over if this replica dies before `queued` is recorded.
      void queue(id, seq, v.lines).catch((err: unknown) => log.error({ err, batch: id }, "queueing a batch's items failed; another replica will retry"));
    }
    return shown(view.batches.get(id) as BatchRecord);
  }

  async function queue(id: string, seq: number, lines: Parameters<BatchStore["enqueue"]>[1]): Promise<void> {
    await store.enqueue(id, lines);
    await store.publishJob(id, { type: "batch", event: "queued", at: now() }, seq);
  }

  async function cancelBatch(owner: string, id: string): Promise<unknown> {
    // Another event may land between reading the batch and recording the cancel (the `queued`
    // that follows a create, a worker's progress): then the view is read again once it has folded
    // that event, and the cancel asked again; never answered as if it had been recorded.
    for (let attempt = 0; ; attempt++) {
      const b = ownBatch(owner, id);
      if (b.status === "cancelling" || b.status === "cancelled") return shown(b);
      if (!RUNNING.has(b.status)) fail(409, `Cannot cancel a batch with status '${b.status}'.`, "batch_not_cancellable");
      const seq = await store.publishJob(id, { type: "batch", event: "cancelling", at: now(), by: me }, b.seq);
      if (seq !== undefined) break;
      if (attempt >= 20) return fail(503, "The batch kept changing while it was being cancelled; retry.", "server_error");
      await viewPast(id, b.seq);
    }
    await store.purgeWork(id).catch((err: unknown) => log.warn({ err, batch: id }, "purging a cancelled batch's items failed; workers skip them"));
    return shown(view.batches.get(id) as BatchRecord);
  }

  /** Resolves once the view holds a later event of the batch than `seq` (or after 2 s). */
  async function viewPast(id: string, seq: number): Promise<void> {
    const until = Date.now() + 2_000;
    while ((view.batches.get(id)?.seq ?? 0) <= seq && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
  }

  // ------------------------------------------------------------------------- the closer
  const closing = new Set<string>();

  async function close(b: BatchRecord, kind: "finalizing" | "expiring" | "cancelling", claimSeq: number): Promise<void> {
    if (kind !== "finalizing") await store.purgeWork(b.id).catch(() => 0);
    const results = await store.readResults(b.id);
    let customIds: string[] | undefined;
    if (kind !== "finalizing") {
      const input = await store.getFile(b.input_file_id);
      const v = input ? validateInput(new TextDecoder().decode(input), b.endpoint) : undefined;
      customIds = v?.ok ? v.lines.map((l) => l.custom_id) : undefined;
    }
    const missing = kind === "expiring" ? { code: "batch_expired", message: "This request could not be executed before the completion window expired." } : kind === "cancelling" ? { code: "batch_cancelled", message: "This request was not executed: the batch was cancelled." } : undefined;
    const a = assembleOutput(b.id, b.total, results, missing, customIds);
    const write = async (id: string, text: string): Promise<string | null> => {
      if (text.length === 0) return null;
      const data = new TextEncoder().encode(text);
      await store.putFile(id, data);
      await store.publishFile({ type: "file", action: "created", file: { id, bytes: data.length, created_at: Math.floor(now() / 1000), filename: `${b.id}_${id.endsWith("-output") ? "output" : "error"}.jsonl`, purpose: "batch_output", owner: b.owner, expires_at: Math.floor(now() / 1000) + DEFAULT_FILE_EXPIRY_S }, at: now() });
      return id;
    };
    const output_file_id = await write(outputFileId(b.id), a.output);
    const error_file_id = await write(errorFileId(b.id), a.errors);
    const event = kind === "finalizing" ? "completed" : kind === "expiring" ? "expired" : "cancelled";
    const seq = await store.publishJob(b.id, { type: "batch", event, at: now(), counts: a.counts, output_file_id, error_file_id }, claimSeq);
    if (seq !== undefined) {
      closings.inc({ status: event });
      log.info({ batch: b.id, status: event, ...a.counts, duplicatesDropped: a.duplicates }, "batch closed");
    }
  }

  async function closeOne(b: BatchRecord): Promise<void> {
    const t = now();
    let kind: "finalizing" | "expiring" | "cancelling" | undefined;
    let claim = true;
    const live = view.live.get(b.id);
    if (b.closing) {
      const stale = t - b.closing.since > reclaimAfterMs + (b.closing.kind === "cancelling" ? cancelGraceMs : 0);
      if (b.closing.kind === "cancelling" && b.closing.by === me && t - b.closing.since >= cancelGraceMs) {
        kind = "cancelling";
        claim = false;
      } else if (stale) kind = b.closing.kind;
    } else if (RUNNING.has(b.status) && t >= b.expires_at) kind = "expiring";
    else if (b.status === "in_progress" && live && live.completed + live.failed >= b.total) kind = "finalizing";
    else if (b.status === "validating" && t - b.created_at > reclaimAfterMs) {
      // The replica that accepted it died before queueing everything: queue again (idempotent).
      const input = await store.getFile(b.input_file_id);
      const v = input ? validateInput(new TextDecoder().decode(input), b.endpoint) : undefined;
      if (v?.ok) {
        log.warn({ batch: b.id }, "taking over a batch left validating");
        await queue(b.id, b.seq, v.lines);
      }
      return;
    }
    if (!kind) return;
    let seq = b.seq;
    if (claim) {
      const claimed = await store.publishJob(b.id, { type: "batch", event: kind, at: t, by: me }, b.seq);
      if (claimed === undefined) return;
      seq = claimed;
    }
    await close(view.batches.get(b.id) as BatchRecord, kind, seq);
  }

  /** Deletes expired files (at most 100 a tick), except an input file a running batch still reads. */
  async function deleteExpired(): Promise<void> {
    const t = now();
    const inUse = new Set<string>();
    for (const b of view.batches.values()) if (!FINAL.has(b.status)) inUse.add(b.input_file_id);
    let n = 0;
    for (const f of [...view.files.values()]) {
      if (n >= 100) break;
      // A grace of reclaimAfterMs past the expiry: a batch created from the file just before it
      // expired (on this replica or another) reaches this view first, and keeps it.
      if (!fileExpired(f, t - reclaimAfterMs) || inUse.has(f.id)) continue;
      n++;
      // Every replica may do this at once: a second deletion event and object delete are no-ops.
      // The object first: a crash in between leaves the record, which the next tick deletes again
      // (the object's delete is then a no-op); the other order would leak the object for good.
      await store.deleteFile(f.id);
      await store.publishFile({ type: "file", action: "deleted", file: f, at: t });
      filesExpired.inc();
    }
  }

  async function tick(): Promise<void> {
    await deleteExpired().catch((err: unknown) => log.warn({ err }, "deleting expired files failed; retried at the next tick"));
    const work: Promise<void>[] = [];
    for (const b of view.batches.values()) {
      if (FINAL.has(b.status) || closing.has(b.id)) continue;
      closing.add(b.id);
      work.push(
        closeOne(b)
          .catch((err: unknown) => log.warn({ err, batch: b.id }, "closing a batch failed; retried at the next tick"))
          .finally(() => closing.delete(b.id)),
      );
    }
    await Promise.all(work);
  }

  // ------------------------------------------------------------------------- routing
  async function route(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://x");
    const parts = url.pathname.split("/").filter(Boolean);
    const method = req.method ?? "GET";
    if (url.pathname === "/healthz" || url.pathname === "/readyz") return send(res, 200, { status: "ok" });
    if (url.pathname === "/metrics") {
      const text = await registry.metrics();
      res.writeHead(200, { "content-type": registry.contentType });
      res.end(text);
      return;
    }
    if (parts[0] !== "v1" || (parts[1] !== "files" && parts[1] !== "batches")) return fail(404, `Unknown path ${url.pathname.slice(0, 64)}: this server serves /v1/files and /v1/batches.`, "unknown_url");
    const caller = callerOf(req);
    const owner = caller.owner;
    const id = parts[2];
    const q = (k: string) => url.searchParams.get(k) ?? undefined;
    if (parts[1] === "files") {
      if (!id && method === "POST") return send(res, 200, await uploadFile(req, owner, caller.models));
      if (!id && method === "GET") {
        const purpose = q("purpose");
        const p = paginate(view.filesOf(owner, purpose).filter((f) => !fileExpired(f, now())), q("after"), q("limit") ?? "100");
        if ("status" in p) throw new HttpError(p);
        const data = p.page.map(fileObject);
        return send(res, 200, { object: "list", data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: p.has_more });
      }
      if (id && parts.length === 3 && method === "GET") return send(res, 200, fileObject(ownFile(owner, id)));
      if (id && parts.length === 3 && method === "DELETE") {
        const f = ownFile(owner, id);
        // Not deleted (the object store cannot be written right now): 503, and the record stays.
        await store.deleteFile(f.id).catch((err: unknown) => {
          log.warn({ err: (err as Error).message, file: f.id }, "deleting a file failed; answered 503");
          return fail(503, "The file store cannot be written right now; retry shortly.", "server_error");
        });
        await store.publishFile({ type: "file", action: "deleted", file: f, at: now() });
        return send(res, 200, { id: f.id, object: "file", deleted: true });
      }
      if (id && parts[3] === "content" && method === "GET") {
        const f = ownFile(owner, id);
        // A NATS node lost under the object store makes reads time out until its stream has a new
        // leader: 503, which clients retry (the file itself is replicated, not lost).
        const data = await store.getFile(f.id).catch((err: unknown) => {
          log.warn({ err: (err as Error).message, file: f.id }, "reading a file failed; answered 503");
          return fail(503, "The file store cannot be read right now; retry shortly.", "server_error");
        });
        if (!data) return fail(404, `No content for File object ${f.id}.`, "file_not_found", "id");
        res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(data.length) });
        res.end(data);
        return;
      }
    } else {
      if (!id && method === "POST") return send(res, 200, await createBatch(req, caller));
      if (!id && method === "GET") {
        const p = paginate(view.batchesOf(owner), q("after"), q("limit"));
        if ("status" in p) throw new HttpError(p);
        const data = p.page.map(shown);
        return send(res, 200, { object: "list", data, first_id: data[0]?.id ?? null, last_id: (data.at(-1) as { id?: string } | undefined)?.id ?? null, has_more: p.has_more });
      }
      if (id && parts.length === 3 && method === "GET") return send(res, 200, shown(ownBatch(owner, id)));
      if (id && parts[3] === "cancel" && parts.length === 4 && method === "POST") return send(res, 200, await cancelBatch(owner, id));
    }
    return fail(405, `${method} ${url.pathname.slice(0, 64)} is not supported.`, "method_not_allowed");
  }

  const server = http.createServer((req, res) => {
    route(req, res).catch((err: unknown) => {
      if (res.headersSent) return void res.destroy();
      if (err instanceof HttpError) {
        // Drain what the client still sends, so it reads the answer.
        req.resume();
        return send(res, err.e.status, { error: err.e.error });
      }
      log.error({ err, path: req.url?.slice(0, 64) }, "batch API request failed");
      send(res, 500, { error: apiError(500, "The server had an error while processing your request.", "server_error").error });
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port ?? 8090, o.host ?? "127.0.0.1", () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  let timer: NodeJS.Timeout | undefined;
  let ticking = false;
  if ((o.tickMs ?? 500) > 0) {
    timer = setInterval(() => {
      if (ticking) return;
      ticking = true;
      void tick().finally(() => {
        ticking = false;
      });
    }, o.tickMs ?? 500);
  }
  log.info({ port, id: me, auth }, "batch API listening");
  return {
    port,
    store,
    tick,
    close: async () => {
      if (timer) clearInterval(timer);
      const closed = new Promise<void>((r) => server.close(() => r()));
      server.closeAllConnections();
      await closed;
      stopKeys?.();
      store.close();
      if (ownsNats) await nats.nc.close();
    },
  };
}
