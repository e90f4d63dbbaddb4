/**
 * Pod set view: model -> pods, folded from PODS events. Pure: no I/O.
 * A request may name a base model or a LoRA adapter served by some of its pods.
 *
 * Source liveness: a pod event names the watcher source that vouches for it. Every event of a
 * source (its heartbeats, its pod events) renews the source at the event's broker time `at`;
 * `sweepSources(now, timeoutMs)` marks sources silent beyond the timeout, and their pods leave
 * the routable lists until the source speaks again. Time comes only from the caller.
 */
import type { AdapterPlacement } from "../../schemas/adapters.js";
import { MAX_ADAPTERS } from "../../schemas/adapters.js";
import type { EngineKind, PodEvent, PodRole, PodSourceHeartbeat, SchedulingPolicy } from "../../schemas/events.js";

export interface PodInfo {
  readonly model: string;
  readonly pod: string;
  readonly address: string;
  readonly engine: EngineKind;
  readonly role: PodRole;
  readonly roleset?: string;
  /** The pod's class for the latency model (PODS `podClass`); absent: unclassed. */
  readonly podClass?: string;
  /** SGLang P/D prefill pods: the bootstrap port decode pods fetch the KV from. */
  readonly bootstrapPort?: number;
  /** The engine schedules by request priority (PODS `schedulingPolicy`); absent: FCFS, no priority is written for it. */
  readonly schedulingPolicy?: SchedulingPolicy;
  readonly metricsAddress?: string;
  readonly kvEvents?: PodEvent["kvEvents"];
  readonly adapters: readonly string[];
  readonly labels: Readonly<Record<string, string>>;
  readonly ready: boolean;
  readonly updatedAt: number;
  /** The watcher source vouching for the pod (absent: published before sources existed). */
  readonly source?: string;
  /** The autoscaler chose it to leave (docs/autoscaling.md): not routable, removed by `deadline`. */
  readonly draining?: { readonly deadline: number };
}

/** Bound on adapters an engine may report for one pod (the LOAD schema's bound). */
const MAX_ENGINE_ADAPTERS = 256;

/**
 * Adapters an engine reported expire when no sample has repeated them for this long (broker time):
 * a scraper refreshes them every scrape (100 ms by default), so only a pod whose load went stale
 * (scraper gone, engine unreachable, `--no-read-models`) loses them, instead of keeping them forever.
 */
export const ENGINE_ADAPTERS_TTL_MS = 10_000;

/** What a gateway knows of one watcher source. */
export interface PodSourceInfo {
  readonly source: string;
  /** Broker time (ms) of the newest event the source published. */
  readonly lastSeen: number;
  readonly watcher?: string;
  /** True once a sweep found it silent beyond the timeout (until it speaks again). */
  readonly silent: boolean;
}

/**
 * Default for the gateways' `--pod-source-timeout-ms`: six missed watcher heartbeats (5 s apart),
 * longer than a leader takeover's budget (12 s lease + two 4 s renewal rounds + a 5 s heartbeat),
 * so a failover normally keeps the source live (a budget, not a guarantee: see docs/architecture.md).
 */
export const DEFAULT_POD_SOURCE_TIMEOUT_MS = 30_000;

/** Bound on remembered sources; a source with no pods left is the first forgotten. */
export const MAX_POD_SOURCES = 10_000;

/**
 * A load placed by the adapter controller becomes routable when its record arrives; an engine sample
 * taken this long after that which no longer lists the adapter (the pod restarted empty) takes
 * the pod out of the adapter's routable list before the controller reacts. Longer than a scrape's
 * round trip, so a sample read just before the load finished never hides a fresh replica.
 */
export const MANAGED_ADAPTER_GRACE_MS = 2_000;

/** What a gateway holds of one managed adapter (the ADAPTERS stream's last record). */
interface ManagedAdapter {
  readonly base?: string;
  /** Pods where its load succeeded -> broker time the gateway first saw it loaded there. */
  readonly loaded: ReadonlyMap<string, number>;
}

