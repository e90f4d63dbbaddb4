/**
 * Property: the kv-bridge's decoder of vLLM/SGLang KV event frames never throws, whatever bytes
 * an engine sends — it returns a batch or a reason — and a valid batch, in either event encoding
 * the simulator (byte-for-byte msgspec) or msgpackr writes, decodes losslessly: every hash, token,
 * block size, medium, LoRA name, timestamp and rank comes back as sent. Through a real ZMQ PUB
 * socket into a running bridge, every undecodable payload is counted and dead-lettered once and
 * the bridge keeps publishing. Why: engines are outside our control (versions, forks, bugs); a
 * frame that crashes or wedges the bridge silently blinds every gateway's prefix routing.
 *
 * Pure decoder: 10,000 valid and 10,000 mutated/random frames. Real sockets: 300 frames.
 * JETROUTE_SOAK=1 raises both.
 */
import { Packr } from "msgpackr";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type KvBridgeHandle, startKvBridge } from "../../services/kv-bridge/bridge.js";
import { encodeBatch, encodeEvent, type EventSpec, TestEngine } from "../../services/kv-bridge/test-engine.js";
import { decodeBatch, type EngineEvent, parseLiveMessage, parseReplayMessage } from "../../services/kv-bridge/wire.js";
import type { KvCacheEvent } from "../../services/sim/kv-cache.js";
import { encodeEventBatch, type KvEventEncoding } from "../../services/sim/kv-events.js";
import { quietLog, startTestEnv, type TestEnv, waitFor } from "../harness/env.js";

const SOAK = process.env.JETROUTE_SOAK;
// 2,000 cases per property in the suite (10,000 took most of a minute per family and passed the
// 30 s test timeout on a loaded host); JETROUTE_SOAK=1 runs 200,000.
const PURE_RUNS = SOAK ? 200_000 : 2_000;
const SOCKET_FRAMES = SOAK ? 5_000 : 300;

const U64_MAX = (1n << 64n) - 1n;
const hex = (h: bigint) => BigInt.asUintN(64, h).toString(16);

// ---- valid batches, simulator encoder ------------------------------------------------------

const u64 = fc.oneof(fc.bigInt({ min: 0n, max: U64_MAX }), fc.constantFrom(0n, 1n, 127n, 128n, 255n, 65_535n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 53n + 1n, 2n ** 63n - 1n, 2n ** 63n, U64_MAX));
const simStored = fc.tuple(fc.integer({ min: 1, max: 4 }), fc.integer({ min: 1, max: 16 })).chain(([n, bs]) =>
  fc.record({
    type: fc.constant("BlockStored" as const),
    blockHashes: fc.array(u64, { minLength: n, maxLength: n }),
    parentBlockHash: fc.option(u64, { nil: null }),
    tokenIds: fc.array(fc.oneof(fc.nat({ max: 200_000 }), fc.constant(0xffffffff)), { minLength: n * bs, maxLength: n * bs }),
    blockSize: fc.constant(bs),
    loraName: fc.option(fc.string({ maxLength: 12 }), { nil: null }),
    extraKeys: fc.array(fc.option(fc.array(fc.string({ maxLength: 6 }), { maxLength: 2 }), { nil: null }), { minLength: n, maxLength: n }),
  }),
);
const simEvent: fc.Arbitrary<KvCacheEvent> = fc.oneof(
  { weight: 4, arbitrary: simStored },
  { weight: 2, arbitrary: fc.record({ type: fc.constant("BlockRemoved" as const), blockHashes: fc.array(u64, { minLength: 1, maxLength: 6 }) }) },
  { weight: 1, arbitrary: fc.constant({ type: "AllBlocksCleared" as const }) },
);
const simBatch = fc.record({
  ts: fc.oneof(fc.double({ min: 0, max: 4e9, noNaN: true }), fc.constantFrom(0, 1_700_000_000, 1_700_000_001.5)),
  events: fc.array(simEvent, { maxLength: 8 }),
  encoding: fc.constantFrom<KvEventEncoding>("map", "array"),
  rank: fc.nat({ max: 2 ** 31 - 1 }),
});

