/**
 * Optional OpenTelemetry traces of the request path (off by default; `--otlp-endpoint`): a
 * `RequestTracer` collects each request's stage timings from the driver's stage observer and, when
 * its routing settles, hands the spans (trace-spans.ts) to an `OtlpTraceExporter`, which POSTs them
 * as OTLP/HTTP JSON to `<endpoint>/v1/traces` in batches. Observation only: a request never waits
 * for, nor fails because of, tracing; a full queue drops spans and counts them.
 */
import { randomBytes } from "node:crypto";
import type { RequestContext, RouteInput } from "../routing/mod.js";
import { RouteError } from "../routing/mod.js";
import type { Logger } from "../shared/log.js";
import type { RequestRouter } from "./extproc-server.js";
import { exportRequest, otlpEndpointError, type OtlpSpan, parseTraceparent, requestSpans, type StageTiming } from "./trace-spans.js";

export const DEFAULT_OTLP_SERVICE_NAME = "jetroute-gateway";

export interface OtlpExporterOptions {
  /** Base URL of the collector's OTLP/HTTP receiver; spans go to `<endpoint>/v1/traces`. */
  endpoint: string;
  serviceName?: string;
  /** Spans waiting to be sent, at most (the rest are dropped and counted). Default 4096. */
  maxQueue?: number;
  /** Spans per POST, at most; a full batch is sent at once. Default 512. */
  maxBatch?: number;
  /** How often a partial batch is sent (ms). Default 1000. */
  intervalMs?: number;
  /** A POST's timeout (ms). Default 5000. */
  timeoutMs?: number;
  log?: Logger;
}

export class OtlpTraceExporter {
  readonly url: string;
  readonly stats = { queued: 0, exported: 0, dropped: 0, failed: 0 };
  private queue: OtlpSpan[] = [];
  private sending: Promise<void> | undefined;
  private readonly timer: NodeJS.Timeout;
  private readonly maxQueue: number;
  private readonly maxBatch: number;
  private readonly timeoutMs: number;
  private readonly serviceName: string;
  private warned = false;

  constructor(private readonly opts: OtlpExporterOptions) {
    const err = otlpEndpointError(opts.endpoint);
    if (err) throw new Error(err);
    this.url = `${opts.endpoint.replace(/\/+$/, "")}/v1/traces`;
    this.maxQueue = opts.maxQueue ?? 4096;
    this.maxBatch = opts.maxBatch ?? 512;
    this.timeoutMs = opts.timeoutMs ?? 5000;
    this.serviceName = opts.serviceName ?? DEFAULT_OTLP_SERVICE_NAME;
    this.timer = setInterval(() => void this.flush(), opts.intervalMs ?? 1000);
    this.timer.unref();
  }

  /** Queues spans (never blocks); those beyond the bound are dropped and counted. */
  add(spans: readonly OtlpSpan[]): void {
    for (const s of spans) {
      if (this.queue.length >= this.maxQueue) this.stats.dropped++;
      else {
        this.queue.push(s);
        this.stats.queued++;
      }
    }
    if (this.queue.length >= this.maxBatch && !this.sending) void this.flush();
  }

  /** Sends what is queued, one batch at a time (one POST in flight); never rejects. */
  flush(): Promise<void> {
    if (this.sending) return this.sending;
    if (this.queue.length === 0) return Promise.resolve();
    this.sending = (async () => {
      while (this.queue.length > 0) {
        const batch = this.queue.splice(0, this.maxBatch);
        await this.post(batch);
      }
    })().finally(() => {
      this.sending = undefined;
    });
    return this.sending;
  }

  /** Stops the timer and sends what is left. */
  async close(): Promise<void> {
    clearInterval(this.timer);
    await this.flush();
  }

