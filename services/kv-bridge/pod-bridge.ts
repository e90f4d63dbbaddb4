/**
 * One pod's bridge: engine ZMQ events in, `KvBatch` / `KvPodCleared` out, in engine order.
 *
 * A single async worker per pod handles live messages one at a time, so sequence decisions,
 * replays and the engine-hash map never interleave. Live messages that arrive while the worker
 * awaits a replay wait in an inbox (and past a bound, in libzmq's queue).
 *
 * Sequence rules (engines.md §1 "Sequence handling"):
 * - seq == last+1: publish.
 * - seq  > last+1: a gap. Replay from the last seq whose timestamp the bridge knows: the engine
 *   answering with that seq *and the same timestamp* proves it is still the same incarnation, and
 *   the replay fills the gap. A replay that starts later than asked (the engine's buffer rolled
 *   past it) cannot fill it: `kv-cleared` (gap-unrepairable), then carry on from what the buffer
 *   still holds. No replay endpoint or no answer: `kv-cleared` (replay-unavailable), carry on from
 *   the new batch.
 * - seq <= last with another timestamp (or seq back at 0): the engine restarted. New epoch,
 *   `kv-cleared` (engine-restart), then everything the new incarnation has buffered.
 * - On connect, and whenever the SUB reconnects, the same replay runs: a new SUB misses the first
 *   messages, and a reconnect may hide a restart.
 *
 * Epochs: see README.md ("Engine epochs"). In short, an epoch is named after the oldest batch of
 * the incarnation the bridge could see, `<seq>@<ts in µs>`, which is `0@<ts of batch 0>` whenever
 * the engine still buffers batch 0, so every bridge derives the same name; and a bridge that finds
 * the pod's last KV message in the stream adopts its epoch once the engine's copy of that batch
 * carries the same timestamp.
 */
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import type { KvBatch, KvPodCleared } from "../../schemas/events.js";
import { decodeEvent } from "../../schemas/validate.js";
import type { Subjects } from "../../streams/subjects.js";
import type { Logger } from "../shared/log.js";
import { encodeEvent } from "../shared/publish.js";
import { BlockMap, type BlockMapCounters } from "./block-map.js";
import type { DeadLetterCounters, KvDeadLetters } from "./dead-letters.js";
import { EngineLink, type LinkCounters } from "./engine-link.js";
import { OrderedPublisher, type PublishCounters } from "./ordered-publisher.js";
import { type EngineBatch, type EngineDialect, type Frame, decodeBatch, parseLiveMessage } from "./wire.js";

export type ClearReason = KvPodCleared["reason"];

export interface KvBridgeStats extends PublishCounters, BlockMapCounters, LinkCounters, DeadLetterCounters {
  pods: number;
  /** Engine batches published (one `KvBatch`, or several parts of one when it was too large). */
  batches: number;
  blocksStored: number;
  blocksRemoved: number;
  allCleared: number;
  cleared: Record<ClearReason, number>;
  gaps: number;
  gapsRepaired: number;
  restarts: number;
  replays: number;
  replayFailures: number;
  /** Live messages dropped because a replay had already delivered them. */
  liveDuplicates: number;
  /** Messages or payloads that could not be used at all (dead-lettered). */
  malformed: number;
  oversize: number;
  /** Known events with bad fields, skipped (their batch is dead-lettered once). */
  invalidEvents: number;
  /** Events with a tag this bridge does not know, skipped. */
  unknownEvents: number;
  /** SGLang BlockStored events with a cache_salt, skipped (their pages are not keyed by salt: misses, never false hits). */
  saltedSkipped: number;
  splitBatches: number;
  internalErrors: number;
}

