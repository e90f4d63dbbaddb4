/**
 * Prefix support and `cache_salt`: the gateway keys a salted prompt as the engine keys it (the
 * salt in the first block), so a salted request matches only blocks of its own salt — in the
 * engine-fed index (precise) and in the routed-prefix history (approximate) — and an unsalted one
 * never matches salted blocks. The index is fed the way the kv-bridge feeds it, from engine events.
 */
import { describe, expect, it } from "vitest";
import type { KvBatch, KvStored } from "../../schemas/events.js";
import { Subjects } from "../../streams/subjects.js";
import { BlockMap } from "../kv-bridge/block-map.js";
import { Director } from "../routing/director.js";
import { MemorySink, MODEL, stateWithPods } from "../routing/stages/testing.js";
import type { Outbox } from "../shared/publish.js";
import { chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
import type { GatewayState } from "../views/gateway-state.js";
import { decodeBlockHashes } from "../views/packed-hashes.js";
import { createPrefixSupport } from "./prefix-support.js";
import type { Tokenizer } from "./tokenization.js";

const tokens = Uint32Array.from({ length: 64 }, (_, i) => 2_000 + i);
const NOW = 1_700_000_000_000;

/** What the kv-bridge publishes for an engine that stored `tokens` (4 blocks of 16) under `salt`. */
function storedOn(state: GatewayState, pod: string, seq: number, salt: string | null): void {
  const ev: KvStored = new BlockMap(MODEL).stored({
    kind: "stored",
    hashes: ["e1", "e2", "e3", "e4"].map((h) => `${h}${seq}`),
    parent: null,
    tokens: Array.from(tokens),
    blockSize: 16,
    loraId: null,
    loraName: null,
    medium: "GPU",
    ...(salt ? { extraKeys: [[salt], null, null, null] } : {}),
  });
  const batch: KvBatch = { type: "kv", model: MODEL, pod, epoch: "e", seq, ts: NOW, events: [ev] };
  state.apply(batch, { stream: "kv", subject: `kv.${pod}`, seq, serverTs: NOW });
}

function setup() {
  const state = stateWithPods(3, "gw");
  const fired: unknown[] = [];
  const outbox = { fire: (_s: string, ev: unknown) => void fired.push(ev) } as unknown as Outbox;
  const tokenizer = { tokenize: () => Promise.reject(new Error("prompts come as token ids here")) } as unknown as Tokenizer;
  const prefix = createPrefixSupport({ gatewayId: "gw", state, tokenizer, subjects: new Subjects(), outbox });
  const pods = state.pods.readyPods(MODEL);
  const matched = (mode: string, salt?: string) => {
    const m = prefix.match(MODEL, pods, tokens, NOW, mode, salt);
    return pods.map((p) => m.info.matched(p.pod));
  };
  return { state, prefix, pods, matched, fired };
}

describe("prefix support - cache_salt", () => {
  it("precise: a salted prompt matches only blocks stored under its salt; an unsalted one only unsalted blocks", () => {
    const { state, matched } = setup();
    storedOn(state, "p0", 1, "tenant-a");
    storedOn(state, "p1", 2, null);
    storedOn(state, "p2", 3, "tenant-b");
    expect(matched("ids", "tenant-a")).toEqual([4, 0, 0]);
    expect(matched("ids", "tenant-b")).toEqual([0, 0, 4]);
    expect(matched("ids")).toEqual([0, 4, 0]);
    expect(matched("ids", "tenant-c")).toEqual([0, 0, 0]);
  });

  it("the hashes it queries are the engine's salted chain, recorded as routed prefixes under that salt only", () => {
    const { prefix, pods, matched } = setup();
    const p0 = pods[0] as (typeof pods)[0];
    const b = prefix.blocks(MODEL, p0, tokens, NOW, "ids", "tenant-a");
    expect(b.hashes).toEqual(promptBlockHashes(tokens, chainSeed(MODEL, null, 16, "tenant-a"), 16));
    prefix.recordRouted(p0, b.hashes, NOW, "c1");
    expect(matched("ids", "tenant-a")).toEqual([4, 0, 0]);
    expect(matched("ids", "tenant-b")).toEqual([0, 0, 0]);
    expect(matched("ids")).toEqual([0, 0, 0]);
  });

  it("approximate: routed prefixes are salted the same way (their own hash space, per salt)", () => {
    const { prefix, pods, matched } = setup();
    const p1 = pods[1] as (typeof pods)[0];
    const a = prefix.blocks(MODEL, p1, tokens, NOW, "approximate", "tenant-a");
    expect(a.mode).toBe("approximate");
    expect(a.hashes).not.toEqual(prefix.blocks(MODEL, p1, tokens, NOW, "approximate").hashes);
    prefix.recordRouted(p1, a.hashes, NOW, "c1");
    expect(matched("approximate", "tenant-a")).toEqual([0, 4, 0]);
    expect(matched("approximate", "tenant-b")).toEqual([0, 0, 0]);
    expect(matched("approximate")).toEqual([0, 0, 0]);
    // Never an engine block either.
    expect(matched("ids", "tenant-a")).toEqual([0, 0, 0]);
  });

  it("routing: a tenant's request is routed on its salted blocks, its record keeps the salted hashes, and the engine gets the salt", () => {
    const { state, prefix } = setup();
    const TENANT = "Tn4nt0000000000A";
    // The engine holds the prompt under the tenant's salt on p2, unsalted on p0.
    storedOn(state, "p2", 1, TENANT);
    storedOn(state, "p0", 2, null);
    const sink = new MemorySink();
    const director = new Director({ gatewayId: "gw", defaultStrategy: "prefix-cache", chargeTtlMs: 60_000, state, sink, now: () => NOW, prefix });
    const body = Buffer.from(JSON.stringify({ model: MODEL, prompt: Array.from(tokens), max_tokens: 2 }));
    const route = (id: string, tenantSalt?: string) => {
      const r = director.route({ headers: { "x-request-id": id, ":path": "/v1/completions" }, body, ...(tenantSalt ? { tenantSalt } : {}) });
      if (r instanceof Promise) throw new Error("token-id prompts route synchronously");
      director.finish(r, "completed", { status: 200 });
      return r;
    };
    const tenant = route("t-1", TENANT);
    expect(tenant.pod.pod).toBe("p2");
    expect(JSON.parse((tenant.body as Buffer).toString()).cache_salt).toBe(TENANT);
    const plain = route("u-1");
    expect(plain.pod.pod).toBe("p0");
    expect(plain.body).toBeUndefined();
    const rec = sink.decisions.find((d) => d.id === "t-1");
    expect(rec?.blocks?.hashes && decodeBlockHashes(rec.blocks.hashes).map(hashToHex)).toEqual(promptBlockHashes(tokens, chainSeed(MODEL, null, 16, TENANT), 16).map(hashToHex));
  });
});
