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
 *
 * One conversation, one entry: a prompt's last-cut ("tail") entry replaces the previous tail of
 * the same conversation — the conversation has moved on, and keeping every turn's prefix would
 * hold a 50-turn conversation's ids ~25 times over. The conversation is known by its anchor, the
 * prefix up to the first cut after the caller's `anchorAt` (the gateway names the end of the first
 * message after the system prompt: the first user task), or, without one, by the tail entry the
 * prompt reused. The anchor matters when a template re-renders earlier messages (Qwen3 strips
 * earlier reasoning when a new user task arrives): the prompt then reuses a shorter prefix, not
 * the previous tail, which would otherwise stay behind unused until evicted. A client that goes
 * back (regenerates an earlier turn) or two conversations with the same first task replace each
 * other's tails: they reuse the longest prefix still cached and encode the rest — slower, never
 * different. Ids are kept as Uint32Array (4 bytes a token, `prefixEntryBytes`); anchors
 * remembered are bounded (`MAX_ANCHORS`, ~200 bytes each).
 *
 * Each entry is an object (`PrefixEntry`) that callers may key derived data on (prefix-support
 * keeps the block hashes of an entry's ids in a WeakMap): `encodeWithReuse` says which entry a
 * prompt reused and which it stored. Their bytes are counted here as `PREFIX_DERIVED_BYTES_PER_TOKEN`.
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
  /** Entries dropped because a longer prefix of the same conversation replaced them. */
  superseded: number;
}

/** Conversations (anchor -> tail key) remembered for replacing their tails; the oldest are forgotten first. */
export const MAX_ANCHORS = 65_536;

export interface PrefixIdsOptions {
  splits: SplitPoints;
  /** Id of each boundary token (split-points' `boundaryTokens`). */
  boundaryIds: ReadonlyMap<string, number>;
  maxBytes: number;
  /** Encodes without adding special tokens. */
  encode(text: string): Promise<number[]>;
}

/** A cached prefix: its ids. The object's identity is stable while it is cached. */
export interface PrefixEntry {
  readonly ids: Uint32Array;
  /** Stored as a prompt's last cut (dropped when the conversation moves on), not a named cut. */
  readonly tail: boolean;
}

/** What one prompt reused and stored. */
export interface PrefixReuse {
  ids: number[];
  /** The cached prefix its ids start with (the first `reused.ids.length` ids are that entry's). */
  reused?: PrefixEntry;
  /** The entries it stored (each a prefix of `ids`). */
  stored: PrefixEntry[];
}

/**
 * Bytes per token allowed for data callers derive from an entry and key on it (block hashes:
 * a BigInt slot per 16-token block is ~32 bytes, 2 bytes a token, for up to 2 block sizes/seeds).
 */
export const PREFIX_DERIVED_BYTES_PER_TOKEN = 4;

export function prefixEntryBytes(tokens: number): number {
  // Key (28 base64 chars, UTF-16) and ~150 of Map entry, entry object and typed-array headers;
  // 4 bytes a token id, plus what callers derive (PREFIX_DERIVED_BYTES_PER_TOKEN).
  return 56 + 150 + (4 + PREFIX_DERIVED_BYTES_PER_TOKEN) * tokens;
}

export class PrefixIdsCache {
  private readonly lru: ByteLru<PrefixEntry>;
  private readonly ids: Set<number>;
  readonly stats: PrefixIdsStats = { hits: 0, misses: 0, reusedChars: 0, unaligned: 0, entries: 0, bytes: 0, evicted: 0, superseded: 0 };

  /** Anchor key -> key of the conversation's latest tail entry (insertion order = age). */
  private readonly tails = new Map<string, string>();

  constructor(private readonly o: PrefixIdsOptions) {
    this.lru = new ByteLru(o.maxBytes);
    this.ids = new Set(o.boundaryIds.values());
  }

  /** The ids of `text` (no special tokens added). `scope` separates models; `storeAlso` = extra offsets worth caching at (the next cut at or after each). */
  async encode(scope: string, text: string, storeAlso: readonly number[] = []): Promise<number[]> {
    return (await this.encodeWithReuse(scope, text, storeAlso)).ids;
  }

