/**
 * Publishes one watcher source's pods to PODS and vouches for them (the I/O shell around
 * reconcile.ts). A driver (static list prober, Kubernetes informer) sets the desired pod states;
 * this keeps PODS equal to them:
 * - while active it follows PODS (last message per pod, then every new one) and folds every
 *   write, its own and anyone else's, into what it believes the stream says: a pod another source
 *   took over is never removed as ours, a pod someone else removed is republished at once;
 * - every publish names the subject's last sequence as this publisher saw it (JetStream's
 *   expected-last-subject-sequence): a write that raced another (another source, a deposed
 *   leader's late publish, the new leader's) is refused by the stream; the subject is re-read and
 *   the plan redone;
 * - a stream that lost messages (purged, deleted and recreated) is read again from scratch and
 *   repaired at the next heartbeat, not at the next re-assertion;
 * - a failed publish is retried with backoff until it lands (the desired state stays pending,
 *   later changes fold into the same retry);
 * - a heartbeat per source every `heartbeatMs` (`<prefix>.podsrc.<source>`), which the gateways'
 *   source timeout is judged on, and every pod re-asserted after `reassertMs`.
 * Only an active publisher that is still its source's leader (checked before every write) and has
 * not seen another watcher heartbeat for its source (two unelected watchers sharing a name would
 * fight over the pods) writes anything.
 */
import type { PubAck } from "@nats-io/jetstream";
import type { PodEvent, PodSourceHeartbeat } from "../../schemas/events.js";
import type { RecordSigner } from "../../streams/signatures.js";
import { streamName } from "../../streams/definitions.js";
import { isWrongLastSequence } from "../../streams/errors.js";
import type { Subjects } from "../../streams/subjects.js";
import { StreamFollower } from "../shared/follower.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { acked, encodeEvent } from "../shared/publish.js";
import { type BackoffOptions, backoffDelayMs, DEFAULT_BACKOFF } from "./backoff.js";
import { planReconcile, podKey, type PodState } from "./reconcile.js";
import type { ModelFilter } from "./pool-models.js";
import { STREAM_EVENT_TYPES } from "../../streams/event-types.js";

export interface SourcePublisherOptions {
  nats: NatsHandles;
  subjects: Subjects;
  prefix: string;
  source: string;
  /** This instance's id (heartbeats name it). */
  watcher: string;
  log: Logger;
  heartbeatMs: number;
  reassertMs: number;
  /** See reconcile.ts `adoptUnowned`. */
  adoptUnowned?: boolean;
  backoff?: BackoffOptions;
  clock?: () => number;
  /** Still the source's leader? Asked before every write (a lease can lapse between rounds). */
  stillLeader?: () => boolean;
  /**
   * False while the driver cannot vouch for its pods (a Kubernetes informer blind for too long):
   * heartbeats stop, so the gateways' source timeout takes the pods out of routing.
   */
  canVouch?: () => boolean;
  /** Without leader election: another watcher heartbeating this source is a clash (refuse to publish). */
  exclusive?: boolean;
  /** Signs each event as it is published (streams/signatures.ts): gateways with `--pod-public-key` act only on signed ones. */
  signer?: RecordSigner;
}

export interface SourcePublisherStats {
  published: number;
  removed: number;
  reasserted: number;
  heartbeats: number;
  publishFailures: number;
  heartbeatFailures: number;
  conflicts: number;
  /** Publishes refused by the stream because the subject changed meanwhile (re-read and re-planned). */
  raced: number;
  /** Times PODS was read again from scratch (activation, lost messages, a recreated stream). */
  reloads: number;
  /** 1 while another watcher heartbeats this source without leader election (this one refuses to publish). */
  clash: number;
  /** Publishes still owed (waiting for a retry). */
  pending: number;
  /** Pods the driver lists that the pool's model filter leaves out (gateway pools). */
  filteredOut: number;
}

