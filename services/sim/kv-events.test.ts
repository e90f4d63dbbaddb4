import { Value } from "@sinclair/typebox/value";
import { Unpackr } from "msgpackr";
import { afterEach, describe, expect, it } from "vitest";
import { Dealer, Subscriber } from "zeromq";
import { KvEventsEndpoint } from "../../schemas/events.js";
import { type SimFleet, type SimFleetOptions, startSimFleet } from "./fleet.js";
import type { KvCacheEvent } from "./kv-cache.js";
import { encodeEventBatch, seqBytes } from "./kv-events.js";
import { waitFor } from "../../test/harness/wait.js";
import { json, metricValue, postJson, scrape } from "./testing.js";

const MODEL = "demo/llama-3.1-8b";
const TWO_63 = 1n << 63n;
// msgpackr's default for 64-bit ints is already BigInt; said explicitly because precision is the point.
const unpackr = new Unpackr({ int64AsType: "bigint", mapsAsObjects: true });

const fleets: SimFleet[] = [];
const sockets: Array<{ close(): void }> = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.close();
  await Promise.all(fleets.splice(0).map((f) => f.close()));
});

async function fleet(options: Partial<SimFleetOptions> = {}): Promise<SimFleet> {
  const f = await startSimFleet({ pods: 1, model: MODEL, timeScale: 1_000, prefillMsPerToken: 0.25, ...options });
  fleets.push(f);
  return f;
}

/** A live subscriber collecting every message, as a router's kv-bridge would. */
async function subscribe(endpoint: string, topic = "") {
  const sock = new Subscriber({ linger: 0 });
  sockets.push(sock);
  sock.connect(endpoint);
  sock.subscribe(topic);
  const messages: Buffer[][] = [];
  void (async () => {
    try {
      for await (const frames of sock) messages.push(frames);
    } catch {
      // closed by the test
    }
  })();
  // A PUB drops what it sends before the subscription reaches it (ZMQ's slow joiner). No condition
  // to wait for: a PUB socket does not tell when a subscription reached it, and probing it would
  // publish a batch, shifting the sequence numbers these tests assert on.
  await new Promise((r) => setTimeout(r, 150));
  return {
    messages,
    seqs: () => messages.map((m) => m[1]?.readBigUInt64BE() ?? -1n),
    /** Waits until the message carrying `seq` has arrived. */
    until: (seq: number) => waitFor(() => messages.some((m) => m[1]?.readBigUInt64BE() === BigInt(seq)), 5_000, `batch ${seq} on the SUB`),
  };
}

/** Every frame of one replay answer, up to and including the end marker. */
async function replay(endpoint: string, start: bigint): Promise<Buffer[][]> {
  const dealer = new Dealer({ linger: 0, receiveTimeout: 3_000 });
  sockets.push(dealer);
  dealer.connect(endpoint);
  const start8 = Buffer.alloc(8);
  start8.writeBigUInt64BE(start);
  await dealer.send([Buffer.alloc(0), start8]);
  const out: Buffer[][] = [];
  for (;;) {
    const frames = await dealer.receive();
    out.push(frames);
    if (frames.some((f) => f.length === 8 && f.equals(Buffer.alloc(8, 0xff)))) return out;
  }
}

const STORED_FIELDS = [
  "block_hashes",
  "parent_block_hash",
  "token_ids",
  "block_size",
  "lora_id",
  "medium",
  "lora_name",
  "extra_keys",
  "group_idx",
  "kv_cache_spec_kind",
  "kv_cache_spec_sliding_window",
];
const FIELDS: Record<string, string[]> = {
  BlockStored: STORED_FIELDS,
  BlockRemoved: ["block_hashes", "medium", "group_idx"],
  AllBlocksCleared: [],
};

type Decoded = { type: string } & Record<string, unknown>;

/** A decoder that accepts both encodings, as a router must: arrays are mapped by declaration order. */
function decodeEvent(raw: unknown): Decoded {
  if (Array.isArray(raw)) {
    const [tag, ...values] = raw as [string, ...unknown[]];
    const names = FIELDS[tag] ?? [];
    return Object.fromEntries([["type", tag], ...names.map((n, i) => [n, values[i]])]) as Decoded;
  }
  return raw as Decoded;
}

