/**
 * Routed prefixes in precise mode carry only what the engine index did not already show: after a
 * decision the gateway publishes the blocks past the picked pod's index match, and matching
 * continues a pod's index run with them. A later turn of a long conversation therefore publishes
 * and folds the blocks the turn adds, not the conversation again, and still counts them at once.
 */
import { describe, expect, it } from "vitest";
import type { KvBatch, KvRouted, KvStored } from "../../schemas/events.js";
import { Subjects } from "../../streams/subjects.js";
import { BlockMap } from "../kv-bridge/block-map.js";
import { MODEL, stateWithPods } from "../routing/stages/testing.js";
import type { Outbox } from "../shared/publish.js";
import { chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
import type { GatewayState } from "../views/gateway-state.js";
import { createPrefixSupport } from "./prefix-support.js";
import type { Tokenizer } from "./tokenization.js";

const NOW = 1_700_000_000_000;
const prompt = Uint32Array.from({ length: 6 * 16 + 5 }, (_, i) => 3_000 + i);

/** The engine on `pod` stored the prompt's first 4 blocks (as the kv-bridge publishes it). */
function stored4(state: GatewayState, pod: string, seq: number): void {
  const ev: KvStored = new BlockMap(MODEL).stored({
    kind: "stored", hashes: ["a", "b", "c", "d"].map((h) => `${h}${seq}`), parent: null, tokens: Array.from(prompt.subarray(0, 64)), blockSize: 16, loraId: null, loraName: null, medium: "GPU",
  });
  const batch: KvBatch = { type: "kv", model: MODEL, pod, epoch: "e", seq, ts: NOW, events: [ev] };
  state.apply(batch, { stream: "kv", subject: `kv.${pod}`, seq, serverTs: NOW });
}

describe("routed prefixes past the engine index (precise)", () => {
  it("publishes only the blocks past the picked pod's index match, and matching continues the index run with them", () => {
    const state = stateWithPods(3, "gw");
    const fired: KvRouted[] = [];
    const outbox = { fire: (_s: string, ev: unknown) => void fired.push(ev as KvRouted) } as unknown as Outbox;
    const tokenizer = { tokenize: () => Promise.reject(new Error("ids only")) } as unknown as Tokenizer;
    const prefix = createPrefixSupport({ gatewayId: "gw", state, tokenizer, subjects: new Subjects(), outbox });
    const pods = state.pods.readyPods(MODEL);
    const [p0, p1] = pods;
    stored4(state, p0?.pod as string, 1);
    const all = promptBlockHashes(prompt, chainSeed(MODEL, null, 16), 16);
    const m1 = prefix.match(MODEL, pods, prompt, NOW, "ids");
    expect(m1.hashes).toEqual(all);
    expect(pods.map((p) => m1.info.matched(p.pod))).toEqual([4, 0, 0]);

    // Picked p0: its engine holds blocks 0-3, so blocks 4 and 5 are published.
    prefix.recordRouted(p0 as never, m1.hashes, NOW, "c1");
    expect(fired.map((e) => e.hashes)).toEqual([all.slice(4).map(hashToHex)]);
    const m2 = prefix.match(MODEL, pods, prompt, NOW + 1, "ids");
    expect(pods.map((p) => m2.info.matched(p.pod))).toEqual([6, 0, 0]);
    expect(m2.detail[0]).toMatchObject({ indexBlocks: 4, routedBlocks: 6 });

    // Picked p1, whose engine holds nothing: the whole prompt is published.
    prefix.recordRouted(p1 as never, m2.hashes, NOW + 1, "c2");
    expect(fired[1]?.hashes).toEqual(all.map(hashToHex));
    const m3 = prefix.match(MODEL, pods, prompt, NOW + 2, "ids");
    expect(pods.map((p) => m3.info.matched(p.pod))).toEqual([6, 6, 0]);

    // Past the precise age limit the continuation no longer counts: back to the index's 4.
    const late = prefix.match(MODEL, pods, prompt, NOW + 60_000, "ids");
    expect(pods.map((p) => late.info.matched(p.pod))).toEqual([4, 0, 0]);
  });
});
