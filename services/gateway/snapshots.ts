/**
 * Prefix-index snapshots: one elected gateway replica writes the serialized index to an Object
 * Store bucket every `intervalMs`; a booting replica loads the newest one and follows the KV stream
 * from the snapshot's sequence + 1 instead of replaying the whole stream.
 *
 * Storage
 * - Object Store `<prefix>-snapshots`, one object per snapshot named `prefix-index-<seq>`, the newest
 *   `keep` (3) kept. One name per snapshot rather than one object overwritten in place: replacing an
 *   object purges the old chunks right after the new metadata lands, so a replica reading the old
 *   version at that moment would fail; with distinct names a reader only races a prune of the oldest,
 *   and it falls back to the next older snapshot if a read fails for any reason (digest, corruption).
 * - Object metadata records what a loader must know before trusting the bytes: the KV stream
 *   sequence the snapshot reflects, the binary format version, the KV stream's creation time (a
 *   recreated stream restarts its sequences, so an old snapshot's sequence would skip new events),
 *   and counts for the "changed since the last snapshot" check.
 *
 * The sequence a snapshot reflects is "every KV message up to here was handled": the gateway's KV
 * follower handles messages synchronously and `serializeSliced()` copies the index's records
 * synchronously before it encodes them in slices (the loop serves requests between slices), so
 * reading the follower's last sequence and taking the copy in the same tick gives a consistent pair. (The index's
 * own `lastSeq` counts only kv and kv-cleared messages; a follower's sequence also covers routed
 * prefixes and the replica's own skipped echoes, which is why the caller may pass `seq`.)
 *
 * Lease (one writer)
 * - The key `snapshotter.prefix-index` of the `<prefix>-leases` KV bucket, under the lease every
 *   jetroute election uses (services/shared/lease.ts, kv-lease.ts, leader.ts): compare-and-set on
 *   the key's revision; a lease is expired once its revision has stood still for a lease duration
 *   on the reader's own monotonic clock, so no two hosts' clocks are ever compared (a freshly booted
 *   replica therefore waits one lease before taking over a long-dead holder's key).
 * - Each tick of a ready replica is one lease round (read, then take, renew or follow), so the
 *   holder renews before each write; it believes itself leader only until half its lease has passed
 *   since the renewal started. Should two replicas ever write at once, that is harmless (snapshots
 *   are self-describing and loaders pick by sequence): the lease only saves the duplicate work.
 *
 * Retention ("the KV stream never drops events newer than the newest snapshot")
 * - The KV stream uses limits retention (max_age 1 h, max_bytes 1 GiB) and nothing here ever purges
 *   it: there is no purge to run ahead of a snapshot (Dynamo's ordering bug needs an explicit purge).
 * - Guaranteed by configuration: `startSnapshotter` refuses `intervalMs + leaseMs > max_age / 10`, so
 *   while some ready replica runs and Object Store writes succeed, the newest snapshot is at most
 *   interval + lease + one write old, far younger than anything max_age drops.
 * - Not guaranteed, only detected: max_bytes drops by size, so a burst can push the stream's first
 *   sequence past the snapshot; no replica alive for longer than max_age; failing Object Store
 *   writes; operator purges. The leader checks the stream every tick: it snapshots early when, at
 *   the rate the stream is currently dropping messages, it would drop past the newest snapshot
 *   within two intervals, and it counts and logs a violation when first_seq > snapshot seq + 1
 *   (events lost between the snapshot and the stream head). A booting replica runs the same check.
 */
