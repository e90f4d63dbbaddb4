/**
 * Matching one long prompt over many pods, in process (part of `npm run bench -- long-context`):
 * a `blocks`-block prompt (6,000 blocks of 16 = 96k tokens) over `pods` pods through the routing
 * stage the gateway runs (services/routing/stages/prefix-match.ts: the engine index, the routed
 * prefixes from block 0, and their continuation past each pod's index run).
 * - typical: the conversation's pod holds the whole prompt, every other pod the shared system
 *   prompt's first `sharedBlocks`, and a routed prefix continues the conversation's pod by the
 *   last turn's blocks;
 * - worst: every pod holds the whole prompt on GPU (the scan runs to the end for all of them).
 * Each lookup timed alone (p50/p99 µs), and the bytes it allocates: heap growth over `lookups`
 * calls with no collection in between (after forced GCs; needs --expose-gc, as `npm run bench`
 * runs), per call. The prompt's hashes are input (the gateway has them), not counted.
 */
import type { KvBatch } from "../../schemas/events.js";
import { matchPrefix } from "../../services/routing/mod.js";
import { xorshift32 } from "../../services/shared/seeded-random.js";
import { chainBlocks, chainSeed, hashToHex } from "../../services/views/block-hash.js";
import type { PodInfo } from "../../services/views/pod-set.js";
import { PrefixIndex } from "../../services/views/prefix-index.js";
import { RoutedPrefixes } from "../../services/views/routed-prefixes.js";

const MODEL = "bench/long";
const gc = (globalThis as { gc?: () => void }).gc;

export interface LongMatchOptions {
  pods?: number;
  blocks?: number;
  sharedBlocks?: number;
  lookups?: number;
}

export interface LongMatchResult {
  pods: number;
  blocks: number;
  typical_p50_us: number;
  typical_p99_us: number;
  worst_p50_us: number;
  worst_p99_us: number;
  /** Heap bytes allocated per lookup (typical / worst); null without --expose-gc. */
  typical_alloc_bytes: number | null;
  worst_alloc_bytes: number | null;
  /** What the typical lookup found for the conversation's pod and for the others. */
  typical_best_blocks: number;
  typical_other_blocks: number;
}

function store(index: PrefixIndex, pod: string, hashes: readonly bigint[], upTo: number, seq: { n: number }): void {
  for (let k = 0; k < upTo; k += 64) {
    const hex = hashes.slice(k, Math.min(upTo, k + 64)).map(hashToHex);
    const batch: KvBatch = {
      type: "kv", model: MODEL, pod, epoch: "e1", seq: k / 64, ts: 0,
      events: [{ kind: "stored", engineHashes: hex, routerHashes: hex, parentEngineHash: null, blockSize: 16, medium: "GPU", lora: null }],
    };
    index.apply(batch, ++seq.n);
  }
}

function timeIt(lookups: number, fn: () => number): { p50: number; p99: number; alloc: number | null; last: number } {
  let last = 0;
  for (let i = 0; i < 200; i++) last = fn();
  const d = new Float64Array(lookups);
  for (let i = 0; i < lookups; i++) {
    const t0 = performance.now();
    last = fn();
    d[i] = (performance.now() - t0) * 1000;
  }
  d.sort();
  let alloc: number | null = null;
  if (gc) {
    const n = 20;
    gc();
    gc();
    const before = process.memoryUsage().heapUsed;
    for (let i = 0; i < n; i++) last = fn();
    alloc = Math.max(0, Math.round((process.memoryUsage().heapUsed - before) / n));
  }
  return { p50: Number((d[Math.floor(lookups / 2)] as number).toFixed(1)), p99: Number((d[Math.floor(lookups * 0.99)] as number).toFixed(1)), alloc, last };
}

export function runLongMatch(o: LongMatchOptions = {}): LongMatchResult {
  const pods = o.pods ?? 100;
  const blocks = o.blocks ?? 6_000;
  const shared = o.sharedBlocks ?? 375;
  const lookups = o.lookups ?? 500;
  const rnd = xorshift32(5);
  const tokens = Array.from({ length: blocks * 16 }, () => Math.floor(rnd() * 128_000));
  const hashes = chainBlocks(chainSeed(MODEL, null, 16), tokens, 16);
  const names = Array.from({ length: pods }, (_, i) => `pod-${i}`);
  const candidates = names.map((pod) => ({ pod, model: MODEL }) as PodInfo);
  const now = 1_000_000;

  const index = new PrefixIndex({ maxEntries: pods * blocks + 1024, initialEntries: blocks + pods * shared + 1024 });
  const seq = { n: 0 };
  store(index, names[0] as string, hashes, blocks - 100, seq);
  for (let p = 1; p < pods; p++) store(index, names[p] as string, hashes, shared, seq);
  const routed = new RoutedPrefixes();
  routed.add({ model: MODEL, pod: names[0] as string, ts: now, ttlMs: 120_000 }, hashes.slice(blocks - 100));
  const views = { index, routed };
  let best = 0;
  let other = 0;
  const typical = timeIt(lookups, () => {
    const r = matchPrefix(views, candidates, hashes, 16, false, now);
    best = r.info.matched(names[0] as string);
    other = r.info.matched(names[1] as string);
    return best;
  });

  const worstIndex = new PrefixIndex({ maxEntries: pods * blocks + 1024, initialEntries: pods * blocks + 1024 });
  for (const p of names) store(worstIndex, p, hashes, blocks, seq);
  const worstViews = { index: worstIndex, routed: new RoutedPrefixes() };
  const worst = timeIt(Math.max(50, lookups / 5), () => matchPrefix(worstViews, candidates, hashes, 16, false, now).info.matched(names[pods - 1] as string));
  if (worst.last !== blocks) throw new Error(`worst case matched ${worst.last} of ${blocks} blocks`);
  return {
    pods,
    blocks,
    typical_p50_us: typical.p50,
    typical_p99_us: typical.p99,
    worst_p50_us: worst.p50,
    worst_p99_us: worst.p99,
    typical_alloc_bytes: typical.alloc,
    worst_alloc_bytes: worst.alloc,
    typical_best_blocks: best,
    typical_other_blocks: other,
  };
}
