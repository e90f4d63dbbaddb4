/**
 * The Batch API end to end against a real stack: nats-server, simulated vLLM pods, a gateway,
 * the dev front (forwarding /v1/files and /v1/batches to batch-api, everything else through
 * ext_proc), batch-api replicas and batch-workers (in-process, and real processes for kill -9).
 *
 * The official `openai` client (the devDependency; passes with v5.23 and v7.60) drives one flow;
 * the same calls also run with plain HTTP in the other tests.
 */
import OpenAI, { toFile } from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Kvm } from "@nats-io/kv";
import { configBucketName } from "../streams/definitions.js";
import { apiKeyBucketKey, hashApiKey } from "../services/gateway/auth.js";
import { configRecordSubject, generateSigningKeyPair, RecordSigner, RecordVerifier } from "../streams/signatures.js";
import { startFront, type FrontServer } from "../services/front/front.js";
import { type BatchApiHandle, startBatchApi } from "../services/batch/api.js";
import { type BatchWorkerHandle, startBatchWorker } from "../services/batch/worker.js";
import { COMPLETION_WINDOW_MS, requestLineId } from "../services/batch/model.js";
import { DEMO_FLOW_CONTROL } from "../services/demo/demo.js";
import { MODEL_CONFIG_KEY_PREFIX } from "../schemas/config.js";
import { encodeToken } from "../streams/tokens.js";
import { spawnJetroute, type ServiceProcess } from "../services/shared/processes.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";
import { runJetroute } from "./harness/cli.js";

type Json = Record<string, unknown>;

const inputFile = (n: number, prefix = "req", maxTokens = 4) =>
  `${Array.from({ length: n }, (_, i) => JSON.stringify({ custom_id: `${prefix}-${i}`, method: "POST", url: "/v1/chat/completions", body: { model: MODEL, messages: [{ role: "user", content: `item ${i}` }], max_tokens: maxTokens } })).join("\n")}\n`;