export function newStats(): KvBridgeStats {
  return {
    pods: 0, batches: 0, blocksStored: 0, blocksRemoved: 0, allCleared: 0,
    cleared: { "engine-restart": 0, "gap-unrepairable": 0, "replay-unavailable": 0, "bridge-start": 0 },
    gaps: 0, gapsRepaired: 0, restarts: 0, replays: 0, replayFailures: 0, liveDuplicates: 0,
    malformed: 0, oversize: 0, invalidEvents: 0, unknownEvents: 0, saltedSkipped: 0, splitBatches: 0, internalErrors: 0,
    acked: 0, duplicates: 0, publishErrors: 0, unknownParents: 0, evicted: 0, ambiguousParents: 0, opaqueBlocks: 0, disconnects: 0, socketsRecreated: 0,
    deadLetters: 0, deadLetterErrors: 0,
  };
}

export interface PodTarget {
  model: string;
  pod: string;
  /** Which engine's wire dialect to decode (default vllm). */
  engine?: EngineDialect;
  endpoint: string;
  replayEndpoint?: string;
  topic?: string;
}

export interface PodBridgeOptions {
  js: JetStreamClient;
  jsm: JetStreamManager;
  subjects: Subjects;
  /** The KV stream's name (the pod's last message there seeds the epoch after a bridge restart). */
  stream: string;
  deadLetters: KvDeadLetters;
  stats: KvBridgeStats;
  log: Logger;
  replayTimeoutMs: number;
  maxFrameBytes: number;
  maxMessageBytes: number;
  window: number;
  maxTrackedBlocks: number;
  reconnectIntervalMs: number;
  reconnectMaxIntervalMs: number;
  /** Largest NATS payload the server accepts. */
  maxPayload(): number;
}

/** What the stream (or this bridge) last said about the pod. */
interface Prev {
  epoch: string;
  /** Last engine seq whose timestamp is known; undefined when the last word was `kv-cleared`. */
  seq?: number;
  tsMs?: number;
  /** The pod's blocks are already cleared downstream (last message was `kv-cleared`). */
  cleared: boolean;
}

interface Cursor {
  epoch: string;
  /** Last engine seq handled (published, or skipped as undecodable). */
  seq: number;
  /** Last seq that decoded, and its engine timestamp: what continuity is checked against. */
  anchorSeq: number;
  anchorTsMs: number;
}

interface Raw {
  seq: number;
  payload: Uint8Array;
  source: "live" | "replay";
  info?: { d: Decoded; reported: boolean; reason?: string; oversize?: boolean };
}

/** A decoded batch, or a hole (`batch` undefined) where the payload was unusable. */
interface Decoded {
  tsMs?: number;
  batch?: EngineBatch;
}

type Continuity = "same" | "unknown" | "different" | "fresh";

type InboxItem = { kind: "live"; frames: Buffer[] } | { kind: "probe"; join?: number };

/** How long after the SUB's handshake the post-join replay runs (the subscription's propagation takes well under this). */
const JOIN_SETTLE_MS = 250;
/** A post-join replay that could not run is tried again this much later. */
const JOIN_RETRY_MS = 1_000;

/** Past either bound the SUB stops being read (libzmq queues, then the engine's PUB drops: a gap). */
const INBOX_PAUSE = 10_000;
const INBOX_PAUSE_BYTES = 64 * 1024 * 1024;
const INBOX_RESUME = 1_000;
/** Headroom under max_payload for the headers (Nats-Msg-Id, Jr-Schema). */
const HEADER_ROOM = 1_024;

export function epochName(seq: number, tsMs: number): string {
  return `${seq}@${Math.round(tsMs * 1000)}`;
}

export class PodBridge {
  private readonly link: EngineLink;
  private readonly publisher: OrderedPublisher;
  private readonly map: BlockMap;
  private readonly subject: string;
  private cursor?: Cursor;
  /** Used while there is no cursor: the stream's (or an ended incarnation's) last word. */
  private prev: Prev | null = null;
  /** seq -> ts (null for holes) of the last replay, to drop the live copies of those batches. */
  private replayTs = new Map<number, number | null>();
  private replayTsMax = -1;
  private replayCooldownUntil = 0;
  private inbox: InboxItem[] = [];
  private inboxBytes = 0;
  private wake?: () => void;
  private closed = false;
  private worker?: Promise<void>;
  private probeQueued = false;
  state: "syncing" | "live" | "closed" = "syncing";