/** Bound on removed pod subjects whose last sequence is remembered. */
const MAX_REMOVED_SEQS = 50_000;
/** Bound on other sources remembered (their heartbeats). */
const MAX_SOURCES = 10_000;
/** A source is live while its last heartbeat is younger than this many of its intervals (the gateways' default timeout is six). */
const LIVE_BEATS = 6;

export class SourcePublisher {
  readonly stats: SourcePublisherStats = { published: 0, removed: 0, reasserted: 0, heartbeats: 0, publishFailures: 0, heartbeatFailures: 0, conflicts: 0, raced: 0, reloads: 0, clash: 0, pending: 0, filteredOut: 0 };
  private desired = new Map<string, PodState>();
  /** What the driver listed, before the pool's model filter. */
  private unfiltered = new Map<string, PodState>();
  private modelFilter: ModelFilter;
  private complete = false;
  private readonly published = new Map<string, PodEvent>();
  private readonly publishedAt = new Map<string, number>();
  /** Each published pod subject's last stream sequence as far as this publisher knows. */
  private readonly seqs = new Map<string, number>();
  /**
   * The same for subjects whose last message is a remove, oldest first and bounded (pod names churn
   * with every rollout). One forgotten costs a refused publish and a re-read, nothing more.
   */
  private readonly removedSeqs = new Map<string, number>();
  private maxSeq = 0;
  private follower: StreamFollower<"pod" | "pod-source"> | undefined;
  /** Local time of the last heartbeat of this source from another watcher (exclusive mode). */
  private foreignBeatAt = Number.NEGATIVE_INFINITY;
  /** Other sources' newest heartbeat (server time, interval), to tell live owners from silent ones. */
  private readonly beats = new Map<string, { at: number; intervalMs: number }>();
  /** Local time since when heartbeats or publishes have been failing (undefined: not failing). */
  private failingSince: number | undefined;
  private active = false;
  private loaded = false;
  private closed = false;
  private dirty = false;
  private syncing: Promise<void> | undefined;
  private attempt = 0;
  private retryTimer: NodeJS.Timeout | undefined;
  private hbTimer: NodeJS.Timeout | undefined;
  private readonly clock: () => number;
  private readonly conflictsLogged = new Set<string>();
  private syncedWaiters: Array<() => void> = [];

  constructor(private readonly o: SourcePublisherOptions) {
    this.clock = o.clock ?? Date.now;
  }

  /** Replaces the desired pod states; `complete` = this is the driver's whole truth (removals allowed). */
  setDesired(desired: Map<string, PodState>, complete: boolean): void {
    this.unfiltered = desired;
    this.complete = complete;
    this.refilter();
  }

  /**
   * Gateway pools (pool-models.ts): only pods of models the filter accepts are published (the rest
   * are removed, as if the driver no longer listed them); undefined = every pod; "unknown" = the
   * models are not known yet: nothing is published and nothing removed. Applied at once.
   */
  setModelFilter(filter: ModelFilter): void {
    this.modelFilter = filter;
    this.refilter();
  }

  private refilter(): void {
    const f = this.modelFilter;
    if (f === undefined) this.desired = this.unfiltered;
    else if (f === "unknown") this.desired = new Map();
    else this.desired = new Map([...this.unfiltered].filter(([, p]) => f(p.model)));
    this.stats.filteredOut = this.unfiltered.size - this.desired.size;
    this.kick();
  }

  /** Becomes (or stops being) the source's writer. */
  setActive(active: boolean): void {
    if (this.closed || active === this.active) return;
    this.active = active;
    if (!active) {
      this.loaded = false;
      this.failingSince = undefined;
      if (this.hbTimer) clearInterval(this.hbTimer);
      this.hbTimer = undefined;
      void this.stopFollower();
      // Nothing is pending on a publisher that stopped writing: nobody waits on it (shutdown).
      for (const w of this.syncedWaiters.splice(0)) w();
      return;
    }
    this.hbTimer = setInterval(() => {
      void this.heartbeat().then(() => this.checkStream());
      this.kick();
    }, this.o.heartbeatMs);
    this.kick();
  }

