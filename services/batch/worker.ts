/**
 * `jetroute batch-worker`: takes batch items from the work queue (BATCH_WORK, one durable pull
 * consumer shared by every worker, explicit acks) and sends each through the routing plane like
 * any client request — HTTP to Envoy (or the dev front) — under a low flow-control objective, so
 * batch items wait in a band below interactive traffic and run on the capacity it leaves.
 *
 * At least once: an item is acked only after its result is recorded (BATCH_RESULTS, Msg-Id
 * batch.line), so a worker killed at any point leaves the item to be redelivered after the ack
 * wait; a long request keeps its item with in-progress heartbeats. Re-executed items produce a
 * second result, dropped by the server inside the duplicate window and by the output assembly
 * after it (model.ts `assembleOutput`), so the output file has one line per item.
 */
import type { JsMsg } from "@nats-io/jetstream";
import type { Logger } from "../shared/log.js";
import { startMetricsServer, statsRegistry } from "../shared/metrics-server.js";
import { connectNats, type NatsHandles } from "../shared/nats.js";
import { BodyTooLargeError, readBodyCapped } from "../shared/http-body.js";
import { answerLimitBytes, batchHex, onPublishFailure, RUNNING, requestLineId, type ResultEvent, resultFits, tooLargeResult, unrecordableResult } from "./model.js";
import { BatchStore, type WorkItem } from "./store.js";
import { ON_BEHALF_OF_HEADER } from "../views/api-keys.js";

export interface BatchWorkerOptions {
  nats: string | string[] | NatsHandles;
  prefix?: string;
  /** Where requests go: Envoy's (or the dev front's) base URL, e.g. http://127.0.0.1:8080. */
  target: string;
  /** Bearer key the worker authenticates with (gateways under --auth required). */
  apiKey?: string;
  /** Flow-control objective of batch requests (sent as x-gateway-inference-objective: ignored by a model that does not define it). */
  objective?: string;
  /** Items in flight at once in this worker. */
  concurrency?: number;
  /** The work consumer's ack wait; heartbeats go at a third of it. */
  ackWaitMs?: number;
  /** Deliveries of an item that got no usable answer (429, 5xx, connection errors) before it is recorded failed. */
  maxAttempts?: number;
  requestTimeoutMs?: number;
  metricsPort?: number;
  metricsHost?: string;
  id?: string;
  log: Logger;
}

export interface BatchWorkerStats {
  executed: number;
  completed: number;
  failed: number;
  retried: number;
  /** Answers larger than a result message holds, recorded as failed (response_too_large). */
  tooLarge: number;
  /** Results that could not be recorded (publish failed): the item was offered again. */
  publishFailed: number;
  /** Items given up on after their result could not be recorded `maxAttempts` times. */
  gaveUp: number;
  skippedFinished: number;
  skippedDone: number;
  invalid: number;
  inFlight: number;
}

export interface BatchWorkerHandle {
  stats: BatchWorkerStats;
  store: BatchStore;
  metricsPort?: number;
  close(): Promise<void>;
}

const RETRY_STATUS = new Set([408, 429, 500, 502, 503, 504]);

/** Back-off before an item that got no usable answer is offered again. */
export function retryDelayMs(deliveries: number): number {
  return Math.min(250 * 2 ** Math.max(0, deliveries - 1), 15_000);
}