  constructor(
    readonly target: PodTarget,
    private readonly o: PodBridgeOptions,
  ) {
    this.subject = o.subjects.kv(target.model, target.pod);
    this.map = new BlockMap(target.model, o.maxTrackedBlocks, o.stats, target.engine ?? "vllm");
    this.publisher = new OrderedPublisher({ js: o.js, window: o.window, log: o.log, counters: o.stats });
    this.link = new EngineLink({
      endpoint: target.endpoint,
      replayEndpoint: target.replayEndpoint,
      topic: target.topic,
      maxMessageBytes: o.maxMessageBytes,
      reconnectIntervalMs: o.reconnectIntervalMs,
      reconnectMaxIntervalMs: o.reconnectMaxIntervalMs,
      log: o.log,
      counters: o.stats,
      onMessage: (frames) => this.push({ kind: "live", frames }),
      onReconnect: () => {
        if (this.probeQueued) return;
        this.probeQueued = true;
        this.push({ kind: "probe" });
      },
      onJoined: () => {
        // Slow joiner: what the engine publishes between the handshake and the subscription taking
        // effect is missed, and on a pod that then goes quiet no later event would reveal the gap.
        // One replay from the anchor shortly after joining fetches it.
        this.armJoin(++this.joinsArmed, JOIN_SETTLE_MS);
      },
    });
  }

  private joinTimer: NodeJS.Timeout | undefined;
  /** Joins seen (handshakes) and the last one whose post-join replay ran (`settled` compares them). */
  private joinsArmed = 0;
  private joinsDone = 0;

  /**
   * Connected to the engine, and the replay after the latest join is done: from here on an event
   * the engine publishes reaches this bridge live (or, if lost, is repaired at the next one).
   */
  get settled(): boolean {
    return this.link.connected && this.joinsArmed > 0 && this.joinsDone === this.joinsArmed;
  }

  /** See EngineLink.connected. */
  get connected(): boolean {
    return this.link.connected;
  }

  /** Batches (and clears) taken from the engine but not yet acknowledged by the KV stream. */
  get unacked(): number {
    return this.publisher.unacked;
  }

  private armJoin(join: number, delayMs: number): void {
    clearTimeout(this.joinTimer);
    this.joinTimer = setTimeout(() => this.push({ kind: "probe", join }), delayMs);
    this.joinTimer.unref();
  }

  get epoch(): string | undefined {
    return this.cursor?.epoch;
  }

  get lastSeq(): number | undefined {
    return this.cursor?.seq;
  }

  start(): void {
    this.o.stats.pods++;
    this.link.start();
    this.worker = this.run();
  }