function decodeBatch(payload: Buffer): { ts: number; events: Decoded[]; raw: unknown[]; rank: unknown } {
  const batch = unpackr.unpack(payload) as [number, unknown[], unknown];
  expect(Array.isArray(batch)).toBe(true);
  return { ts: batch[0], raw: batch[1], events: batch[1].map(decodeEvent), rank: batch[2] };
}

const hashes = (e: Decoded): bigint[] => (e.block_hashes as Array<bigint | number>).map((h) => BigInt(h));

/** hash → {parent, tokens} from a stream of batches, applying removals and clears. */
function fold(payloads: Buffer[]): Map<string, { parent: string | null; tokens: number[] }> {
  const set = new Map<string, { parent: string | null; tokens: number[] }>();
  for (const p of payloads) {
    for (const e of decodeBatch(p).events) {
      if (e.type === "AllBlocksCleared") set.clear();
      if (e.type === "BlockRemoved") {
        for (const h of hashes(e)) {
          expect(set.has(h.toString()), `BlockRemoved ${h} was never stored`).toBe(true);
          set.delete(h.toString());
        }
      }
      if (e.type === "BlockStored") {
        const size = e.block_size as number;
        const tokens = e.token_ids as number[];
        let parent = e.parent_block_hash === null ? null : BigInt(e.parent_block_hash as bigint).toString();
        hashes(e).forEach((h, i) => {
          set.set(h.toString(), { parent, tokens: tokens.slice(i * size, (i + 1) * size) });
          parent = h.toString();
        });
      }
    }
  }
  return set;
}

async function cache(address: string) {
  return json(fetch(`http://${address}/debug/cache`));
}

const prompt = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i);
const complete = (address: string, tokens: number[], extra: object = {}) =>
  json(postJson(address, "/v1/completions", { model: MODEL, prompt: tokens, max_tokens: 1, ...extra }));

describe("KV event wire format", () => {
  // Reference bytes from msgspec 0.22 encoding vLLM's own struct declarations (EventBatch
  // array_like; events array_like for "array", plain tagged structs for "map"; omit_defaults).
  const example: KvCacheEvent[] = [
    {
      type: "BlockStored",
      blockHashes: [1n, 2n],
      parentBlockHash: null,
      tokenIds: prompt(100, 32),
      blockSize: 16,
      loraName: null,
      extraKeys: [null, null],
    },
  ];
  const mixed: KvCacheEvent[] = [
    {
      type: "BlockStored",
      blockHashes: [(1n << 64n) - 1n, TWO_63, 1n << 32n, 255n, 127n],
      parentBlockHash: TWO_63 - 1n,
      tokenIds: [0, 127, 128, 255, 256, 65535, 65536, 151644],
      blockSize: 1,
      loraName: null,
      extraKeys: [["salt-a"], null, null, null, null],
    },
    { type: "BlockRemoved", blockHashes: [12345678901234567890n, 3n] },
    { type: "AllBlocksCleared" },
  ];
  const tokens100to131 = "dc00206465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7fcc80cc81cc82cc83";
  const golden = {
    arrayExample: `93cb41d954fc40200000919cab426c6f636b53746f726564920102c0${tokens100to131}10c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec000`,
    mapExample:
      "93cb41d954fc40200000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920102b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473" +
      `${tokens100to131}aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00`,
    arrayMixed:
      "93cb41d954fc40400000939cab426c6f636b53746f72656495cfffffffffffffffffcf8000000000000000cf0000000100000000ccff7fcf7fffffffffffffff98007fcc80ccffcd0100cdffffce00010000ce0002505c01c0a3475055c09591a673616c742d61c0c0c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f76656492cfab54a98ceb1f0ad203a34750550091b0416c6c426c6f636b73436c656172656400",
    mapMixed:
      "93cb41d954fc40400000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657395cfffffffffffffffffcf8000000000000000cf0000000100000000ccff7fb1706172656e745f626c6f636b5f68617368cf7fffffffffffffffa9746f6b656e5f69647398007fcc80ccffcd0100cdffffce00010000ce0002505caa626c6f636b5f73697a6501a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739591a673616c742d61c0c0c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657392cfab54a98ceb1f0ad203a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400",
  };

  it("encodes batches byte for byte as vLLM's msgspec encoder does, in both encodings", () => {
    expect(encodeEventBatch(1700000000.5, example, "array").toString("hex")).toBe(golden.arrayExample);
    expect(encodeEventBatch(1700000000.5, example, "map").toString("hex")).toBe(golden.mapExample);
    // An integral timestamp stays float64; every hash >= 2^32 is uint64 (0xcf), smaller ones shrink.
    expect(encodeEventBatch(1700000001, mixed, "array").toString("hex")).toBe(golden.arrayMixed);
    expect(encodeEventBatch(1700000001, mixed, "map").toString("hex")).toBe(golden.mapMixed);
  });

  it("decodes with msgpackr to the exact 64-bit values", () => {
    const batch = decodeBatch(encodeEventBatch(1700000001, mixed, "map"));
    expect(batch.ts).toBe(1700000001);
    expect(batch.rank).toBe(0);
    expect(batch.events[0]?.block_hashes).toEqual([(1n << 64n) - 1n, TWO_63, 1n << 32n, 255, 127]);
    expect(batch.events[0]?.parent_block_hash).toBe(TWO_63 - 1n);
    expect(batch.events[1]?.block_hashes).toEqual([12345678901234567890n, 3]);
  });
});

