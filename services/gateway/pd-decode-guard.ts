/**
 * The decode side of a disaggregated (P/D) request, as the ext_proc adapter watches it: the decode
 * watchdog (no first chunk, or no next one, in time) and the gateway's own error, which ends the
 * request with an immediate OpenAI error before the response started, or after it as a last SSE
 * event spliced in before the engine's `[DONE]` (clients stop reading there), or by a reset after a
 * grace period when the engine's stream does not end. One per exchange, made only for P/D requests.
 */
import { RouteError, routeErrorBody, type RoutedRequest } from "../routing/mod.js";
import type { ProcessingResponse } from "../extproc/types.js";

/** Decode watchdog of disaggregated requests (AIBrix's defaults: 60 s to the first chunk, 120 s between chunks). */
export interface PdWatchdog {
  firstChunkMs: number;
  idleMs: number;
  /** After the engine was told to stop mid-stream: how long its stream may take to end before the gateway resets it. */
  graceMs?: number;
}

export const DEFAULT_PD_WATCHDOG: Readonly<PdWatchdog> = { firstChunkMs: 60_000, idleMs: 120_000, graceMs: 1_000 };

/** What the guard needs of its exchange. */
export interface DecodeGuardHost {
  readonly watchdog: PdWatchdog;
  /** The stream is over (ended or cancelled): nothing more is sent or finished. */
  over(): boolean;
  /** The response headers reached the gateway: an error can only travel in the body now. */
  responseStarted(): boolean;
  /** Answers with an immediate OpenAI error (Envoy acts on one whenever it arrives). */
  immediate(err: RouteError): void;
  /** Ends the routed request as the gateway's error. */
  fail(r: RoutedRequest, err: RouteError): void;
  /** Asks the decode engine to stop (SGLang `/abort_request`). */
  abortDecode?(r: RoutedRequest): void;
}

export class DecodeGuard {
  private timer: NodeJS.Timeout | undefined;
  /** The error that ended the decode after its response had started. */
  private failure: RouteError | undefined;

  constructor(
    private readonly r: RoutedRequest,
    private readonly host: DecodeGuardHost,
  ) {}

  /** The gateway's error for a decode it ended after the response started (sent in the body). */
  get error(): RouteError | undefined {
    return this.failure;
  }

  /** The decode was routed: watch for its first chunk (streams only: a whole answer arrives at its end). */
  routed(): void {
    if (this.r.stream) this.arm(this.host.watchdog.firstChunkMs, "no first chunk");
  }

  /** A response chunk arrived: watch for the next one. */
  chunk(endOfStream: boolean, bytes: number): void {
    if (this.r.stream && !this.failure && !endOfStream && bytes > 0) this.arm(this.host.watchdog.idleMs, "no next chunk");
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private arm(ms: number, what: string): void {
    this.stop();
    const r = this.r;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (r.finished || this.host.over()) return;
      this.host.abortDecode?.(r);
      this.end(new RouteError("decodeTimeout", `decode on ${r.pod.pod}: ${what} within ${ms} ms`));
    }, ms);
    this.timer.unref?.();
  }

  /**
   * Ends the decode from the gateway's side. Before response headers: an immediate error. After:
   * the error goes out as a last SSE event when the engine ends its stream, or the stream is reset
   * after the grace period.
   */
  end(err: RouteError): void {
    const r = this.r;
    if (r.finished || this.host.over()) return;
    this.stop();
    if (!this.host.responseStarted()) {
      this.host.immediate(err);
      this.host.fail(r, err);
      return;
    }
    this.failure ??= err;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (r.finished || this.host.over()) return;
      this.host.immediate(err);
      this.host.fail(r, err);
    }, this.host.watchdog.graceMs ?? 1_000);
    this.timer.unref?.();
  }

  /**
   * A streamed (SSE) response chunk after the gateway ended the decode: the engine's `[DONE]` is
   * dropped and, at the stream's end, the error and a `[DONE]` of the gateway's are spliced in.
   * Undefined when the guard has no error to splice.
   */
  splice(body: Uint8Array | undefined, endOfStream: boolean): ProcessingResponse | undefined {
    const err = this.failure;
    if (!err) return undefined;
    const text = Buffer.from(body ?? []).toString("utf8").replaceAll("data: [DONE]\n\n", "");
    const tail = endOfStream ? `data: ${JSON.stringify(routeErrorBody(err))}\n\ndata: [DONE]\n\n` : "";
    if (endOfStream) this.stop();
    return { response_body: { response: { status: "CONTINUE", body_mutation: { body: Buffer.from(text + tail) } } } };
  }
}
