/**
 * Stream and bucket definitions, as code. `applyStreams` makes the server match them.
 *
 * Everything here runs on nats-server 2.9.10: file storage (memory storage degrades linearly
 * for last-by-subject lookups on 2.9), one subject filter per consumer, no per-message TTL.
 * Expiry of charges is enforced by readers; `max_age` is only garbage collection.
 */
import { DiscardPolicy, RetentionPolicy, StorageType, type StreamConfig } from "@nats-io/jetstream";
import { Subjects } from "./subjects.js";

const SECOND_NS = 1_000_000_000;
const MINUTE_NS = 60 * SECOND_NS;
const HOUR_NS = 60 * MINUTE_NS;
const MiB = 1024 * 1024;
/** How long a response is kept (its location and its items): OpenAI keeps stored responses 30 days. */
export const RESPONSE_RETENTION_DAYS = 30;

export type StreamKey = "PODS" | "LOAD" | "KV" | "CHARGES" | "DECISIONS" | "DLQ" | "USAGE" | "AUTOSCALE" | "ADAPTERS" | "BATCH" | "BATCH_WORK" | "BATCH_RESULTS" | "RESPONSES" | "RESPONSE_STORE";

export interface StreamDefinition {
  key: StreamKey;
  /** The fields jetroute owns; anything else on the server is left as the operator set it. */
  config: Pick<
    StreamConfig,
    | "name"
    | "subjects"
    | "retention"
    | "storage"
    | "discard"
    | "max_age"
    | "max_bytes"
    | "max_msgs_per_subject"
    | "duplicate_window"
    | "allow_direct"
    | "num_replicas"
  >;
  purpose: string;
}

export interface StreamOptions {
  prefix?: string;
  /** The prefix of the config bucket, when `prefix` is a gateway pool's namespace (streams/pools.ts). */
  configPrefix?: string;
  /** Replicas per stream (3 on a 3-node cluster). */
  replicas?: number;
}

export function streamName(prefix: string, key: StreamKey): string {
  return `${prefix.toUpperCase().replace(/[^A-Z0-9_-]/g, "_")}_${key}`;
}

export function configBucketName(prefix: string): string {
  return `${prefix.replace(/[^A-Za-z0-9_-]/g, "_")}-config`;
}

/** KV bucket holding the prefix-index snapshot lease (see services/gateway/snapshots.ts). */
export const leaseBucketName = (prefix: string): string => `${prefix.replace(/[^A-Za-z0-9_-]/g, "_")}-leases`;
/** Object store holding the Batch API's files (inputs, outputs, errors). */
export const filesBucketName = (prefix: string): string => `${prefix.replace(/[^A-Za-z0-9_-]/g, "_")}-files`;
/** Object store holding prefix-index snapshots. */
export const snapshotBucketName = (prefix: string): string => `${prefix.replace(/[^A-Za-z0-9_-]/g, "_")}-snapshots`;

