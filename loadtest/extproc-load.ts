/**
 * gRPC load generator for ext_proc servers: each simulated request is one ext_proc stream driven
 * as Envoy drives it (request headers, BUFFERED request body, response headers, STREAMED response
 * body, half-close). Closed loop: `concurrency` streams are in flight at all times; or paced
 * (`rate`): streams start every 1/rate seconds, at most `concurrency` in flight, so that a fixed
 * offered load does not grow with the server's speed (a slot missed while all streams are busy is
 * run late, not dropped, up to the end of the window).
 *
 * Run it in its own process when benchmarking (`node dist/loadtest/extproc-load.js --target ...`)
 * so it does not share an event loop with the server under test; it prints one JSON line.
 */
import { realpathSync } from "node:fs";
import http2 from "node:http2";
import { pathToFileURL } from "node:url";
import * as grpc from "@grpc/grpc-js";
import { Command, InvalidArgumentError } from "commander";
import { intOption } from "../services/shared/cli-options.js";
import { ExtProcClient, type ExtProcExchange, type Phase } from "../services/extproc/envoy-client.js";
import { EXT_PROC_METHOD_PATH, loadExtProc } from "../services/extproc/protos.js";
import type { ProcessingRequest, ProcessingResponse } from "../services/extproc/types.js";

export interface ExtProcLoadOptions {
  /** `host:port` of the ext_proc server. */
  target: string;
  /** Streams kept in flight. */
  concurrency: number;
  /** Length of the measured window. */
  durationMs: number;
  /** Stream starts per second (paced); undefined = closed loop. */
  rate?: number;
  /**
   * Wall-clock time (epoch ms) to start at, once the process is up: several generators started
   * together then load their targets over the same window, which a bench can sample exactly.
   */
  startAt?: number;
  /** Streams run but are not measured for this long first (JIT, connection setup). */
  warmupMs?: number;
  /** Approximate size of the chat-completions request body. */
  bodyBytes?: number;
  model: string;
  /** Extra request headers (e.g. `routing-strategy`). */
  headers?: Record<string, string>;
  /** Response body messages per stream; the last carries `end_of_stream`. */
  responseChunks?: number;
  messageTimeoutMs?: number;
  /** How each stream ends; see `ExtProcClientOptions.closeMode`. */
  closeMode?: "graceful" | "reset";
  /**
   * `http2` (default): pre-framed messages on raw HTTP/2 streams, cheap enough not to be the
   * bottleneck. `grpc-js`: the project's `ExtProcClient`, to cross-check the fast path.
   */
  transport?: "http2" | "grpc-js";
}

export interface ExtProcLoadResult {
  /** Streams that got every reply (or an immediate response) inside the measured window. */
  completed: number;
  /** Of those, streams ended early by an immediate response (e.g. 429/503 from the gateway). */
  immediate: number;
  errors: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  maxMs: number;
  concurrency: number;
  durationMs: number;
  /** The pacing asked for (stream starts per second), when paced. */
  rate?: number;
  /** With `startAt`: how late (ms) the window started after it (process start-up, timers). */
  startLateMs?: number;
  /**
   * The generator's own CPU use over the run, in % of one core. Near 100 means the generator,
   * not the server, set the pace.
   */
  generatorCpuPct: number;
  /** The first error's message, to tell a broken target from a slow one. */
  firstError?: string;
}

interface Step {
  phase: Phase;
  message: Buffer;
}

/** A chat-completions body of about `bytes` bytes; the prompt is padding. */
export function chatCompletionsBody(model: string, bytes: number): Buffer {
  const skeleton = { model, stream: true, messages: [{ role: "user", content: "" }] };
  const overhead = Buffer.byteLength(JSON.stringify(skeleton));
  const words = "the quick brown fox jumps over the lazy dog ";
  const need = Math.max(0, bytes - overhead);
  const content = words.repeat(Math.ceil(need / words.length)).slice(0, need);
  return Buffer.from(JSON.stringify({ ...skeleton, messages: [{ role: "user", content }] }));
}

