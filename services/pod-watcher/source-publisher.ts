/**
 * Publishes one watcher source's pods to PODS and vouches for them (the I/O shell around
 * reconcile.ts). A driver (static list prober, Kubernetes informer) sets the desired pod states;
 * this keeps PODS equal to them:
 * - at activation it reads PODS back (last message per pod) and publishes only the difference,
 *   removing its own source's pods that are no longer wanted — never another source's;
 * - every publish is acknowledged by the stream; a failed one is retried with backoff until it
 *   lands (the desired state stays pending, later changes fold into the same retry);
 * - a heartbeat per source every `heartbeatMs` (`<prefix>.podsrc.<source>`), which the gateways'
 *   source timeout is judged on, and every pod re-asserted after `reassertMs`.
 * Only an active publisher (the leader of its source) writes anything.
 */
import type { PodEvent, PodSourceHeartbeat } from "../../schemas/events.js";
import { streamName } from "../../streams/definitions.js";
import type { Subjects } from "../../streams/subjects.js";
import { StreamFollower } from "../shared/follower.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import { acked } from "../shared/publish.js";
import { type BackoffOptions, backoffDelayMs, DEFAULT_BACKOFF } from "./backoff.js";
import { planReconcile, podKey, type PodState } from "./reconcile.js";

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
}

export interface SourcePublisherStats {
  published: number;
  removed: number;
  reasserted: number;
  heartbeats: number;
  publishFailures: number;
  heartbeatFailures: number;
  conflicts: number;
  /** Publishes still owed (waiting for a retry). */
  pending: number;
}

export class SourcePublisher {
  readonly stats: SourcePublisherStats = { published: 0, removed: 0, reasserted: 0, heartbeats: 0, publishFailures: 0, heartbeatFailures: 0, conflicts: 0, pending: 0 };
  private desired = new Map<string, PodState>();
  private complete = false;
  private readonly published = new Map<string, PodEvent>();
  private readonly publishedAt = new Map<string, number>();
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
    this.desired = desired;
    this.complete = complete;
    this.kick();
  }

  /** Becomes (or stops being) the source's writer. */
  setActive(active: boolean): void {
    if (this.closed || active === this.active) return;
    this.active = active;
    if (!active) {
      this.loaded = false;
      if (this.hbTimer) clearInterval(this.hbTimer);
      this.hbTimer = undefined;
      return;
    }
    this.hbTimer = setInterval(() => {
      void this.heartbeat();
      this.kick();
    }, this.o.heartbeatMs);
    this.kick();
  }

  get isActive(): boolean {
    return this.active;
  }

  /** Resolves once PODS holds the current desired state (nothing pending). */
  whenSynced(): Promise<void> {
    if (this.active && this.loaded && !this.dirty && !this.syncing && this.stats.pending === 0) return Promise.resolve();
    return new Promise((r) => this.syncedWaiters.push(r));
  }

  /** What the stream says now (as far as this publisher knows), by `podKey`. */
  publishedPods(): ReadonlyMap<string, PodEvent> {
    return this.published;
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

  /** Reads the stream's last word on every pod (all sources: conflicts are reported, not touched). */
  private async load(): Promise<void> {
    this.published.clear();
    this.publishedAt.clear();
    const follower = new StreamFollower({
      nats: this.o.nats, subjects: this.o.subjects, log: this.o.log, name: `pod-watcher-${this.o.source}`, family: "pods", types: ["pod"] as const,
      stream: streamName(this.o.prefix, "PODS"), filter: this.o.subjects.all("pods"), startAt: { kind: "last-per-subject" },
      onEvent: (ev, m) => {
        const k = podKey(ev.model, ev.pod);
        if (ev.action === "remove") {
          this.published.delete(k);
          this.publishedAt.delete(k);
        } else {
          this.published.set(k, ev);
          this.publishedAt.set(k, m.serverTs);
        }
      },
    });
    await follower.start();
    try {
      await follower.whenCaughtUp();
    } finally {
      await follower.stop();
    }
    this.loaded = true;
  }

  private async syncOnce(): Promise<void> {
    const plan = planReconcile({
      source: this.o.source, desired: this.desired, complete: this.complete, published: this.published, publishedAt: this.publishedAt, now: this.clock(), reassertMs: this.o.reassertMs,
      adoptUnowned: this.o.adoptUnowned ?? false,
    });
    this.stats.pending = plan.upserts.length + plan.removes.length;
    this.stats.reasserted += plan.reasserted;
    for (const k of plan.conflicts) {
      if (this.conflictsLogged.has(k) || this.conflictsLogged.size >= 1_000) continue;
      this.conflictsLogged.add(k);
      this.stats.conflicts++;
      const [model, pod] = k.split("\u0000");
      this.o.log.warn({ source: this.o.source, model, pod, other: this.published.get(k)?.source ?? null }, "pod also published by another source; ours wins until fixed");
    }
    for (const ev of [...plan.upserts, ...plan.removes]) {
      if (!this.active || this.closed) return;
      await acked(this.o.nats.js, this.o.subjects.pod(ev.model, ev.pod), ev);
      const k = podKey(ev.model, ev.pod);
      if (ev.action === "remove") {
        this.published.delete(k);
        this.publishedAt.delete(k);
        this.stats.removed++;
        this.o.log.info({ source: this.o.source, model: ev.model, pod: ev.pod }, "pod removed");
      } else {
        const previous = this.published.get(k);
        this.published.set(k, ev);
        this.publishedAt.set(k, ev.ts);
        this.stats.published++;
        if (previous?.ready !== ev.ready || previous?.address !== ev.address) this.o.log.info({ source: this.o.source, model: ev.model, pod: ev.pod, address: ev.address, ready: ev.ready }, "pod published");
      }
      this.stats.pending--;
    }
  }

  private async heartbeat(): Promise<void> {
    if (!this.active || this.closed) return;
    const hb: PodSourceHeartbeat = {
      type: "pod-source", source: this.o.source, watcher: this.o.watcher, pods: [...this.published.values()].filter((p) => p.source === this.o.source).length, intervalMs: this.o.heartbeatMs, ts: this.clock(),
    };
    try {
      await acked(this.o.nats.js, this.o.subjects.podSource(this.o.source), hb);
      this.stats.heartbeats++;
    } catch (err) {
      // The next beat is the retry: a heartbeat is only as good as it is recent.
      this.stats.heartbeatFailures++;
      this.o.log.warn({ source: this.o.source, err: (err as Error).message }, "source heartbeat failed");
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.active = false;
    if (this.hbTimer) clearInterval(this.hbTimer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    await this.syncing?.catch(() => undefined);
  }
}
