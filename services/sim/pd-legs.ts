/**
 * How a pod serves the two legs of prefill/decode disaggregation, per engine and role. It turns a
 * request's P/D fields into generation hooks (see generate.ts) and answers the KV channel:
 *
 * vLLM (NixlConnector, synchronous): a prefill leg (`kv_transfer_params.do_remote_decode`) runs,
 * keeps its blocks under its request id and answers with the params a decode needs; the decode leg
 * reads the KV over the prefill's side channel, which frees the prefill's blocks. A decode with
 * incomplete params, or whose read fails, computes the prompt itself (vLLM's recompute policy).
 *
 * SGLang (bootstrap, asynchronous): both legs arrive at once with the same bootstrap room. The
 * prefill runs, then waits until the decode takes its KV and only then answers; the decode waits on
 * the prefill's bootstrap server for the room. Either side gives up after `disaggTimeoutMs`.
 * (Real SGLang lets the prefill wait for the decode's handshake before computing; here the prefill
 * computes first, which shows the same waits on both sides.)
 */
import type { PodRole } from "../../schemas/events.js";
import type { SimClock } from "./clock.js";
import { ApiError, badRequest } from "./errors.js";
import type { FaultState } from "./faults.js";
import { DEFAULT_SIDE_CHANNEL_DELAY_MS } from "./faults.js";
import type { GenerationHooks, HeldBlocks } from "./generate.js";
import type { HeldKvRegistry } from "./held-kv.js";
import { type ChannelFault, KvChannelError, kvChannelRequest } from "./kv-channel.js";
import type { EngineKind } from "./metrics.js";
import { parseBootstrap, parseKvTransferParams } from "./pd-params.js";
import type { PdStats } from "./pd-stats.js";
import type { GenerationRequest } from "./requests.js";

export interface PdTimings {
  /** vLLM: how long a finished prefill holds its blocks for the decode (simulated ms). */
  kvAbortTimeoutMs: number;
  /** SGLang: how long decode waits for the room and prefill for the decode (simulated ms). */
  disaggTimeoutMs: number;
  /** vLLM: a side-channel read gives up after this many wall ms. */
  kvReadTimeoutMs: number;
  /** Simulated time to move one block's KV from prefill to decode. */
  kvTransferMsPerBlock: number;
}

/** What the legs need from their pod; the engine-bound parts are getters because a restart swaps them. */
export interface PdPod {
  engine: EngineKind;
  role: PodRole;
  /** Identifies the current engine incarnation (vLLM's engine id); changes on restart. */
  engineId(): string;
  clock(): SimClock;
  held(): HeldKvRegistry;
  stats(): PdStats;
  faults: FaultState;
  timings: PdTimings;
  /** The vLLM side channel's advertised address. */
  sideChannel: { host: string; port: number } | undefined;
}

type Schedule = (fn: () => void) => () => void;
const afterSimMs =
  (clock: SimClock, ms: number): Schedule =>
  (fn) =>
    clock.at(clock.now() + ms, fn);
const afterWallMs =
  (ms: number): Schedule =>
  (fn) => {
    const t = setTimeout(fn, ms);
    return () => clearTimeout(t);
  };

/** Fires when `schedule` says so or when `parent` fires, whichever is first. */
function deadline(schedule: Schedule, parent: AbortSignal): { signal: AbortSignal; cancel(): void } {
  const ac = new AbortController();
  const onParent = (): void => ac.abort();
  const cancelTimer = schedule(() => ac.abort());
  parent.addEventListener("abort", onParent, { once: true });
  if (parent.aborted) ac.abort();
  return {
    signal: ac.signal,
    cancel() {
      cancelTimer();
      parent.removeEventListener("abort", onParent);
    },
  };
}