/**
 * Serializes a stream's messages once: every simulated request sends the same bytes, so encoding
 * per request would only measure the generator.
 */
function encodeSteps(opts: ExtProcLoadOptions): Step[] {
  const method = loadExtProc().client.service.Process;
  if (!method) throw new Error("ext_proc service definition has no Process method");
  const encode = method.requestSerialize as (m: ProcessingRequest) => Buffer;
  const body = chatCompletionsBody(opts.model, opts.bodyBytes ?? 2048);
  const chunks = Math.max(1, opts.responseChunks ?? 1);
  const h = (record: Record<string, string>) => ({
    headers: Object.entries(record).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })),
  });
  const steps: Step[] = [
    {
      phase: "request_headers",
      message: encode({
        request_headers: {
          headers: h({
            ":authority": "jetroute-load",
            ":path": "/v1/chat/completions",
            ":method": "POST",
            ":scheme": "http",
            "content-type": "application/json",
            "content-length": String(body.length),
            ...opts.headers,
          }),
          end_of_stream: false,
        },
      }),
    },
    { phase: "request_body", message: encode({ request_body: { body, end_of_stream: true } }) },
    {
      phase: "response_headers",
      message: encode({
        response_headers: { headers: h({ ":status": "200", "content-type": "text/event-stream" }), end_of_stream: false },
      }),
    },
  ];
  const token = Buffer.from('data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n');
  for (let i = 0; i < chunks; i++) {
    const last = i === chunks - 1;
    const chunk = last ? Buffer.from("data: [DONE]\n\n") : token;
    steps.push({ phase: "response_body", message: encode({ response_body: { body: chunk, end_of_stream: last } }) });
  }
  return steps;
}

/** Runs simulated requests over one connection; `run` resolves true when a stream ended with an immediate response. */
interface StreamRunner {
  run(): Promise<boolean>;
  /** Cancels every stream in flight. */
  cancelAll(): void;
  close(): void;
}

/** The reference path: the same client the dev front and the integration tests use. */
function grpcJsRunner(opts: ExtProcLoadOptions, steps: Step[]): StreamRunner {
  const client = new ExtProcClient(opts.target, {
    messageTimeoutMs: opts.messageTimeoutMs ?? 30_000,
    closeMode: opts.closeMode ?? "graceful",
  });
  const inFlight = new Set<ExtProcExchange>();
  return {
    async run() {
      const ex = client.open();
      inFlight.add(ex);
      try {
        for (const step of steps) {
          if ((await ex.send(step.phase, step.message)).kind === "immediate") return true;
        }
        // Envoy closes the side stream without holding up the next request.
        void ex.end();
        return false;
      } finally {
        inFlight.delete(ex);
      }
    },
    cancelAll: () => {
      for (const ex of inFlight) ex.cancel();
    },
    close: () => client.close(),
  };
}

/**
 * The fast path. grpc-js spends about 200 us of client CPU per stream on call setup, twice what
 * the no-op server spends answering it, so a grpc-js generator would be what the benchmark
 * measures. This runner sends the pre-serialized messages on raw HTTP/2 streams with gRPC's
 * 5-byte length prefix and decodes each reply with the official proto loader (about 60 us per
 * stream in all).
 */
