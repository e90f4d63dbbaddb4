/**
 * Counters of the prefill/decode legs on one pod, rendered next to the engine's own metrics and
 * returned under `pd` in `/debug/state`. Failure reasons are a closed set, so the label is bounded.
 */
import type { EngineKind } from "./metrics.js";
import { Exposition, type Labels } from "./prom-text.js";

export const TRANSFER_FAILURE_REASONS = ["refused", "timeout", "unknown_request", "bad_response"] as const;
export type TransferFailureReason = (typeof TRANSFER_FAILURE_REASONS)[number];

export interface PdSnapshot {
  /** Decode legs that got their prompt's KV from a prefill engine. */
  reads: number;
  /** vLLM decode legs whose kv_transfer_params lacked a field: computed locally. */
  misses: number;
  /** Requests without P/D params on a decode-role pod: computed locally. */
  localPrefills: number;
  failures: Record<TransferFailureReason, number>;
  /** Held prefill KV freed because no decode came for it in time. */
  leaks: number;
  /** Finished prefills whose blocks are held for a decode right now. */
  heldRequests: number;
  /** SGLang decode legs waiting for their room's KV (sglang:num_decode_prealloc_queue_reqs). */
  decodePreallocQueue: number;
  /** SGLang prefill legs waiting for a decode to take the KV (sglang:num_prefill_bootstrap_queue_reqs). */
  prefillBootstrapQueue: number;
}

export class PdStats {
  reads = 0;
  misses = 0;
  localPrefills = 0;
  leaks = 0;
  decodePreallocQueue = 0;
  prefillBootstrapQueue = 0;
  readonly failures: Record<TransferFailureReason, number> = { refused: 0, timeout: 0, unknown_request: 0, bad_response: 0 };

  snapshot(heldRequests: number): PdSnapshot {
    return {
      reads: this.reads,
      misses: this.misses,
      localPrefills: this.localPrefills,
      failures: { ...this.failures },
      leaks: this.leaks,
      heldRequests,
      decodePreallocQueue: this.decodePreallocQueue,
      prefillBootstrapQueue: this.prefillBootstrapQueue,
    };
  }
}

export function renderPdMetrics(engine: EngineKind, model: string, s: PdSnapshot): string {
  const labels: Labels = { model_name: model };
  const one = (v: number): Array<[Labels, number]> => [[labels, v]];
  const e = new Exposition()
    .counter("jetroute_sim_kv_transfer_reads_total", "Decode requests that read their prompt's KV from a prefill engine.", one(s.reads))
    .counter("jetroute_sim_kv_transfer_misses_total", "Decode requests whose kv_transfer_params were incomplete (prefill recomputed).", one(s.misses))
    .counter("jetroute_sim_kv_transfer_local_prefills_total", "Requests without P/D params computed on a decode pod.", one(s.localPrefills))
    .counter(
      "jetroute_sim_kv_transfer_failures_total",
      "KV transfers that failed, by reason.",
      TRANSFER_FAILURE_REASONS.map((reason) => [{ ...labels, reason }, s.failures[reason]]),
    )
    .counter("jetroute_sim_kv_transfer_leaks_total", "Held prefill KV freed by timeout because no decode read it.", one(s.leaks))
    .gauge("jetroute_sim_kv_transfer_held_requests", "Finished prefills whose KV blocks are held for a decode.", one(s.heldRequests));
  if (engine === "sglang") {
    e.gauge("sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue.", one(s.prefillBootstrapQueue));
    e.gauge("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.", one(s.decodePreallocQueue));
  }
  return e.toString();
}
