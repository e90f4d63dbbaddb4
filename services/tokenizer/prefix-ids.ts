/**
 * Token ids of rendered chat prompts, reusing the ids of a prefix encoded before: a new turn of a
 * conversation (or a new conversation on a known system prompt) encodes only the text after the
 * longest cached prefix. Prefixes are only ever cut at split points (split-points.ts), where
 * encoding the two sides separately is exactly encoding the whole; tests check that on many
 * random conversations.
 *
 * Keys are SHA-1 digests of (scope, prefix text), computed incrementally over the cut points in
 * one pass; values are the prefix's ids. Bounded in bytes (ByteLru). Which prefixes are stored:
 * the prompt's last cut (the start of the reply a next turn will send back) and cuts the caller
 * names (the end of the first message: a shared system prompt).
 */
import { createHash, type Hash } from "node:crypto";
import { ByteLru } from "./byte-lru.js";
import type { SplitPoints } from "./split-points.js";

export interface PrefixIdsStats {
  /** Prompts that reused a cached prefix, and the characters they did not encode again. */
  hits: number;
  misses: number;
  reusedChars: number;
  /** Prefixes not stored because the ids could not be lined up with the cut (never seen with real tokenizers). */
  unaligned: number;
  entries: number;
  bytes: number;
  evicted: number;
}

export interface PrefixIdsOptions {
  splits: SplitPoints;
  /** Id of each boundary token (split-points' `boundaryTokens`). */
  boundaryIds: ReadonlyMap<string, number>;
  maxBytes: number;
  /** Encodes without adding special tokens. */
  encode(text: string): Promise<number[]>;
}

export function prefixEntryBytes(ids: readonly number[]): number {
  // Key (28 base64 chars, UTF-16), 8 bytes a small-integer array slot, ~100 of Map entry and headers.
  return 56 + 8 * ids.length + 100;
}

export class PrefixIdsCache {
  private readonly lru: ByteLru<number[]>;
  private readonly ids: Set<number>;
  readonly stats: PrefixIdsStats = { hits: 0, misses: 0, reusedChars: 0, unaligned: 0, entries: 0, bytes: 0, evicted: 0 };

  constructor(private readonly o: PrefixIdsOptions) {
    this.lru = new ByteLru(o.maxBytes);
    this.ids = new Set(o.boundaryIds.values());
  }

  /** The ids of `text` (no special tokens added). `scope` separates models; `storeAlso` = extra offsets worth caching at (the next cut at or after each). */
  async encode(scope: string, text: string, storeAlso: readonly number[] = []): Promise<number[]> {
    const cuts = this.o.splits.of(text);
    if (cuts.length === 0) return this.o.encode(text);
    const keys = prefixKeys(scope, text, cuts);
    let hit = -1;
    let prefix: number[] | undefined;
    for (let i = cuts.length - 1; i >= 0; i--) {
      prefix = this.lru.get(keys[i] as string);
      if (prefix) {
        hit = i;
        break;
      }
    }
    const from = hit >= 0 ? (cuts[hit] as number) : 0;
    if (hit >= 0) {
      this.stats.hits++;
      this.stats.reusedChars += from;
    } else this.stats.misses++;
    const rest = await this.o.encode(text.slice(from));
    const ids = prefix ? prefix.concat(rest) : rest;
    this.storePrefixes(keys, cuts, hit, prefix ?? [], rest, storeAlso);
    this.stats.entries = this.lru.size;
    this.stats.bytes = this.lru.bytes;
    this.stats.evicted = this.lru.evicted;
    return ids;
  }

  private storePrefixes(keys: string[], cuts: number[], hit: number, prefix: readonly number[], rest: number[], storeAlso: readonly number[]): void {
    const want = new Set<number>([cuts.length - 1]);
    for (const at of storeAlso) {
      const i = cuts.findIndex((c) => c >= at);
      if (i >= 0) want.add(i);
    }
    for (const i of [...want]) if (i <= hit || this.lru.has(keys[i] as string)) want.delete(i);
    if (want.size === 0) return;
    // The k-th boundary id in `rest` ends the k-th cut after the hit. Every occurrence of a boundary
    // token yields its id, so equal counts prove no ordinary text produced one.
    const ends: number[] = [];
    for (let j = 0; j < rest.length; j++) if (this.ids.has(rest[j] as number)) ends.push(j + 1);
    if (ends.length !== cuts.length - 1 - hit) {
      this.stats.unaligned++;
      return;
    }
    for (const i of want) {
      const value = prefix.concat(rest.slice(0, ends[i - hit - 1] as number));
      this.lru.set(keys[i] as string, value, prefixEntryBytes(value));
    }
  }
}

/** SHA-1 of (scope, text up to each cut), in one pass over the text. */
function prefixKeys(scope: string, text: string, cuts: readonly number[]): string[] {
  const h: Hash = createHash("sha1").update(scope).update("\u0000");
  const keys: string[] = [];
  let prev = 0;
  for (const c of cuts) {
    h.update(text.slice(prev, c));
    keys.push(h.copy().digest("base64"));
    prev = c;
  }
  return keys;
}