function http2Runner(opts: ExtProcLoadOptions, steps: Step[]): StreamRunner {
  const method = loadExtProc().client.service.Process;
  if (!method) throw new Error("ext_proc service definition has no Process method");
  const decode = method.responseDeserialize as (b: Buffer) => ProcessingResponse & { response?: string };
  const frames = steps.map((s) => ({ phase: s.phase, frame: grpcFrame(s.message) }));
  const timeoutMs = opts.messageTimeoutMs ?? 30_000;
  const reset = opts.closeMode === "reset";
  const requestHeaders = { ":method": "POST", ":path": EXT_PROC_METHOD_PATH, "content-type": "application/grpc", te: "trailers" };
  const inFlight = new Set<http2.ClientHttp2Stream>();
  let session: http2.ClientHttp2Session | undefined;
  const currentSession = () => {
    if (!session || session.closed || session.destroyed) {
      const s = http2.connect(`http://${opts.target}`);
      // Failures surface on the streams; the next stream after one reconnects.
      s.on("error", () => {});
      s.on("goaway", () => {
        if (session === s) session = undefined;
      });
      session = s;
    }
    return session;
  };

  const run = () =>
    new Promise<boolean>((resolve, reject) => {
      const stream = currentSession().request(requestHeaders);
      inFlight.add(stream);
      let next = 0;
      let pending: Buffer = Buffer.alloc(0);
      let settled = false;
      const timer = setTimeout(() => fail(new Error(`no ext_proc reply within ${timeoutMs} ms`)), timeoutMs);
      const done = (immediate: boolean) => {
        settled = true;
        clearTimeout(timer);
        inFlight.delete(stream);
        stream.end();
        if (reset) stream.close(http2.constants.NGHTTP2_CANCEL);
        resolve(immediate);
      };
      const fail = (err: Error) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        inFlight.delete(stream);
        stream.close(http2.constants.NGHTTP2_CANCEL);
        reject(err);
      };
      const onMessage = (msg: Buffer) => {
        const expected = frames[next]?.phase;
        const got = decode(msg).response;
        if (got === "immediate_response") return done(true);
        if (got !== expected) return fail(new Error(`expected a ${expected ?? "no"} reply, got ${got ?? "nothing"}`));
        next++;
        const f = frames[next];
        if (!f) return done(false);
        timer.refresh();
        stream.write(f.frame);
      };
      stream.on("data", (chunk: Buffer) => {
        pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
        while (!settled && pending.length >= 5) {
          if (pending[0] !== 0) return fail(new Error("compressed gRPC message: compression was never negotiated"));
          const len = pending.readUInt32BE(1);
          if (pending.length < 5 + len) break;
          const msg = pending.subarray(5, 5 + len);
          pending = pending.subarray(5 + len);
          onMessage(msg);
        }
      });
      const onStatus = (h: http2.IncomingHttpHeaders) => {
        const code = Number(h["grpc-status"] ?? "0");
        if (code !== 0) fail(new Error(`ext_proc stream failed: ${grpcStatusName(code)} ${decodeURIComponent(String(h["grpc-message"] ?? ""))}`));
      };
      stream.on("response", (h) => {
        if (h[":status"] !== 200) fail(new Error(`ext_proc stream failed: HTTP ${h[":status"]}`));
        else if (h["grpc-status"] !== undefined) onStatus(h);
      });
      stream.on("trailers", onStatus);
      stream.on("error", (err) => fail(new Error(`ext_proc stream failed: UNAVAILABLE ${err.message}`, { cause: err })));
      stream.on("close", () => fail(new Error("ext_proc stream closed before its last reply")));
      const first = frames[0];
      if (first) stream.write(first.frame);
    });

  return {
    run,
    cancelAll: () => {
      for (const s of inFlight) s.close(http2.constants.NGHTTP2_CANCEL);
    },
    close: () => {
      const s = session;
      if (!s) return;
      s.close();
      // Half-closed streams normally finish at once; a server that never ends them must not pin the process.
      setTimeout(() => s.destroy(), 1_000).unref();
    },
  };
}

function grpcFrame(message: Buffer): Buffer {
  const frame = Buffer.allocUnsafe(5 + message.length);
  frame[0] = 0;
  frame.writeUInt32BE(message.length, 1);
  message.copy(frame, 5);
  return frame;
}

