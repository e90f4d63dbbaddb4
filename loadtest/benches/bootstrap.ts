/**
 * `npm run bench -- bootstrap`: how fast a new gateway replica's prefix index is ready, from the
 * newest snapshot plus the stream tail (services/gateway/snapshots.ts) versus replaying the whole KV
 * stream, on a real nats-server with file storage.
 *
 * Workload: `blocks` (1 M) distinct blocks stored by `pods` (32) engines as KvBatch messages of
 * `blocksPerBatch` (16) blocks each (62.5 k messages), published with async JetStream publishes in a
 * bounded window and the bridge's `Nats-Msg-Id`. Router and engine hashes are random 64-bit hex, as
 * xxh64 router hashes and engine block hashes are. Conversations chain 32 batches (512 blocks).
 * A snapshot is taken once the base is applied, then a tail of `tailFraction` (5%) more messages
 * arrives: 70% stores of new blocks, 30% removals of a pod's oldest 16 blocks (engine LRU).
 *
 * Measured (each in a fresh node process, alternating, `rounds` times, median reported):
 * (a) snapshot_ready_s: list + fetch + deserialize the newest snapshot, follow from seq+1 to the end;
 * (b) replay_ready_s: follow the whole stream into an empty index.
 * Both use StreamFollower with the gateway's handler, so JSON parsing and schema validation are in
 * the measured path, and "ready" is the follower's own caught-up signal. Both must end in the same
 * index (checked: counts, last sequence, sample lookups) or the bench fails.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { PubAck } from "@nats-io/jetstream";
import type { KvBatch } from "../../schemas/events.js";
import { applyStreams } from "../../streams/apply.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { loadNewestSnapshot, writeSnapshot } from "../../services/gateway/snapshots.js";
import { StreamFollower } from "../../services/shared/follower.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { startNatsServer } from "../../services/shared/nats-server.js";
import { encodeEvent } from "../../services/shared/publish.js";
import { PrefixIndex, type PrefixIndexOptions } from "../../services/views/prefix-index.js";
import { xorshift32 } from "../../services/shared/seeded-random.js";

export interface BootstrapBenchOptions {
  /** Distinct blocks in the index before the snapshot. */
  blocks?: number;
  blocksPerBatch?: number;
  pods?: number;
  /** Messages published after the snapshot, as a fraction of the base messages. */
  tailFraction?: number;
  /** Async publishes in flight. */
  window?: number;
  /** Measured bootstraps of each kind. */
  rounds?: number;
  /** Publish with `Nats-Msg-Id` like the kv-bridge (dedupe costs the server a little). */
  msgIds?: boolean;
  /**
   * Give the KV followers the subject filter `<prefix>.kv.>`. Redundant (the KV stream captures
   * nothing else) and, on nats-server 2.9.10, slow when catching up a tail a little longer than
   * one pull batch (~250 ms for 3 k messages instead of ~20 ms). Default false, matching the
   * gateway once its KV follower drops the filter; true measures the gateway as it was.
   */
  kvFilter?: boolean;
}

const MODEL = "bench/Llama-3.1-8B";
const PREFIX = "jr";
const BATCHES_PER_CONVERSATION = 32;
// The gateway's own index configuration (services/gateway/gateway.ts).
const INDEX_OPTS: PrefixIndexOptions = { maxEntries: 4_000_000, touchOnMatch: false };

/** murmur3's 32-bit finalizer: a cheap bijective mix, so hashes are derived, never stored. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}
/** 64-bit hex as the bridge writes it (no leading zeros), from two mixed 32-bit halves. */
function hex64(a: number, b: number): string {
  const hi = fmix32(a);
  const lo = fmix32(b ^ 0x9e3779b9);
  return hi === 0 ? lo.toString(16) : hi.toString(16) + lo.toString(16).padStart(8, "0");
}
const routerHash = (block: number) => hex64(block * 2 + 1, block);
/** Engines hash differently from the router and per process: a per-pod salt. */
const engineHash = (pod: number, k: number) => hex64((pod * 0x01000193) ^ (k * 2 + 0x5bd1e995), k + pod * 0x3c6ef372);

/** The engines' side: which blocks each pod stored, in order, so removals name the oldest. */
class Fleet {
  private nextBlock = 0;
  private readonly stored: number[];
  private readonly removed: number[];
  private readonly seq: number[];
  private readonly parent: (string | null)[];
  private readonly convBatches: number[];
  readonly samples: bigint[][] = [];

  constructor(
    readonly pods: number,
    readonly perBatch: number,
  ) {
    this.stored = new Array(pods).fill(0);
    this.removed = new Array(pods).fill(0);
    this.seq = new Array(pods).fill(0);
    this.parent = new Array(pods).fill(null);
    this.convBatches = new Array(pods).fill(0);
  }