  get isActive(): boolean {
    return this.active;
  }

  /** How long (ms) heartbeats or publishes have been failing without one success; 0 = healthy. */
  failingForMs(): number {
    return this.failingSince === undefined ? 0 : this.clock() - this.failingSince;
  }

  /** Resolves once PODS holds the current desired state (nothing pending), or the publisher stops writing. */
  whenSynced(): Promise<void> {
    if (!this.active || this.closed) return Promise.resolve();
    if (this.loaded && !this.dirty && !this.syncing && this.stats.pending === 0) return Promise.resolve();
    return new Promise((r) => this.syncedWaiters.push(r));
  }

  /** What the stream says now (as far as this publisher knows), by `podKey`. */
  publishedPods(): ReadonlyMap<string, PodEvent> {
    return this.published;
  }

  private mayPublish(): boolean {
    if (!this.active || this.closed) return false;
    if (this.o.stillLeader && !this.o.stillLeader()) return false;
    const clash = this.o.exclusive === true && this.clock() - this.foreignBeatAt < 3 * this.o.heartbeatMs;
    this.stats.clash = clash ? 1 : 0;
    return !clash;
  }

  private ok(): void {
    this.failingSince = undefined;
  }

  private failed(): void {
    this.failingSince ??= this.clock();
  }

  private kick(): void {
    this.dirty = true;
    if (!this.syncing && !this.retryTimer && this.active) this.syncing = this.loop().finally(() => (this.syncing = undefined));
  }

  private async loop(): Promise<void> {
    while (this.dirty && this.active && !this.closed) {
      this.dirty = false;
      try {
        if (!this.loaded) {
          await this.load();
          await this.heartbeat();
        }
        await this.syncOnce();
        this.attempt = 0;
      } catch (err) {
        this.stats.publishFailures++;
        this.failed();
        // The stream may have been deleted or recreated under us: read it again before the retry.
        this.loaded = false;
        const delay = backoffDelayMs(this.attempt++, Math.random(), this.o.backoff ?? DEFAULT_BACKOFF);
        this.o.log.warn({ source: this.o.source, err: (err as Error).message, retryInMs: delay }, "publishing to PODS failed; retrying");
        this.retryTimer = setTimeout(() => {
          this.retryTimer = undefined;
          this.kick();
        }, delay);
        return;
      }
    }
    if (this.active && this.loaded && !this.dirty && this.stats.pending === 0) for (const w of this.syncedWaiters.splice(0)) w();
  }

  /** Folds one write (ours, acknowledged, or anyone's, as followed) in; false if not newer than what is known. */
  private fold(k: string, ev: PodEvent, seq: number, at: number): boolean {
    if (seq <= this.lastSeqOf(k)) return false;
    if (seq > this.maxSeq) this.maxSeq = seq;
    if (ev.action === "remove") {
      this.seqs.delete(k);
      this.removedSeqs.delete(k);
      this.removedSeqs.set(k, seq);
      if (this.removedSeqs.size > MAX_REMOVED_SEQS) this.removedSeqs.delete(this.removedSeqs.keys().next().value as string);
      this.published.delete(k);
      this.publishedAt.delete(k);
    } else {
      this.removedSeqs.delete(k);
      this.seqs.set(k, seq);
      this.published.set(k, ev);
      this.publishedAt.set(k, at);
    }
    return true;
  }

  private lastSeqOf(k: string): number {
    return this.seqs.get(k) ?? this.removedSeqs.get(k) ?? 0;
  }

  private async stopFollower(): Promise<void> {
    const f = this.follower;
    this.follower = undefined;
    await f?.stop();
  }