export interface PodSetReader {
  /** Ready pods serving `model` (a base model or an adapter). Stable array until the next change. */
  readyPods(model: string): readonly PodInfo[];
  /** A managed adapter's base model (its requests wait for a replica under the base's flow control), else undefined. */
  baseOf?(model: string): string | undefined;
  /** True when any pod, ready or not, serves `model`: distinguishes 404 from 503. */
  knows(model: string): boolean;
  get(model: string, pod: string): PodInfo | undefined;
  byAddress(address: string): PodInfo | undefined;
  all(): readonly PodInfo[];
}

const key = (model: string, pod: string) => `${model}\u0000${pod}`;

const merged = (published: readonly string[], engine: readonly string[] | undefined): readonly string[] =>
  engine === undefined || engine.length === 0 ? published : [...new Set([...published, ...engine])].sort();

export interface PodSetOptions {
  /** Pod addresses allowed (`--pod-cidrs`); a pod outside is held as absent and counted. Default: any. */
  addressAllowed?: (address: string) => boolean;
}

export class PodSet implements PodSetReader {
  constructor(private readonly o: PodSetOptions = {}) {}

  /** Pods published with an address outside `addressAllowed`, by pod key (held as absent). */
  private readonly refused = new Set<string>();
  private readonly pods = new Map<string, PodInfo>();
  private readyCache = new Map<string, readonly PodInfo[]>();
  private served = new Set<string>();
  private addresses = new Map<string, PodInfo>();
  private readonly sources = new Map<string, { lastSeen: number; watcher?: string }>();
  /** Adapters the engines report (LOAD samples), by pod key; merged into `adapters`. */
  private readonly engineAdapters = new Map<string, readonly string[]>();
  /** When each pod's engine adapters were last reported (the newest broker time known then). */
  private readonly engineAdaptersAt = new Map<string, number>();
  /** The newest broker time seen (events' `at`, sweeps' `now`): time for samples that carry none. */
  private latest = 0;
  /**
   * LoRA adapters the adapter controller manages (ADAPTERS stream, docs/adapters.md): their
   * routable pods are the ones whose load succeeded, whatever engines or PODS list; bounded by
   * MAX_ADAPTERS (a record beyond it is counted and ignored).
   */
  private readonly managed = new Map<string, ManagedAdapter>();
  /** Placement records ignored because MAX_ADAPTERS adapters are already managed. */
  managedRefused = 0;
  /** Adapters as PODS published them, by pod key. */
  private readonly publishedAdapters = new Map<string, readonly string[]>();
  private readonly silentSources = new Set<string>();
  lastSeq = 0;
  version = 0;
  /** Pods currently held as absent because their address is outside the allowed networks. */
  get refusedAddresses(): number {
    return this.refused.size;
  }
  /**
   * Adapters ignored because they are named like a base model some pod serves (as of now): an
   * engine-reported one counts per pod, a managed one (placement record) once. Either would take
   * that model's traffic.
   */
  shadowingAdapters = 0;
  /** Of those, managed adapters (placement records) refused for their name (as of now). */
  shadowingManaged = 0;