export function streamDefinitions(opts: StreamOptions = {}): StreamDefinition[] {
  const s = new Subjects(opts.prefix);
  const replicas = opts.replicas ?? 1;
  const base = {
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    discard: DiscardPolicy.Old,
    allow_direct: true,
    num_replicas: replicas,
    duplicate_window: 2 * MINUTE_NS,
  };
  const def = (key: StreamKey, purpose: string, cfg: Partial<StreamDefinition["config"]>): StreamDefinition => ({
    key,
    purpose,
    config: { ...base, name: streamName(s.prefix, key), subjects: [], max_age: 0, max_bytes: -1, max_msgs_per_subject: -1, ...cfg },
  });
  // A pool's namespace (a config prefix other than its own) shares the base prefix's USAGE stream.
  const pooled = opts.configPrefix !== undefined && opts.configPrefix !== s.prefix;
  return [
    def("PODS", "pod readiness; last message per subject is the pod's state", {
      subjects: [s.all("pods"), s.all("podsrc")],
      max_msgs_per_subject: 5,
      max_age: 30 * 24 * HOUR_NS,
    }),
    // Gateways read only the newest sample per pod (last per subject); the history is kept for
    // `jetroute replay`, which rebuilds the load view as of each decision.
    def("LOAD", "engine load samples; gateways read the newest per pod, replay the last 10 minutes", {
      subjects: [s.all("load")],
      max_age: 10 * MINUTE_NS,
      max_bytes: 1024 * MiB,
    }),
    def("KV", "KV cache block events per pod; snapshots cover anything older", {
      subjects: [s.all("kv")],
      max_age: HOUR_NS,
      max_bytes: 1024 * MiB,
      duplicate_window: 10 * MINUTE_NS,
    }),
    def("CHARGES", "provisional charges, releases and gateway heartbeats", {
      subjects: [s.all("charges"), s.all("releases"), s.all("hb")],
      max_age: 30 * MINUTE_NS,
      max_bytes: 512 * MiB,
    }),
    def("DECISIONS", "one record per request: the input of offline replay", {
      subjects: [s.all("decisions")],
      max_age: 72 * HOUR_NS,
      max_bytes: 2048 * MiB,
    }),
    // Dead letters carry a Msg-Id per source message (services/shared/dead-letter.ts): an hour is
    // as long as LOAD, KV, CHARGES and USAGE keep what a rebooting reader re-reads, and longer than
    // a crash loop's back-off, so a re-read adds no entry. (A bad PODS record that stays its pod's
    // last can come back once an hour of reboots.) The server holds the ids of the last hour in
    // memory: a few tens of bytes per dead letter.
    def("DLQ", "dead letters: messages a consumer could not validate", {
      subjects: [s.all("dlq")],
      max_age: 7 * 24 * HOUR_NS,
      max_bytes: 256 * MiB,
      duplicate_window: HOUR_NS,
    }),
    // One record per policy per evaluation (1 s by default, ~1 KB): a week of one policy is ~600 MB
    // at most; max_bytes bounds many policies together.
    def("AUTOSCALE", "autoscaling recommendations: every evaluation's inputs, arithmetic and result", {
      subjects: [s.all("autoscale")],
      max_age: 7 * 24 * HOUR_NS,
      max_bytes: 1024 * MiB,
    }),
    // One record per placement decision of an adapter (~1 KB); gateways read the last per subject
    // (the adapter's current placement), the history says why each adapter moved.
    def("ADAPTERS", "LoRA adapter placement decisions; the last per adapter is where it is loaded", {
      subjects: [s.all("adapters")],
      max_age: 7 * 24 * HOUR_NS,
      max_bytes: 512 * MiB,
    }),
    // Each summary is a whole rate window's counts, so only the newest per gateway process matters
    // to a gateway (it reads the last per subject), for three minutes, which outlive the window a
    // summary counts in. Summaries are small (about 40 bytes per listed user).
    ...(pooled
      ? []
      : [
          def("USAGE", "per-user rate-limit usage of every gateway, shared by every pool (base prefix only)", {
            subjects: [s.all("usage")],
            max_age: 3 * MINUTE_NS,
            // One subject per gateway process, its newest summary only: 64 MiB (the servers reserve
            // it) holds ~64 processes listing 10,000 users each, or thousands of small summaries.
            max_bytes: 64 * MiB,
            max_msgs_per_subject: 1,
          }),
          // The Batch API (docs/batch.md), base prefix only. Job events: a file's records and a
          // batch's lifecycle, kept as long as files are (30 days); every batch-api replica folds
          // them. A batch is at most a few dozen events; a file one or two.
          def("BATCH", "Batch API: file records and batch job events (event-sourced job state)", {
            subjects: [s.all("batch")],
            max_age: 30 * 24 * HOUR_NS,
            max_bytes: 1024 * MiB,
          }),
          // The items to run: one message per request line, removed when a worker acks it. Kept
          // past the 24 h completion window only so an expired batch's leftovers are purged, not lost.
          def("BATCH_WORK", "Batch API: the items of running batches, a work queue pulled by batch-workers", {
            subjects: [s.all("batchwork")],
            retention: RetentionPolicy.Workqueue,
            max_age: 48 * HOUR_NS,
            max_bytes: 4096 * MiB,
          }),
          // One message per executed item; read back when a batch's output file is assembled.
          // A week outlives every completion window and a stuck finalisation's retries.
          def("BATCH_RESULTS", "Batch API: one result per executed item (idempotent by batch and line)", {
            subjects: [s.all("batchres")],
            max_age: 7 * 24 * HOUR_NS,
            max_bytes: 4096 * MiB,
          }),
          // The Responses API (docs/stateful-apis.md), base prefix only: a conversation may change
          // models (and so pools) between turns, and a tenant's responses are one set.
          // Where each response lives: one small record per response (~300 bytes), the last per
          // subject only (a deletion replaces it). Every gateway replica folds it from the start.
          def("RESPONSES", "Responses API: the pod, model and tenant of every recorded response (folded by every gateway)", {
            subjects: [s.all("resploc")],
            max_age: RESPONSE_RETENTION_DAYS * 24 * HOUR_NS,
            max_bytes: 512 * MiB,
            max_msgs_per_subject: 1,
          }),
          // Each stored response's input and output items, read by id (direct get of its subject's
          // last message), never folded. Bounded by bytes and age; the oldest go first.
          def("RESPONSE_STORE", "Responses API: stored responses' items by tenant and id (read on a continuation, DELETE, input_items)", {
            subjects: [s.all("respstore")],
            max_age: RESPONSE_RETENTION_DAYS * 24 * HOUR_NS,
            max_bytes: 4096 * MiB,
            max_msgs_per_subject: 1,
          }),
        ]),
  ];
}