  /**
   * (Re)reads the stream's last word on every pod (all sources: conflicts are reported, not
   * touched), then keeps following it: every later write lands in the same state.
   */
  private async load(): Promise<void> {
    await this.stopFollower();
    this.published.clear();
    this.publishedAt.clear();
    this.seqs.clear();
    this.removedSeqs.clear();
    this.maxSeq = 0;
    this.beats.clear();
    this.stats.reloads++;
    const follower: StreamFollower<"pod" | "pod-source"> = new StreamFollower({
      // The whole stream (2.9 allows one filter): pods, and the sources' heartbeats for clash detection.
      nats: this.o.nats, subjects: this.o.subjects, log: this.o.log, name: `pod-watcher-${this.o.source}`, family: "pods", types: STREAM_EVENT_TYPES.PODS,
      stream: streamName(this.o.prefix, "PODS"), startAt: { kind: "last-per-subject" },
      onEvent: (ev, m) => {
        if (this.follower !== follower) return;
        if (m.seq > this.maxSeq) this.maxSeq = m.seq;
        if (ev.type === "pod-source") {
          if (ev.source !== this.o.source && (this.beats.has(ev.source) || this.beats.size < MAX_SOURCES)) this.beats.set(ev.source, { at: m.serverTs, intervalMs: ev.intervalMs });
          // Only live beats count: the replay holds the last beat of this source's earlier runs.
          if (follower.caughtUp && this.o.exclusive && ev.source === this.o.source && ev.watcher !== this.o.watcher) {
            if (this.stats.clash === 0) this.o.log.error({ source: this.o.source, me: this.o.watcher, other: ev.watcher }, "another pod-watcher publishes this source without leader election; refusing to publish (give each watcher its own --source, or run the pair with --leader-election)");
            this.foreignBeatAt = this.clock();
            this.stats.clash = 1;
          }
          return;
        }
        // Someone else's write (our own were folded when acknowledged): re-plan against it.
        if (this.fold(podKey(ev.model, ev.pod), ev, m.seq, m.serverTs) && this.loaded) this.kick();
      },
    });
    this.follower = follower;
    await follower.start();
    await follower.whenCaughtUp();
    this.loaded = true;
  }

  /** A write was refused: the subject changed since we last saw it. Read its last message now. */
  private async reread(subject: string, k: string): Promise<void> {
    let advanced = false;
    try {
      const m = await this.o.nats.jsm.streams.getMessage(streamName(this.o.prefix, "PODS"), { last_by_subj: subject });
      // Null is the server's "no message found" (10037): the subject's messages are gone (purged).
      // What else went with them? Read it all again.
      if (m === null) {
        this.loaded = false;
        return;
      }
      const ev = m.json<PodEvent>();
      if (ev?.type === "pod") advanced = this.fold(k, ev, m.seq, m.time.getTime());
    } catch {
      // The read failed: learnt nothing.
    }
    // Nothing learnt (the read failed, or the message there is not a pod's): give the follower a moment.
    if (!advanced) await new Promise((r) => setTimeout(r, 100));
  }

  /**
   * Did the stream lose what we rely on? A purge moves its first sequence past messages we hold
   * as the last word on our pods; a recreated stream numbers from 1 again. Either way: read it
   * again and republish what is missing, now rather than at the next re-assertion.
   */
  private async checkStream(): Promise<void> {
    if (!this.loaded || !this.mayPublish()) return;
    let first: number;
    let last: number;
    try {
      const info = await this.o.nats.jsm.streams.info(streamName(this.o.prefix, "PODS"));
      first = info.state.first_seq;
      last = info.state.last_seq;
    } catch {
      return; // the heartbeat's failure is counted already
    }
    let lost = last < this.maxSeq;
    if (!lost)
      for (const [k, ev] of this.published) {
        if (ev.source === this.o.source && this.lastSeqOf(k) < first) {
          lost = true;
          break;
        }
      }
    if (!lost) return;
    this.o.log.warn({ source: this.o.source, firstSeq: first, lastSeq: last, knownSeq: this.maxSeq }, "PODS lost messages (purged or recreated); reading it again and republishing");
    this.loaded = false;
    this.kick();
  }