  private batch(pod: number, events: KvBatch["events"]): KvBatch {
    const seq = this.seq[pod] as number;
    this.seq[pod] = seq + 1;
    return { type: "kv", model: MODEL, pod: `pod-${pod}`, epoch: "e1", seq, ts: Date.now(), events };
  }

  store(pod: number): KvBatch {
    if ((this.convBatches[pod] as number) >= BATCHES_PER_CONVERSATION) {
      this.convBatches[pod] = 0;
      this.parent[pod] = null;
    }
    this.convBatches[pod] = (this.convBatches[pod] as number) + 1;
    const k0 = this.stored[pod] as number;
    const engineHashes: string[] = new Array(this.perBatch);
    const routerHashes: string[] = new Array(this.perBatch);
    for (let i = 0; i < this.perBatch; i++) {
      engineHashes[i] = engineHash(pod, k0 + i);
      routerHashes[i] = routerHash(this.nextBlock++);
    }
    this.stored[pod] = k0 + this.perBatch;
    const parentEngineHash = this.parent[pod] as string | null;
    this.parent[pod] = engineHashes[this.perBatch - 1] as string;
    if (this.nextBlock % 4099 < this.perBatch) this.samples.push(routerHashes.map((h) => BigInt(`0x${h}`)));
    return this.batch(pod, [{ kind: "stored", engineHashes, routerHashes, parentEngineHash, blockSize: 16, medium: "GPU", lora: null }]);
  }

  /** The pod evicts its oldest blocks (LRU), as an engine under memory pressure does. */
  evict(pod: number): KvBatch {
    const k0 = this.removed[pod] as number;
    const n = Math.min(this.perBatch, (this.stored[pod] as number) - k0);
    if (n <= 0) return this.store(pod);
    this.removed[pod] = k0 + n;
    return this.batch(pod, [{ kind: "removed", engineHashes: Array.from({ length: n }, (_, i) => engineHash(pod, k0 + i)), medium: "GPU" }]);
  }
}


async function publishAll(nats: NatsHandles, subjects: Subjects, n: number, make: () => KvBatch, window: number, msgIds: boolean): Promise<number> {
  const inflight: Promise<PubAck>[] = [];
  let last = 0;
  for (let i = 0; i < n; i++) {
    const b = make();
    inflight.push(nats.js.publish(subjects.kv(b.model, b.pod), encodeEvent(b), msgIds ? { msgID: `${b.pod}:${b.epoch}:${b.seq}` } : undefined));
    if (inflight.length >= window) last = Math.max(last, (await inflight.shift())?.seq ?? 0);
  }
  for (const p of inflight) last = Math.max(last, (await p).seq);
  return last;
}

/** The gateway's KV follower (services/gateway/gateway.ts), folding into `index` from `fromSeq`. */
function kvFollower(nats: NatsHandles, subjects: Subjects, index: PrefixIndex, fromSeq: number | undefined, name: string, kvFilter: boolean) {
  return new StreamFollower({
    nats,
    subjects,
    log: createLogger("bench-bootstrap", "warn"),
    name,
    family: "kv",
    types: ["kv", "kv-cleared", "kv-routed"] as const,
    stream: streamName(PREFIX, "KV"),
    ...(kvFilter ? { filter: subjects.all("kv") } : {}),
    startAt: fromSeq === undefined ? { kind: "all" } : { kind: "sequence", seq: fromSeq },
    onEvent: (ev, m) => {
      if (ev.type === "kv") index.apply(ev, m.seq);
      else if (ev.type === "kv-cleared") index.applyCleared(ev, m.seq);
      else index.touch(ev.model, ev.hashes);
    },
  });
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const round = (x: number, digits = 3) => Number(x.toFixed(digits));

/** Counts, position and sample answers: two indexes with equal fingerprints hold the same state. */
function fingerprint(index: PrefixIndex, samples: bigint[][]): string {
  const { entries, blocks, pods, lastSeq } = index.stats();
  const answers = samples.map((q) => {
    const r = index.longestMatch(MODEL, q, undefined, { touch: false });
    return r.pods
      .map((p, i) => `${p}=${r.blocks[i]}`)
      .sort()
      .join(",");
  });
  return JSON.stringify({ entries, blocks, pods, lastSeq, answers });
}

interface ChildResult {
  readyS: number;
  loadS: number;
  fetchS: number;
  deserializeS: number;
  tailS: number;
  invalid: number;
  fingerprint: string;
}

const CHILD_FLAG = "--bootstrap-child";

/** Runs one bootstrap in a new node process (this module, re-executed with the same loader flags). */
function runChild(a: { mode: "snapshot" | "replay"; url: string; samplesFile: string; kvFilter: boolean }): Promise<ChildResult> {
  const args = [...process.execArgv, fileURLToPath(import.meta.url), CHILD_FLAG, a.mode, a.url, a.samplesFile, a.kvFilter ? "filter" : "no-filter"];
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, JETROUTE_LOG_LEVEL: "warn" } });
    let out = "";
    let err = "";
    proc.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    proc.stderr.on("data", (d: Buffer) => {
      err = (err + d.toString()).slice(-4000);
    });
    proc.once("error", reject);
    proc.once("exit", (code) => {
      const line = out.trim().split("\n").at(-1) ?? "";
      try {
        if (code !== 0) throw new Error(`exit ${code}`);
        resolve(JSON.parse(line) as ChildResult);
      } catch (e) {
        reject(new Error(`bootstrap child (${a.mode}) failed: ${(e as Error).message}: ${err}`));
      }
    });
  });
}