function expected(e: KvCacheEvent): EngineEvent {
  switch (e.type) {
    case "BlockStored":
      return {
        kind: "stored",
        hashes: e.blockHashes.map(hex),
        parent: e.parentBlockHash === null ? null : hex(e.parentBlockHash),
        tokens: e.tokenIds,
        blockSize: e.blockSize,
        loraId: null,
        loraName: e.loraName,
        medium: "GPU",
        // Extra keys come through when any block has some (all-nil reads as none).
        ...(e.extraKeys.some((k) => k !== null) ? { extraKeys: e.extraKeys } : {}),
      };
    case "BlockRemoved":
      return { kind: "removed", hashes: e.blockHashes.map(hex), medium: "GPU" };
    case "AllBlocksCleared":
      return { kind: "all-cleared" };
  }
}

// ---- valid batches, msgpackr (int64 forms, SGLang signed hashes, digests) --------------------

const anyHash = fc.oneof(fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }), fc.nat(), fc.uint8Array({ minLength: 1, maxLength: 32 }));
const hashHex = (h: bigint | number | Uint8Array) => (h instanceof Uint8Array ? Buffer.from(h).toString("hex") : hex(BigInt(h)));
const specStored = fc.tuple(fc.integer({ min: 1, max: 4 }), fc.integer({ min: 1, max: 8 })).chain(([n, bs]) =>
  fc.record({
    type: fc.constant("BlockStored" as const),
    hashes: fc.array(anyHash, { minLength: n, maxLength: n }),
    parent: fc.option(anyHash, { nil: null }),
    tokens: fc.array(fc.nat({ max: 0xffffffff }), { minLength: n * bs, maxLength: n * bs }),
    blockSize: fc.constant(bs),
    loraId: fc.option(fc.nat({ max: 2 ** 31 - 1 }), { nil: null }),
    medium: fc.option(fc.constantFrom("GPU", "CPU", "CPU_PINNED", "DISK"), { nil: null }),
    loraName: fc.option(fc.string({ maxLength: 8 }), { nil: null }),
  }),
);
const spec: fc.Arbitrary<EventSpec> = fc.oneof(specStored, fc.record({ type: fc.constant("BlockRemoved" as const), hashes: fc.array(anyHash, { minLength: 1, maxLength: 5 }), medium: fc.option(fc.constantFrom("GPU", "CPU"), { nil: null }) }), fc.constant({ type: "AllBlocksCleared" as const }));

function expectedSpec(e: EventSpec): EngineEvent {
  if (e.type === "AllBlocksCleared") return { kind: "all-cleared" };
  if (e.type === "BlockRemoved") return { kind: "removed", hashes: e.hashes.map(hashHex), medium: e.medium ?? "GPU" };
  return { kind: "stored", hashes: e.hashes.map(hashHex), parent: e.parent == null ? null : hashHex(e.parent), tokens: e.tokens, blockSize: e.blockSize, loraId: e.loraId ?? null, loraName: e.loraName ?? null, medium: e.medium === undefined ? "GPU" : e.medium };
}

// ---- mutated and random frames -------------------------------------------------------------

