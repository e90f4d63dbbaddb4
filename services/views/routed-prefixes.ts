/**
 * Routed prefixes: which pod each gateway recently sent which prompt blocks to, shared through
 * the KV stream (`kv-routed` events). Pure, bounded, expiring.
 *
 * Two uses: the whole index where engines publish no KV events (approximate mode: hashes of
 * character chunks), and a short-lived supplement to the engine index covering the time between a
 * routing decision and the engine's BlockStored (the same router hashes, from token ids).
 * Matching stops at each pod's first miss, like the engine index.
 */
import type { KvRouted } from "../../schemas/events.js";
import { hexToHash } from "./block-hash.js";

interface Holder {
  pod: string;
  ts: number;
  expiresAt: number;
}

export interface RoutedMatch {
  /** Matched leading blocks per pod (only pods with a match). */
  readonly blocks: ReadonlyMap<string, number>;
}

export interface RoutedPrefixesOptions {
  /** Bound on distinct (model, block) keys; the least recently written go first (the one order-dependent part: only beyond it may replicas differ). */
  maxBlocks?: number;
  /** Bound on pods remembered per block (the most recently routed kept). */
  maxPodsPerBlock?: number;
}

/** Oldest routing first; the pod name breaks ties (a canonical order). */
const byAge = (a: Holder, b: Holder) => a.ts - b.ts || (a.pod < b.pod ? -1 : a.pod > b.pod ? 1 : 0);

export class RoutedPrefixes {
  private readonly blocks = new Map<string, Holder[]>();
  readonly maxBlocks: number;
  readonly maxPodsPerBlock: number;
  evicted = 0;

  constructor(o: RoutedPrefixesOptions = {}) {
    this.maxBlocks = o.maxBlocks ?? 500_000;
    this.maxPodsPerBlock = o.maxPodsPerBlock ?? 8;
  }

  private static key(model: string, hash: bigint): string {
    return `${model}\u0000${hash.toString(36)}`;
  }

  add(ev: Pick<KvRouted, "model" | "pod" | "ts" | "ttlMs">, hashes: readonly bigint[]): void {
    const expiresAt = ev.ts + ev.ttlMs;
    for (const h of hashes) {
      const k = RoutedPrefixes.key(ev.model, h);
      let holders = this.blocks.get(k);
      if (holders) {
        this.blocks.delete(k); // re-insert: Map order doubles as write recency
      } else {
        holders = [];
        if (this.blocks.size >= this.maxBlocks) this.evictOldest();
      }
      // Commutative, so every replica (and replay) holds the same whatever order the routings
      // arrived in (a gateway applies its own at once, its peers' from the stream): a pod's
      // latest routing counts, and the most recently routed pods are kept.
      const held = holders.find((x) => x.pod === ev.pod);
      if (held) {
        held.ts = Math.max(held.ts, ev.ts);
        held.expiresAt = Math.max(held.expiresAt, expiresAt);
      } else holders.push({ pod: ev.pod, ts: ev.ts, expiresAt });
      holders.sort(byAge);
      if (holders.length > this.maxPodsPerBlock) holders.shift();
      this.blocks.set(k, holders);
    }
  }

  apply(ev: KvRouted): void {
    this.add(ev, ev.hashes.map(hexToHash));
  }

  /**
   * Leading blocks of `hashes` each candidate pod was routed, counting only unexpired entries
   * no older than `maxAgeMs` (where engines report their caches, a routed entry only has to cover
   * the moment before the engine's own event; kept longer, it would hide the engine's evictions).
   */
  match(model: string, hashes: readonly bigint[], now: number, candidates: readonly string[], maxAgeMs = Number.POSITIVE_INFINITY): RoutedMatch {
    const alive = new Set(candidates);
    const counts = new Map<string, number>();
    for (let i = 0; i < hashes.length && alive.size > 0; i++) {
      const holders = this.blocks.get(RoutedPrefixes.key(model, hashes[i] as bigint));
      const next = new Set<string>();
      for (const h of holders ?? []) if (h.expiresAt > now && now - h.ts <= maxAgeMs && alive.has(h.pod)) next.add(h.pod);
      for (const p of next) counts.set(p, i + 1);
      for (const p of alive) if (!next.has(p)) alive.delete(p);
    }
    return { blocks: counts };
  }

  /**
   * For each candidate, how many consecutive blocks of `hashes` from its own `starts[i]` it was
   * routed (0 where block `starts[i]` is not routed to it, or `starts[i]` is past the end): the
   * continuation of what the engine index already shows for that pod. Same age rules as `match`.
   * Stops at each pod's first miss: O(continued blocks), whatever the prompt's length.
   */
  matchFrom(model: string, hashes: readonly bigint[], now: number, candidates: readonly string[], starts: ArrayLike<number>, maxAgeMs = Number.POSITIVE_INFINITY): Int32Array {
    const out = new Int32Array(candidates.length);
    for (let c = 0; c < candidates.length; c++) {
      const pod = candidates[c] as string;
      let i = starts[c] as number;
      for (; i < hashes.length; i++) {
        const holders = this.blocks.get(RoutedPrefixes.key(model, hashes[i] as bigint));
        if (!holders?.some((h) => h.pod === pod && h.expiresAt > now && now - h.ts <= maxAgeMs)) break;
      }
      out[c] = Math.max(0, i - (starts[c] as number));
    }
    return out;
  }

  /** Drops expired holders (call on a timer); returns blocks removed. */
  sweep(now: number): number {
    let n = 0;
    for (const [k, holders] of this.blocks) {
      const live = holders.filter((h) => h.expiresAt > now);
      if (live.length === 0) {
        this.blocks.delete(k);
        n++;
      } else if (live.length !== holders.length) this.blocks.set(k, live);
    }
    return n;
  }

  removePod(model: string, pod: string): void {
    const prefix = `${model}\u0000`;
    for (const [k, holders] of this.blocks) {
      if (!k.startsWith(prefix)) continue;
      const live = holders.filter((h) => h.pod !== pod);
      if (live.length === 0) this.blocks.delete(k);
      else if (live.length !== holders.length) this.blocks.set(k, live);
    }
  }

  get size(): number {
    return this.blocks.size;
  }

  /** Unexpired holders per block, in a canonical order (state comparison). */
  dump(now: number): Array<[string, string[]]> {
    const out: Array<[string, string[]]> = [];
    for (const [k, holders] of this.blocks) {
      const live = holders.filter((h) => h.expiresAt > now).map((h) => `${h.pod}@${h.ts}`);
      if (live.length > 0) out.push([k, live]);
    }
    return out.sort((a, b) => (a[0] < b[0] ? -1 : 1));
  }

  private evictOldest(): void {
    const first = this.blocks.keys().next();
    if (first.done) return;
    this.blocks.delete(first.value);
    this.evicted++;
  }
}