/** The child: connect, bootstrap like a new gateway replica, print one JSON line. */
async function childMain(argv: string[]): Promise<void> {
  const [mode, url, samplesFile, filter] = argv;
  const samples = (JSON.parse(readFileSync(samplesFile as string, "utf8")) as string[][]).map((q) => q.map((x) => BigInt(`0x${x}`)));
  const c = await connectNats(url as string);
  const subjects = new Subjects(PREFIX);
  const log = createLogger("bench-bootstrap-child", "warn");
  const t0 = performance.now();
  let index: PrefixIndex;
  let fromSeq: number | undefined;
  let fetchMs = 0;
  let deserializeMs = 0;
  if (mode === "snapshot") {
    const loaded = await loadNewestSnapshot({ nats: c, prefix: PREFIX, log, indexOptions: INDEX_OPTS });
    if (!loaded) throw new Error("no snapshot loaded");
    index = loaded.index;
    fromSeq = loaded.seq + 1;
    fetchMs = loaded.fetchMs;
    deserializeMs = loaded.deserializeMs;
  } else index = new PrefixIndex(INDEX_OPTS);
  const t1 = performance.now();
  const f = kvFollower(c, subjects, index, fromSeq, `bench-${mode}-${process.pid}`, filter === "filter");
  await f.start();
  await f.whenCaughtUp();
  const t2 = performance.now();
  await f.stop();
  const result: ChildResult = {
    readyS: (t2 - t0) / 1000,
    loadS: (t1 - t0) / 1000,
    fetchS: fetchMs / 1000,
    deserializeS: deserializeMs / 1000,
    tailS: (t2 - t1) / 1000,
    invalid: f.invalid,
    fingerprint: fingerprint(index, samples),
  };
  await c.nc.close();
  console.log(JSON.stringify(result));
}