const packr = new Packr({ useRecords: false, useFloat32: 0 });
const edge = fc.constantFrom<unknown>(2n ** 63n - 1n, -(2n ** 63n), 2n ** 64n - 1n, -1n, -1, 2 ** 53, 2 ** 31, -(2 ** 31), Number.NaN, Number.POSITIVE_INFINITY, -0, 1.5, "", "BlockStored", null, true, new Uint8Array(0), new Uint8Array(33));
const junk: fc.Arbitrary<unknown> = fc.letrec<{ v: unknown }>((tie) => ({
  v: fc.oneof({ depthSize: "small", withCrossShrink: true }, edge, fc.string({ maxLength: 8 }), fc.integer(), fc.double(), fc.array(tie("v"), { maxLength: 5 }), fc.array(fc.tuple(fc.constantFrom("type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"), tie("v")), { maxLength: 6 }).map((es) => new Map(es))),
})).v;
/** A well-formed envelope around a mutated event: one field of a valid event replaced by junk. */
const mutatedEvent = fc.tuple(spec, fc.constantFrom<EventForm>("map", "array"), fc.nat({ max: 8 }), fc.oneof(edge, junk)).map(([e, form, slot, v]) => {
  const raw = encodeEvent(e, form);
  if (raw instanceof Map) {
    const keys = [...raw.keys()];
    raw.set(keys[slot % keys.length] as string, v);
  } else if (Array.isArray(raw)) raw[slot % (raw.length + 1)] = v;
  return raw;
});
type EventForm = "map" | "array";
const HUGE = [
  packr.pack([1.0, Array.from({ length: 50_000 }, () => ["AllBlocksCleared"]), 0]),
  packr.pack([1.0, [["BlockStored", Array.from({ length: 50_000 }, (_, i) => BigInt(i)), null, [], 16]], 0]),
  packr.pack([1.0, [new Map<string, unknown>([["type", "BlockRemoved"], ["block_hashes", Array.from({ length: 100_000 }, (_, i) => 2n ** 63n + BigInt(i))]])], 0]),
  packr.pack([1.0, [["BlockStored", [1n], null, Array.from({ length: 300_000 }, (_, i) => i), 300_000]], 2n ** 31n]),
];
const badFrame: fc.Arbitrary<Buffer> = fc.oneof(
  { depthSize: "small" },
  { weight: 1, arbitrary: fc.constantFrom(...HUGE) },
  { weight: 30, arbitrary: fc.uint8Array({ maxLength: 256 }).map((u) => Buffer.from(u)) },
  { weight: 30, arbitrary: simBatch.chain((b) => { const full = encodeEventBatch(b.ts, b.events, b.encoding, b.rank); return fc.nat({ max: Math.max(0, full.length - 1) }).map((n) => full.subarray(0, n)); }) },
  { weight: 30, arbitrary: fc.tuple(fc.oneof(edge, fc.double()), fc.array(mutatedEvent, { maxLength: 4 }), fc.oneof(edge, fc.nat())).map(([ts, evs, rank]) => packr.pack([ts, evs, rank])) },
  { weight: 30, arbitrary: junk.map((v) => packr.pack(v)) },
  { weight: 30, arbitrary: fc.array(fc.oneof(edge, junk), { maxLength: 4 }).map((v) => packr.pack(v)) },
  // Headers claiming far more than is there: array32 / str32 / bin32 lengths of 2^32-1.
  { weight: 3, arbitrary: fc.constantFrom(Buffer.from([0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff]), Buffer.from([0xdb, 0xff, 0xff, 0xff, 0xff]), Buffer.from([0xc6, 0xff, 0xff, 0xff, 0xff]), Buffer.from([0xc1]), Buffer.from([0xd4, 0xff, 0x00])) },
);

describe("properties - ZMQ KV event frames (pure decoder)", () => {
  it(`valid simulator batches, map and array encodings, decode losslessly (${PURE_RUNS} cases)`, () => {
    fc.assert(
      fc.property(simBatch, (b) => {
        const r = decodeBatch(encodeEventBatch(b.ts, b.events, b.encoding, b.rank));
        if (!r.ok) throw new Error(r.reason);
        expect(r.value).toEqual({ ts: b.ts, dpRank: b.rank, events: b.events.map(expected), unknownTags: [], invalid: [] });
      }),
      { numRuns: PURE_RUNS },
    );
  });

  it(`valid msgpackr batches with int64, signed and digest hashes decode losslessly (${PURE_RUNS / 2} cases)`, () => {
    fc.assert(
      fc.property(fc.array(spec, { maxLength: 6 }), fc.constantFrom<EventForm>("map", "array"), fc.oneof(fc.constant<"absent">("absent"), fc.constant(null), fc.nat({ max: 2 ** 31 - 1 })), (events, form, rank) => {
        const r = decodeBatch(encodeBatch(1_700_000_000.25, events.map((e) => encodeEvent(e, form)), rank));
        if (!r.ok) throw new Error(r.reason);
        expect(r.value).toEqual({ ts: 1_700_000_000.25, dpRank: rank === "absent" ? undefined : rank, events: events.map(expectedSpec), unknownTags: [], invalid: [] });
      }),
      { numRuns: PURE_RUNS / 2 },
    );
  });

  it(`random, truncated and mutated frames never throw: a batch or a reason (${PURE_RUNS} cases)`, () => {
    fc.assert(
      fc.property(badFrame, fc.array(fc.uint8Array({ maxLength: 12 }), { maxLength: 5 }), (payload, frames) => {
        const r = decodeBatch(payload);
        if (r.ok) {
          expect(Array.isArray(r.value.events)).toBe(true);
          expect(r.value.events.length + r.value.unknownTags.length + r.value.invalid.length).toBeGreaterThanOrEqual(0);
          const badHash = r.value.events.flatMap((e) => (e.kind === "all-cleared" ? [] : e.hashes)).find((h) => !/^[0-9a-f]{1,64}$/.test(h));
          expect(badHash).toBeUndefined();
        } else expect(r.reason.length).toBeGreaterThan(0);
        // The envelopes never throw either.
        const live = parseLiveMessage(frames);
        const replay = parseReplayMessage(frames);
        expect(typeof live.ok).toBe("boolean");
        expect(typeof replay.ok).toBe("boolean");
      }),
      { numRuns: PURE_RUNS },
    );
  });
});