  /** `encode`, saying which cached entry was reused and which were stored; `anchorAt`: where the conversation's identity ends (see the module comment). */
  async encodeWithReuse(scope: string, text: string, storeAlso: readonly number[] = [], anchorAt?: number): Promise<PrefixReuse> {
    const cuts = this.o.splits.of(text);
    if (cuts.length === 0) return { ids: await this.o.encode(text), stored: [] };
    const keys = prefixKeys(scope, text, cuts, this.keyedCuts(text, cuts, storeAlso, anchorAt));
    let hit = -1;
    let prefix: PrefixEntry | undefined;
    for (let i = cuts.length - 1; i >= 0; i--) {
      if (keys[i] === undefined) continue;
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
    const ids = prefix ? concatIds(prefix.ids, rest) : rest;
    const stored = this.storePrefixes(keys, cuts, hit, ids, (prefix?.ids.length ?? 0), rest, storeAlso);
    if (stored.some((e) => e.tail)) this.supersede(keys, cuts, anchorAt, prefix?.tail ? (keys[hit] as string) : undefined);
    this.stats.entries = this.lru.size;
    this.stats.bytes = this.lru.bytes;
    this.stats.evicted = this.lru.evicted;
    return { ids, ...(prefix ? { reused: prefix } : {}), stored };
  }

  /**
   * The cuts worth a key: only entries stored at a prompt's last cut (tails) or at a named cut
   * exist, and a later turn adds a few cuts past its previous tail, so the last `TAIL_CUTS` cuts,
   * the cuts at or after each named offset and the anchor's cut are looked up; a digest at every
   * cut of a 100k-token prompt (hundreds of them) cost more than the rest of the lookup.
   */
  private keyedCuts(text: string, cuts: readonly number[], storeAlso: readonly number[], anchorAt: number | undefined): Set<number> {
    const want = new Set<number>();
    for (let i = Math.max(0, cuts.length - TAIL_CUTS); i < cuts.length; i++) want.add(i);
    for (const at of [...storeAlso, ...(anchorAt === undefined ? [] : [anchorAt])]) {
      const i = firstCutAtOrAfter(cuts, at);
      if (i >= 0) want.add(i);
    }
    void text;
    return want;
  }

  /** The conversation moved on: drops its previous tail entry (the anchor's, or the tail just reused). */
  private supersede(keys: readonly (string | undefined)[], cuts: readonly number[], anchorAt: number | undefined, reusedTail: string | undefined): void {
    const newTail = keys[keys.length - 1] as string;
    const a = anchorAt === undefined ? -1 : firstCutAtOrAfter(cuts, anchorAt);
    const anchor = a >= 0 && a < keys.length - 1 ? (keys[a] as string) : undefined;
    let previous = reusedTail;
    if (anchor !== undefined) {
      previous = this.tails.get(anchor) ?? previous;
      this.tails.delete(anchor);
      this.tails.set(anchor, newTail);
      if (this.tails.size > MAX_ANCHORS) this.tails.delete(this.tails.keys().next().value as string);
    }
    if (previous !== undefined && previous !== newTail && this.lru.delete(previous)) this.stats.superseded++;
  }

  private storePrefixes(keys: (string | undefined)[], cuts: number[], hit: number, ids: readonly number[], reusedTokens: number, rest: number[], storeAlso: readonly number[]): PrefixEntry[] {
    const last = cuts.length - 1;
    const want = new Set<number>([last]);
    for (const at of storeAlso) {
      const i = firstCutAtOrAfter(cuts, at);
      if (i >= 0) want.add(i);
    }
    for (const i of [...want]) if (i <= hit || keys[i] === undefined || this.lru.has(keys[i] as string)) want.delete(i);
    if (want.size === 0) return [];
    // The k-th boundary id in `rest` ends the k-th cut after the hit. Every occurrence of a boundary
    // token yields its id, so equal counts prove no ordinary text produced one.
    const ends: number[] = [];
    for (let j = 0; j < rest.length; j++) if (this.ids.has(rest[j] as number)) ends.push(j + 1);
    if (ends.length !== cuts.length - 1 - hit) {
      this.stats.unaligned++;
      return [];
    }
    const stored: PrefixEntry[] = [];
    for (const i of want) {
      const n = reusedTokens + (ends[i - hit - 1] as number);
      const entry: PrefixEntry = { ids: prefixIds(ids, n), tail: i === last && !storeAlso.some((at) => firstCutAtOrAfter(cuts, at) === i) };
      if (this.lru.set(keys[i] as string, entry, prefixEntryBytes(n))) stored.push(entry);
    }
    return stored;
  }
}

/** The first `n` ids, as a Uint32Array (no intermediate array). */
function prefixIds(ids: readonly number[], n: number): Uint32Array {
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = ids[i] as number;
  return out;
}

/** A cached prefix's ids followed by the newly encoded rest, as one plain array. */
function concatIds(prefix: Uint32Array, rest: readonly number[]): number[] {
  const n = prefix.length;
  const out = new Array<number>(n + rest.length);
  for (let i = 0; i < n; i++) out[i] = prefix[i] as number;
  for (let i = 0; i < rest.length; i++) out[n + i] = rest[i] as number;
  return out;
}

/** Cuts looked up past the end of a prompt (a turn adds a few; an agent step with many tool calls more). */
export const TAIL_CUTS = 48;

/** Index of the first cut at or after `at` (cuts ascending), or -1. */
function firstCutAtOrAfter(cuts: readonly number[], at: number): number {
  let lo = 0;
  let hi = cuts.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((cuts[mid] as number) < at) lo = mid + 1;
    else hi = mid;
  }
  return lo < cuts.length ? lo : -1;
}

/** SHA-1 of (scope, text up to each cut in `want`), in one pass over the text; other cuts have no key (undefined). */
function prefixKeys(scope: string, text: string, cuts: readonly number[], want: ReadonlySet<number>): (string | undefined)[] {
  const h: Hash = createHash("sha1").update(scope).update("\u0000");
  const keys: (string | undefined)[] = new Array(cuts.length);
  let prev = 0;
  for (let i = 0; i < cuts.length; i++) {
    if (!want.has(i)) continue;
    const c = cuts[i] as number;
    h.update(text.slice(prev, c));
    keys[i] = h.copy().digest("base64");
    prev = c;
  }
  return keys;
}