export async function runBootstrapBench(opts: BootstrapBenchOptions = {}): Promise<Record<string, unknown>> {
  const o = {
    blocks: opts.blocks ?? 1_000_000,
    blocksPerBatch: opts.blocksPerBatch ?? 16,
    pods: opts.pods ?? 32,
    tailFraction: opts.tailFraction ?? 0.05,
    window: opts.window ?? 256,
    rounds: opts.rounds ?? 5,
    msgIds: opts.msgIds ?? true,
    kvFilter: opts.kvFilter ?? false,
  };
  const log = createLogger("bench-bootstrap", "warn");
  const server = await startNatsServer();
  const h = await connectNats(server.url);
  try {
    await applyStreams(h.nc, h.jsm);
    const subjects = new Subjects(PREFIX);
    const fleet = new Fleet(o.pods, o.blocksPerBatch);
    const rand = xorshift32(42);
    const pickPod = () => Math.floor(rand() * o.pods);

    // ---- base: 1 M blocks
    const baseMsgs = Math.ceil(o.blocks / o.blocksPerBatch);
    console.error(`bootstrap bench: publishing ${baseMsgs} KvBatch messages (${o.blocks} blocks, ${o.pods} pods, window ${o.window}) ...`);
    let t = performance.now();
    const baseSeq = await publishAll(h, subjects, baseMsgs, () => fleet.store(pickPod()), o.window, o.msgIds);
    const publishS = (performance.now() - t) / 1000;
    const si = await h.jsm.streams.info(streamName(PREFIX, "KV"));
    console.error(`  ${Math.round(baseMsgs / publishS)} msgs/s; stream ${si.state.messages} msgs, ${(si.state.bytes / 2 ** 20).toFixed(1)} MiB`);

    // ---- the snapshotter's replica: replays the base, then writes the snapshot
    const live = new PrefixIndex(INDEX_OPTS);
    t = performance.now();
    const builder = kvFollower(h, subjects, live, undefined, "bench-builder", o.kvFilter);
    await builder.start();
    await builder.whenCaughtUp();
    const buildS = (performance.now() - t) / 1000;
    if (builder.lastSeq !== baseSeq) throw new Error(`builder stopped at ${builder.lastSeq}, expected ${baseSeq}`);
    const written = await writeSnapshot({ nats: h, prefix: PREFIX, index: live, seq: () => builder.lastSeq, gatewayId: "bench-snapshotter", log });
    console.error(
      `  base replay ${buildS.toFixed(2)} s; snapshot at seq ${written.seq}: ${(written.size / 2 ** 20).toFixed(1)} MiB, serialize ${written.serializeMs.toFixed(0)} ms, put ${written.putMs.toFixed(0)} ms`,
    );

    // ---- tail after the snapshot, applied by the live replica too (the reference state)
    const tailMsgs = Math.round(baseMsgs * o.tailFraction);
    const endSeq = await publishAll(h, subjects, tailMsgs, () => (rand() < 0.7 ? fleet.store(pickPod()) : fleet.evict(pickPod())), o.window, o.msgIds);
    const deadline = performance.now() + 30_000;
    while (builder.lastSeq < endSeq && performance.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    await builder.stop();
    if (builder.lastSeq !== endSeq) throw new Error(`live replica stopped at ${builder.lastSeq}, expected ${endSeq}`);
    const want = fingerprint(live, fleet.samples);
    const liveStats = live.stats();
    console.error(`  tail: ${tailMsgs} msgs (seq ${baseSeq + 1}..${endSeq}); index ${liveStats.blocks} blocks, ${liveStats.entries} entries`);

    // ---- measured bootstraps, each in a fresh node process: a new replica boots with a cold JIT
    // and heap (in process, the replay path would run hot from the builder's replay above).
    const samplesFile = path.join(mkdtempSync(path.join(os.tmpdir(), "jr-bootstrap-")), "samples.json");
    writeFileSync(samplesFile, JSON.stringify(fleet.samples.map((q) => q.map((x) => x.toString(16)))));
    const snapRuns: ChildResult[] = [];
    const replayRuns: ChildResult[] = [];
    try {
      for (let r = 0; r < o.rounds; r++) {
        for (const mode of ["snapshot", "replay"] as const) {
          const res = await runChild({ mode, url: server.url, samplesFile, kvFilter: o.kvFilter });
          if (res.invalid > 0) throw new Error(`${mode}: ${res.invalid} messages failed validation`);
          if (res.fingerprint !== want) throw new Error(`${mode}: the bootstrapped index differs from the live one`);
          (mode === "snapshot" ? snapRuns : replayRuns).push(res);
        }
        const s = snapRuns.at(-1) as ChildResult;
        console.error(
          `  round ${r + 1}: snapshot+tail ${s.readyS.toFixed(3)} s (load ${s.loadS.toFixed(3)} = fetch ${s.fetchS.toFixed(3)} + deserialize ${s.deserializeS.toFixed(3)} + list, tail ${s.tailS.toFixed(3)}) | replay ${(replayRuns.at(-1) as ChildResult).readyS.toFixed(3)} s`,
        );
      }
    } finally {
      rmSync(path.dirname(samplesFile), { recursive: true, force: true });
    }
    const snapshotReady = median(snapRuns.map((x) => x.readyS));
    const replayReady = median(replayRuns.map((x) => x.readyS));
    return {
      bench: "bootstrap",
      blocks: o.blocks,
      snapshot_ready_s: round(snapshotReady),
      replay_ready_s: round(replayReady),
      snapshot_bytes: written.size,
      speedup: round(replayReady / snapshotReady, 2),
      targets_met: snapshotReady <= 2 && replayReady / snapshotReady >= 2,
      snapshot_load_s: round(median(snapRuns.map((x) => x.loadS))),
      snapshot_fetch_s: round(median(snapRuns.map((x) => x.fetchS))),
      snapshot_deserialize_s: round(median(snapRuns.map((x) => x.deserializeS))),
      snapshot_tail_s: round(median(snapRuns.map((x) => x.tailS))),
      snapshot_serialize_ms: Math.round(written.serializeMs),
      snapshot_put_ms: Math.round(written.putMs),
      base_messages: baseMsgs,
      tail_messages: tailMsgs,
      stream_bytes: si.state.bytes,
      index_blocks: liveStats.blocks,
      index_entries: liveStats.entries,
      publish_msgs_per_s: Math.round(baseMsgs / publishS),
      replay_msgs_per_s: Math.round(endSeq / replayReady),
      kv_filter: o.kvFilter,
      rounds: o.rounds,
      snapshot_ready_rounds_s: snapRuns.map((x) => round(x.readyS)),
      replay_ready_rounds_s: replayRuns.map((x) => round(x.readyS)),
    };
  } finally {
    await h.nc.close();
    await server.stop();
  }
}

if (process.argv[2] === CHILD_FLAG && process.argv[1] === fileURLToPath(import.meta.url)) {
  childMain(process.argv.slice(3)).then(
    () => process.exit(0),
    (err: unknown) => {
      console.error(err);
      process.exit(1);
    },
  );
}