describe("properties - ZMQ frames through a real PUB socket into a running bridge", () => {
  let env: TestEnv;
  let engine: TestEngine;
  let bridge: KvBridgeHandle;
  const POD = "zmq-prop";
  beforeAll(async () => {
    env = await startTestEnv();
    engine = await new TestEngine({ form: "map" }).start();
    await env.publishPod({ pod: POD, address: "127.0.0.1:9", kvEvents: { endpoint: engine.endpoint, replayEndpoint: engine.replayEndpoint as string, topic: engine.topic } });
    bridge = await startKvBridge({ nats: env.server.url, log: quietLog, replayTimeoutMs: 300 });
  });
  afterAll(async () => {
    await bridge?.close();
    await engine?.close();
    await env?.stop();
  });

  const lastSeq = () => bridge.pods().find((p) => p.pod === POD)?.lastSeq;

  it(`${SOCKET_FRAMES} generated frames: bad ones counted and dead-lettered once, the bridge keeps going`, { timeout: 120_000 }, async () => {
    // Until a batch arrives live, the SUB may not be subscribed yet (ZMQ's slow joiner).
    let tokens = 1;
    const fresh = (): EventSpec => ({ type: "BlockStored", hashes: [BigInt(tokens)], parent: null, tokens: [tokens++, tokens++], blockSize: 2 });
    for (let i = 0; ; i++) {
      await engine.publish([fresh()]);
      try {
        await waitFor(() => lastSeq() === engine.seq - 1, 300, "warm-up batch");
        break;
      } catch (err) {
        if (i > 100) throw err;
      }
    }
    const base = { ...bridge.stats };
    let malformed = 0;
    let invalidEvents = 0;
    let unknownEvents = 0;
    let letters = 0;
    const frames = fc.sample(fc.oneof({ weight: 2, arbitrary: fc.constant(undefined) }, { weight: 3, arbitrary: badFrame }), { numRuns: SOCKET_FRAMES, seed: 7 });
    for (const f of frames) {
      // Valid batches keep the engine's clock; bad payloads become holes the sequence moves past.
      const payload = f ?? encodeBatch(engine.ts, [encodeEvent(fresh(), "map")]);
      if (f === undefined) engine.ts += 0.001;
      const d = decodeBatch(Buffer.from(payload));
      if (!d.ok) {
        malformed++;
        letters++;
      } else {
        unknownEvents += d.value.unknownTags.length;
        if (d.value.invalid.length > 0) {
          invalidEvents += d.value.invalid.length;
          letters++;
        }
      }
      await engine.publishPayload(payload);
    }
    await waitFor(() => lastSeq() === engine.seq - 1, 20_000, "bridge past every frame");
    await waitFor(() => bridge.stats.deadLetters - base.deadLetters === letters, 5_000, "dead letters published");
    const s = bridge.stats;
    expect({ malformed: s.malformed - base.malformed, invalidEvents: s.invalidEvents - base.invalidEvents, unknownEvents: s.unknownEvents - base.unknownEvents, deadLetters: s.deadLetters - base.deadLetters }).toEqual({ malformed, invalidEvents, unknownEvents, deadLetters: letters });
    expect(s.internalErrors).toBe(0);
    expect(s.deadLetterErrors).toBe(0);
    // Still alive: one more good batch goes through.
    await engine.publish([fresh()]);
    await waitFor(() => lastSeq() === engine.seq - 1, 5_000, "a good batch after the bad ones");
    console.log(`zmq frames: ${JSON.stringify({ frames: SOCKET_FRAMES, malformed, invalidEvents, unknownEvents, letters })}`);
  });
});