import { type JetStreamManager, StorageType, type StreamInfo } from "@nats-io/jetstream";
import { type ObjectInfo, type ObjectStore, Objm, setSha256Backend } from "@nats-io/obj";
import { snapshotBucketName, streamName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { kvLeaseStore } from "../shared/kv-lease.js";
import { LeaderElector } from "../shared/leader.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { PrefixIndex, type PrefixIndexOptions } from "../views/prefix-index.js";
import { immediateYield } from "../routing/mod.js";

export const DEFAULT_SNAPSHOT_INTERVAL_MS = 30_000;
export const DEFAULT_SNAPSHOT_LEASE_MS = 15_000;
export const DEFAULT_SNAPSHOTS_KEPT = 3;
const OBJECT_PREFIX = "prefix-index-";
const LEASE_KEY = "snapshotter.prefix-index";
/** The index's binary format family (magic "JRPI"); the version comes from the bytes themselves. */
const FORMAT_FAMILY = "jrpi";
/** Snapshots must come at least this many times per KV max_age. */
const RETENTION_FACTOR = 10;

const META = {
  format: "jetroute-format",
  seq: "jetroute-kv-seq",
  stream: "jetroute-kv-stream",
  streamCreated: "jetroute-kv-stream-created",
  entries: "jetroute-entries",
  blocks: "jetroute-blocks",
  pods: "jetroute-pods",
  gateway: "jetroute-gateway",
  createdMs: "jetroute-created-ms",
} as const;

export { leaseBucketName, snapshotBucketName } from "../../streams/definitions.js";
const objectName = (seq: number) => `${OBJECT_PREFIX}${String(seq).padStart(16, "0")}`;

/** What a snapshot's metadata says about it. */
export interface SnapshotMeta {
  name: string;
  /** Last KV stream sequence the snapshot reflects. */
  seq: number;
  /** e.g. "jrpi/1". */
  format: string;
  stream: string;
  streamCreated: string;
  entries: number;
  blocks: number;
  pods: number;
  gateway: string;
  createdMs: number;
  size: number;
}

export interface SnapshotWriteResult extends SnapshotMeta {
  serializeMs: number;
  putMs: number;
}

export interface LoadedSnapshot {
  index: PrefixIndex;
  /** Follow the KV stream from `seq + 1`. */
  seq: number;
  /** Snapshot size. */
  bytes: number;
  /** Time since the snapshot was written (writer's clock). */
  ageMs: number;
  name: string;
  gateway: string;
  /** List + fetch + deserialize time, and the last two alone. */
  loadMs: number;
  fetchMs: number;
  deserializeMs: number;
  /** Present when the stream has dropped events after `seq`: the index misses them. */
  lost?: { from: number; to: number };
}

export interface RetentionReport {
  stream: string;
  firstSeq: number;
  lastSeq: number;
  /** Newest snapshot's sequence (0: none). */
  snapshotSeq: number;
  /** Every event is covered by the snapshot or still in the stream. */
  ok: boolean;
  /** Stream sequences neither in the stream nor in the snapshot (inclusive), when not ok. */
  lost?: { from: number; to: number };
}

/**
 * Events neither in the snapshot nor retained: (snapshotSeq, firstSeq). An empty stream reports
 * first = last + 1, so "everything aged out after the snapshot" is caught as well.
 */
export function retentionGap(firstSeq: number, snapshotSeq: number): { from: number; to: number } | undefined {
  return firstSeq > snapshotSeq + 1 ? { from: snapshotSeq + 1, to: firstSeq - 1 } : undefined;
}

/**
 * Refuses timing that cannot keep the newest snapshot inside the KV stream's max_age: the worst
 * snapshot age with a live replica is about one interval plus one lease (takeover after a crash).
 */
export function validateSnapshotTiming(o: { intervalMs: number; leaseMs: number; maxAgeMs: number }): void {
  if (!(o.intervalMs >= 10)) throw new RangeError(`snapshot interval must be >= 10 ms, got ${o.intervalMs}`);
  if (!(o.leaseMs >= 30)) throw new RangeError(`snapshot lease must be >= 30 ms, got ${o.leaseMs}`);
  if (o.maxAgeMs > 0 && (o.intervalMs + o.leaseMs) * RETENTION_FACTOR > o.maxAgeMs) {
    throw new RangeError(
      `snapshot interval (${o.intervalMs} ms) + lease (${o.leaseMs} ms) must be at most 1/${RETENTION_FACTOR} of the KV stream's max_age (${o.maxAgeMs} ms): ` +
        "otherwise the stream may drop events no snapshot covers",
    );
  }
}

let nativeSha = false;
/** node:crypto SHA-256 instead of the client's pure-JS default: ~10x faster on 20 MB snapshots. */
function useNativeSha(): void {
  if (nativeSha) return;
  setSha256Backend("native");
  nativeSha = true;
}

async function openStore(nats: NatsHandles, prefix: string, create: boolean, replicas = 1): Promise<ObjectStore | undefined> {
  useNativeSha();
  const objm = new Objm(nats.js);
  const name = snapshotBucketName(prefix);
  if (create) {
    try {
      return await objm.create(name, { storage: StorageType.File, replicas });
    } catch (err) {
      // Another replica creating the bucket at the same moment can make ours fail on 2.9
      // ("subjects overlap"): the bucket exists either way.
      return await objm.open(name).catch(() => Promise.reject(err));
    }
  }
  // Objm.open says "object store not found" in a plain Error: ask for the bucket's stream instead,
  // so that only a missing bucket reads as missing and a failed call is reported as itself.
  try {
    await nats.jsm.streams.info(`OBJ_${name}`);
  } catch (err) {
    if (isStreamNotFound(err)) return undefined;
    throw err;
  }
  return await objm.open(name, false);
}

async function kvStreamInfo(jsm: JetStreamManager, prefix: string): Promise<StreamInfo> {
  return jsm.streams.info(streamName(prefix, "KV"));
}

/** A stream's first sequence; 0 (never written) reads as 1. */
const firstSeqOf = (si: StreamInfo) => Math.max(1, si.state.first_seq);

function parseMeta(info: Pick<ObjectInfo, "name" | "metadata" | "size" | "deleted">): SnapshotMeta | string {
  if (info.deleted) return "deleted";
  if (!info.name.startsWith(OBJECT_PREFIX)) return "not a prefix-index snapshot";
  const m = info.metadata ?? {};
  const num = (k: string) => {
    const v = Number(m[k]);
    return Number.isSafeInteger(v) && v >= 0 ? v : undefined;
  };
  const seq = num(META.seq);
  const format = m[META.format];
  if (seq === undefined || seq < 1) return `bad or missing ${META.seq}: ${JSON.stringify(m[META.seq])}`;
  if (!format?.startsWith(`${FORMAT_FAMILY}/`)) return `unknown format ${JSON.stringify(format)}`;
  return {
    name: info.name,
    seq,
    format,
    stream: m[META.stream] ?? "",
    streamCreated: m[META.streamCreated] ?? "",
    entries: num(META.entries) ?? 0,
    blocks: num(META.blocks) ?? 0,
    pods: num(META.pods) ?? 0,
    gateway: m[META.gateway] ?? "",
    createdMs: num(META.createdMs) ?? 0,
    size: info.size,
  };
}

/** Valid snapshot descriptions, newest (highest sequence) first. */
async function listSnapshots(store: ObjectStore, log?: Logger): Promise<SnapshotMeta[]> {
  const out: SnapshotMeta[] = [];
  for (const info of await store.list()) {
    const m = parseMeta(info);
    if (typeof m === "string") {
      if (m !== "deleted") log?.warn({ object: info.name, reason: m }, "ignoring object in the snapshot bucket");
    } else out.push(m);
  }
  return out.sort((a, b) => b.seq - a.seq || b.createdMs - a.createdMs);
}

/** The newest snapshot's description, or undefined (no bucket, no snapshot). */
export async function newestSnapshotMeta(nats: NatsHandles, prefix: string): Promise<SnapshotMeta | undefined> {
  const store = await openStore(nats, prefix, false);
  return store ? (await listSnapshots(store))[0] : undefined;
}

async function putSnapshot(
  store: ObjectStore,
  o: { jsm: JetStreamManager; prefix: string; index: PrefixIndex; seq?: () => number; gatewayId: string },
): Promise<SnapshotWriteResult> {
  const si = await kvStreamInfo(o.jsm, o.prefix);
  // No await between reading the sequence and serializing: the follower cannot apply a message in
  // between, so the bytes reflect exactly the messages up to `seq`.
  const seq = Math.max(o.index.lastSeq, o.seq?.() ?? 0);
  if (seq < 1) throw new Error("the index has applied nothing yet: no snapshot to write");
  const t0 = performance.now();
  // Counted in the same tick as the copy serializeSliced takes first: the counts match the bytes.
  const st = o.index.stats();
  // Encoded in slices with the loop handed back between them: several MB at 100 pods would hold
  // every request for tens of milliseconds (serializeMs is wall time across the slices).
  const bytes = await o.index.serializeSliced(immediateYield);
  const serializeMs = performance.now() - t0;
  // The index writes magic (int32) then its format version (uint16) first: record what was written.
  const version = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint16(4, true);
  const meta: SnapshotMeta = {
    name: objectName(seq),
    seq,
    format: `${FORMAT_FAMILY}/${version}`,
    stream: si.config.name,
    streamCreated: si.created,
    entries: st.entries,
    blocks: st.blocks,
    pods: st.pods,
    gateway: o.gatewayId,
    createdMs: Date.now(),
    size: bytes.byteLength,
  };
  const t1 = performance.now();
  await store.putBlob(
    {
      name: meta.name,
      description: `prefix index at ${meta.stream} seq ${seq}: ${st.blocks} blocks, ${st.entries} entries, ${st.pods} pods`,
      metadata: {
        [META.format]: meta.format,
        [META.seq]: String(seq),
        [META.stream]: meta.stream,
        [META.streamCreated]: meta.streamCreated,
        [META.entries]: String(meta.entries),
        [META.blocks]: String(meta.blocks),
        [META.pods]: String(meta.pods),
        [META.gateway]: meta.gateway,
        [META.createdMs]: String(meta.createdMs),
      },
      // Fewer, larger chunks: the client awaits each chunk's ack in turn. Clamped to max_payload.
      options: { max_chunk_size: 1024 * 1024 },
    },
    bytes,
  );
  return { ...meta, serializeMs, putMs: performance.now() - t1 };
}

async function pruneSnapshots(store: ObjectStore, keep: number, log?: Logger): Promise<number> {
  const all = await listSnapshots(store, log);
  let n = 0;
  for (const m of all.slice(Math.max(1, keep))) {
    try {
      await store.delete(m.name);
      n++;
    } catch (err) {
      log?.warn({ object: m.name, err: (err as Error).message }, "could not delete an old snapshot");
    }
  }
  return n;
}

export interface WriteSnapshotOptions {
  nats: NatsHandles;
  prefix: string;
  index: PrefixIndex;
  /** Last KV sequence handled (the follower's); defaults to the index's own `lastSeq`. */
  seq?: () => number;
  gatewayId: string;
  log?: Logger;
  /** Snapshots to keep (newest first); older ones are deleted after the write. */
  keep?: number;
  replicas?: number;
}

/** Writes one snapshot now, without a lease (benchmarks, tools, tests). */
export async function writeSnapshot(o: WriteSnapshotOptions): Promise<SnapshotWriteResult> {
  const store = (await openStore(o.nats, o.prefix, true, o.replicas)) as ObjectStore;
  const r = await putSnapshot(store, { jsm: o.nats.jsm, prefix: o.prefix, index: o.index, seq: o.seq, gatewayId: o.gatewayId });
  await pruneSnapshots(store, o.keep ?? DEFAULT_SNAPSHOTS_KEPT, o.log);
  return r;
}

export interface CheckRetentionOptions {
  nats: NatsHandles;
  prefix: string;
  /** The newest snapshot's sequence; looked up in the bucket when omitted. */
  snapshotSeq?: number;
}

/** Compares the KV stream's first sequence with the newest snapshot (see the module comment). */
export async function checkRetention(o: CheckRetentionOptions): Promise<RetentionReport> {
  const snapshotSeq = o.snapshotSeq ?? (await newestSnapshotMeta(o.nats, o.prefix))?.seq ?? 0;
  const si = await kvStreamInfo(o.nats.jsm, o.prefix);
  return retentionReport(si, snapshotSeq);
}

function retentionReport(si: StreamInfo, snapshotSeq: number): RetentionReport {
  const firstSeq = firstSeqOf(si);
  const lost = retentionGap(firstSeq, snapshotSeq);
  return { stream: si.config.name, firstSeq, lastSeq: si.state.last_seq, snapshotSeq, ok: lost === undefined, ...(lost ? { lost } : {}) };
}

export interface LoadSnapshotOptions {
  nats: NatsHandles;
  prefix: string;
  log: Logger;
  /** The gateway's index configuration (budget, weights, touchOnMatch): not part of a snapshot. */
  indexOptions?: PrefixIndexOptions;
  /**
   * When the stream has dropped events after the snapshot (retention broke the guard):
   * `use` (default) loads it anyway and reports `lost`, `replay` returns undefined so the caller
   * replays what the stream still holds. Both views miss the lost events; `use` keeps everything
   * the snapshot knew, `replay` forgets every block stored before the stream's first message.
   */
  onGap?: "use" | "replay";
  /** Snapshots to try, newest first, before giving up. */
  maxAttempts?: number;
}

/**
 * The newest usable snapshot, or undefined: replay the KV stream from the start. Never throws for
 * a bad snapshot (logged, next older one tried); throws only when NATS itself fails.
 */
export async function loadNewestSnapshot(o: LoadSnapshotOptions): Promise<LoadedSnapshot | undefined> {
  const t0 = performance.now();
  const store = await openStore(o.nats, o.prefix, false);
  if (!store) {
    o.log.info({ bucket: snapshotBucketName(o.prefix) }, "no snapshot bucket: replaying the KV stream from the start");
    return undefined;
  }
  const [candidates, si] = await Promise.all([listSnapshots(store, o.log), kvStreamInfo(o.nats.jsm, o.prefix)]);
  if (candidates.length === 0) {
    o.log.info({ bucket: snapshotBucketName(o.prefix) }, "no snapshot yet: replaying the KV stream from the start");
    return undefined;
  }
  let attempts = 0;
  for (const m of candidates) {
    if (attempts++ >= (o.maxAttempts ?? DEFAULT_SNAPSHOTS_KEPT)) break;
    const skip = (reason: string, extra: Record<string, unknown> = {}) => o.log.warn({ snapshot: m.name, seq: m.seq, reason, ...extra }, "snapshot unusable");
    if (m.stream !== si.config.name || m.streamCreated !== si.created) {
      // A recreated stream numbers from 1 again: following from the old sequence would skip events.
      skip("snapshot of another KV stream incarnation", { snapshotStream: m.stream, snapshotStreamCreated: m.streamCreated, streamCreated: si.created });
      continue;
    }
    if (m.seq > si.state.last_seq) {
      skip("snapshot is ahead of the stream", { lastSeq: si.state.last_seq });
      continue;
    }
    let index: PrefixIndex;
    let fetchMs = 0;
    let deserializeMs = 0;
    try {
      const t1 = performance.now();
      const bytes = await store.getBlob(m.name);
      if (!bytes) {
        skip("object vanished (pruned while loading)");
        continue;
      }
      const t2 = performance.now();
      fetchMs = t2 - t1;
      index = PrefixIndex.deserialize(bytes, o.indexOptions);
      deserializeMs = performance.now() - t2;
    } catch (err) {
      skip(`corrupt snapshot: ${(err as Error).message}`);
      continue;
    }
    // The snapshot reflects every message up to `seq`, including ones the index itself does not
    // count (routed prefixes, skipped echoes): the replica's KV position starts there.
    if (index.lastSeq < m.seq) index.lastSeq = m.seq;
    const lost = retentionGap(firstSeqOf(si), m.seq);
    const loaded: LoadedSnapshot = {
      index,
      seq: m.seq,
      bytes: m.size,
      ageMs: Math.max(0, Date.now() - m.createdMs),
      name: m.name,
      gateway: m.gateway,
      loadMs: performance.now() - t0,
      fetchMs,
      deserializeMs,
      ...(lost ? { lost } : {}),
    };
    if (lost) {
      o.log.error(
        { snapshot: m.name, seq: m.seq, firstSeq: firstSeqOf(si), lost, onGap: o.onGap ?? "use" },
        "KV stream dropped events newer than the newest snapshot: the index misses them (retention guard broken)",
      );
      if (o.onGap === "replay") return undefined;
    }
    o.log.info({ snapshot: m.name, seq: m.seq, bytes: m.size, blocks: m.blocks, ageMs: loaded.ageMs, loadMs: Math.round(loaded.loadMs) }, "prefix index loaded from snapshot");
    return loaded;
  }
  o.log.warn({ tried: Math.min(attempts, candidates.length) }, "no usable snapshot: replaying the KV stream from the start");
  return undefined;
}

// ------------------------------------------------------------------------------------ snapshotter

export interface SnapshotterOptions {
  nats: NatsHandles;
  prefix: string;
  gatewayId: string;
  /** The live index (read at each write). */
  index: () => PrefixIndex;
  /** Last KV sequence handled by the replica's follower (see the module comment). */
  seq?: () => number;
  /** Contend for the lease and write only while this is true (the index is caught up). */
  ready?: () => boolean;
  intervalMs?: number;
  leaseMs?: number;
  /** Snapshots kept in the bucket. */
  keep?: number;
  /** Replicas of the snapshot and lease buckets (3 on a 3-node cluster). */
  replicas?: number;
  log: Logger;
}

export interface SnapshotterStats {
  leader: boolean;
  holder: string | undefined;
  acquired: number;
  lost: number;
  writes: number;
  writeErrors: number;
  /** Due writes skipped because nothing changed since the newest snapshot. */
  unchanged: number;
  lastWrite: SnapshotWriteResult | undefined;
  retention: {
    checks: number;
    /** Checks that found events no snapshot covers. */
    violations: number;
    /** Writes brought forward because the stream was dropping towards the newest snapshot. */
    early: number;
    last: RetentionReport | undefined;
  };
}

export interface Snapshotter {
  readonly stats: SnapshotterStats;
  isLeader(): boolean;
  /** Writes a snapshot now if this replica holds the lease and the index changed. */
  snapshotNow(): Promise<SnapshotWriteResult | undefined>;
  /** Stops; `release: false` leaves the lease to expire (what a crash looks like to the others). */
  close(opts?: { release?: boolean }): Promise<void>;
}

/** Starts contending for the snapshot lease; the holder writes snapshots (module comment). */
export async function startSnapshotter(o: SnapshotterOptions): Promise<Snapshotter> {
  const intervalMs = o.intervalMs ?? DEFAULT_SNAPSHOT_INTERVAL_MS;
  const leaseMs = o.leaseMs ?? DEFAULT_SNAPSHOT_LEASE_MS;
  const si = await kvStreamInfo(o.nats.jsm, o.prefix);
  validateSnapshotTiming({ intervalMs, leaseMs, maxAgeMs: si.config.max_age / 1e6 });
  const store = (await openStore(o.nats, o.prefix, true, o.replicas)) as ObjectStore;
  // Rounds run at this snapshotter's ticks (step), never on the elector's own timer.
  const lease = new LeaderElector({ store: await kvLeaseStore(o.nats, o.prefix, LEASE_KEY, { replicas: o.replicas ?? 1 }), me: o.gatewayId, durationMs: leaseMs, log: o.log });
  const snapshotter = new LeaseHoldingSnapshotter(o, store, lease, intervalMs, Math.max(10, Math.min(intervalMs, leaseMs / 3)));
  snapshotter.start();
  return snapshotter;
}

/** The newest snapshot in the bucket as far as a snapshotter knows. */
type NewestSnapshot = Pick<SnapshotMeta, "seq" | "entries" | "blocks" | "pods" | "createdMs">;

/**
 * Whether a retention report asks for an early write: the stream dropped events no snapshot
 * covers (`violation`), or, dropping at the rate seen since the previous report, it will drop past
 * the newest snapshot within two intervals (`early`). Pure.
 */
export function retentionUrgency(
  report: RetentionReport,
  prevFirst: { seq: number; at: number } | undefined,
  newest: Pick<NewestSnapshot, "seq"> | undefined,
  now: number,
  intervalMs: number,
): { kind: "violation" } | { kind: "early"; leftMs: number } | undefined {
  if (!report.ok) return { kind: "violation" };
  if (!prevFirst || !(report.firstSeq > prevFirst.seq) || !newest) return undefined;
  const perMs = (report.firstSeq - prevFirst.seq) / (now - prevFirst.at);
  const leftMs = (newest.seq + 1 - report.firstSeq) / perMs;
  return leftMs < 2 * intervalMs ? { kind: "early", leftMs } : undefined;
}

class LeaseHoldingSnapshotter implements Snapshotter {
  readonly stats: SnapshotterStats = {
    leader: false,
    holder: undefined,
    acquired: 0,
    lost: 0,
    writes: 0,
    writeErrors: 0,
    unchanged: 0,
    lastWrite: undefined,
    retention: { checks: 0, violations: 0, early: 0, last: undefined },
  };
  private readonly log: Logger;
  private readonly keep: number;
  /** The newest snapshot in the bucket as far as this replica knows (set on acquiring the lease). */
  private newest: NewestSnapshot | undefined;
  private prevFirst: { seq: number; at: number } | undefined;
  private urgent = false;
  private writing: Promise<SnapshotWriteResult | undefined> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;
  private closed = false;

  constructor(
    private readonly o: SnapshotterOptions,
    private readonly store: ObjectStore,
    private readonly lease: LeaderElector,
    private readonly intervalMs: number,
    private readonly tickMs: number,
  ) {
    this.log = o.log;
    this.keep = o.keep ?? DEFAULT_SNAPSHOTS_KEPT;
  }

  /** First tick at once: a replica that starts ready takes a free lease without waiting. */
  start(): void {
    this.runTick();
  }

  isLeader(): boolean {
    return this.lease.isLeader();
  }

  async snapshotNow(): Promise<SnapshotWriteResult | undefined> {
    if (!this.lease.isLeader()) return undefined;
    await this.writing;
    return this.write();
  }

  async close(opts: { release?: boolean } = {}): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.timer);
    await this.ticking;
    await this.writing;
    await this.lease.stop(opts.release !== false);
    this.stats.leader = false;
  }

  private runTick(): void {
    this.ticking = this.tick()
      .catch((err) => this.log.warn({ err: (err as Error).message }, "snapshotter tick failed"))
      .finally(() => {
        this.ticking = undefined;
        this.schedule();
      });
  }

  private schedule(): void {
    if (this.closed) return;
    this.timer = setTimeout(() => this.runTick(), this.tickMs);
    this.timer.unref();
  }

  private async write(): Promise<SnapshotWriteResult | undefined> {
    const { o, stats, newest } = this;
    const index = o.index();
    const seq = Math.max(index.lastSeq, o.seq?.() ?? 0);
    const st = index.stats();
    if (seq < 1) return undefined;
    if (newest && (seq < newest.seq || (seq === newest.seq && st.entries === newest.entries && st.blocks === newest.blocks && st.pods === newest.pods))) {
      // Unchanged, or this replica lags behind the newest snapshot (an older state is no use).
      stats.unchanged++;
      return undefined;
    }
    try {
      const r = await putSnapshot(this.store, { jsm: o.nats.jsm, prefix: o.prefix, index, seq: o.seq, gatewayId: o.gatewayId });
      stats.writes++;
      stats.lastWrite = r;
      this.newest = r;
      this.urgent = false;
      this.log.info({ snapshot: r.name, seq: r.seq, bytes: r.size, blocks: r.blocks, serializeMs: Math.round(r.serializeMs), putMs: Math.round(r.putMs) }, "prefix index snapshot written");
      await pruneSnapshots(this.store, this.keep, this.log);
      return r;
    } catch (err) {
      stats.writeErrors++;
      this.log.warn({ err: (err as Error).message }, "prefix index snapshot failed");
      return undefined;
    }
  }

  private async checkRetentionNow(): Promise<void> {
    const { stats } = this;
    const info = await kvStreamInfo(this.o.nats.jsm, this.o.prefix);
    const report = retentionReport(info, this.newest?.seq ?? 0);
    const was = stats.retention.last;
    stats.retention.checks++;
    stats.retention.last = report;
    const now = performance.now();
    const urgency = retentionUrgency(report, this.prevFirst, this.newest, now, this.intervalMs);
    if (urgency?.kind === "violation") {
      stats.retention.violations++;
      if (was?.ok !== false || was.lost?.to !== report.lost?.to) {
        this.log.error({ ...report }, "KV stream dropped events newer than the newest snapshot: booting replicas will miss them");
      }
      this.urgent = true;
      return;
    }
    if (urgency?.kind === "early" && !this.urgent) {
      this.urgent = true;
      stats.retention.early++;
      this.log.warn({ firstSeq: report.firstSeq, snapshotSeq: this.newest?.seq, leftMs: Math.round(urgency.leftMs) }, "KV stream is dropping towards the newest snapshot: snapshotting early");
    }
    this.prevFirst = { seq: report.firstSeq, at: now };
  }

  private async tick(): Promise<void> {
    const { o, stats, lease } = this;
    if (o.ready && !o.ready()) return;
    const was = stats.leader;
    await lease.step();
    const leader = lease.isLeader();
    stats.leader = leader;
    stats.holder = lease.holder;
    if (leader && !was) {
      stats.acquired++;
      // Start from the bucket's newest snapshot: no rewrite of an unchanged index on takeover.
      const m = (await listSnapshots(this.store).catch(() => []))[0];
      this.newest = m;
      this.log.info({ gateway: o.gatewayId, newestSeq: m?.seq ?? 0 }, "snapshot lease acquired");
    } else if (!leader && was) {
      stats.lost++;
      this.log.warn({ gateway: o.gatewayId, holder: lease.holder }, "snapshot lease lost");
    }
    if (!leader) return;
    await this.checkRetentionNow().catch((err) => this.log.warn({ err: (err as Error).message }, "KV retention check failed"));
    const newest = this.newest;
    const due = this.urgent || !newest || Date.now() - newest.createdMs >= this.intervalMs;
    if (due && !this.writing && lease.isLeader()) {
      // In the background: a long write must not delay lease renewals.
      this.writing = this.write().finally(() => {
        this.writing = undefined;
      });
    }
  }
}