  /** `at`: the event's broker time (renews its source's liveness; 0 = not known). */
  apply(ev: PodEvent, seq = 0, at = 0): void {
    if (seq) this.lastSeq = seq;
    if (at > this.latest) this.latest = at;
    if (ev.source !== undefined && at > 0) this.seen(ev.source, at, undefined);
    const k = key(ev.model, ev.pod);
    // An address outside the allowed networks: as if the pod were removed (nothing routes to it).
    const refuse = ev.action !== "remove" && this.o.addressAllowed !== undefined && !this.o.addressAllowed(ev.address);
    if (refuse) this.refused.add(k);
    else this.refused.delete(k);
    if (ev.action === "remove" || refuse) {
      this.engineAdapters.delete(k);
      this.engineAdaptersAt.delete(k);
      this.publishedAdapters.delete(k);
      if (!this.pods.delete(k)) return;
    } else {
      this.publishedAdapters.set(k, ev.adapters ?? []);
      this.pods.set(k, {
        model: ev.model,
        pod: ev.pod,
        address: ev.address,
        engine: ev.engine,
        role: ev.role ?? "combined",
        roleset: ev.roleset,
        ...(ev.podClass !== undefined ? { podClass: ev.podClass } : {}),
        ...(ev.bootstrapPort !== undefined ? { bootstrapPort: ev.bootstrapPort } : {}),
        ...(ev.schedulingPolicy !== undefined ? { schedulingPolicy: ev.schedulingPolicy } : {}),
        metricsAddress: ev.metricsAddress,
        kvEvents: ev.kvEvents,
        adapters: merged(ev.adapters ?? [], this.engineAdapters.get(k)),
        labels: ev.labels ?? {},
        ready: ev.ready,
        updatedAt: ev.ts,
        ...(ev.source !== undefined ? { source: ev.source } : {}),
        ...(ev.draining !== undefined ? { draining: { deadline: ev.draining.deadline } } : {}),
      });
    }
    this.rebuild();
  }

  /**
   * The adapters a pod's engine reports about itself (a LOAD sample's `adapters`): routable by
   * name together with those PODS lists. A runtime `/v1/load_lora_adapter` shows up here within a
   * scrape. Unknown pods are ignored (PODS decides which pods exist).
   */
  setEngineAdapters(model: string, pod: string, adapters: readonly string[]): void {
    const k = key(model, pod);
    const p = this.pods.get(k);
    if (!p) return;
    const next = [...new Set(adapters)].slice(0, MAX_ENGINE_ADAPTERS).sort();
    this.engineAdaptersAt.set(k, this.latest);
    const prev = this.engineAdapters.get(k);
    // The same list again: nothing changes, unless it still lacks a managed adapter placed on this
    // pod, whose grace may have ended since (the pod restarted empty).
    if (prev && prev.length === next.length && prev.every((a, i) => a === next[i]) && !this.lacksManaged(p.pod, next)) return;
    this.engineAdapters.set(k, next);
    this.pods.set(k, { ...p, adapters: merged(this.publishedAdapters.get(k) ?? [], next) });
    this.rebuild();
  }

  /**
   * An adapter placement record (ADAPTERS stream, last per adapter): the adapter becomes routable
   * to the pods where its load succeeded, and only to those (engine lists and PODS no longer
   * count for it); a `deleted` record forgets it. `at`: the record's broker time.
   */
  applyPlacement(rec: AdapterPlacement, at = 0): void {
    if (at > this.latest) this.latest = at;
    const prev = this.managed.get(rec.adapter);
    if (rec.deleted) {
      if (prev && this.managed.delete(rec.adapter)) this.rebuild();
      return;
    }
    if (!prev && this.managed.size >= MAX_ADAPTERS) {
      this.managedRefused++;
      return;
    }
    const loaded = new Map<string, number>();
    for (const x of rec.pods) if (x.state === "loaded") loaded.set(x.pod, prev?.loaded.get(x.pod) ?? (at || this.latest));
    const m: ManagedAdapter = { ...(rec.baseModel !== undefined ? { base: rec.baseModel } : {}), loaded };
    this.managed.set(rec.adapter, m);
    // Named like a base model some pod serves: refused (it would take that model's traffic). The
    // full rebuild keeps the model's own list and counts it.
    for (const p of this.pods.values()) {
      if (p.model === rec.adapter) {
        this.rebuild();
        return;
      }
    }
    // Only this adapter's list changes (a full rebuild per record would make a catch-up quadratic);
    // an adapter that was not managed may have been routed by engine lists: then rebuild all.
    if (!prev && this.served.has(rec.adapter)) {
      this.rebuild();
      return;
    }
    this.served.add(rec.adapter);
    this.version++;
    const list: PodInfo[] = [];
    if (loaded.size > 0) {
      for (const [k, p] of this.pods) {
        const loadedAt = loaded.get(p.pod);
        if (loadedAt === undefined || (m.base !== undefined && p.model !== m.base) || this.engineDropped(k, rec.adapter, loadedAt)) continue;
        if (p.ready && p.draining === undefined && this.vouched(p)) list.push(p);
      }
    }
    list.sort((a, b) => (a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : 0));
    if (list.length > 0) this.readyCache.set(rec.adapter, list);
    else this.readyCache.delete(rec.adapter);
  }