  private liveSources(): Set<string> {
    const now = this.clock();
    const live = new Set<string>();
    for (const [name, b] of this.beats) if (now - b.at <= LIVE_BEATS * b.intervalMs) live.add(name);
    return live;
  }

  private async syncOnce(): Promise<void> {
    const plan = planReconcile({
      source: this.o.source, desired: this.desired, complete: this.complete && this.modelFilter !== "unknown", published: this.published, publishedAt: this.publishedAt, now: this.clock(), reassertMs: this.o.reassertMs,
      adoptUnowned: this.o.adoptUnowned ?? false, liveSources: this.liveSources(),
    });
    this.stats.pending = plan.upserts.length + plan.removes.length;
    this.stats.reasserted += plan.reasserted;
    for (const k of plan.conflicts) {
      if (this.conflictsLogged.has(k) || this.conflictsLogged.size >= 1_000) continue;
      this.conflictsLogged.add(k);
      this.stats.conflicts++;
      const [model, pod] = k.split("\u0000");
      this.o.log.warn({ source: this.o.source, model, pod, other: this.published.get(k)?.source ?? null }, "pod also listed by another source; the live owner keeps it until fixed");
    }
    for (const ev of [...plan.upserts, ...plan.removes]) {
      if (!this.mayPublish()) return;
      const k = podKey(ev.model, ev.pod);
      const subject = this.o.subjects.pod(ev.model, ev.pod);
      let ack: PubAck;
      try {
        ack = await this.o.nats.js.publish(subject, encodeEvent(this.signed(subject, ev)), { expect: { lastSubjectSequence: this.lastSeqOf(k) } });
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
        // Someone wrote this pod since we last looked: learn what, and plan again.
        this.stats.raced++;
        await this.reread(subject, k);
        this.dirty = true;
        return;
      }
      this.ok();
      const previous = this.published.get(k);
      this.fold(k, ev, ack.seq, ev.ts);
      if (ev.action === "remove") {
        this.stats.removed++;
        this.o.log.info({ source: this.o.source, model: ev.model, pod: ev.pod }, "pod removed");
      } else {
        this.stats.published++;
        if (previous?.ready !== ev.ready || previous?.address !== ev.address) this.o.log.info({ source: this.o.source, model: ev.model, pod: ev.pod, address: ev.address, ready: ev.ready }, "pod published");
      }
      this.stats.pending--;
    }
  }

  private async heartbeat(): Promise<void> {
    if (!this.mayPublish()) return;
    if (this.o.canVouch && !this.o.canVouch()) return;
    const hb: PodSourceHeartbeat = {
      type: "pod-source", source: this.o.source, watcher: this.o.watcher, pods: [...this.published.values()].filter((p) => p.source === this.o.source).length, intervalMs: this.o.heartbeatMs, ts: this.clock(),
    };
    try {
      const subject = this.o.subjects.podSource(this.o.source);
      const ack = await acked(this.o.nats.js, subject, this.signed(subject, hb));
      this.stats.heartbeats++;
      this.ok();
      // A stream numbering below what we have seen was recreated: everything must be read again.
      if (this.loaded && ack.seq < this.maxSeq) {
        this.loaded = false;
        this.kick();
      }
    } catch (err) {
      // The next beat is the retry: a heartbeat is only as good as it is recent.
      this.stats.heartbeatFailures++;
      this.failed();
      this.o.log.warn({ source: this.o.source, err: (err as Error).message }, "source heartbeat failed");
    }
  }

  /** The event as published under `subject`: signed at this attempt when a signer is set. */
  private signed<T extends PodEvent | PodSourceHeartbeat>(subject: string, ev: T): T {
    return this.o.signer ? this.o.signer.sign(subject, ev, this.clock()) : ev;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.active = false;
    if (this.hbTimer) clearInterval(this.hbTimer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    for (const w of this.syncedWaiters.splice(0)) w();
    await this.syncing?.catch(() => undefined);
    await this.stopFollower();
  }
}