  private async post(batch: OtlpSpan[]): Promise<void> {
    try {
      const res = await fetch(this.url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(exportRequest(this.serviceName, batch)),
        redirect: "error",
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      await res.arrayBuffer().catch(() => undefined);
      if (!res.ok) throw new Error(`OTLP receiver answered ${res.status}`);
      this.stats.exported += batch.length;
    } catch (err) {
      this.stats.failed += batch.length;
      if (!this.warned) {
        this.warned = true;
        this.opts.log?.warn({ err, url: this.url }, "OTLP trace export failed; spans dropped (logged once)");
      }
    }
  }
}

/** Stage spans kept per request, at most (a strict commit's retries run the commit section again). */
const MAX_STAGES = 64;

interface Pending {
  readonly startMs: number;
  readonly stages: StageTiming[];
  model?: string;
  maxTokens?: number;
}

const wallNow = () => performance.timeOrigin + performance.now();

/** Collects each request's stage timeline and exports its spans when its routing settles. */
export class RequestTracer {
  private readonly open = new WeakMap<RouteInput, Pending>();

  constructor(
    private readonly exporter: Pick<OtlpTraceExporter, "add">,
    private readonly now: () => number = wallNow,
  ) {}

  /** The driver's stage observer (with the request's context): records the stage on the request's timeline. */
  stage(stage: string, seconds: number, ctx: RequestContext): void {
    const p = this.open.get(ctx.input);
    if (!p) return;
    if (p.model === undefined && ctx.parsed) {
      p.model = ctx.parsed.model;
      if (ctx.parsed.maxTokens !== undefined) p.maxTokens = ctx.parsed.maxTokens;
    }
    if (p.stages.length >= MAX_STAGES) return;
    const end = this.now();
    p.stages.push({ stage, startMs: end - seconds * 1000, endMs: end });
  }

  /** A router whose `route` is traced; everything else goes straight to `inner`. */
  wrap(inner: RequestRouter): RequestRouter {
    return {
      route: (input) => {
        this.open.set(input, { startMs: this.now(), stages: [] });
        let r: ReturnType<RequestRouter["route"]>;
        try {
          r = inner.route(input);
        } catch (err) {
          this.settle(input, undefined, err);
          throw err;
        }
        if (r instanceof Promise) {
          r.then(
            (x) => this.settle(input, x, undefined),
            (err: unknown) => this.settle(input, undefined, err),
          );
          return r;
        }
        this.settle(input, r, undefined);
        return r;
      },
      firstToken: (r) => inner.firstToken(r),
      finish: (r, outcome, info) => inner.finish(r, outcome, info),
      reject: (headers, model, err) => inner.reject(headers, model, err),
      ...(inner.abortDecode ? { abortDecode: (r) => inner.abortDecode?.(r) } : {}),
    };
  }

  private settle(input: RouteInput, routed: ReturnType<RequestRouter["route"]> | undefined, err: unknown): void {
    try {
      const p = this.open.get(input);
      if (!p) return;
      this.open.delete(input);
      const parent = parseTraceparent(input.headers.traceparent);
      // Parent-based sampling (OpenTelemetry's default): a client span not sampled is not continued.
      if (parent && !parent.sampled) return;
      // One draw for every id of the request: a trace id, the request span's and one per stage.
      const ids = randomBytes(16 + 8 * (1 + p.stages.length)).toString("hex");
      const r = routed instanceof Promise ? undefined : routed;
      const refusal =
        err === undefined ? undefined : err instanceof RouteError ? { type: err.code, message: err.message, ...(err.refusal ? { stage: err.refusal.stage } : {}) } : { type: "internal_error" };
      const model = p.model ?? (err instanceof RouteError ? err.refusal?.model : undefined);
      this.exporter.add(
        requestSpans({
          traceId: parent?.traceId ?? ids.slice(0, 32),
          spanId: ids.slice(32, 48),
          ...(parent ? { parentSpanId: parent.parentSpanId } : {}),
          stageSpanIds: p.stages.map((_, i) => ids.slice(48 + 16 * i, 64 + 16 * i)),
          startMs: p.startMs,
          endMs: this.now(),
          ...(input.headers[":path"] !== undefined ? { path: input.headers[":path"] } : {}),
          ...(model !== undefined ? { requestModel: model } : {}),
          ...(p.maxTokens !== undefined ? { maxTokens: p.maxTokens } : {}),
          stages: p.stages,
          ...(r ? { routed: { model: r.model, pod: r.pod.address, strategy: r.strategy } } : {}),
          ...(refusal ? { refusal } : {}),
        }),
      );
    } catch {
      // Tracing never fails a request.
    }
  }
}