  baseOf(model: string): string | undefined {
    return this.managed.get(model)?.base;
  }

  /** Managed adapters (their count, for metrics and /debug/state). */
  get managedAdapters(): number {
    return this.managed.size;
  }

  /** True when a managed adapter placed on `pod` is missing from its engine's list `names`. */
  private lacksManaged(pod: string, names: readonly string[]): boolean {
    if (this.managed.size === 0) return false;
    for (const [a, m] of this.managed) if (m.loaded.has(pod) && !names.includes(a)) return true;
    return false;
  }

  /** Whether the engine's newest list contradicts a load placed at `loadedAt` (sampled after the grace). */
  private engineDropped(k: string, adapter: string, loadedAt: number): boolean {
    const at = this.engineAdaptersAt.get(k);
    const list = this.engineAdapters.get(k);
    return at !== undefined && list !== undefined && at > loadedAt + MANAGED_ADAPTER_GRACE_MS && !list.includes(adapter);
  }

  /** A watcher heartbeat at broker time `at`. */
  applySource(ev: PodSourceHeartbeat, at: number): void {
    if (at > this.latest) this.latest = at;
    this.seen(ev.source, at, ev.watcher);
  }

  private seen(source: string, at: number, watcher: string | undefined): void {
    const s = this.sources.get(source);
    if (s) {
      if (at > s.lastSeen) s.lastSeen = at;
      if (watcher !== undefined) s.watcher = watcher;
    } else {
      if (this.sources.size >= MAX_POD_SOURCES) this.forgetOneSource();
      this.sources.set(source, { lastSeen: at, ...(watcher !== undefined ? { watcher } : {}) });
    }
    // A silent source that speaks again is routable at once, not at the next sweep.
    if (this.silentSources.delete(source)) this.rebuild();
  }

  /** Forgets the longest-silent source without pods (or, if every source has pods, the longest-silent one). */
  private forgetOneSource(): void {
    const used = new Set<string>();
    for (const p of this.pods.values()) if (p.source !== undefined) used.add(p.source);
    const oldest = (skipUsed: boolean): string | undefined => {
      let victim: string | undefined;
      let at = Number.POSITIVE_INFINITY;
      for (const [name, s] of this.sources) {
        if (skipUsed && used.has(name)) continue;
        if (s.lastSeen < at) {
          at = s.lastSeen;
          victim = name;
        }
      }
      return victim;
    };
    const victim = oldest(true) ?? oldest(false);
    if (victim === undefined) return;
    this.sources.delete(victim);
    this.silentSources.delete(victim);
  }

  /**
   * Marks sources silent for longer than `timeoutMs` at broker time `now` (and live ones live).
   * A pod whose source was never heard of at all is judged from its own event's arrival, which
   * `apply` recorded as the source's first sighting. Returns true when routability changed.
   */
  sweepSources(now: number, timeoutMs: number): boolean {
    if (now > this.latest) this.latest = now;
    let changed = this.expireEngineAdapters(now);
    if (!(timeoutMs > 0)) {
      if (changed) this.rebuild();
      return changed;
    }
    for (const [name, s] of this.sources) {
      const silent = now - s.lastSeen > timeoutMs;
      if (silent === this.silentSources.has(name)) continue;
      if (silent) this.silentSources.add(name);
      else this.silentSources.delete(name);
      changed = true;
    }
    if (changed) this.rebuild();
    return changed;
  }