  async close(flushTimeoutMs = 2_000): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.joinTimer);
    this.state = "closed";
    this.o.stats.pods--;
    this.wake?.();
    await this.link.close();
    // Give queued batches a moment to be acked; a NATS outage must not hang shutdown.
    let timer: NodeJS.Timeout | undefined;
    const drained = (async () => {
      await this.worker;
      await this.publisher.flush();
    })();
    await Promise.race([drained, new Promise((r) => (timer = setTimeout(r, flushTimeoutMs)))]);
    clearTimeout(timer);
    this.publisher.close();
    await this.worker;
  }

  private push(item: InboxItem): void {
    if (this.closed) return;
    this.inbox.push(item);
    if (item.kind === "live") for (const f of item.frames) this.inboxBytes += f.length;
    if (this.inbox.length >= INBOX_PAUSE || this.inboxBytes >= INBOX_PAUSE_BYTES) this.link.pause();
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  private async next(): Promise<InboxItem | undefined> {
    while (!this.closed) {
      const item = this.inbox.shift();
      if (item) {
        if (item.kind === "live") for (const f of item.frames) this.inboxBytes -= f.length;
        if (this.inbox.length <= INBOX_RESUME && this.inboxBytes < INBOX_PAUSE_BYTES / 2) this.link.resume();
        return item;
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
    return undefined;
  }

  private async run(): Promise<void> {
    await this.guard(() => this.initialSync());
    for (;;) {
      const item = await this.next();
      if (!item) return;
      if (item.kind === "probe" && item.join !== undefined) {
        const join = item.join;
        const ran = (await this.guard(() => this.probe())) === true;
        // A replay that could not run (cooling down after a failure, timed out) is tried again.
        if (ran) this.joinsDone = Math.max(this.joinsDone, join);
        else if (join === this.joinsArmed && !this.closed) this.armJoin(join, JOIN_RETRY_MS);
      } else if (item.kind === "probe") {
        this.probeQueued = false;
        await this.guard(() => this.probe());
      } else {
        await this.guard(() => this.onLive(item.frames));
      }
    }
  }

  /** A bug in one message's handling must not stop the pod's worker. */
  private async guard<T>(fn: () => Promise<T>): Promise<T | undefined> {
    try {
      return await fn();
    } catch (err) {
      if (this.closed) return;
      this.o.stats.internalErrors++;
      this.o.log.error({ err, pod: this.target.pod }, "kv-bridge worker error");
    }
  }

  // ---- sequence handling -------------------------------------------------------------------

  private async initialSync(): Promise<void> {
    this.prev = await this.lookupPrev();
    if (!this.link.hasReplay) {
      this.state = "live";
      return; // the first live batch resolves the epoch
    }
    await this.syncFromStart();
    this.state = "live";
  }

  /** Nothing seen yet: whatever the engine's buffer holds is new. False when the replay could not run. */
  private async syncFromStart(): Promise<boolean> {
    const r = await this.replay(0);
    if (r) await this.resolve(r, this.prev, "gap-unrepairable");
    return r !== undefined;
  }

  private async onLive(frames: Buffer[]): Promise<void> {
    const parsed = this.envelope(frames);
    if (!parsed) return;
    const raw: Raw = { seq: parsed.seq, payload: parsed.payload, source: "live" };
    if (raw.seq > this.replayTsMax && this.replayTs.size > 0) this.replayTs.clear();
    const c = this.cursor;
    if (!c) {
      const fromReplay = raw.seq > 0 ? await this.replay(0) : undefined;
      await this.resolve(merge(fromReplay ?? [], raw), this.prev, fromReplay ? "gap-unrepairable" : raw.seq > 0 ? "replay-unavailable" : "bridge-start");
      return;
    }
    if (raw.seq === c.seq + 1) {
      await this.apply(raw, true);
      return;
    }
    if (raw.seq <= c.seq) {
      const known = raw.seq === c.anchorSeq ? c.anchorTsMs : this.replayTs.get(raw.seq);
      if (known !== undefined) {
        const d = this.decode(raw, false);
        if (known === null || d.tsMs === known) {
          this.o.stats.liveDuplicates++;
          return;
        }
      }
      this.o.log.info({ pod: this.target.pod, seq: raw.seq, last: c.seq }, "engine sequence went back; checking for a restart");
      await this.anomaly(raw, 0);
      return;
    }
    this.o.stats.gaps++;
    this.o.log.info({ pod: this.target.pod, seq: raw.seq, last: c.seq }, "sequence gap");
    await this.anomaly(raw, c.anchorSeq);
  }

  /**
   * After a SUB reconnect or join: anything missed (or a restart) shows up in a replay from the
   * anchor. False when the replay could not run (the caller may try again).
   */
  private async probe(): Promise<boolean> {
    const c = this.cursor;
    if (!this.link.hasReplay) return true;
    return c ? await this.anomaly(undefined, c.anchorSeq) : await this.syncFromStart();
  }

  /** False when the replay could not run. */
  private async anomaly(trigger: Raw | undefined, from: number): Promise<boolean> {
    const c = this.cursor as Cursor;
    const lastSeq = c.seq;
    const prev: Prev = { epoch: c.epoch, seq: c.anchorSeq, tsMs: c.anchorTsMs, cleared: false };
    let replayed = await this.replay(from);
    if (!replayed) {
      if (trigger) await this.resolve([trigger], prev, "replay-unavailable");
      return false;
    }
    let obs = merge(replayed, trigger);
    // A different incarnation: its oldest buffered batch names the new epoch, so look from 0.
    if (from > 0 && this.classify(obs, prev) === "different") {
      replayed = await this.replay(0);
      if (replayed) obs = merge(replayed, trigger);
    }
    const kind = await this.resolve(obs, prev, "gap-unrepairable");
    if (kind === "same" && trigger && trigger.seq > lastSeq) this.o.stats.gapsRepaired++;
    return true;
  }

  /**
   * Is `obs` the continuation of what downstream last heard? "same": the engine still has that
   * batch with that timestamp. "unknown": its buffer starts later (rolled past it), nothing proves
   * either way. "different": another incarnation. "fresh": downstream has no batch to compare.
   */
  private classify(obs: readonly Raw[], prev: Prev | null): Continuity {
    if (!prev || prev.seq === undefined) return "fresh";
    const first = obs[0];
    const last = obs[obs.length - 1];
    if (!first || !last) return "different";
    if (first.seq <= prev.seq && prev.seq <= last.seq) {
      const at = obs.find((o) => o.seq === prev.seq);
      const ts = at ? this.decode(at, false).tsMs : undefined;
      return ts !== undefined && ts === prev.tsMs ? "same" : "different";
    }
    if (first.seq > prev.seq) {
      const ts = this.firstTs(obs);
      if (ts !== undefined && prev.tsMs !== undefined && ts >= prev.tsMs) return "unknown";
    }
    return "different";
  }

  /**
   * Decides the epoch for what the engine showed (`obs`, oldest first) given what downstream last
   * heard (`prev`), publishes a `kv-cleared` when downstream's picture of the pod cannot be
   * continued, then applies `obs` in order.
   */
  private async resolve(obs: Raw[], prev: Prev | null, hint: ClearReason): Promise<Continuity | "empty"> {
    this.replayTs.clear();
    this.replayTsMax = -1;
    const first = obs[0];
    if (!first) {
      // The engine has no batches at all: whatever downstream knows about this pod is gone.
      if (prev && !prev.cleared) {
        this.o.stats.restarts++;
        await this.publishClear(prev.epoch, "engine-restart", "end");
      }
      this.prev = prev ? { epoch: prev.epoch, cleared: true } : null;
      this.cursor = undefined;
      this.map.clear();
      return "empty";
    }
    const kind = this.classify(obs, prev);
    let epoch: string;
    let publishAfter = -1;
    let mapFloor = -1;
    if (kind === "same") {
      const p = prev as Prev;
      epoch = p.epoch;
      publishAfter = p.seq as number;
      if (this.cursor?.epoch === epoch) mapFloor = this.cursor.seq;
    } else if (kind === "unknown") {
      // Same incarnation or not, nothing tells; keeping the epoch keeps Msg-Ids comparable with any
      // other bridge on this pod, and seqs only grow, so none collides with an earlier batch.
      epoch = (prev as Prev).epoch;
      await this.publishClear(epoch, hint, `@${first.seq}`);
    } else {
      epoch = this.anchorEpoch(obs);
      this.map.clear();
      if (kind === "different") {
        this.o.stats.restarts++;
        this.o.log.info({ pod: this.target.pod, epoch, previous: prev?.epoch }, "engine restarted: new epoch");
      }
      if (prev && prev.epoch === epoch) publishAfter = prev.seq ?? -1;
      else if (prev && !prev.cleared) await this.publishClear(epoch, kind === "different" ? "engine-restart" : hint, `@${first.seq}`);
      else if (!prev && first.seq > 0) await this.publishClear(epoch, "bridge-start", `@${first.seq}`);
    }
    if (kind !== "same" || !this.cursor || this.cursor.epoch !== epoch) {
      this.cursor = { epoch, seq: first.seq - 1, anchorSeq: -1, anchorTsMs: -1 };
    }
    this.prev = null;
    for (const r of obs) {
      if (this.closed) break;
      if (r.seq <= mapFloor) continue;
      const d = await this.apply(r, r.seq > publishAfter);
      this.replayTs.set(r.seq, d.tsMs ?? null);
      this.replayTsMax = r.seq;
    }
    return kind;
  }

  private anchorEpoch(obs: readonly Raw[]): string {
    for (const r of obs) {
      const ts = this.decode(r, false).tsMs;
      if (ts !== undefined) return epochName(r.seq, ts);
    }
    // Nothing decodable to anchor on: a bridge-local name (other bridges will not agree).
    return `${(obs[0] as Raw).seq}@local-${Date.now()}`;
  }

  private firstTs(obs: readonly Raw[]): number | undefined {
    for (const r of obs) {
      const ts = this.decode(r, false).tsMs;
      if (ts !== undefined) return ts;
    }
    return undefined;
  }

  // ---- applying and publishing -------------------------------------------------------------

  /** Updates the map and the cursor with one batch; publishes it when `publish`. */
  private async apply(r: Raw, publish: boolean): Promise<Decoded> {
    const c = this.cursor as Cursor;
    const d = this.decode(r, publish);
    c.seq = Math.max(c.seq, r.seq);
    if (d.tsMs !== undefined) {
      c.anchorSeq = r.seq;
      c.anchorTsMs = d.tsMs;
    }
    if (!d.batch) return d;
    const events: KvBatch["events"] = [];
    let stored = 0;
    let removed = 0;
    for (const ev of d.batch.events) {
      if (ev.kind === "stored") {
        events.push(this.map.stored(ev));
        stored += ev.hashes.length;
      } else if (ev.kind === "removed") {
        events.push(this.map.removed(ev));
        removed += ev.hashes.length;
      } else {
        this.map.clear();
        events.push({ kind: "all-cleared" });
        if (publish) this.o.stats.allCleared++;
      }
    }
    if (!publish) return d;
    const msg: KvBatch = {
      type: "kv",
      model: this.target.model,
      pod: this.target.pod,
      epoch: c.epoch,
      seq: r.seq,
      ts: d.tsMs as number,
      ...(d.batch.dpRank !== undefined ? { dpRank: d.batch.dpRank } : {}),
      events,
    };
    this.o.stats.batches++;
    this.o.stats.blocksStored += stored;
    this.o.stats.blocksRemoved += removed;
    await this.publishBatch(msg);
    return d;
  }

  private async publishBatch(msg: KvBatch): Promise<void> {
    const id = `${this.target.pod}:${msg.epoch}:${msg.seq}`;
    const data = encodeEvent(msg);
    const limit = this.o.maxPayload() - HEADER_ROOM;
    if (data.length <= limit) {
      await this.publisher.send({ subject: this.subject, data, msgId: id, schema: "kv/1" });
      return;
    }
    // Over the server's max_payload: same seq, events split across parts (ids `<id>.<part>`).
    this.o.stats.splitBatches++;
    const parts = splitBatch(msg, limit);
    for (let i = 0; i < parts.length; i++) {
      await this.publisher.send({ subject: this.subject, data: encodeEvent(parts[i]), msgId: i === 0 ? id : `${id}.${i}`, schema: "kv/1" });
    }
  }

  private async publishClear(epoch: string, reason: ClearReason, idSuffix: string): Promise<void> {
    const ev: KvPodCleared = { type: "kv-cleared", model: this.target.model, pod: this.target.pod, epoch, reason, ts: Date.now() };
    this.o.stats.cleared[reason]++;
    this.o.log.info({ pod: this.target.pod, epoch, reason }, "pod's KV blocks cleared downstream");
    await this.publisher.send({ subject: this.subject, data: encodeEvent(ev), msgId: `${this.target.pod}:${epoch}:cleared${idSuffix}`, schema: "kv-cleared/1" });
  }

  // ---- engine input ------------------------------------------------------------------------

  private replayFailedRecently(): boolean {
    return Date.now() < this.replayCooldownUntil;
  }

  /** Replay from `from`; undefined when unavailable (no endpoint, timeout, cooling down after one). */
  private async replay(from: number): Promise<Raw[] | undefined> {
    if (!this.link.hasReplay || this.replayFailedRecently() || this.closed) return undefined;
    this.o.stats.replays++;
    const r = await this.link.replay(from, this.o.replayTimeoutMs);
    if (!r.ok) {
      this.o.stats.replayFailures++;
      this.replayCooldownUntil = Date.now() + Math.max(1_000, this.o.replayTimeoutMs);
      this.o.log.warn({ pod: this.target.pod, from, reason: r.reason }, "replay unavailable");
      return undefined;
    }
    const out: Raw[] = [];
    for (const rep of r.replies) {
      if (!rep.parsed.ok) {
        this.o.stats.malformed++;
        this.o.deadLetters.send({ ...this.dlBase("replay"), reason: rep.parsed.reason, frames: rep.frames });
        continue;
      }
      const f = rep.parsed.value;
      if (f.seq >= from) out.push({ seq: f.seq, payload: f.payload, source: "replay" });
    }
    out.sort((a, b) => a.seq - b.seq);
    // An engine answers each seq once; keep the first copy if one ever repeats.
    return out.filter((x, i) => i === 0 || (out[i - 1] as Raw).seq !== x.seq);
  }

  private dlBase(source: "live" | "replay") {
    return { model: this.target.model, pod: this.target.pod, endpoint: source === "live" ? this.target.endpoint : (this.target.replayEndpoint ?? ""), source };
  }

  /** The live envelope; undefined (after dead-lettering) when it is unusable. */
  private envelope(frames: Buffer[]): Frame | undefined {
    const big = frames.find((f) => f.length > this.o.maxFrameBytes);
    const p = parseLiveMessage(frames);
    if (!p.ok) {
      this.o.stats.malformed++;
      if (big) this.o.stats.oversize++;
      this.o.deadLetters.send({ ...this.dlBase("live"), reason: p.reason, frames });
      return undefined;
    }
    if (big && big !== p.value.payload) {
      this.o.stats.malformed++;
      this.o.stats.oversize++;
      this.o.deadLetters.send({ ...this.dlBase("live"), reason: `frame of ${big.length} bytes exceeds the ${this.o.maxFrameBytes}-byte limit`, frames, engineSeq: p.value.seq });
      return undefined;
    }
    return p.value;
  }

  /**
   * Decodes a payload once (cached on the Raw). Unusable payloads become holes: the sequence moves
   * past them rather than replaying the same bytes forever (see README "Bad input"). `report` is
   * false when the batch is only consulted (continuity checks, duplicate checks, map rebuilds), so
   * one bad batch is counted and dead-lettered once, when it is first handled for real.
   */
  private decode(r: Raw, report: boolean): Decoded {
    let info = r.info;
    if (!info) {
      if (r.payload.length > this.o.maxFrameBytes) {
        info = r.info = { d: {}, reported: false, reason: `payload of ${r.payload.length} bytes exceeds the ${this.o.maxFrameBytes}-byte limit`, oversize: true };
      } else {
        const b = decodeBatch(r.payload, this.target.engine ?? "vllm");
        info = r.info = b.ok ? { d: { tsMs: b.value.ts * 1000, batch: b.value }, reported: false } : { d: {}, reported: false, reason: b.reason };
      }
    }
    if (report && !info.reported) {
      info.reported = true;
      const b = info.d.batch;
      if (!b) {
        this.o.stats.malformed++;
        if (info.oversize) this.o.stats.oversize++;
        this.o.deadLetters.send({ ...this.dlBase(r.source), reason: info.reason ?? "undecodable payload", frames: [r.payload], type: "EventBatch", engineSeq: r.seq });
      } else {
        this.o.stats.unknownEvents += b.unknownTags.length;
        this.o.stats.saltedSkipped += b.salted ?? 0;
        if (b.invalid.length > 0) {
          this.o.stats.invalidEvents += b.invalid.length;
          this.o.deadLetters.send({ ...this.dlBase(r.source), reason: `invalid events skipped: ${b.invalid.join("; ")}`, frames: [r.payload], type: "EventBatch", engineSeq: r.seq });
        }
      }
    }
    return info.d;
  }

  // ---- stream ------------------------------------------------------------------------------

  private async lookupPrev(): Promise<Prev | null> {
    try {
      const m = await this.o.jsm.streams.getMessage(this.o.stream, { last_by_subj: this.subject });
      if (!m) return null;
      const ev = decodeEvent(m.data, ["kv", "kv-cleared"] as const);
      if (!ev.ok) return null;
      if (ev.event.type === "kv") return { epoch: ev.event.epoch, seq: ev.event.seq, tsMs: ev.event.ts, cleared: false };
      return { epoch: ev.event.epoch, cleared: true };
    } catch (err) {
      this.o.log.warn({ err, pod: this.target.pod }, "cannot read the pod's last KV message; starting without it");
      return null;
    }
  }
}

/** Replayed batches plus the live batch that triggered the replay (if the replay did not reach it). */
function merge(replayed: Raw[], trigger: Raw | undefined): Raw[] {
  if (!trigger) return replayed;
  const last = replayed[replayed.length - 1];
  if (!last || trigger.seq > last.seq) return [...replayed, trigger];
  return replayed;
}

/** Splits a batch whose JSON exceeds `limit` bytes into parts with the same seq, in event order. */
export function splitBatch(msg: KvBatch, limit: number): KvBatch[] {
  const envelope = Buffer.byteLength(JSON.stringify({ ...msg, events: [] }));
  const budget = Math.max(256, limit - envelope - 16);
  const pieces: KvBatch["events"] = [];
  for (const ev of msg.events) {
    const size = Buffer.byteLength(JSON.stringify(ev));
    if (size <= budget || ev.kind === "all-cleared") {
      pieces.push(ev);
      continue;
    }
    const perHash = Math.ceil(size / ev.engineHashes.length);
    const n = Math.max(1, Math.floor(budget / perHash) - 1);
    for (let i = 0; i < ev.engineHashes.length; i += n) {
      if (ev.kind === "stored") {
        pieces.push({
          ...ev,
          engineHashes: ev.engineHashes.slice(i, i + n),
          routerHashes: ev.routerHashes.slice(i, i + n),
          parentEngineHash: i === 0 ? ev.parentEngineHash : (ev.engineHashes[i - 1] as string),
        });
      } else {
        pieces.push({ ...ev, engineHashes: ev.engineHashes.slice(i, i + n) });
      }
    }
  }
  const parts: KvBatch[] = [];
  let cur: KvBatch["events"] = [];
  let curSize = 0;
  for (const ev of pieces) {
    const size = Buffer.byteLength(JSON.stringify(ev)) + 1;
    if (cur.length > 0 && curSize + size > budget) {
      parts.push({ ...msg, events: cur });
      cur = [];
      curSize = 0;
    }
    cur.push(ev);
    curSize += size;
  }
  parts.push({ ...msg, events: cur });
  return parts;
}
