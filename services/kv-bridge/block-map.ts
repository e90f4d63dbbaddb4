/**
 * Per-pod engine-hash -> router-hash map: turns engine BlockStored/BlockRemoved events into the
 * `KvStored`/`KvRemoved` the KV stream carries. Pure.
 *
 * Router hashes are recomputed from the event's token ids (services/views/block-hash.ts), chained
 * from the parent's router hash, which only this map knows: the engine sends its own parent hash.
 * A parent the map does not know (the bridge restarted after the engine's replay buffer rolled, or
 * the map dropped it at its bound) still yields a deterministic chain, seeded from the parent's
 * engine hash, so those blocks never match a prompt (a miss, never a false hit) while removals of
 * them still apply.
 *
 * vLLM's per-block `extra_keys` are read (readExtraKeys in services/views/block-hash.ts): the
 * `cache_salt` a prompt's first block carries seeds its chain as the gateway seeds a salted prompt,
 * so salted blocks match only prompts with the same salt; extra keys no gateway reproduces
 * (multimodal ids, prompt embeddings) make the block and its descendants opaque: misses.
 *
 * A block can sit in several tiers (GPU, CPU, storage) under one engine hash; the entry lives until
 * it has been removed from every tier it was stored in.
 *
 * SGLang's block hash is `hash(tuple(page_tokens))`, not chained: one page at two places of the
 * radix tree has one engine hash, and the map can only keep one of its router hashes. A child
 * naming such a parent could then chain from the wrong copy — a false prefix hit. So in the SGLang
 * dialect an engine hash seen with two different router hashes is remembered as ambiguous
 * (bounded), and a child of an ambiguous parent chains as from an unknown parent: a miss, never a
 * false hit.
 */
import { xxh64 } from "@node-rs/xxhash";
import type { KvRemoved, KvStored } from "../../schemas/events.js";
import { type BlockHash, chainBlocks, chainSeed, hashToHex, opaqueBlock, readExtraKeys } from "../views/block-hash.js";
import type { EngineBlockRemoved, EngineBlockStored, EngineDialect } from "./wire.js";

const UNKNOWN_PARENT_SEED = 0x756e6b6e6f776e70n; // "unknownp"

interface Entry {
  router: BlockHash;
  tiers: number;
}

export interface BlockMapCounters {
  unknownParents: number;
  evicted: number;
  /** SGLang: stored blocks whose parent's engine hash stood for two different chains (chained as unknown). */
  ambiguousParents: number;
  /** Blocks with extra keys no gateway reproduces (multimodal ids, prompt embeddings): stored under keys no prompt hashes to. */
  opaqueBlocks: number;
}

export class BlockMap {
  private readonly entries = new Map<string, Entry>();
  private readonly seeds = new Map<string, BlockHash>();
  private readonly tierBits = new Map<string, number>();
  /** SGLang: engine hashes stored with two different router hashes (insertion-ordered, bounded). */
  private readonly ambiguous = new Set<string>();
  private readonly maxAmbiguous: number;
  constructor(
    private readonly model: string,
    /** Bound on tracked blocks (exceeded by up to 1/16 between evictions); least recently used go first. */
    private readonly maxEntries = 262_144,
    readonly counters: BlockMapCounters = { unknownParents: 0, evicted: 0, ambiguousParents: 0, opaqueBlocks: 0 },
    private readonly dialect: EngineDialect = "vllm",
  ) {
    this.maxAmbiguous = Math.max(1024, maxEntries >> 4);
  }

  get size(): number {
    return this.entries.size;
  }

  clear(): void {
    this.entries.clear();
    this.ambiguous.clear();
  }

  /** SGLang engine hashes currently known to stand for more than one chain. */
  get ambiguousHashes(): number {
    return this.ambiguous.size;
  }

  /** The router hash an engine hash maps to, if known (refreshes its recency). */
  routerHash(engineHash: string): BlockHash | undefined {
    const e = this.entries.get(engineHash);
    if (!e) return undefined;
    this.entries.delete(engineHash);
    this.entries.set(engineHash, e);
    return e.router;
  }