function grpcStatusName(code: number): string {
  return grpc.status[code] ?? String(code);
}

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return 0;
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1));
  return sorted[idx] ?? 0;
}

const round = (x: number) => Math.round(x * 1000) / 1000;

export async function runExtProcLoad(opts: ExtProcLoadOptions): Promise<ExtProcLoadResult> {
  if (!(opts.concurrency >= 1)) throw new RangeError("concurrency must be >= 1");
  if (!(opts.durationMs > 0)) throw new RangeError("durationMs must be > 0");
  if (opts.rate !== undefined && !(opts.rate > 0)) throw new RangeError("rate must be > 0");
  const steps = encodeSteps(opts);
  const runner = (opts.transport ?? "http2") === "http2" ? http2Runner(opts, steps) : grpcJsRunner(opts, steps);
  if (opts.startAt !== undefined && opts.startAt > Date.now()) await new Promise((r) => setTimeout(r, (opts.startAt as number) - Date.now()));
  const start = performance.now();
  const startLateMs = opts.startAt === undefined ? undefined : Math.max(0, Date.now() - opts.startAt);
  const cpu0 = process.cpuUsage();
  const measureFrom = start + (opts.warmupMs ?? 0);
  // With startAt the window ends at startAt + warm-up + duration whatever the start-up delay, so
  // several generators (and whoever samples CPU over that window) cover the same interval.
  const windowMs = Math.max(1, opts.durationMs - (startLateMs ?? 0));
  const stopAt = measureFrom + windowMs;
  const latencies: number[] = [];
  let immediate = 0;
  let errors = 0;
  let firstError: string | undefined;
  let stopping = false;
  // Paced: the next free start slot; every worker takes one, waits for it, then runs its stream.
  const gapMs = opts.rate === undefined ? 0 : 1000 / opts.rate;
  let nextSlot = start;
  const waitForSlot = async (): Promise<void> => {
    if (gapMs === 0) return;
    const slot = nextSlot;
    nextSlot += gapMs;
    const wait = slot - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  };

  const worker = async (): Promise<void> => {
    while (!stopping) {
      await waitForSlot();
      if (stopping) break;
      const t0 = performance.now();
      try {
        const wasImmediate = await runner.run();
        const t1 = performance.now();
        if (t0 >= measureFrom && t1 <= stopAt) {
          latencies.push(t1 - t0);
          if (wasImmediate) immediate++;
        }
      } catch (err) {
        if (stopping || t0 < measureFrom) continue;
        errors++;
        firstError ??= err instanceof Error ? err.message : String(err);
        // A target that fails instantly must not turn the loop into a busy spin.
        await new Promise((r) => setTimeout(r, 1));
      }
    }
  };

  const stopTimer = setTimeout(() => {
    stopping = true;
    // Streams still open at the end of the window are not measured; stop them now.
    runner.cancelAll();
  }, stopAt - start);
  try {
    await Promise.all(Array.from({ length: opts.concurrency }, worker));
  } finally {
    clearTimeout(stopTimer);
    runner.close();
  }

  const cpu = process.cpuUsage(cpu0);
  const wallMs = performance.now() - start;
  const sorted = Float64Array.from(latencies).sort();
  const sum = latencies.reduce((a, b) => a + b, 0);
  const result: ExtProcLoadResult = {
    completed: latencies.length,
    immediate,
    errors,
    rps: round(latencies.length / (windowMs / 1000)),
    p50Ms: round(percentile(sorted, 0.5)),
    p99Ms: round(percentile(sorted, 0.99)),
    meanMs: round(latencies.length ? sum / latencies.length : 0),
    maxMs: round(sorted.length ? (sorted[sorted.length - 1] ?? 0) : 0),
    concurrency: opts.concurrency,
    durationMs: opts.durationMs,
    ...(opts.rate !== undefined ? { rate: opts.rate } : {}),
    ...(startLateMs !== undefined ? { startLateMs } : {}),
    generatorCpuPct: Math.round(((cpu.user + cpu.system) / 1000 / wallMs) * 1000) / 10,
  };
  if (firstError !== undefined) result.firstError = firstError;
  return result;
}