describe("Batch API - files, batches, workers through the routing plane", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let api: BatchApiHandle;
  let front: FrontServer;
  let base: string;
  let clockShift = 0;
  const workers: BatchWorkerHandle[] = [];
  const procs: ServiceProcess[] = [];

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: MODEL, decodeMsPerStep: 2, maxBatch: 16, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address });
    // Flow control as the demo configures it: the workers' `batch` objective is a band below interactive.
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(MODEL)}`, JSON.stringify(DEMO_FLOW_CONTROL));
    const gw = await env.gateway();
    api = await startBatchApi({ nats: env.nats, port: 0, log: quietLog, id: "api-1", now: () => Date.now() + clockShift, tickMs: 100, cancelGraceMs: 300, reclaimAfterMs: 5_000 });
    front = await startFront({ port: 0, gateways: [`127.0.0.1:${gw.port}`], batchApi: `127.0.0.1:${api.port}`, logger: quietLog });
    base = `http://127.0.0.1:${front.port}`;
    // The gateway answers 503 until its views caught up with PODS.
    await waitFor(async () => {
      const r = await fetch(`${base}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 1 }) });
      await r.arrayBuffer();
      return r.status === 200;
    }, 10_000, "the gateway routes");
  });
  afterAll(async () => {
    for (const p of procs) await p.stop().catch(() => undefined);
    for (const w of workers) await w.close();
    await front?.close();
    await api?.close();
    await fleet?.close();
    await env?.stop();
  });

  const worker = async (extra: Partial<Parameters<typeof startBatchWorker>[0]> = {}) => {
    const w = await startBatchWorker({ nats: env.nats, target: base, log: quietLog, concurrency: 8, ackWaitMs: 2_000, ...extra });
    workers.push(w);
    return w;
  };
  const upload = async (text: string, name = "input.jsonl", headers: Record<string, string> = {}, at = base) => {
    const form = new FormData();
    form.set("purpose", "batch");
    form.set("file", new Blob([text]), name);
    return await fetch(`${at}/v1/files`, { method: "POST", body: form, headers });
  };
  const json = async (r: Response | Promise<Response>) => (await (await r).json()) as Json;
  const createBatch = (input_file_id: string, at = base, headers: Record<string, string> = {}) =>
    fetch(`${at}/v1/batches`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify({ input_file_id, endpoint: "/v1/chat/completions", completion_window: "24h", metadata: { job: "test" } }) });
  const batch = (id: string) => json(fetch(`${base}/v1/batches/${id}`));
  const until = async (id: string, status: string, ms = 30_000) => {
    let last: Json = {};
    await waitFor(async () => {
      last = await batch(id);
      return last.status === status;
    }, ms, `batch ${id} ${status}`);
    return last;
  };
  const lines = async (fileId: string) => (await (await fetch(`${base}/v1/files/${fileId}/content`)).text()).trim().split("\n").filter(Boolean).map((l) => JSON.parse(l) as Json);

  it("runs a batch to completed: output file with one OpenAI result line per request, through the gateway", async () => {
    const up = await upload(inputFile(40));
    expect(up.status).toBe(200);
    const file = (await up.json()) as Json;
    expect(file).toMatchObject({ object: "file", purpose: "batch", filename: "input.jsonl" });
    const created = await json(createBatch(file.id as string));
    expect(created).toMatchObject({ object: "batch", status: "validating", endpoint: "/v1/chat/completions", completion_window: "24h", metadata: { job: "test" }, request_counts: { total: 40, completed: 0, failed: 0 } });
    await worker();
    const done = await until(created.id as string, "completed");
    expect(done.request_counts).toEqual({ total: 40, completed: 40, failed: 0 });
    expect(done.error_file_id).toBeNull();
    for (const k of ["in_progress_at", "finalizing_at", "completed_at"]) expect(typeof done[k]).toBe("number");
    const out = await lines(done.output_file_id as string);
    expect(out.map((l) => l.custom_id).sort()).toEqual(Array.from({ length: 40 }, (_, i) => `req-${i}`).sort());
    const first = out[0] as { id: string; response: { status_code: number; request_id: string; body: { object: string; choices: unknown[] } }; error: unknown };
    expect(first.id).toMatch(/^batch_req_/);
    expect(first.error).toBeNull();
    expect(first.response.status_code).toBe(200);
    expect(first.response.body.object).toBe("chat.completion");
    // The items went through the routing plane, each in the batch band: the gateway's decision records say so.
    const c = await env.nats.js.consumers.get("JR_DECISIONS");
    let batchBand = 0;
    for (;;) {
      const m = await c.next({ expires: 1_000 });
      if (!m) break;
      const flow = (m.json() as { flow?: { band: number; objective?: string } }).flow;
      if (flow?.objective === "batch" && flow.band === -1) batchBand++;
      if (m.info.pending === 0) break;
    }
    expect(batchBand).toBeGreaterThanOrEqual(40);
    // The output file is listed as the tenant's, with purpose batch_output.
    const files = await json(fetch(`${base}/v1/files`));
    expect((files.data as Json[]).map((f) => f.purpose)).toContain("batch_output");
    // Progress is on /metrics.
    const metrics = await (await fetch(`http://127.0.0.1:${api.port}/metrics`)).text();
    expect(metrics).toMatch(/jetroute_batch_batches\{status="completed"\} [1-9]/);
  }, 60_000);

  it("refuses bad input with OpenAI-shaped errors, line numbers included", async () => {
    const dup = await upload(`${inputFile(2)}${inputFile(1)}`);
    expect(dup.status).toBe(400);
    expect(((await dup.json()) as { error: Json }).error).toMatchObject({ type: "invalid_request_error", code: "duplicate_custom_id", param: "custom_id", message: expect.stringMatching(/^Line 3: /) });
    const form = new FormData();
    form.set("purpose", "fine-tune");
    form.set("file", new Blob([inputFile(1)]), "x.jsonl");
    const purpose = await fetch(`${base}/v1/files`, { method: "POST", body: form });
    expect(purpose.status).toBe(400);
    expect(((await purpose.json()) as { error: Json }).error.param).toBe("purpose");
    const nofile = await json(createBatch("file-000000000000000000000000"));
    expect(nofile.error).toMatchObject({ param: "input_file_id" });
    const bad = await fetch(`${base}/v1/batches`, { method: "POST", headers: { "content-type": "application/json" }, body: "{nope" });
    expect(bad.status).toBe(400);
    const missing = await fetch(`${base}/v1/batches/batch_000000000000000000000000`);
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { error: Json }).error).toMatchObject({ type: "invalid_request_error", code: "batch_not_found" });
  });

  it("cancel stops dispatching and closes what finished; expiry closes a batch at its completion window", async () => {
    for (const w of workers.splice(0)) await w.close();
    // No worker runs: the items wait on the queue.
    const f1 = await json(upload(inputFile(5, "cancel")));
    const b1 = await json(createBatch(f1.id as string));
    await until(b1.id as string, "in_progress");
    const cancelling = await json(fetch(`${base}/v1/batches/${b1.id}/cancel`, { method: "POST" }));
    expect(cancelling.status).toBe("cancelling");
    expect(typeof cancelling.cancelling_at).toBe("number");
    const cancelled = await until(b1.id as string, "cancelled");
    expect(cancelled.request_counts).toEqual({ total: 5, completed: 0, failed: 0 });
    expect(cancelled.output_file_id).toBeNull();
    expect((await lines(cancelled.error_file_id as string)).map((l) => (l.error as Json).code)).toEqual(Array(5).fill("batch_cancelled"));
    const queued = await env.nats.jsm.streams.info("JR_BATCH_WORK");
    expect(queued.state.messages).toBe(0);
    // Cancelling a finished batch is a 409.
    const again = await fetch(`${base}/v1/batches/${b1.id}/cancel`, { method: "POST" });
    expect(again.status).toBe(200);
    const completedId = ((await json(fetch(`${base}/v1/batches?limit=100`))).data as Json[]).find((b) => b.status === "completed")?.id;
    expect((await fetch(`${base}/v1/batches/${completedId}/cancel`, { method: "POST" })).status).toBe(409);

    const f2 = await json(upload(inputFile(3, "exp")));
    const b2 = await json(createBatch(f2.id as string));
    await until(b2.id as string, "in_progress");
    clockShift = COMPLETION_WINDOW_MS + 1_000;
    try {
      const expired = await until(b2.id as string, "expired");
      expect((await lines(expired.error_file_id as string)).map((l) => [l.custom_id, (l.error as Json).code])).toEqual([["exp-0", "batch_expired"], ["exp-1", "batch_expired"], ["exp-2", "batch_expired"]]);
      expect(typeof expired.expired_at).toBe("number");
    } finally {
      clockShift = 0;
    }
  }, 60_000);

  it("a worker killed with SIGKILL mid-batch loses no item and duplicates no line", async () => {
    const n = 300;
    const f = await json(upload(inputFile(n, "kill", 30)));
    const spawnWorker = (name: string) => {
      const p = spawnJetroute(name, ["batch-worker", "--nats", env.server.url, "--target", base, "--concurrency", "8", "--ack-wait-ms", "2000"], { env: { JETROUTE_LOG_LEVEL: "warn" } });
      procs.push(p);
      return p;
    };
    const w1 = spawnWorker("batch-worker-1");
    const w2 = spawnWorker("batch-worker-2");
    await Promise.all([w1.waitForLine((v: Json) => v.service === "batch-worker"), w2.waitForLine((v: Json) => v.service === "batch-worker")]);
    const b = await json(createBatch(f.id as string));
    await waitFor(async () => {
      const c = (await batch(b.id as string)).request_counts as { completed: number };
      return c.completed >= n / 4;
    }, 60_000, "a quarter of the items done");
    await w1.kill();
    const done = await until(b.id as string, "completed", 90_000);
    expect(done.request_counts).toEqual({ total: n, completed: n, failed: 0 });
    const out = await lines(done.output_file_id as string);
    const ids = out.map((l) => l.custom_id as string);
    expect(ids.length).toBe(n);
    expect(new Set(ids).size).toBe(n);
  }, 120_000);

  it("`jetroute batch status` prints one progress line per batch", async () => {
    const r = await runJetroute(["batch", "status", "--nats", env.server.url, "--all"]);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split("\n");
    expect(lines.some((l) => /^batch_[0-9a-f]{24} completed 300\/300 \(100\.0%\) completed 300 failed 0$/.test(l))).toBe(true);
    expect(lines.some((l) => /^batch_[0-9a-f]{24} cancelled 0\/5 \(0\.0%\)/.test(l))).toBe(true);
    const bad = await runJetroute(["batch", "status", "not-a-batch", "--nats", env.server.url]);
    expect(bad.code).toBe(2);
  }, 30_000);

  it("the official openai client: files.create, batches.create/retrieve/list/cancel, files.content", async () => {
    const w = await worker();
    const client = new OpenAI({ apiKey: "unused", baseURL: `${base}/v1`, maxRetries: 0 });
    const file = await client.files.create({ file: await toFile(Buffer.from(inputFile(10, "sdk")), "sdk.jsonl"), purpose: "batch" });
    expect(file.id).toMatch(/^file-/);
    const created = await client.batches.create({ input_file_id: file.id, endpoint: "/v1/chat/completions", completion_window: "24h", metadata: { via: "openai" } });
    let b = created;
    await waitFor(async () => {
      b = await client.batches.retrieve(created.id);
      return b.status === "completed";
    }, 30_000, "completed through the client");
    expect(b.request_counts).toEqual({ total: 10, completed: 10, failed: 0 });
    expect(b.output_file_id).toBeTruthy();
    const content = await client.files.content(b.output_file_id as string);
    const text = await content.text();
    expect(text.trim().split("\n").map((l: string) => JSON.parse(l).custom_id).sort()).toEqual(Array.from({ length: 10 }, (_, i) => `sdk-${i}`).sort());
    const listed: string[] = [];
    for await (const x of client.batches.list({ limit: 2 })) listed.push(x.id);
    expect(listed).toContain(created.id);
    await w.close();
    workers.splice(workers.indexOf(w), 1);
    const f2 = await client.files.create({ file: await toFile(Buffer.from(inputFile(2, "sdk2")), "sdk2.jsonl"), purpose: "batch" });
    const b2 = await client.batches.create({ input_file_id: f2.id, endpoint: "/v1/chat/completions", completion_window: "24h" });
    const c = await client.batches.cancel(b2.id);
    expect(["cancelling", "cancelled"]).toContain(c.status);
  }, 60_000);

  it("tenancy: with --auth required a key sees only its own user's files and batches", async () => {
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const keyA = "jr-test-key-tenant-a-0000000000000000000000";
    const keyB = "jr-test-key-tenant-b-0000000000000000000000";
    await kv.put(apiKeyBucketKey(hashApiKey(keyA)), JSON.stringify({ user: "tenant-a", createdAt: Date.now() }));
    await kv.put(apiKeyBucketKey(hashApiKey(keyB)), JSON.stringify({ user: "tenant-b", createdAt: Date.now() }));
    const authed = await startBatchApi({ nats: env.nats, port: 0, log: quietLog, id: "api-auth", auth: "required", tickMs: 0 });
    try {
      const at = `http://127.0.0.1:${authed.port}`;
      const A = { authorization: `Bearer ${keyA}` };
      const B = { authorization: `Bearer ${keyB}` };
      const none = await upload(inputFile(1), "x.jsonl", {}, at);
      expect(none.status).toBe(401);
      expect(((await none.json()) as { error: Json }).error.type).toBe("authentication_error");
      const fa = await json(upload(inputFile(1, "a"), "a.jsonl", A, at));
      expect((await fetch(`${at}/v1/files/${fa.id}`, { headers: A })).status).toBe(200);
      expect((await fetch(`${at}/v1/files/${fa.id}`, { headers: B })).status).toBe(404);
      expect((await fetch(`${at}/v1/files/${fa.id}/content`, { headers: B })).status).toBe(404);
      expect((await json(createBatch(fa.id as string, at, B))).error).toMatchObject({ param: "input_file_id" });
      const ba = await json(createBatch(fa.id as string, at, A));
      expect(ba.status).toBe("validating");
      expect((await fetch(`${at}/v1/batches/${ba.id}`, { headers: B })).status).toBe(404);
      expect(((await json(fetch(`${at}/v1/batches`, { headers: B }))).data as Json[]).length).toBe(0);
      expect(((await json(fetch(`${at}/v1/batches`, { headers: A }))).data as Json[]).map((b) => b.id)).toEqual([ba.id]);
      expect((await fetch(`${at}/v1/files/${fa.id}`, { method: "DELETE", headers: B })).status).toBe(404);
      expect(await json(fetch(`${at}/v1/files/${fa.id}`, { method: "DELETE", headers: A }))).toEqual({ id: fa.id, object: "file", deleted: true });
      expect((await fetch(`${at}/v1/files/${fa.id}`, { headers: A })).status).toBe(404);
    } finally {
      await authed.close();
    }
  }, 60_000);

  it("with --auth required, a key's models allow-list is checked at upload and at create, and --config-public-key refuses unsigned key records", async () => {
    const bucket = configBucketName("jr");
    const kv = await new Kvm(env.nats.nc).open(bucket);
    const op = generateSigningKeyPair();
    const signer = new RecordSigner(op.privateKeyPem);
    const wide = "jr-test-key-models-wide-000000000000000000";
    const narrow = "jr-test-key-models-narrow-0000000000000000";
    const unsigned = "jr-test-key-models-unsigned-00000000000000";
    const put = (token: string, rec: Json, sign: boolean) => {
      const key = apiKeyBucketKey(hashApiKey(token));
      return kv.put(key, JSON.stringify(sign ? signer.sign(configRecordSubject(bucket, key), rec, Date.now()) : rec));
    };
    await put(wide, { user: "tenant-m", createdAt: Date.now() }, true);
    await put(narrow, { user: "tenant-m", createdAt: Date.now(), models: ["some-other-model"] }, true);
    await put(unsigned, { user: "tenant-m", createdAt: Date.now(), admin: true }, false);
    const authed = await startBatchApi({ nats: env.nats, port: 0, log: quietLog, id: "api-models", auth: "required", tickMs: 0, configPublicKey: new RecordVerifier(op.publicKeyPem) });
    try {
      const at = `http://127.0.0.1:${authed.port}`;
      const W = { authorization: `Bearer ${wide}` };
      const N = { authorization: `Bearer ${narrow}` };
      // A planted, unsigned key record is refused as a gateway started with the same key refuses it.
      const u = await upload(inputFile(1), "u.jsonl", { authorization: `Bearer ${unsigned}` }, at);
      expect(u.status).toBe(401);
      await u.arrayBuffer();
      // Upload under the narrow key: the line naming a model outside its list is refused, by line.
      const n = await upload(inputFile(2, "n"), "n.jsonl", N, at);
      expect(n.status).toBe(400);
      const err = ((await n.json()) as { error: Json }).error;
      expect(err).toMatchObject({ code: "model_not_allowed", param: "body.model", type: "invalid_request_error" });
      expect(err.message).toMatch(/^Line 1: /);
      // The same user's wider key uploads it; creating the batch with the narrow key is still refused, nothing recorded.
      const f = await json(upload(inputFile(2, "w"), "w.jsonl", W, at));
      const before = authed.store.view.batches.size;
      const c = await createBatch(f.id as string, at, N);
      expect(c.status).toBe(400);
      expect(((await c.json()) as { error: Json }).error).toMatchObject({ code: "model_not_allowed", param: "body.model" });
      expect(authed.store.view.batches.size).toBe(before);
      expect((await json(createBatch(f.id as string, at, W))).status).toBe("validating");
    } finally {
      await authed.close();
    }
  }, 60_000);

  it("items run under the owner's key: its objective ceiling, cache salt and user apply (worker key with --delegate); a key without it is refused 403", async () => {
    // Only this test's worker may take items from the (shared) work queue.
    for (const w of workers.splice(0)) await w.close();
    for (const p of procs.splice(0)) await p.stop().catch(() => undefined);
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const SALT = "owner-salt-0123456789abcdef";
    const ownerKey = "jr-test-key-batch-owner-000000000000000000";
    // The worker's key through the real CLI, as an operator makes it.
    const made = await runJetroute(["config", "add-key", "--user", "batch-worker", "--delegate", "--json", "--nats", env.server.url]);
    expect(made.code, made.stderr).toBe(0);
    const workerRec = JSON.parse(made.stdout.trim()) as { key: string; delegate?: boolean };
    expect(workerRec.delegate).toBe(true);
    const workerKey = workerRec.key;
    const plainKey = "jr-test-key-batch-worker-plain-00000000000";
    await kv.put(apiKeyBucketKey(hashApiKey(ownerKey)), JSON.stringify({ user: "tenant-d", createdAt: Date.now(), objective: "batch", cacheSalt: SALT }));
    await kv.put(apiKeyBucketKey(hashApiKey(plainKey)), JSON.stringify({ user: "plain-worker", createdAt: Date.now() }));
    const gw = await env.gateway({ id: "gw-auth", auth: "required" });
    await waitFor(() => gw.apiKeys.size >= 3, 5_000, "the keys reach the gateway");
    const authed = await startBatchApi({ nats: env.nats, port: 0, log: quietLog, id: "api-owner", auth: "required", tickMs: 100 });
    const front2 = await startFront({ port: 0, gateways: [`127.0.0.1:${gw.port}`], batchApi: `127.0.0.1:${authed.port}`, logger: quietLog });
    const decisions = new Map<string, { user?: string; flow?: { objective?: string; band: number } }>();
    const sub = env.nats.nc.subscribe(env.subjects.all("decisions"), { callback: (_e, m) => void decisions.set((m.json() as { id: string }).id, m.json()) });
    try {
      const at = `http://127.0.0.1:${front2.port}`;
      const O = { authorization: `Bearer ${ownerKey}` };
      const chatAs = (key: string, extra: Record<string, string>) =>
        fetch(`${at}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${key}`, ...extra }, body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 1 }) });
      await waitFor(async () => {
        const r = await chatAs(ownerKey, {});
        await r.arrayBuffer();
        return r.status === 200;
      }, 10_000, "the authenticating gateway routes");
      // A key without --delegate naming the owner: 403, OpenAI-shaped; the owner's hash is not echoed.
      const refused = await chatAs(plainKey, { "x-jetroute-on-behalf-of": hashApiKey(ownerKey) });
      expect(refused.status).toBe(403);
      const body = (await refused.json()) as { error: Json };
      expect(body.error).toMatchObject({ type: "permission_error", code: "delegation_not_allowed", param: "x-jetroute-on-behalf-of" });
      expect(JSON.stringify(body)).not.toContain(hashApiKey(ownerKey));
      // The delegate key naming a key that does not exist: refused too.
      expect((await chatAs(workerKey, { "x-jetroute-on-behalf-of": "0".repeat(64) })).status).toBe(403);
      expect((await chatAs(workerKey, { "x-jetroute-on-behalf-of": "not-a-hash" })).status).toBe(400);

      // Prompts long enough to fill cache blocks, so the engines keep them under the salt they got.
      const long = "a tenant prompt long enough to fill several cache blocks at the engine ".repeat(8);
      const n = 6;
      const text = `${Array.from({ length: n }, (_, i) => JSON.stringify({ custom_id: `own-${i}`, method: "POST", url: "/v1/chat/completions", body: { model: MODEL, messages: [{ role: "user", content: `${long} ${i}` }], max_tokens: 2 } })).join("\n")}\n`;
      const f = await json(upload(text, "owner.jsonl", O, at));
      const b = await json(createBatch(f.id as string, at, O));
      expect(b.status).toBe("validating");
      // The worker asks for the interactive band with its own key: the owner's key caps it at batch.
      const w = await worker({ target: at, apiKey: workerKey, objective: "interactive" });
      let done: Json = {};
      await waitFor(async () => {
        done = await json(fetch(`${at}/v1/batches/${b.id}`, { headers: O }));
        return done.status === "completed";
      }, 30_000, "the owner's batch completes");
      expect(done.request_counts).toEqual({ total: n, completed: n, failed: 0 });
      for (let i = 0; i < n; i++) {
        const id = requestLineId(b.id as string, i);
        await waitFor(() => decisions.has(id), 10_000, `the decision record of ${id}`);
        const d = decisions.get(id);
        expect(d?.user).toBe("tenant-d");
        expect(d?.flow).toMatchObject({ objective: "batch", band: -1 });
      }
      const salts = new Set(fleet.pods.flatMap((p) => fleet.cacheListing(p.name).blocks.filter((x) => x.parentHash === null).map((x) => x.extraKeys?.[0] ?? null)));
      expect(salts.has(SALT)).toBe(true);
      await w.close();
      workers.splice(workers.indexOf(w), 1);

      // The same batch run by a worker whose key lacks --delegate: every item is refused, recorded in the error file.
      const f2 = await json(upload(inputFile(2, "nodelegate"), "nd.jsonl", O, at));
      const b2 = await json(createBatch(f2.id as string, at, O));
      const w2 = await worker({ target: at, apiKey: plainKey });
      let done2: Json = {};
      await waitFor(async () => {
        done2 = await json(fetch(`${at}/v1/batches/${b2.id}`, { headers: O }));
        return done2.status === "completed";
      }, 30_000, "the second batch completes");
      expect(done2.request_counts).toEqual({ total: 2, completed: 0, failed: 2 });
      const errs = (await (await fetch(`${at}/v1/files/${done2.error_file_id}/content`, { headers: O })).text()).trim().split("\n").map((l) => JSON.parse(l) as { response: { status_code: number; body: { error: Json } } });
      for (const e of errs) expect(e.response).toMatchObject({ status_code: 403, body: { error: { code: "delegation_not_allowed" } } });
      await w2.close();
      workers.splice(workers.indexOf(w2), 1);
    } finally {
      sub.unsubscribe();
      await front2.close();
      await authed.close();
    }
  }, 90_000);

  it("files expire: expires_after sets expires_at (OpenAI's bounds); an expired file answers 404, leaves the list, and the closer deletes it", async () => {
    const withExpiry = (seconds: string, anchor = "created_at") => {
      const form = new FormData();
      form.set("purpose", "batch");
      form.set("expires_after[anchor]", anchor);
      form.set("expires_after[seconds]", seconds);
      form.set("file", new Blob([inputFile(1, "exp")]), "exp.jsonl");
      return fetch(`${base}/v1/files`, { method: "POST", body: form });
    };
    const tooShort = await withExpiry("60");
    expect(tooShort.status).toBe(400);
    expect(((await tooShort.json()) as { error: Json }).error).toMatchObject({ type: "invalid_request_error", code: "invalid_value", param: "expires_after.seconds" });
    expect((await withExpiry("3600", "last_active_at")).status).toBe(400);
    const short = await json(withExpiry("3600"));
    expect(short.expires_at).toBe((short.created_at as number) + 3600);
    const dflt = await json(upload(inputFile(1, "dflt")));
    expect(dflt.expires_at).toBe((dflt.created_at as number) + 30 * 24 * 3600);
    // Past the expiry by more than the closer's grace (reclaimAfterMs, 5 s here).
    clockShift += 3_606_000;
    try {
      expect((await fetch(`${base}/v1/files/${short.id}`)).status).toBe(404);
      expect((await fetch(`${base}/v1/files/${short.id}/content`)).status).toBe(404);
      expect(((await json(fetch(`${base}/v1/files`))).data as Json[]).map((f) => f.id)).not.toContain(short.id);
      expect((await createBatch(short.id as string)).status).toBe(400);
      // The closer (every tick) deletes its record and its object; the 30-day file stays.
      await waitFor(async () => !api.store.view.files.has(short.id as string) && (await api.store.getFile(short.id as string)) === null, 10_000, "the expired file deleted");
      expect((await fetch(`${base}/v1/files/${dflt.id}`)).status).toBe(200);
    } finally {
      clockShift -= 3_606_000;
    }
  }, 30_000);
});