  /** Drops engine-reported adapters nobody repeated within ENGINE_ADAPTERS_TTL_MS; true if any pod changed. */
  private expireEngineAdapters(now: number): boolean {
    let changed = false;
    for (const [k, at] of this.engineAdaptersAt) {
      if (now - at <= ENGINE_ADAPTERS_TTL_MS) continue;
      this.engineAdaptersAt.delete(k);
      const had = this.engineAdapters.get(k);
      this.engineAdapters.delete(k);
      const p = this.pods.get(k);
      if (!p || !had || had.length === 0) continue;
      this.pods.set(k, { ...p, adapters: this.publishedAdapters.get(k) ?? [] });
      changed = true;
    }
    return changed;
  }

  /** False for a pod whose source is silent (published ready or not). */
  vouched(p: PodInfo): boolean {
    return p.source === undefined || !this.silentSources.has(p.source);
  }

  sourceInfo(): PodSourceInfo[] {
    return [...this.sources].map(([source, s]) => ({ source, lastSeen: s.lastSeen, ...(s.watcher !== undefined ? { watcher: s.watcher } : {}), silent: this.silentSources.has(source) }));
  }

  private rebuild(): void {
    this.version++;
    const ready = new Map<string, PodInfo[]>();
    const served = new Set<string>();
    const addresses = new Map<string, PodInfo>();
    const add = (m: string, p: PodInfo) => {
      served.add(m);
      // A draining pod (the autoscaler's handshake) keeps its in-flight requests and gets nothing new.
      if (!p.ready || p.draining !== undefined || !this.vouched(p)) return;
      let list = ready.get(m);
      if (!list) ready.set(m, (list = []));
      list.push(p);
    };
    // An engine names its own adapters; it may not name another model: an adapter called like a
    // base model some pod serves would take that model's traffic. Adapters PODS lists are the
    // operator's word and always count.
    const bases = new Set<string>();
    for (const p of this.pods.values()) bases.add(p.model);
    let shadowing = 0;
    const byPodName = new Map<string, Array<[string, PodInfo]>>();
    for (const [k, p] of this.pods) {
      add(p.model, p);
      if (this.managed.size > 0) {
        let list = byPodName.get(p.pod);
        if (!list) byPodName.set(p.pod, (list = []));
        list.push([k, p]);
      }
      const published = this.publishedAdapters.get(k);
      for (const a of p.adapters) {
        // A managed adapter goes only where the controller's loads succeeded (below).
        if (this.managed.has(a)) continue;
        if (bases.has(a) && !published?.includes(a)) {
          shadowing++;
          continue;
        }
        add(a, p);
      }
      // Two pods on one address: an upgrade's leftover unowned copy and its sourced successor (same
      // pod, new name). The one a source vouches for is the live one.
      const there = addresses.get(p.address);
      if (!there || (there.source === undefined && p.source !== undefined)) addresses.set(p.address, p);
    }
    let shadowingManaged = 0;
    for (const [a, m] of this.managed) {
      // Never the ready list of a base model: a managed adapter named like one is refused.
      if (bases.has(a)) {
        shadowingManaged++;
        continue;
      }
      served.add(a);
      for (const [pod, loadedAt] of m.loaded) {
        for (const [k, p] of byPodName.get(pod) ?? []) {
          if (m.base !== undefined && p.model !== m.base) continue;
          if (this.engineDropped(k, a, loadedAt)) continue;
          add(a, p);
        }
      }
    }
    for (const list of ready.values()) list.sort((a, b) => (a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : 0));
    this.readyCache = ready;
    this.shadowingAdapters = shadowing + shadowingManaged;
    this.shadowingManaged = shadowingManaged;
    this.served = served;
    this.addresses = addresses;
  }

  readyPods(model: string): readonly PodInfo[] {
    return this.readyCache.get(model) ?? [];
  }

  knows(model: string): boolean {
    return this.served.has(model);
  }

  get(model: string, pod: string): PodInfo | undefined {
    return this.pods.get(key(model, pod));
  }

  byAddress(address: string): PodInfo | undefined {
    return this.addresses.get(address);
  }

  all(): readonly PodInfo[] {
    return [...this.pods.values()];
  }

  get size(): number {
    return this.pods.size;
  }
}