export async function startBatchWorker(o: BatchWorkerOptions): Promise<BatchWorkerHandle> {
  const log = o.log;
  const id = o.id ?? `batch-worker-${process.pid}`;
  const nats = typeof o.nats === "string" || Array.isArray(o.nats) ? await connectNats(o.nats, id) : o.nats;
  const ownsNats = typeof o.nats === "string" || Array.isArray(o.nats);
  const store = new BatchStore({ nats, ...(o.prefix ? { prefix: o.prefix } : {}), log, name: id });
  await store.start();
  const view = store.view;
  const ackWaitMs = o.ackWaitMs ?? 30_000;
  const consumer = await store.workConsumer(ackWaitMs);
  const concurrency = o.concurrency ?? 16;
  const maxAttempts = o.maxAttempts ?? 10;
  const objective = o.objective ?? "batch";
  const target = o.target.replace(/\/$/, "");
  const stats: BatchWorkerStats = { executed: 0, completed: 0, failed: 0, retried: 0, tooLarge: 0, publishFailed: 0, gaveUp: 0, skippedFinished: 0, skippedDone: 0, invalid: 0, inFlight: 0 };
  let stopped = false;
  const controller = new AbortController();

  const maxPayload = (): number => nats.nc.info?.max_payload ?? 1024 * 1024;
  const encoder = new TextEncoder();

  async function execute(item: WorkItem, m: JsMsg, ownerKey: string | undefined): Promise<"done" | "retry" | "handled"> {
    const body = (JSON.parse(item.raw) as { body: unknown }).body;
    const requestId = requestLineId(item.batch, item.line);
    const headers: Record<string, string> = {
      "content-type": "application/json",
      "x-request-id": requestId,
      "x-gateway-inference-objective": objective,
      "x-jetroute-fairness-id": `batch-${batchHex(item.batch)}`,
    };
    if (o.apiKey) {
      headers.authorization = `Bearer ${o.apiKey}`;
      // The item runs under the key that created its batch (the worker's key needs --delegate).
      if (ownerKey) headers[ON_BEHALF_OF_HEADER] = ownerKey;
    }
    const beat = setInterval(() => m.working(), Math.max(1_000, Math.floor(ackWaitMs / 3)));
    let result: ResultEvent;
    try {
      const res = await fetch(`${target}${item.url}`, {
        method: "POST",
        headers,
        body: JSON.stringify(body),
        signal: AbortSignal.any([controller.signal, AbortSignal.timeout(o.requestTimeoutMs ?? 600_000)]),
      });
      const limit = answerLimitBytes(maxPayload());
      let text: string | undefined;
      try {
        text = await readBodyCapped(res, limit, "the model's response");
      } catch (err) {
        if (!(err instanceof BodyTooLargeError)) throw err;
      }
      if (RETRY_STATUS.has(res.status) && m.info.deliveryCount < maxAttempts) return "retry";
      if (text === undefined) {
        result = tooLargeResult(item, limit, Date.now());
      } else {
        let parsed: unknown = text;
        try {
          parsed = JSON.parse(text);
        } catch {
          /* a non-JSON answer is kept as text */
        }
        result = { type: "batch-result", batch: item.batch, line: item.line, custom_id: item.custom_id, response: { status_code: res.status, request_id: res.headers.get("x-request-id") ?? requestId, body: parsed }, error: null, at: Date.now() };
        // Escaping can make the encoded event longer than the answer read: measured, not assumed.
        if (!resultFits(encoder.encode(JSON.stringify(result)).byteLength, maxPayload())) result = tooLargeResult(item, limit, Date.now());
      }
      if (result.error?.code === "response_too_large") stats.tooLarge++;
    } catch (err) {
      if (stopped) throw err;
      if (m.info.deliveryCount < maxAttempts) return "retry";
      result = { type: "batch-result", batch: item.batch, line: item.line, custom_id: item.custom_id, response: null, error: { code: "request_failed", message: `The request could not be completed: ${(err as Error).message}`.slice(0, 300) }, at: Date.now() };
    } finally {
      clearInterval(beat);
    }
    try {
      await store.publishResult(result);
    } catch (err) {
      if (stopped) throw err;
      stats.publishFailed++;
      const reason = (err as Error).message;
      const next = onPublishFailure(m.info.deliveryCount, maxAttempts);
      if (next.action === "nak") {
        log.warn({ err: reason, batch: item.batch, line: item.line, deliveries: m.info.deliveryCount }, "recording a batch result failed; the item is offered again");
        m.nak(next.delayMs);
        return "handled";
      }
      // Out of attempts: record the item failed (a small event) and drop it from the queue.
      stats.gaveUp++;
      stats.failed++;
      log.warn({ err: reason, batch: item.batch, line: item.line, deliveries: m.info.deliveryCount }, "recording a batch result failed too often; the item is recorded failed");
      await store.publishResult(unrecordableResult(item, reason, Date.now())).catch((e: unknown) => log.warn({ err: (e as Error).message, batch: item.batch, line: item.line }, "recording the failure failed too; the item stays without a result"));
      m.term();
      return "handled";
    }
    stats.executed++;
    if (result.response && result.response.status_code < 300) stats.completed++;
    else stats.failed++;
    return "done";
  }

  async function handle(m: JsMsg): Promise<void> {
    let item: WorkItem;
    try {
      item = JSON.parse(new TextDecoder().decode(m.data)) as WorkItem;
      if (typeof item.batch !== "string" || !Number.isInteger(item.line) || typeof item.url !== "string" || typeof item.raw !== "string") throw new Error("not a work item");
    } catch {
      stats.invalid++;
      log.warn({ subject: m.subject, seq: m.seq }, "invalid work item dropped");
      m.term();
      return;
    }
    const b = view.batches.get(item.batch);
    if (!b) {
      // The view lags the queue by a few milliseconds at most; an item whose batch never shows up is dropped.
      if (m.info.deliveryCount > 20) {
        stats.invalid++;
        m.term();
      } else m.nak(500);
      return;
    }
    if (!RUNNING.has(b.status)) {
      stats.skippedFinished++;
      m.ack();
      return;
    }
    if (view.isDone(item.batch, item.line)) {
      stats.skippedDone++;
      m.ack();
      return;
    }
    stats.inFlight++;
    try {
      const r = await execute(item, m, b.owner_key);
      if (r === "retry") {
        stats.retried++;
        m.nak(retryDelayMs(m.info.deliveryCount));
      } else if (r === "done") m.ack();
    } finally {
      stats.inFlight--;
    }
  }

  const lanes = Array.from({ length: concurrency }, async () => {
    while (!stopped) {
      let m: JsMsg | null = null;
      try {
        m = await consumer.next({ expires: 2_000 });
      } catch (err) {
        if (stopped) return;
        log.warn({ err: (err as Error).message }, "pulling a batch item failed; retrying");
        await new Promise((r) => setTimeout(r, 500));
        continue;
      }
      if (!m) continue;
      const msg = m;
      await handle(m).catch((err: unknown) => {
        // Stopping: hand the item back at once rather than after the ack wait.
        if (stopped) msg.nak();
        else log.warn({ err, seq: m?.seq }, "a batch item failed; it is redelivered after the ack wait");
      });
    }
  });

  let metrics: { port: number; close(): void } | undefined;
  if (o.metricsPort !== undefined && o.metricsPort >= 0) {
    metrics = await startMetricsServer(o.metricsPort, o.metricsHost ?? "127.0.0.1", statsRegistry("batch_worker", () => stats), log);
  }
  log.info({ id, target, objective, concurrency }, "batch worker started");
  return {
    stats,
    store,
    ...(metrics ? { metricsPort: metrics.port } : {}),
    close: async () => {
      stopped = true;
      controller.abort();
      await Promise.allSettled(lanes);
      metrics?.close();
      store.close();
      if (ownsNats) await nats.nc.close();
    },
  };
}