/** Waits `ms` simulated ms (the KV transfer itself); rejects if `signal` fires first. */
function transferTime(clock: SimClock, ms: number, signal: AbortSignal): Promise<void> {
  if (ms <= 0) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const onAbort = (): void => {
      cancel();
      reject(new Error("aborted"));
    };
    const cancel = clock.at(clock.now() + ms, () => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    });
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** The hooks for one generation request; may also adjust `gen` (SGLang's prefill answers one token, not streamed). */
export function pdHooks(pod: PdPod, body: Record<string, unknown>, raw: string, gen: GenerationRequest, requestId: string): GenerationHooks {
  return pod.engine === "vllm" ? vllmHooks(pod, body, requestId) : sglangHooks(pod, body, raw, gen);
}

function vllmHooks(pod: PdPod, body: Record<string, unknown>, requestId: string): GenerationHooks {
  const intent = parseKvTransferParams(body.kv_transfer_params);
  const stats = pod.stats();
  if (intent.kind === "prefill" && pod.role !== "decode" && pod.sideChannel) {
    const side = pod.sideChannel;
    return {
      hold: {
        async after(kv: HeldBlocks) {
          const ok = pod.held().hold(requestId, {
            blocks: kv.blockIds.length,
            release: kv.release,
            onEnd: (how) => {
              if (how === "expired") stats.leaks++;
            },
          }, pod.timings.kvAbortTimeoutMs);
          if (!ok) {
            kv.release();
            throw new ApiError(503, "ServiceUnavailableError", "Too many prefills wait for their decode");
          }
          return {
            kv_transfer_params: {
              do_remote_prefill: true,
              do_remote_decode: false,
              remote_block_ids: kv.blockIds,
              remote_engine_id: pod.engineId(),
              remote_request_id: requestId,
              remote_host: side.host,
              remote_port: side.port,
              tp_size: 1,
            },
          };
        },
      },
    };
  }
  if (pod.role === "prefill") return {};
  if (intent.kind === "incomplete") {
    stats.misses++;
    return {};
  }
  if (intent.kind === "none") {
    if (pod.role === "decode") stats.localPrefills++;
    return {};
  }
  if (intent.kind !== "decode") return {};
  return {
    async before(signal) {
      // The read timeout is wall time, whatever the time scale: it stands for a network timeout.
      const read = deadline(afterWallMs(pod.timings.kvReadTimeoutMs), signal);
      let answer: Record<string, unknown>;
      try {
        answer = await kvChannelRequest(intent.host, intent.port, { op: "read", request_id: intent.requestId, engine_id: intent.engineId }, read.signal);
      } catch (err) {
        if (signal.aborted) throw err;
        stats.failures[err instanceof KvChannelError ? err.reason : "refused"]++;
        return { prefilled: false };
      } finally {
        read.cancel();
      }
      if (answer.ok !== true || typeof answer.blocks !== "number") {
        stats.failures[answer.error === "unknown_request" ? "unknown_request" : "bad_response"]++;
        return { prefilled: false };
      }
      stats.reads++;
      // The read stands for a control message: its wall time, multiplied by the time scale, would
      // dwarf the transfer, so the decode's latency starts when the read is answered.
      const readAtMs = pod.clock().now();
      await transferTime(pod.clock(), answer.blocks * pod.timings.kvTransferMsPerBlock, signal);
      return { prefilled: true, arrivedAtMs: readAtMs };
    },
  };
}

function sglangHooks(pod: PdPod, body: Record<string, unknown>, raw: string, gen: GenerationRequest): GenerationHooks {
  const info = parseBootstrap(body, raw);
  const stats = pod.stats();
  if (pod.role === "decode" && !info) {
    throw badRequest("A decode server needs bootstrap_host, bootstrap_port and bootstrap_room on every request");
  }
  if (!info || pod.role === "combined") return {};
  if (pod.role === "prefill") {
    gen.maxTokens = 1;
    gen.stream = false;
    gen.includeUsage = false;
    return {
      hold: {
        after(kv: HeldBlocks, signal: AbortSignal) {
          return new Promise<Record<string, unknown>>((resolve, reject) => {
            const held = pod.held();
            stats.prefillBootstrapQueue++;
            const entry = {
              blocks: kv.blockIds.length,
              release: kv.release,
              onEnd: (how: "taken" | "expired" | "dropped") => {
                stats.prefillBootstrapQueue--;
                signal.removeEventListener("abort", onAbort);
                if (how === "taken") return resolve({});
                if (how === "expired") stats.leaks++;
                reject(new ApiError(500, "InternalServerError", `KV transfer for bootstrap room ${info.room} ${how === "expired" ? "timed out waiting for the decode" : "was dropped"}`));
              },
            };
            const onAbort = (): void => held.drop(info.room, entry);
            if (!held.hold(info.room, entry, pod.timings.disaggTimeoutMs)) {
              stats.prefillBootstrapQueue--;
              kv.release();
              reject(new ApiError(503, "ServiceUnavailableError", "Too many prefills wait for their decode"));
              return;
            }
            signal.addEventListener("abort", onAbort, { once: true });
          });
        },
      },
    };
  }
  return {
    async before(signal) {
      const wait = deadline(afterSimMs(pod.clock(), pod.timings.disaggTimeoutMs), signal);
      stats.decodePreallocQueue++;
      let answer: Record<string, unknown>;
      try {
        answer = await kvChannelRequest(info.host, info.port, { op: "wait", room: info.room }, wait.signal);
      } catch (err) {
        if (signal.aborted) throw err;
        const reason = err instanceof KvChannelError ? err.reason : "refused";
        stats.failures[reason]++;
        throw new ApiError(500, "InternalServerError", `KV transfer from ${info.host}:${info.port} failed (${reason}) for bootstrap room ${info.room}`);
      } finally {
        wait.cancel();
        stats.decodePreallocQueue--;
      }
      if (answer.ok !== true || typeof answer.blocks !== "number") {
        stats.failures.bad_response++;
        throw new ApiError(500, "InternalServerError", `KV transfer from ${info.host}:${info.port} failed for bootstrap room ${info.room}`);
      }
      stats.reads++;
      await transferTime(pod.clock(), answer.blocks * pod.timings.kvTransferMsPerBlock, signal);
      return { prefilled: true };
    },
  };
}

/** The KV channel's answer to one request line, for the pod's own side channel or bootstrap server. */
export function answerKvChannel(pod: PdPod, request: Record<string, unknown>, signal: AbortSignal): Promise<Record<string, unknown>> {
  const held = pod.held();
  if (request.op === "read" && typeof request.request_id === "string") {
    if (request.engine_id !== pod.engineId()) return Promise.resolve({ ok: false, error: "unknown_request" });
    const blocks = held.take(request.request_id);
    return Promise.resolve(blocks === undefined ? { ok: false, error: "unknown_request" } : { ok: true, blocks });
  }
  if (request.op === "wait" && typeof request.room === "string") {
    return held.waitAndTake(request.room, signal).then((blocks) => ({ ok: true, blocks }));
  }
  return Promise.resolve({ ok: false, error: "bad_request" });
}

/** The fault the pod's channel server should apply right now. */
export function channelFault(pod: PdPod): ChannelFault {
  const f = pod.faults.current;
  const mode = pod.engine === "vllm" ? f.sideChannel : f.bootstrap;
  if (mode === "refuse") return { kind: "refuse" };
  if (mode === "drop") return { kind: "drop" };
  if (mode === "delay") return { kind: "delay", ms: f.sideChannelDelayMs ?? DEFAULT_SIDE_CHANNEL_DELAY_MS };
  return { kind: "ok" };
}