function transportKind(v: string): "http2" | "grpc-js" {
  if (v !== "http2" && v !== "grpc-js") throw new InvalidArgumentError("transport must be http2 or grpc-js");
  return v;
}

function closeMode(v: string): "graceful" | "reset" {
  if (v !== "graceful" && v !== "reset") throw new InvalidArgumentError("close-mode must be graceful or reset");
  return v;
}

function headerPair(v: string, acc: Record<string, string>): Record<string, string> {
  const i = v.indexOf(":");
  if (i <= 0) throw new InvalidArgumentError(`header must be name:value, got ${v}`);
  acc[v.slice(0, i).trim().toLowerCase()] = v.slice(i + 1).trim();
  return acc;
}

export async function main(argv: string[]): Promise<void> {
  const program = new Command("extproc-load")
    .description("ext_proc load generator (closed loop, or paced with --rate); prints one JSON result line")
    .requiredOption("--target <host:port>", "ext_proc server")
    .option("--concurrency <n>", "streams in flight", intOption(1), 64)
    .option("--duration-ms <ms>", "measured window", intOption(1), 5_000)
    .option("--rate <n>", "paced: stream starts per second (at most --concurrency in flight); default closed loop", intOption(1))
    .option("--warmup-ms <ms>", "unmeasured warm-up", intOption(0), 1_000)
    .option("--start-at <epoch-ms>", "start at this wall-clock time (ms since the epoch), to line several generators up", intOption(0))
    .option("--body-bytes <n>", "request body size", intOption(0), 2_048)
    .option("--model <name>", "model in the request body", "sim-model")
    .option("--response-chunks <n>", "response body messages per stream", intOption(1), 1)
    .option("--message-timeout-ms <ms>", "per-message timeout", intOption(1), 30_000)
    .option("--transport <kind>", "http2 (fast) or grpc-js (reference client)", transportKind, "http2")
    .option("--close-mode <mode>", "graceful (wait for the server's status) or reset (cancel after half-close)", closeMode, "graceful")
    .option("--header <name:value>", "extra request header (repeatable)", headerPair, {} as Record<string, string>)
    .showHelpAfterError();
  program.parse(argv);
  const o = program.opts<{
    target: string;
    concurrency: number;
    durationMs: number;
    rate?: number;
    startAt?: number;
    warmupMs: number;
    bodyBytes: number;
    model: string;
    responseChunks: number;
    messageTimeoutMs: number;
    closeMode: "graceful" | "reset";
    transport: "http2" | "grpc-js";
    header: Record<string, string>;
  }>();
  const result = await runExtProcLoad({
    target: o.target,
    concurrency: o.concurrency,
    durationMs: o.durationMs,
    ...(o.rate !== undefined ? { rate: o.rate } : {}),
    ...(o.startAt !== undefined ? { startAt: o.startAt } : {}),
    warmupMs: o.warmupMs,
    bodyBytes: o.bodyBytes,
    model: o.model,
    responseChunks: o.responseChunks,
    messageTimeoutMs: o.messageTimeoutMs,
    closeMode: o.closeMode,
    transport: o.transport,
    headers: o.header,
  });
  process.stdout.write(`${JSON.stringify(result)}\n`);
  // The result is out; nothing left in flight may keep a benchmark step waiting.
  setTimeout(() => process.exit(0), 1_000).unref();
}

function isEntryPoint(): boolean {
  const script = process.argv[1];
  if (!script) return false;
  try {
    return import.meta.url === pathToFileURL(realpathSync(script)).href;
  } catch {
    return false;
  }
}

if (isEntryPoint()) {
  main(process.argv).catch((err: unknown) => {
    process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  });
}
