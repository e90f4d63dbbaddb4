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
 * message after the system prompt: the first user task): its tail is stored under the anchor's
 * digest with the tail's text, and a later turn digests only the text up to its anchor, compares
 * the tail's text with its own (a memory compare), and scans for cuts only past it — work in
 * proportion to the turn, not the conversation, but for that compare. A prompt that does not
 * extend its conversation's tail (a template that re-renders earlier messages: Qwen3 strips
 * earlier reasoning when a new user task arrives; an edited history) takes the digest path:
 * SHA-1 of the prefixes at its last cuts and named cuts, the longest cached one reused (the
 * system prompt's entry at least), and its new tail replaces the conversation's. Without an anchor
 * a tail is stored under the digest of its text and found by that path. A client that goes back
 * (regenerates an earlier turn) or two conversations with the same first task replace each
 * other's tails: they reuse the longest prefix still cached and encode the rest — slower, never
 * different. Ids are kept as Uint32Array (4 bytes a token, `prefixEntryBytes`), an anchored
 * tail's text at 1 byte a character (2 when it has characters above U+00FF); a prompt's ids are
 * returned as one Uint32Array too (the router's token type, prompt-tokens.ts `TokenIds`): the
 * reused prefix copied as memory, the encoder's ids of the rest after it.
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
  /** Of the hits: later turns that found their conversation's tail by its anchor (no digest of the whole prompt). */
  anchoredHits: number;
}

export interface PrefixIdsOptions {
  splits: SplitPoints;
  /** Id of each boundary token (split-points' `boundaryTokens`). */
  boundaryIds: ReadonlyMap<string, number>;
  maxBytes: number;
  /** Encodes without adding special tokens (the encoder's array, or a typed array). */
  encode(text: string): Promise<ArrayLike<number>>;
}

/** A cached prefix: its ids. The object's identity is stable while it is cached. */
export interface PrefixEntry {
  readonly ids: Uint32Array;
  /** Stored as a prompt's last cut (dropped when the conversation moves on), not a named cut. */
  readonly tail: boolean;
  /**
   * A conversation's tail found by its anchor: the prefix's text itself (compared with the next
   * prompt instead of digesting that prompt), and whether it holds characters above U+00FF (V8
   * then stores it at 2 bytes a character).
   */
  readonly text?: string;
  readonly wide?: boolean;
}

/** What one prompt reused and stored. */
export interface PrefixReuse {
  /** The prompt's ids: the reused entry's ids and the newly encoded rest, copied into one typed array. */
  ids: Uint32Array;
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

export function prefixEntryBytes(tokens: number, textBytes = 0): number {
  // Key (28 base64 chars, UTF-16) and ~150 of Map entry, entry object and typed-array headers;
  // 4 bytes a token id, plus what callers derive (PREFIX_DERIVED_BYTES_PER_TOKEN); an anchored
  // tail also holds its text (1 byte a character, 2 when it has one above U+00FF).
  return 56 + 150 + (4 + PREFIX_DERIVED_BYTES_PER_TOKEN) * tokens + textBytes;
}

/** Whether a string has a character V8 cannot store in one byte. */
const WIDE = /[\u0100-\uffff]/;

export class PrefixIdsCache {
  private readonly lru: ByteLru<PrefixEntry>;
  private readonly ids: Set<number>;
  readonly stats: PrefixIdsStats = { hits: 0, misses: 0, reusedChars: 0, unaligned: 0, entries: 0, bytes: 0, evicted: 0, superseded: 0, anchoredHits: 0 };

  constructor(private readonly o: PrefixIdsOptions) {
    this.lru = new ByteLru(o.maxBytes);
    this.ids = new Set(o.boundaryIds.values());
  }

  /** The ids of `text` (no special tokens added). `scope` separates models; `storeAlso` = extra offsets worth caching at (the next cut at or after each). */
  async encode(scope: string, text: string, storeAlso: readonly number[] = []): Promise<Uint32Array> {
    return (await this.encodeWithReuse(scope, text, storeAlso)).ids;
  }

  /** `encode`, saying which cached entry was reused and which were stored; `anchorAt`: where the conversation's identity ends (see the module comment). */
  async encodeWithReuse(scope: string, text: string, storeAlso: readonly number[] = [], anchorAt?: number): Promise<PrefixReuse> {
    // The conversation's tail, found by its anchor and compared as text: a later turn digests only
    // the text up to its anchor and scans for cuts only past the tail.
    const anchorCut = anchorAt === undefined ? undefined : this.o.splits.of(text, anchorAt, 1)[0];
    const anchorKey = anchorCut === undefined ? undefined : `t${digestOf(scope, text, anchorCut)}`;
    const tail = anchorKey === undefined ? undefined : this.lru.get(anchorKey);
    if (anchorKey !== undefined && tail?.text !== undefined && this.extends(text, tail.text)) return this.extendTail(text, anchorKey, tail);
    const cuts = this.o.splits.of(text);
    if (cuts.length === 0) return { ids: concatIds(undefined, await this.o.encode(text)), stored: [] };
    const keys = prefixKeys(scope, text, cuts, this.keyedCuts(cuts, storeAlso, anchorAt));
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
    const ids = concatIds(prefix?.ids, rest);
    // An anchored conversation's tail is stored under its anchor (replacing the previous one);
    // without an anchor, under the digest of its text (found by the lookup above).
    const last = cuts.length - 1;
    const lastNamed = storeAlso.some((at) => firstCutAtOrAfter(cuts, at) === last);
    const anchored = anchorKey !== undefined && !lastNamed && (anchorCut as number) < (cuts[last] as number) ? anchorKey : undefined;
    if (anchored !== undefined) keys[last] = anchored;
    const stored = this.storePrefixes(keys, cuts, hit, ids, prefix?.ids.length ?? 0, rest, storeAlso, anchored === undefined ? undefined : text);
    // The conversation moved on: a tail it reused under another key goes.
    if (stored.some((e) => e.tail) && prefix?.tail && keys[hit] !== keys[last] && this.lru.delete(keys[hit] as string)) this.stats.superseded++;
    this.updateStats();
    return { ids, ...(prefix ? { reused: prefix } : {}), stored };
  }

  /** Whether `text` starts with `prefix` (a slice compares as memory; `startsWith` walks characters). */
  private extends(text: string, prefix: string): boolean {
    if (text.length < prefix.length) return false;
    if (text.slice(0, prefix.length) !== prefix) return false;
    // The tail ended at a cut of its own prompt; the same text up to there makes it one here too.
    return this.o.splits.of(text, prefix.length, 1)[0] === prefix.length;
  }

  /** A later turn of an anchored conversation: its tail's ids, the text after it encoded, the new tail stored in its place. */
  private async extendTail(text: string, key: string, tail: PrefixEntry): Promise<PrefixReuse> {
    const from = (tail.text as string).length;
    this.stats.hits++;
    this.stats.anchoredHits++;
    this.stats.reusedChars += from;
    const cuts = this.o.splits.of(text, from + 1);
    const rest = await this.o.encode(text.slice(from));
    const ids = concatIds(tail.ids, rest);
    const stored: PrefixEntry[] = [];
    if (cuts.length > 0) {
      const end = this.tokensThrough(rest, cuts.length);
      if (end === undefined) this.stats.unaligned++;
      else {
        const n = tail.ids.length + end;
        const cut = cuts[cuts.length - 1] as number;
        const added = text.slice(from, cut);
        const wide = tail.wide === true || WIDE.test(added);
        // The new tail's ids: a copy of the prompt's first n ids (memory, not a walk of an array).
        const tailIds = ids.slice(0, n);
        const entry: PrefixEntry = { ids: tailIds, tail: true, text: text.slice(0, cut), wide };
        if (this.lru.set(key, entry, prefixEntryBytes(n, cut * (wide ? 2 : 1)))) {
          stored.push(entry);
          this.stats.superseded++;
        }
      }
    }
    this.updateStats();
    return { ids, reused: tail, stored };
  }

  /** Tokens of `rest` up to and including its `count`-th boundary id; undefined when it has another number of them. */
  private tokensThrough(rest: ArrayLike<number>, count: number): number | undefined {
    // Every occurrence of a boundary token yields its id, so equal counts prove no ordinary text produced one.
    let seen = 0;
    let end = 0;
    for (let j = 0; j < rest.length; j++) {
      if (!this.ids.has(rest[j] as number)) continue;
      seen++;
      if (seen === count) end = j + 1;
    }
    return seen === count ? end : undefined;
  }

  private updateStats(): void {
    this.stats.entries = this.lru.size;
    this.stats.bytes = this.lru.bytes;
    this.stats.evicted = this.lru.evicted;
  }

  /**
   * The cuts worth a key: only entries stored at a prompt's last cut (tails) or at a named cut
   * exist, and a later turn adds a few cuts past its previous tail, so the last `TAIL_CUTS` cuts,
   * the cuts at or after each named offset and the anchor's cut are looked up; a digest at every
   * cut of a 100k-token prompt (hundreds of them) cost more than the rest of the lookup.
   */
  private keyedCuts(cuts: readonly number[], storeAlso: readonly number[], anchorAt: number | undefined): Set<number> {
    const want = new Set<number>();
    for (let i = Math.max(0, cuts.length - TAIL_CUTS); i < cuts.length; i++) want.add(i);
    for (const at of [...storeAlso, ...(anchorAt === undefined ? [] : [anchorAt])]) {
      const i = firstCutAtOrAfter(cuts, at);
      if (i >= 0) want.add(i);
    }
    return want;
  }

  private storePrefixes(keys: (string | undefined)[], cuts: number[], hit: number, ids: Uint32Array, reusedTokens: number, rest: ArrayLike<number>, storeAlso: readonly number[], anchoredText: string | undefined): PrefixEntry[] {
    const last = cuts.length - 1;
    const want = new Set<number>([last]);
    for (const at of storeAlso) {
      const i = firstCutAtOrAfter(cuts, at);
      if (i >= 0) want.add(i);
    }
    const named = (i: number) => storeAlso.some((at) => firstCutAtOrAfter(cuts, at) === i);
    // An anchored tail is stored again when its key holds an older tail of the conversation.
    for (const i of [...want]) if (i <= hit || keys[i] === undefined || (this.lru.has(keys[i] as string) && !(i === last && anchoredText !== undefined && !named(i)))) want.delete(i);
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
      const tail = i === last && !named(i);
      // A copy, not a view: an entry must not keep the whole prompt's buffer alive.
      let entry: PrefixEntry = { ids: ids.slice(0, n), tail };
      let textBytes = 0;
      if (tail && anchoredText !== undefined) {
        const text = anchoredText.slice(0, cuts[i] as number);
        const wide = WIDE.test(text);
        entry = { ...entry, text, wide };
        textBytes = text.length * (wide ? 2 : 1);
        if (this.lru.has(keys[i] as string)) this.stats.superseded++;
      }
      if (this.lru.set(keys[i] as string, entry, prefixEntryBytes(n, textBytes))) stored.push(entry);
    }
    return stored;
  }
}

/** SHA-1 (base64) of (scope, the text up to `end`). */
function digestOf(scope: string, text: string, end: number): string {
  return createHash("sha1").update(scope).update("\u0000").update(text.slice(0, end)).digest("base64");
}

/**
 * A cached prefix's ids followed by the newly encoded rest, as one typed array: the prefix is
 * copied as memory (a 100k-token prefix in well under a millisecond, where building a JS array of
 * it element by element cost ~4.5 ms a request), only the rest is converted from the encoder's array.
 */
function concatIds(prefix: Uint32Array | undefined, rest: ArrayLike<number>): Uint32Array {
  const n = prefix?.length ?? 0;
  const out = new Uint32Array(n + rest.length);
  if (prefix) out.set(prefix);
  // Element by element: `set` from a plain array takes V8's generic path (~10x slower than this loop).
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