  stored(ev: EngineBlockStored): KvStored {
    const lora = loraKey(ev);
    let parent: BlockHash;
    if (ev.parent === null) {
      const first = readExtraKeys(ev.extraKeys?.[0] ?? null, ev, true);
      // A salted first block is seeded with its salt, as the gateway seeds a salted prompt; an
      // opaque one gets the plain seed here and is made opaque with the other blocks below.
      parent = first !== "opaque" && first.salt !== null ? chainSeed(this.model, lora, ev.blockSize, first.salt) : this.seed(lora, ev.blockSize);
    } else {
      const known = this.routerHash(ev.parent);
      if (known !== undefined && this.ambiguous.has(ev.parent)) {
        this.counters.ambiguousParents++;
        parent = unknownParent(this.model, lora, ev.blockSize, ev.parent);
      } else if (known !== undefined) parent = known;
      else {
        this.counters.unknownParents++;
        parent = unknownParent(this.model, lora, ev.blockSize, ev.parent);
      }
    }
    const routers = ev.extraKeys ? this.chainWithExtraKeys(parent, ev) : chainBlocks(parent, ev.tokens, ev.blockSize);
    const bit = this.tierBit(ev.medium);
    const routerHex: string[] = new Array(routers.length);
    for (let i = 0; i < routers.length; i++) {
      const h = ev.hashes[i] as string;
      const r = routers[i] as BlockHash;
      const prev = this.entries.get(h);
      if (prev) {
        this.entries.delete(h);
        if (prev.router !== r && this.dialect === "sglang") this.markAmbiguous(h);
      }
      this.entries.set(h, { router: r, tiers: (prev && prev.router === r ? prev.tiers : 0) | bit });
      routerHex[i] = hashToHex(r);
    }
    this.evict();
    return {
      kind: "stored",
      engineHashes: ev.hashes,
      routerHashes: routerHex,
      parentEngineHash: ev.parent,
      blockSize: ev.blockSize,
      medium: ev.medium,
      lora,
    };
  }

  removed(ev: EngineBlockRemoved): KvRemoved {
    const bit = this.tierBit(ev.medium);
    for (const h of ev.hashes) {
      const e = this.entries.get(h);
      if (!e) continue;
      e.tiers &= ~bit;
      if (e.tiers === 0) this.entries.delete(h);
    }
    return { kind: "removed", engineHashes: ev.hashes, medium: ev.medium };
  }

  /**
   * Chains block by block where extra keys vary: a block whose extra keys a gateway cannot
   * reproduce (readExtraKeys) is stored under an opaque key, and so is every block chained from it.
   */
  private chainWithExtraKeys(parent: BlockHash, ev: EngineBlockStored): BlockHash[] {
    const n = ev.hashes.length;
    const out: BlockHash[] = new Array(n);
    let h = parent;
    for (let i = 0; i < n; i++) {
      h = chainBlocks(h, ev.tokens, ev.blockSize, i * ev.blockSize, 1)[0] as BlockHash;
      if (readExtraKeys(ev.extraKeys?.[i] ?? null, ev, i === 0 && ev.parent === null) === "opaque") {
        this.counters.opaqueBlocks++;
        h = opaqueBlock(h);
      }
      out[i] = h;
    }
    return out;
  }

  private markAmbiguous(h: string): void {
    this.ambiguous.delete(h);
    this.ambiguous.add(h);
    // Forgetting the oldest can only bring back the old risk for that one page; bounded regardless.
    if (this.ambiguous.size > this.maxAmbiguous) this.ambiguous.delete(this.ambiguous.values().next().value as string);
  }

  private evict(): void {
    // Evicting in chunks of 1/16 of the bound: walking the Map from its head past the holes that
    // earlier deletions left costs more than the deletions, so it should happen rarely.
    if (this.entries.size <= this.maxEntries + (this.maxEntries >> 4)) return;
    // Map iteration is insertion order and every store or lookup re-inserts, so the first keys
    // are the least recently used.
    for (const k of this.entries.keys()) {
      this.entries.delete(k);
      this.counters.evicted++;
      if (this.entries.size <= this.maxEntries) break;
    }
  }

  private seed(lora: string | null, blockSize: number): BlockHash {
    const k = `${lora ?? ""}\u0000${blockSize}`;
    let s = this.seeds.get(k);
    if (s === undefined) this.seeds.set(k, (s = chainSeed(this.model, lora, blockSize)));
    return s;
  }

  /** GPU and "no medium" share a bit: engines leave `medium` out for the GPU tier. */
  private tierBit(medium: string | null): number {
    const name = medium === null ? "GPU" : medium.toUpperCase();
    let bit = this.tierBits.get(name);
    if (bit === undefined) {
      bit = 1 << Math.min(this.tierBits.size, 30);
      this.tierBits.set(name, bit);
    }
    return bit;
  }
}

/**
 * The adapter part of the chain seed. vLLM >= mid-2026 sends `lora_name`, which is what a gateway
 * knows from the request; older engines only send the numeric `lora_id`, which no gateway can map
 * back to a name, so those blocks get a key no prompt will reproduce (misses, not false hits).
 */
export function loraKey(ev: Pick<EngineBlockStored, "loraName" | "loraId">): string | null {
  if (ev.loraName !== null) return ev.loraName;
  return ev.loraId === null ? null : `lora-id:${ev.loraId}`;
}

export function unknownParent(model: string, lora: string | null, blockSize: number, parentEngineHash: string): BlockHash {
  return xxh64(`jetroute-kv/unknown-parent\0${model}\0${lora ?? ""}\0${blockSize}\0${parentEngineHash}`, UNKNOWN_PARENT_SEED);
}