describe("KV events from a simulated pod", () => {
  it("publishes [topic, seq, EventBatch] per step in map and array form, with exact uint64 hashes", async () => {
    const f = await fleet({ pods: 2, kvEventsEncoding: ["map", "array"] });
    for (const [i, pod] of f.pods.entries()) {
      const kv = pod.kvEvents;
      expect(kv?.topic).toBe("kv-events");
      expect(Value.Check(KvEventsEndpoint, kv)).toBe(true);
      const sub = await subscribe(kv?.endpoint ?? "");
      const prompts = [prompt(1000, 64), prompt(2000, 80), prompt(3000, 40)];
      for (const p of prompts) await complete(pod.address, p);
      await fetch(`http://${pod.address}/reset_prefix_cache`, { method: "POST" });
      await sub.until(3);
      expect(sub.seqs()).toEqual([0n, 1n, 2n, 3n]);

      const listing = await cache(pod.address);
      const seen: bigint[] = [];
      for (const [n, frames] of sub.messages.entries()) {
        expect(frames).toHaveLength(3);
        expect(frames[0]?.toString()).toBe("kv-events");
        expect(frames[1]?.equals(seqBytes(n))).toBe(true);
        const payload = frames[2] as Buffer;
        // Positional batch of 3 opening with a float64 timestamp.
        expect(payload.subarray(0, 2).toString("hex")).toBe("93cb");
        const batch = decodeBatch(payload);
        expect(Math.abs(batch.ts - Date.now() / 1000)).toBeLessThan(30);
        expect(batch.rank).toBe(0);
        expect(batch.events).toHaveLength(1);
        const [event] = batch.events;
        const raw = batch.raw[0];
        if (i === 0) expect(raw).not.toBeInstanceOf(Array);
        else expect(raw).toBeInstanceOf(Array);
        if (n === 3) {
          expect(raw).toEqual(i === 0 ? { type: "AllBlocksCleared" } : ["AllBlocksCleared"]);
          continue;
        }
        const tokens = prompts[n] as number[];
        const blocks = Math.floor(tokens.length / 16);
        expect(event).toMatchObject({
          type: "BlockStored",
          parent_block_hash: null,
          token_ids: tokens.slice(0, blocks * 16),
          block_size: 16,
          lora_id: null,
          medium: "GPU",
          lora_name: null,
          extra_keys: Array(blocks).fill(null),
          group_idx: 0,
          kv_cache_spec_kind: "full_attention",
        });
        // The map form leaves out None-valued defaulted fields; the array form carries every field.
        if (i === 0) expect(Object.keys(raw as object)).not.toContain("kv_cache_spec_sliding_window");
        else expect(raw).toHaveLength(12);
        const hs = hashes(event as Decoded);
        expect(hs).toHaveLength(blocks);
        for (const h of hs) {
          // Hashes at or above 2^32 travel as msgpack uint64: 0xcf then 8 bytes big-endian.
          if (h >= 1n << 32n) expect(payload.includes(Buffer.concat([Buffer.from([0xcf]), seqBytesBig(h)]))).toBe(true);
        }
        seen.push(...hs);
      }
      // The full 64-bit range is used: some hash is above 2^63 and survives decoding exactly.
      const big = seen.filter((h) => h > TWO_63);
      expect(big.length).toBeGreaterThan(0);
      // /debug/cache was read after reset_prefix_cache: empty, and the next batch is seq 4.
      expect(listing).toMatchObject({ blocks: [], nextSeq: 4, blockSize: 16 });
    }
  });

  it("lists exactly the blocks the events describe, under eviction pressure", async () => {
    // 24 blocks of 16: every 100-token prompt stores 6, so the fourth prompt on starts evicting.
    const f = await fleet({ kvCacheBlocks: 24, maxModelLen: 256, kvEventsEncoding: "array" });
    const pod = f.pods[0];
    const sub = await subscribe(pod?.kvEvents?.endpoint ?? "");
    const prompts = Array.from({ length: 8 }, (_, k) => prompt(500 * (k + 1), 100));
    for (const p of prompts) await complete(pod?.address ?? "", p);
    // The first prompt again: its blocks were evicted (tail first), so it is a miss and re-stored.
    await complete(pod?.address ?? "", prompts[0] as number[]);
    const listing = await cache(pod?.address ?? "");
    expect(listing.pendingEvents).toBe(0);
    await sub.until(listing.nextSeq - 1);
    const payloads = sub.messages.map((m) => m[2] as Buffer);
    const events = payloads.flatMap((p) => decodeBatch(p).events);
    const stored = events.filter((e) => e.type === "BlockStored").flatMap(hashes);
    const removed = events.filter((e) => e.type === "BlockRemoved").flatMap(hashes);
    // Nine prompts of 6 full blocks each were all stored: the repeat found its blocks evicted.
    expect(stored).toHaveLength(54);
    expect(events.at(-1)).toMatchObject({ type: "BlockStored", parent_block_hash: null, token_ids: prompts[0]?.slice(0, 96) });
    const folded = fold(payloads);
    const listed = new Map(
      (listing.blocks as Array<{ hash: string; parentHash: string | null; tokenIds: number[] }>).map((b) => [
        b.hash,
        { parent: b.parentHash, tokens: b.tokenIds },
      ]),
    );
    expect(listed.size).toBe(stored.length - removed.length);
    expect(listed.size).toBeGreaterThan(12);
    expect(listed).toEqual(folded);
  });

  it("replays buffered batches from a start sequence in both layouts, then the end marker", async () => {
    const f = await fleet({ pods: 2, kvEventsReplayLayout: ["new", "old"], kvEventsBufferSteps: 4, kvEventsTopic: "kv" });
    const empty = Buffer.alloc(0);
    const end = Buffer.alloc(8, 0xff);
    for (const [i, pod] of f.pods.entries()) {
      const sub = await subscribe(pod.kvEvents?.endpoint ?? "", "kv");
      for (let k = 0; k < 6; k++) await complete(pod.address, prompt(100 * (k + 1), 32));
      await sub.until(5);
      const live = sub.messages.map((m) => m[2] as Buffer);
      const endpoint = pod.kvEvents?.replayEndpoint ?? "";

      const fromThree = await replay(endpoint, 3n);
      const expected = (seqs: number[]) =>
        i === 0
          ? [...seqs.map((s) => [empty, Buffer.from("kv"), seqBytes(s), live[s]]), [empty, empty, end, empty]]
          : [...seqs.map((s) => [empty, seqBytes(s), live[s]]), [empty, end, empty]];
      expect(fromThree).toEqual(expected([3, 4, 5]));
      // Only the last bufferSteps (4) batches are kept.
      expect(await replay(endpoint, 0n)).toEqual(expected([2, 3, 4, 5]));
      expect(await replay(endpoint, 6n)).toEqual(expected([]));
    }
  });

  it("serves a repeated prompt from cache: no re-announce, shorter prefill, vLLM's query/hit counters", async () => {
    // timeScale 5: a timer that fires 30 ms late on a loaded machine is 0.15 s of simulated time.
    const f = await fleet({ timeScale: 5, prefillMsPerToken: 1, decodeMsPerStep: 10 });
    const address = f.pods[0]?.address ?? "";
    const sub = await subscribe(f.pods[0]?.kvEvents?.endpoint ?? "");
    const p = prompt(4000, 256);
    await complete(address, p);
    const cold = await scrape(address);
    await complete(address, p);
    const warm = await scrape(address);
    const ttft = (m: string) => metricValue(m, "vllm:time_to_first_token_seconds_sum") ?? Number.NaN;
    // 256 uncached tokens at 1 ms, then only the 16 of the last block (the hit stops one token short).
    // A step never ends early; it may end late by the machine's timer lateness (bounded above).
    const coldTtft = ttft(cold);
    const warmTtft = ttft(warm) - coldTtft;
    expect(coldTtft).toBeGreaterThanOrEqual(0.255);
    expect(coldTtft).toBeLessThan(0.256 + 0.15);
    expect(warmTtft).toBeGreaterThanOrEqual(0.015);
    expect(warmTtft).toBeLessThan(0.016 + 0.15);
    expect(warmTtft).toBeLessThan(coldTtft);
    expect(metricValue(warm, "vllm:prefix_cache_queries_total")).toBe(512);
    expect(metricValue(warm, "vllm:prefix_cache_hits_total")).toBe(240);
    expect(metricValue(warm, "vllm:cache_config_info", { block_size: "16", enable_prefix_caching: "True", num_gpu_blocks: "4096" })).toBe(1);
    // The first prompt's batch; the engine's next sequence number then shows no second one was made.
    await sub.until(0);
    expect(sub.seqs()).toEqual([0n]);
    expect((await cache(address)).nextSeq).toBe(1);
    // A different cache_salt shares nothing.
    await complete(address, p, { cache_salt: "tenant-b" });
    const salted = await scrape(address);
    expect(metricValue(salted, "vllm:prefix_cache_hits_total")).toBe(240);
    expect((await postJson(address, "/v1/completions", { prompt: p, cache_salt: "" })).status).toBe(400);
  });

  it("on restart drops in-flight requests, empties the cache and numbers batches from 0 again, announcing nothing", async () => {
    const f = await fleet({ timeScale: 10, decodeMsPerStep: 50 });
    const pod = f.pods[0];
    const address = pod?.address ?? "";
    const sub = await subscribe(pod?.kvEvents?.endpoint ?? "");
    await complete(address, prompt(100, 48));
    await complete(address, prompt(200, 48));
    const streaming = await postJson(address, "/v1/completions", { prompt: prompt(300, 48), max_tokens: 5_000, stream: true });
    const reader = streaming.body?.getReader();
    await reader?.read();
    await sub.until(2);

    const res = await postJson(address, "/debug/restart", {});
    expect(res.status).toBe(200);
    const drained = (async () => {
      for (;;) if ((await reader?.read())?.done !== false) return "ended cleanly";
    })();
    await expect(drained).rejects.toThrow();
    const listing = await cache(address);
    expect(listing).toMatchObject({ blocks: [], nextSeq: 0, usedBlocks: 0 });
    expect(metricValue(await scrape(address), "vllm:prefix_cache_queries_total")).toBe(0);
    // "Announcing nothing" has no event to wait for: let what was sent before the restart land,
    // then watch a window in which nothing may arrive.
    await new Promise((r) => setTimeout(r, 100));
    const before = sub.messages.length;
    await new Promise((r) => setTimeout(r, 100));
    expect(sub.messages.length).toBe(before);

    await complete(address, prompt(100, 48));
    await waitFor(() => sub.messages.length > before, 5_000, "the first batch after the restart");
    // The sequence went backwards: that, and nothing else, tells a subscriber the engine restarted.
    expect(sub.seqs().at(-1)).toBe(0n);
    const [first] = decodeBatch(sub.messages.at(-1)?.[2] as Buffer).events;
    expect(first).toMatchObject({ type: "BlockStored", parent_block_hash: null });
    expect((await replay(pod?.kvEvents?.replayEndpoint ?? "", 0n)).map((frames) => frames[2]?.toString("hex"))).toEqual([
      seqBytes(0).toString("hex"),
      "ff".repeat(8),
    ]);
    // The programmatic restart does the same.
    f.restart(pod?.name ?? "");
    expect(f.cacheListing(pod?.name ?? "")).toMatchObject({ blocks: [], nextSeq: 0 });
  });

  it("publishes nothing when disabled, and never from SGLang pods", async () => {
    const off = await fleet({ kvEvents: false });
    expect(off.pods[0]?.kvEvents).toBeUndefined();
    expect((await cache(off.pods[0]?.address ?? "")).nextSeq).toBeNull();
    const mixed = await fleet({ pods: 2, engine: ["vllm", "sglang"], kvEventsEncoding: "array", kvEventsReplayLayout: "old" });
    expect(mixed.pods.map((p) => [p.kvEventsEncoding, p.kvEventsReplayLayout, p.kvEvents !== undefined])).toEqual([
      ["array", "old", true],
      [undefined, undefined, false],
    ]);
  });
});

function seqBytesBig(v: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(v);
  return b;
}
