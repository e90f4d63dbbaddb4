import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { KvBatch, KvPodCleared } from "../../schemas/events.js";
import { streamName } from "../../streams/definitions.js";
import { applyStreams } from "../../streams/apply.js";
import { Subjects } from "../../streams/subjects.js";
import { startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { StreamFollower } from "../shared/follower.js";
import { encodeEvent } from "../shared/publish.js";
import { hashToHex } from "../views/block-hash.js";
import { PrefixIndex } from "../views/prefix-index.js";
import {
  checkRetention,
  leaseBucketName,
  loadNewestSnapshot,
  newestSnapshotMeta,
  retentionGap,
  retentionUrgency,
  snapshotBucketName,
  startSnapshotter,
  validateSnapshotTiming,
  writeSnapshot,
} from "./snapshots.js";
import { xorshift32 } from "../shared/seeded-random.js";

const M = "org/Model-3.1-8B";
const INDEX_OPTS = { maxEntries: 100_000, touchOnMatch: false };

/** A pino logger whose lines are kept, to assert on what was logged and why. */
function captureLog() {
  const lines: Array<Record<string, unknown> & { msg?: string }> = [];
  const log = pino({ level: "debug" }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  return { log, lines };
}


/**
 * Engine-like batches for a few pods: chained stores of 4-blocks runs, removals of older blocks,
 * a pod restart (kv-cleared + new epoch), a shared system prompt held by every pod.
 */
class Workload {
  private readonly rand: () => number;
  private readonly engineSeq = new Map<string, number>();
  private readonly epoch = new Map<string, string>();
  private readonly held = new Map<string, string[]>();
  /** Router-hash chains stored so far (for lookups). */
  readonly chains: bigint[][] = [];
  private readonly system: bigint[];

  constructor(
    readonly pods: string[],
    seed = 1,
  ) {
    this.rand = xorshift32(seed);
    this.system = Array.from({ length: 6 }, () => this.hash());
    this.chains.push(this.system);
  }

  private hash(): bigint {
    return (BigInt((this.rand() * 2 ** 32) >>> 0) << 32n) | BigInt((this.rand() * 2 ** 32) >>> 0);
  }

  private batch(pod: string, events: KvBatch["events"]): KvBatch {
    const seq = (this.engineSeq.get(pod) ?? -1) + 1;
    this.engineSeq.set(pod, seq);
    return { type: "kv", model: M, pod, epoch: this.epoch.get(pod) ?? "e1", seq, ts: Date.now(), events };
  }

  private stored(pod: string, chain: bigint[]): KvBatch["events"][number] {
    const eh = chain.map((h) => hashToHex(h ^ BigInt(pod.length * 7919 + pod.charCodeAt(pod.length - 1))));
    const list = this.held.get(pod) ?? [];
    list.push(...eh);
    this.held.set(pod, list);
    return { kind: "stored", engineHashes: eh, routerHashes: chain.map(hashToHex), parentEngineHash: null, blockSize: 16, medium: this.rand() < 0.2 ? "CPU" : "GPU", lora: null };
  }

  /** `n` messages (KvBatch or KvPodCleared). */
  next(n: number): Array<KvBatch | KvPodCleared> {
    const out: Array<KvBatch | KvPodCleared> = [];
    while (out.length < n) {
      const pod = this.pods[Math.floor(this.rand() * this.pods.length)] as string;
      const r = this.rand();
      if (r < 0.15) {
        out.push(this.batch(pod, [this.stored(pod, this.system)]));
      } else if (r < 0.3 && (this.held.get(pod)?.length ?? 0) > 8) {
        const list = this.held.get(pod) as string[];
        out.push(this.batch(pod, [{ kind: "removed", engineHashes: list.splice(0, 3), medium: null }]));
      } else if (r < 0.32) {
        const epoch = `e${out.length}-${Math.floor(this.rand() * 1e6)}`;
        this.epoch.set(pod, epoch);
        this.engineSeq.set(pod, -1);
        this.held.set(pod, []);
        out.push({ type: "kv-cleared", model: M, pod, epoch, reason: "engine-restart", ts: Date.now() });
      } else {
        const chain = [...this.system, ...Array.from({ length: 4 }, () => this.hash())];
        this.chains.push(chain);
        out.push(this.batch(pod, [this.stored(pod, chain.slice(this.system.length))]));
      }
    }
    return out;
  }
}

/** Every pod's matched blocks for each stored chain (and its prefixes), as plain data. */
function answers(index: PrefixIndex, chains: bigint[][]) {
  return chains.map((c) => {
    const r = index.longestMatch(M, c, undefined, { touch: false });
    return Object.fromEntries(r.pods.map((p, i) => [p, [r.blocks[i], r.gpuBlocks[i], r.weighted[i]]]));
  });
}

let env: TestEnv;
let prefixes = 0;

/** A fresh prefix with its own streams and buckets: tests in this file never see each other's state. */
async function freshPrefix(): Promise<{ prefix: string; subjects: Subjects }> {
  const prefix = `snap${++prefixes}`;
  await applyStreams(env.nats.nc, env.nats.jsm, { prefix });
  return { prefix, subjects: new Subjects(prefix) };
}

async function publish(subjects: Subjects, events: Array<KvBatch | KvPodCleared>): Promise<number> {
  let last = 0;
  for (const ev of events) last = (await env.nats.js.publish(subjects.kv(ev.model, ev.pod), encodeEvent(ev))).seq;
  return last;
}

/** Folds the KV stream into `index` the way the gateway does, until caught up. */
async function follow(prefix: string, subjects: Subjects, index: PrefixIndex, fromSeq?: number) {
  const f = new StreamFollower({
    nats: env.nats,
    subjects,
    log: captureLog().log,
    name: `test-${prefix}`,
    family: "kv",
    types: ["kv", "kv-cleared", "kv-routed"] as const,
    stream: streamName(prefix, "KV"),
    filter: subjects.all("kv"),
    startAt: fromSeq ? { kind: "sequence", seq: fromSeq } : { kind: "all" },
    onEvent: (ev, m) => {
      if (ev.type === "kv") index.apply(ev, m.seq);
      else if (ev.type === "kv-cleared") index.applyCleared(ev, m.seq);
    },
  });
  await f.start();
  await f.whenCaughtUp();
  return f;
}

beforeAll(async () => {
  env = await startTestEnv();
});
afterAll(async () => {
  await env?.stop();
});

describe("snapshot round trip", () => {
  it("snapshot + tail from seq+1 answers exactly like a replay from the start", async () => {
    const { prefix, subjects } = await freshPrefix();
    const work = new Workload(["pod-a", "pod-b", "pod-c", "pod-d"], 7);
    const headSeq = await publish(subjects, work.next(300));

    const live = new PrefixIndex(INDEX_OPTS);
    const f = await follow(prefix, subjects, live);
    expect(f.lastSeq).toBe(headSeq);
    const { log, lines } = captureLog();
    const written = await writeSnapshot({ nats: env.nats, prefix, index: live, seq: () => f.lastSeq, gatewayId: "gw-1", log });
    await f.stop();
    expect(written).toMatchObject({ seq: headSeq, format: "jrpi/1", gateway: "gw-1", entries: live.stats().entries });

    const loaded = await loadNewestSnapshot({ nats: env.nats, prefix, log, indexOptions: INDEX_OPTS });
    expect(loaded).toBeDefined();
    if (!loaded) return;
    expect(loaded).toMatchObject({ seq: headSeq, bytes: written.size, gateway: "gw-1" });
    expect(loaded.lost).toBeUndefined();
    expect(loaded.index.lastSeq).toBe(live.lastSeq);
    expect(answers(loaded.index, work.chains)).toEqual(answers(live, work.chains));
    // Counters (stale, podClears, ...) are per process, not state: only the contents must match.
    const contents = (x: PrefixIndex) => {
      const { entries, blocks, pods, lastSeq } = x.stats();
      return { entries, blocks, pods, lastSeq };
    };
    expect(contents(loaded.index)).toEqual(contents(live));
    expect(lines.some((l) => l.msg === "prefix index loaded from snapshot")).toBe(true);

    // More events after the snapshot: snapshot + tail must equal a full replay.
    const tailEnd = await publish(subjects, work.next(120));
    const tail = await follow(prefix, subjects, loaded.index, loaded.seq + 1);
    const replayed = new PrefixIndex(INDEX_OPTS);
    const full = await follow(prefix, subjects, replayed);
    expect(tail.lastSeq).toBe(tailEnd);
    expect(full.lastSeq).toBe(tailEnd);
    expect(answers(loaded.index, work.chains)).toEqual(answers(replayed, work.chains));
    expect(contents(loaded.index)).toEqual(contents(replayed));
    loaded.index.assertConsistent();
    await Promise.all([tail.stop(), full.stop()]);
  });

  it("no bucket and an empty bucket both mean: replay from the start", async () => {
    const { prefix } = await freshPrefix();
    const { log, lines } = captureLog();
    // `streams apply` creates the bucket; an older deployment may not have it.
    await env.nats.jsm.streams.delete(`OBJ_${snapshotBucketName(prefix)}`).catch(() => undefined);
    expect(await loadNewestSnapshot({ nats: env.nats, prefix, log })).toBeUndefined();
    expect(lines.at(-1)?.msg).toMatch(/no snapshot bucket/);
    await new Objm(env.nats.js).create(snapshotBucketName(prefix));
    expect(await loadNewestSnapshot({ nats: env.nats, prefix, log })).toBeUndefined();
    expect(lines.at(-1)?.msg).toMatch(/no snapshot yet/);
  });

  it("keeps only the newest few snapshots", async () => {
    const { prefix, subjects } = await freshPrefix();
    const work = new Workload(["p"], 3);
    const index = new PrefixIndex(INDEX_OPTS);
    for (let i = 0; i < 5; i++) {
      await publish(subjects, work.next(3));
      await (await follow(prefix, subjects, index, index.lastSeq + 1)).stop();
      await writeSnapshot({ nats: env.nats, prefix, index, gatewayId: "gw", keep: 2 });
    }
    const store = await new Objm(env.nats.js).open(snapshotBucketName(prefix));
    const names = (await store.list()).filter((i) => !i.deleted).map((i) => i.name);
    expect(names.sort()).toEqual([`prefix-index-${String(12).padStart(16, "0")}`, `prefix-index-${String(15).padStart(16, "0")}`]);
    expect((await newestSnapshotMeta(env.nats, prefix))?.seq).toBe(15);
  });
});

describe("bad snapshots", () => {
  /** Writes `bytes` as a snapshot object claiming to reflect `seq`. */
  async function putRaw(prefix: string, seq: number, bytes: Uint8Array, meta: Record<string, string> = {}) {
    const si = await env.nats.jsm.streams.info(streamName(prefix, "KV"));
    const store = await new Objm(env.nats.js).create(snapshotBucketName(prefix));
    await store.putBlob(
      {
        name: `prefix-index-${String(seq).padStart(16, "0")}`,
        metadata: {
          "jetroute-format": "jrpi/1",
          "jetroute-kv-seq": String(seq),
          "jetroute-kv-stream": si.config.name,
          "jetroute-kv-stream-created": si.created,
          "jetroute-created-ms": String(Date.now()),
          ...meta,
        },
      },
      bytes,
    );
  }

  it("a corrupt snapshot is skipped with a logged reason; none left -> undefined", async () => {
    const { prefix, subjects } = await freshPrefix();
    await publish(subjects, new Workload(["p"]).next(5));
    await putRaw(prefix, 5, new TextEncoder().encode("definitely not an index"));
    const { log, lines } = captureLog();
    expect(await loadNewestSnapshot({ nats: env.nats, prefix, log })).toBeUndefined();
    const why = lines.find((l) => l.msg === "snapshot unusable");
    expect(why?.reason).toMatch(/corrupt snapshot: not a prefix index snapshot/);
    expect(lines.at(-1)?.msg).toMatch(/no usable snapshot/);
  });

  it("a truncated newest snapshot falls back to the next older one", async () => {
    const { prefix, subjects } = await freshPrefix();
    const work = new Workload(["p", "q"], 5);
    await publish(subjects, work.next(40));
    const index = new PrefixIndex(INDEX_OPTS);
    await (await follow(prefix, subjects, index)).stop();
    await writeSnapshot({ nats: env.nats, prefix, index, gatewayId: "gw" });
    await publish(subjects, work.next(2));
    const good = index.serialize();
    await putRaw(prefix, 42, good.subarray(0, good.length - 9));
    const { log, lines } = captureLog();
    const loaded = await loadNewestSnapshot({ nats: env.nats, prefix, log, indexOptions: INDEX_OPTS });
    expect(loaded?.seq).toBe(40);
    expect(lines.find((l) => l.msg === "snapshot unusable")).toMatchObject({ seq: 42 });
    expect(loaded && answers(loaded.index, work.chains)).toEqual(answers(index, work.chains));
  });

  it("snapshots of a recreated stream, ahead of the stream, or with unreadable metadata are not used", async () => {
    const { prefix, subjects } = await freshPrefix();
    const work = new Workload(["p"], 9);
    await publish(subjects, work.next(10));
    const index = new PrefixIndex(INDEX_OPTS);
    await (await follow(prefix, subjects, index)).stop();
    const bytes = index.serialize();
    await putRaw(prefix, 9, bytes, { "jetroute-kv-stream-created": "2001-01-01T00:00:00Z" });
    await putRaw(prefix, 99, bytes);
    await putRaw(prefix, 8, bytes, { "jetroute-format": "zip/3" });
    const { log, lines } = captureLog();
    expect(await loadNewestSnapshot({ nats: env.nats, prefix, log })).toBeUndefined();
    const reasons = lines.filter((l) => l.msg === "snapshot unusable" || l.msg === "ignoring object in the snapshot bucket").map((l) => l.reason);
    expect(reasons).toEqual(expect.arrayContaining(["snapshot is ahead of the stream", "snapshot of another KV stream incarnation", 'unknown format "zip/3"']));
  });
});

describe("retention guard", () => {
  it("retentionGap: only events after the snapshot and before the stream's first message are lost", () => {
    expect(retentionGap(1, 0)).toBeUndefined();
    expect(retentionGap(11, 10)).toBeUndefined();
    expect(retentionGap(5, 10)).toBeUndefined();
    expect(retentionGap(15, 10)).toEqual({ from: 11, to: 14 });
    expect(retentionGap(2, 0)).toEqual({ from: 1, to: 1 });
  });

  it("retentionUrgency: a gap is a violation; a stream dropping towards the snapshot within two intervals asks for an early write", () => {
    const report = (firstSeq: number, ok = true) => ({ stream: "KV", firstSeq, lastSeq: 10_000, snapshotSeq: 5_000, ok });
    expect(retentionUrgency(report(6_000, false), undefined, { seq: 5_000 }, 0, 60_000)).toEqual({ kind: "violation" });
    // No earlier report or no snapshot: no rate to extrapolate from.
    expect(retentionUrgency(report(1_000), undefined, { seq: 5_000 }, 0, 60_000)).toBeUndefined();
    expect(retentionUrgency(report(1_000), { seq: 900, at: 0 }, undefined, 1_000, 60_000)).toBeUndefined();
    // 100 events per second dropped; 4,001 to go to pass the snapshot: 40 s < 2 x 60 s.
    expect(retentionUrgency(report(1_000), { seq: 900, at: 0 }, { seq: 5_000 }, 1_000, 60_000)).toEqual({ kind: "early", leftMs: 40_010 });
    // The same rate against a 10 s interval: 40 s is more than two intervals away.
    expect(retentionUrgency(report(1_000), { seq: 900, at: 0 }, { seq: 5_000 }, 1_000, 10_000)).toBeUndefined();
    // A stream that dropped nothing since the last report is not moving.
    expect(retentionUrgency(report(900), { seq: 900, at: 0 }, { seq: 5_000 }, 1_000, 60_000)).toBeUndefined();
  });

  it("refuses an interval that is not far below the KV stream's max_age", () => {
    expect(() => validateSnapshotTiming({ intervalMs: 30_000, leaseMs: 15_000, maxAgeMs: 3_600_000 })).not.toThrow();
    expect(() => validateSnapshotTiming({ intervalMs: 400_000, leaseMs: 15_000, maxAgeMs: 3_600_000 })).toThrow(/max_age/);
    expect(() => validateSnapshotTiming({ intervalMs: 10 * 3_600_000, leaseMs: 15_000, maxAgeMs: 0 })).not.toThrow();
  });

  it("startSnapshotter checks the timing against the real stream", async () => {
    const { prefix } = await freshPrefix();
    await expect(startSnapshotter({ nats: env.nats, prefix, gatewayId: "g", index: () => new PrefixIndex(), intervalMs: 20 * 60_000, log: captureLog().log })).rejects.toThrow(
      /max_age/,
    );
  });

  it("detects a stream that dropped events the newest snapshot does not cover", async () => {
    const { prefix, subjects } = await freshPrefix();
    const work = new Workload(["p", "q"], 11);
    await publish(subjects, work.next(20));
    const index = new PrefixIndex(INDEX_OPTS);
    const f = await follow(prefix, subjects, index);
    await writeSnapshot({ nats: env.nats, prefix, index, seq: () => f.lastSeq, gatewayId: "gw" });
    await f.stop();
    expect(await checkRetention({ nats: env.nats, prefix })).toMatchObject({ ok: true, snapshotSeq: 20, firstSeq: 1, lastSeq: 20 });

    await publish(subjects, work.next(10));
    // What max_age or max_bytes would do: the stream drops 21..24, newer than the snapshot.
    await env.nats.jsm.streams.purge(streamName(prefix, "KV"), { seq: 25 });
    expect(await checkRetention({ nats: env.nats, prefix })).toMatchObject({ ok: false, snapshotSeq: 20, firstSeq: 25, lost: { from: 21, to: 24 } });

    const { log, lines } = captureLog();
    const used = await loadNewestSnapshot({ nats: env.nats, prefix, log, indexOptions: INDEX_OPTS });
    expect(used).toMatchObject({ seq: 20, lost: { from: 21, to: 24 } });
    expect(lines.find((l) => l.level === 50)?.msg).toMatch(/dropped events newer than the newest snapshot/);
    expect(await loadNewestSnapshot({ nats: env.nats, prefix, log, onGap: "replay" })).toBeUndefined();

    // The leader reports it too, and snapshots at once (the gap stays: those events are gone).
    const s = await startSnapshotter({ nats: env.nats, prefix, gatewayId: "leader", index: () => index, intervalMs: 60_000, leaseMs: 600, log });
    try {
      await waitFor(() => s.stats.retention.violations > 0, 5_000, "a retention violation");
      expect(s.stats.retention.last).toMatchObject({ ok: false, lost: { from: 21, to: 24 } });
      expect(lines.some((l) => l.level === 50 && /booting replicas will miss them/.test(String(l.msg)))).toBe(true);
    } finally {
      await s.close();
    }
  });
});

describe("snapshot lease", () => {
  /** An index with content at stream seq `seq` (the lease tests never load, so seqs need no stream). */
  function indexAt(seq: number, index = new PrefixIndex(INDEX_OPTS), work = new Workload(["a", "b"], seq)) {
    const evs = work.next(5);
    for (const [i, ev] of evs.entries()) {
      const at = seq - evs.length + i + 1;
      if (ev.type === "kv") index.apply(ev, at);
      else index.applyCleared(ev, at);
    }
    return index;
  }

  it("two snapshotters: one writes; after the holder dies the other takes over once the lease expires", async () => {
    const { prefix } = await freshPrefix();
    const index = indexAt(10);
    const { log } = captureLog();
    const opts = { nats: env.nats, prefix, index: () => index, intervalMs: 100, leaseMs: 600, log };
    const a = await startSnapshotter({ ...opts, gatewayId: "gw-a" });
    const b = await startSnapshotter({ ...opts, gatewayId: "gw-b" });
    try {
      await waitFor(() => a.stats.writes + b.stats.writes > 0, 5_000, "a first snapshot");
      // Several intervals with changes: still only the one leader writes.
      for (let seq = 20; seq <= 50; seq += 10) {
        indexAt(seq, index);
        await waitFor(() => (a.stats.lastWrite?.seq ?? 0) === seq || (b.stats.lastWrite?.seq ?? 0) === seq, 5_000, `snapshot ${seq}`);
      }
      // Due ticks without changes write nothing.
      const [leader, other] = a.stats.writes > 0 ? [a, b] : [b, a];
      const idle = leader.stats.unchanged;
      await waitFor(() => leader.stats.unchanged >= idle + 3, 5_000, "three due ticks without changes");
      expect(other.stats.writes).toBe(0);
      expect(leader.isLeader()).toBe(true);
      expect(other.isLeader()).toBe(false);
      expect(leader.stats.unchanged).toBeGreaterThan(0);
      const leaderId = leader === a ? "gw-a" : "gw-b";
      expect(other.stats.holder).toBe(leaderId);

      // A crash: the lease is not released and must expire.
      const t0 = performance.now();
      await leader.close({ release: false });
      await waitFor(() => other.isLeader(), 5_000, "takeover");
      const takeoverMs = performance.now() - t0;
      expect(takeoverMs).toBeGreaterThan(300);
      expect(takeoverMs).toBeLessThan(3_000);
      // The new leader does not rewrite an unchanged index, and writes the next change.
      expect(other.stats.writes).toBe(0);
      indexAt(60, index);
      await waitFor(() => other.stats.writes > 0, 5_000, "a snapshot by the new leader");
      expect(await newestSnapshotMeta(env.nats, prefix)).toMatchObject({ seq: 60, gateway: leaderId === "gw-a" ? "gw-b" : "gw-a" });
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });

  it("a live holder whose clock is 5 s behind keeps the lease (its stamped expiry is not read); once it stops renewing, it is taken over", async () => {
    const { prefix } = await freshPrefix();
    const index = indexAt(10);
    const { log } = captureLog();
    const kv = await new Kvm(env.nats.js).open(leaseBucketName(prefix));
    // A holder on a host 5 s behind, writing what gateways from before the shared lease wrote: to
    // every other host its expiry has always already passed.
    const skewedNow = () => Date.now() - 5_000;
    const value = () => JSON.stringify({ holder: "gw-skewed", renewedAt: skewedNow(), expiresAt: skewedNow() + 600, leaseMs: 600 });
    let revision = await kv.create("snapshotter.prefix-index", value());
    let renewals = 0;
    let renewing = true;
    const holder = (async () => {
      while (renewing) {
        await new Promise((r) => setTimeout(r, 100));
        if (renewing) revision = await kv.update("snapshotter.prefix-index", value(), revision);
        renewals++;
      }
    })();
    const s = await startSnapshotter({ nats: env.nats, prefix, index: () => index, intervalMs: 100, leaseMs: 600, gatewayId: "gw-fresh", log });
    try {
      await waitFor(() => s.stats.holder === "gw-skewed", 3_000, "the skewed holder seen");
      const from = renewals;
      // Several lease durations of renewals: never taken, never written.
      await waitFor(() => renewals >= from + 20, 10_000, "20 renewals by the skewed holder");
      expect(s.isLeader()).toBe(false);
      expect(s.stats).toMatchObject({ acquired: 0, writes: 0, holder: "gw-skewed" });
      renewing = false;
      await holder;
      const t0 = performance.now();
      await waitFor(() => s.isLeader(), 5_000, "takeover once the revision stood still");
      expect(performance.now() - t0).toBeGreaterThan(300);
      await waitFor(() => s.stats.writes > 0, 5_000, "a snapshot by the new holder");
    } finally {
      renewing = false;
      await holder.catch(() => undefined);
      await s.close();
    }
  });

  it("a graceful close hands the lease over at once; a replica that is not ready never contends", async () => {
    const { prefix } = await freshPrefix();
    const index = indexAt(10);
    const { log } = captureLog();
    const opts = { nats: env.nats, prefix, index: () => index, intervalMs: 100, leaseMs: 3_000, log };
    let bReady = false;
    const a = await startSnapshotter({ ...opts, gatewayId: "gw-a" });
    const b = await startSnapshotter({ ...opts, gatewayId: "gw-b", ready: () => bReady });
    const c = await startSnapshotter({ ...opts, gatewayId: "gw-c", ready: () => false });
    try {
      await waitFor(() => a.stats.writes > 0, 5_000, "a's first snapshot");
      bReady = true;
      await waitFor(() => b.stats.holder === "gw-a", 5_000, "b sees a's lease");
      const t0 = performance.now();
      await a.close();
      await waitFor(() => b.isLeader(), 2_000, "takeover");
      // Well under the 3 s lease: the key was deleted, not left to expire.
      expect(performance.now() - t0).toBeLessThan(1_500);
      expect(c.isLeader()).toBe(false);
      expect(c.stats).toMatchObject({ acquired: 0, writes: 0, holder: undefined });
    } finally {
      await Promise.all([a.close(), b.close(), c.close()]);
    }
  });
});
