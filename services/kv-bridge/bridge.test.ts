/**
 * The bridge between real ZMQ sockets (scripted engines, test-engine.ts) and a real nats-server:
 * what ends up in the KV stream, in what order, under which Msg-Id, and what ends up dead-lettered.
 */
import { createHash } from "node:crypto";
import type { MsgHdrs } from "@nats-io/transport-node";
import { Packr } from "msgpackr";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { KvBatch, KvPodCleared } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { streamName } from "../../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { chainSeed, hashToHex, promptBlockHashes } from "../views/block-hash.js";
import { type KvBridgeHandle, type KvBridgeOptions, startKvBridge } from "./bridge.js";
import { KvDlqHeaders } from "./dead-letters.js";
import { epochName } from "./pod-bridge.js";
import { ownsPod } from "./shard.js";
import { type EventSpec, encodeBatch, encodeEvent, TestEngine, type TestEngineOptions } from "./test-engine.js";
import { seqFrame } from "./wire.js";

type KvMessage = KvBatch | KvPodCleared;
interface StoredMsg {
  ev: KvMessage;
  msgId?: string;
  schema?: string;
}

let env: TestEnv;
let engines: TestEngine[] = [];
let bridges: KvBridgeHandle[] = [];
/** Pods published by the running test: removed afterwards so later tests' bridges ignore them. */
const pods = new Set<string>();

beforeAll(async () => {
  env = await startTestEnv();
});
afterEach(async () => {
  for (const pod of pods) await env.publishPod({ pod, address: "127.0.0.1:9", action: "remove" });
  pods.clear();
  for (const b of bridges) expect(b.stats.internalErrors).toBe(0);
  await Promise.all(bridges.map((b) => b.close()));
  await Promise.all(engines.map((e) => e.close()));
  bridges = [];
  engines = [];
});
afterAll(async () => {
  await env?.stop();
});

async function engine(o: TestEngineOptions = {}): Promise<TestEngine> {
  const e = await new TestEngine(o).start();
  engines.push(e);
  return e;
}

async function bridge(o: Partial<KvBridgeOptions> = {}): Promise<KvBridgeHandle> {
  const b = await startKvBridge({ nats: env.server.url, log: quietLog, replayTimeoutMs: 300, ...o });
  bridges.push(b);
  return b;
}

async function podFor(pod: string, e: TestEngine, extra: Record<string, unknown> = {}): Promise<void> {
  pods.add(pod);
  await env.publishPod({ pod, address: "127.0.0.1:9", kvEvents: { endpoint: e.endpoint, replayEndpoint: e.replayEndpoint, topic: e.topic }, ...extra });
}

/** Everything the KV stream holds for a pod, in stream order. */
async function readKv(pod: string): Promise<StoredMsg[]> {
  const c = await env.nats.js.consumers.get(streamName("jr", "KV"), { filter_subjects: env.subjects.kv(MODEL, pod) });
  const n = (await c.info(true)).num_pending;
  const out: StoredMsg[] = [];
  if (n === 0) return out;
  const it = await c.fetch({ max_messages: n, expires: 2_000 });
  for await (const m of it) {
    out.push({ ev: m.json<KvMessage>(), msgId: m.headers?.get("Nats-Msg-Id"), schema: m.headers?.get("Jr-Schema") });
    if (out.length >= n) break;
  }
  return out;
}

async function kvUntil(pod: string, ok: (msgs: StoredMsg[]) => boolean, timeoutMs = 5_000): Promise<StoredMsg[]> {
  let msgs: StoredMsg[] = [];
  await waitFor(async () => ok((msgs = await readKv(pod))), timeoutMs, () => `the KV stream for ${pod} to match; has ${JSON.stringify(msgs.map(brief))}`, 20);
  return msgs;
}

/** The first `n` dead letters one bridge (`consumer`) wrote for a pod, in stream order. */
async function kvLetters(pod: string, n: number, consumer: string): Promise<Array<{ data: Uint8Array; headers: MsgHdrs }>> {
  let out: Array<{ data: Uint8Array; headers: MsgHdrs }> = [];
  await waitFor(
    async () => {
      const c = await env.nats.js.consumers.get(streamName("jr", "DLQ"), { filter_subjects: env.subjects.deadLetter("kv") });
      const total = (await c.info(true)).num_pending;
      out = [];
      if (total === 0) return false;
      const it = await c.fetch({ max_messages: total, expires: 2_000 });
      let read = 0;
      for await (const m of it) {
        if (m.headers?.get(KvDlqHeaders.pod) === pod && m.headers.get(KvDlqHeaders.consumer) === consumer) out.push({ data: m.data, headers: m.headers });
        if (++read >= total) break;
      }
      return out.length >= n;
    },
    5_000,
    () => `${n} dead letters for ${pod} (${out.length} so far)`,
    50,
  );
  return out.slice(0, n);
}

async function kvHas(pod: string, seq: number): Promise<boolean> {
  return batches(await readKv(pod)).some((x) => x.seq === seq);
}

const brief = (m: StoredMsg) => (m.ev.type === "kv" ? `${m.ev.epoch}:${m.ev.seq}` : `cleared(${m.ev.reason})`);
const batches = (msgs: StoredMsg[]) => msgs.filter((m) => m.ev.type === "kv").map((m) => m.ev as KvBatch);
const lastSeq = (b: KvBridgeHandle, pod: string) => b.pods().find((p) => p.pod === pod)?.lastSeq;

let tokenBase = 10_000;
/** A BlockStored of `n` fresh root blocks (unique tokens so every test's hashes differ). */
function freshStored(n = 1, blockSize = 4): EventSpec {
  const tokens = Array.from({ length: n * blockSize }, () => tokenBase++);
  return { type: "BlockStored", hashes: Array.from({ length: n }, () => BigInt(tokenBase++)), parent: null, tokens, blockSize };
}

/** Publishes until a batch reaches the bridge live (no replay needed): the SUB is subscribed. */
async function warm(b: KvBridgeHandle, pod: string, e: TestEngine): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const replays = b.stats.replays;
    await e.publish([freshStored()]);
    try {
      await waitFor(() => lastSeq(b, pod) === e.seq - 1, 300);
    } catch {
      continue;
    }
    if (b.stats.replays === replays) return;
  }
  throw new Error(`bridge never received ${pod}'s batches live`);
}

describe("kv-bridge - engines to the KV stream", () => {
  it("map and array encodings, replayed at connect then live: contiguous KvBatches with the gateway's router hashes", async () => {
    const tokens = Array.from({ length: 64 }, (_, i) => 500 + i);
    const events: EventSpec[][] = [
      [{ type: "BlockStored", hashes: [0xfedcba9876543210n, 2n], parent: null, tokens: tokens.slice(0, 32), blockSize: 16 }],
      [{ type: "BlockStored", hashes: [3n, -5n], parent: 2n, tokens: tokens.slice(32), blockSize: 16, medium: null }],
      [{ type: "BlockRemoved", hashes: [3n, -5n] }],
      [{ type: "AllBlocksCleared" }],
    ];
    const setups = [
      { pod: "enc-map", o: { form: "map", layout: "new" } },
      { pod: "enc-array", o: { form: "array", layout: "old-delimited", dpRank: "absent" } },
    ] as const;
    const es: TestEngine[] = [];
    for (const s of setups) {
      const e = await engine(s.o);
      es.push(e);
      await podFor(s.pod, e);
      // Sent before any bridge exists: only the replay at connect can deliver these.
      for (const ev of events.slice(0, 2)) await e.publish(ev);
    }
    const b = await bridge();
    for (const [i, s] of setups.entries()) {
      await waitFor(() => lastSeq(b, s.pod) === 1, 3_000, "replayed batches");
      for (const ev of events.slice(2)) await (es[i] as TestEngine).publish(ev);
    }
    const prompt = promptBlockHashes(tokens, chainSeed(MODEL, null, 16), 16).map(hashToHex);
    for (const [i, s] of setups.entries()) {
      const msgs = await kvUntil(s.pod, (m) => m.length >= 4);
      const e = es[i] as TestEngine;
      const epoch = epochName(0, (e.buffer[0] as { seq: number }) && firstTs(e) * 1000);
      expect(msgs.map((m) => m.msgId)).toEqual([0, 1, 2, 3].map((q) => `${s.pod}:${epoch}:${q}`));
      expect(msgs.every((m) => m.schema === "kv/1" && checkEvent("kv", m.ev).ok)).toBe(true);
      const [b0, b1, b2, b3] = batches(msgs) as [KvBatch, KvBatch, KvBatch, KvBatch];
      expect(b0).toMatchObject({ model: MODEL, pod: s.pod, epoch, seq: 0, ts: firstTs(e) * 1000 });
      expect(b0.dpRank).toBe(s.o.form === "map" ? 0 : undefined);
      expect(b0.events).toEqual([
        { kind: "stored", engineHashes: ["fedcba9876543210", "2"], routerHashes: prompt.slice(0, 2), parentEngineHash: null, blockSize: 16, medium: "GPU", lora: null },
      ]);
      expect(b1.events).toEqual([
        { kind: "stored", engineHashes: ["3", "fffffffffffffffb"], routerHashes: prompt.slice(2), parentEngineHash: "2", blockSize: 16, medium: null, lora: null },
      ]);
      expect(b2.events).toEqual([{ kind: "removed", engineHashes: ["3", "fffffffffffffffb"], medium: "GPU" }]);
      expect(b3.events).toEqual([{ kind: "all-cleared" }]);
    }
    expect(b.stats).toMatchObject({ batches: 8, blocksStored: 8, blocksRemoved: 4, allCleared: 2, unknownParents: 0, malformed: 0 });
  });

  it("a gap is repaired through replay: the published batches stay contiguous, no kv-cleared", async () => {
    const e = await engine({ layout: "old" });
    await podFor("gap", e);
    const b = await bridge();
    await warm(b, "gap", e);
    const anchor = e.seq - 1;
    for (let i = 0; i < 3; i++) await e.publish([freshStored()], { live: false });
    await e.publish([freshStored(2)]);
    const msgs = await kvUntil("gap", (m) => m.length >= e.seq);
    expect(batches(msgs).map((x) => x.seq)).toEqual(Array.from({ length: e.seq }, (_, i) => i));
    expect(msgs.some((m) => m.ev.type === "kv-cleared")).toBe(false);
    expect(e.replayRequests).toContain(anchor);
    expect(b.stats.gaps).toBeGreaterThanOrEqual(1);
    expect(b.stats.gapsRepaired).toBeGreaterThanOrEqual(1);
  });

  it("slow joiner: a batch the SUB misses while joining a pod that then goes quiet is fetched by the replay after joining", async () => {
    const e = await engine();
    await podFor("joiner", e);
    const b = await bridge();
    // The moment the SUB's session is up (its subscription not yet in effect), the engine publishes
    // one batch the SUB does not get (buffered only), and then nothing more: no later event reveals the gap.
    // After the start-up replay (state live), so that only the post-join replay can find the batch.
    await waitFor(() => {
      const p = b.pods().find((x) => x.pod === "joiner");
      return p?.connected === true && p.state === "live";
    }, 5_000, "the SUB's handshake and the start-up replay");
    expect(b.pods().find((p) => p.pod === "joiner")?.settled).toBe(false);
    const replays = b.stats.replays;
    const seq = await e.publish([freshStored(2)], { live: false });
    const msgs = await kvUntil("joiner", (m) => batches(m).some((x) => x.seq === seq));
    expect(batches(msgs).map((x) => x.seq)).toEqual([seq]);
    expect(b.stats.replays).toBeGreaterThan(replays);
    await waitFor(() => b.pods().find((p) => p.pod === "joiner")?.settled === true, 5_000, "settled after the post-join replay");
  });

  it("gaps replay cannot cover publish kv-cleared: buffer rolled, replay hung, no replay endpoint", async () => {
    const rolled = await engine({ layout: "new-delimited" });
    const hung = await engine();
    const noReplay = await engine({ replay: false });
    await podFor("rolled", rolled);
    await podFor("hung", hung);
    await podFor("no-replay", noReplay);
    const b = await bridge({ replayTimeoutMs: 200 });
    await Promise.all([warm(b, "rolled", rolled), warm(b, "hung", hung), warm(b, "no-replay", noReplay)]);
    const before = { rolled: rolled.seq, hung: hung.seq, noReplay: noReplay.seq };
    for (const e of [rolled, hung, noReplay]) for (let i = 0; i < 5; i++) await e.publish([freshStored()], { live: false });
    rolled.forgetBefore(before.rolled + 3);
    hung.replayMuted = true;
    for (const e of [rolled, hung, noReplay]) await e.publish([freshStored()]);

    const tail = (msgs: StoredMsg[], from: number) => msgs.slice(msgs.findIndex((m) => m.ev.type === "kv" && m.ev.seq === from - 1)).map(brief).map((x) => x.replace(/^.*:/, ""));
    const r = await kvUntil("rolled", (m) => batches(m).at(-1)?.seq === rolled.seq - 1);
    expect(tail(r, before.rolled)).toEqual([`${before.rolled - 1}`, "cleared(gap-unrepairable)", ...[3, 4, 5].map((k) => `${before.rolled + k}`)]);
    const h = await kvUntil("hung", (m) => batches(m).at(-1)?.seq === hung.seq - 1);
    expect(tail(h, before.hung)).toEqual([`${before.hung - 1}`, "cleared(replay-unavailable)", `${before.hung + 5}`]);
    const n = await kvUntil("no-replay", (m) => batches(m).at(-1)?.seq === noReplay.seq - 1);
    expect(tail(n, before.noReplay)).toEqual([`${before.noReplay - 1}`, "cleared(replay-unavailable)", `${before.noReplay + 5}`]);
    // A kept epoch: the gap does not make a new incarnation.
    for (const msgs of [r, h, n]) expect(new Set(batches(msgs).map((x) => x.epoch)).size).toBe(1);
    expect(b.stats.replayFailures).toBeGreaterThanOrEqual(1);
  });

  it("an engine restart starts a new epoch after kv-cleared(engine-restart), also across a process restart on the same ports", async () => {
    const e = await engine();
    await podFor("restart", e);
    const b = await bridge();
    await warm(b, "restart", e);
    await e.publish([freshStored()]);
    const epoch1 = b.pods().find((p) => p.pod === "restart")?.epoch;
    // Same sockets, sequence back to 0 (an engine that restarted faster than the SUB noticed).
    e.restart();
    for (let i = 0; i < 3; i++) await e.publish([freshStored()]);
    const epoch2 = epochName(0, firstTs(e) * 1000);
    const msgs = await kvUntil("restart", (m) => m.some((x) => x.ev.type === "kv" && x.ev.epoch === epoch2 && x.ev.seq === 2));
    const i = msgs.findIndex((m) => m.ev.type === "kv-cleared");
    expect(msgs[i]?.ev).toMatchObject({ type: "kv-cleared", reason: "engine-restart", epoch: epoch2 });
    expect(msgs.slice(0, i).every((m) => m.ev.type === "kv" && m.ev.epoch === epoch1)).toBe(true);
    expect(msgs.slice(i + 1).map(brief)).toEqual([0, 1, 2].map((q) => `${epoch2}:${q}`));
    expect(epoch2).not.toBe(epoch1);

    // The process dies and a new one binds the same ports: the SUB reconnects (with backoff), the
    // bridge finds an engine with nothing buffered and clears the pod before any new event.
    const at = { endpoint: e.endpoint, replayEndpoint: e.replayEndpoint };
    await e.close();
    engines = engines.filter((x) => x !== e);
    const cleared = b.stats.cleared["engine-restart"];
    await waitFor(() => b.pods().find((p) => p.pod === "restart")?.connected === false, 5_000, "the bridge to see the engine gone");
    const e2 = new TestEngine();
    engines.push(e2);
    await e2.start(at);
    await waitFor(() => b.stats.cleared["engine-restart"] === cleared + 1, 5_000, "clear after the engine came back");
    expect((await readKv("restart")).at(-1)?.ev).toMatchObject({ type: "kv-cleared", reason: "engine-restart", epoch: epoch2 });
    for (let k = 0; k < 3; k++) await e2.publish([freshStored()]);
    const epoch3 = epochName(0, firstTs(e2) * 1000);
    const after = await kvUntil("restart", (m) => m.some((x) => x.ev.type === "kv" && x.ev.epoch === epoch3 && x.ev.seq === 2));
    expect(after.slice(after.findLastIndex((m) => m.ev.type === "kv-cleared") + 1).map(brief)).toEqual([0, 1, 2].map((q) => `${epoch3}:${q}`));
    expect(b.stats.disconnects).toBeGreaterThanOrEqual(1);
  });

  it("two bridges on one pod store each batch once; a restarted bridge resumes without republishing", async () => {
    const e = await engine();
    await podFor("twins", e);
    for (let i = 0; i < 20; i++) await e.publish([freshStored(2)], { live: false });
    const [b1, b2] = await Promise.all([bridge({ name: "twin-1" }), bridge({ name: "twin-2" })]);
    for (let i = 0; i < 200; i++) {
      await e.publish([freshStored(2)]);
      // Pacing, not a wait: a short pause every 20 batches keeps the two bridges reading (and
      // racing for the same batches) while the engine publishes; no condition stands for that.
      if (i % 20 === 0) await new Promise((r) => setTimeout(r, 2));
    }
    await waitFor(() => lastSeq(b1, "twins") === 219 && lastSeq(b2, "twins") === 219, 5_000, "both bridges at the head");
    await Promise.all([b1, b2].map(async (b) => waitFor(() => b.stats.acked >= b.stats.batches, 3_000, "acks")));
    const msgs = await kvUntil("twins", (m) => m.length >= 220);
    expect(batches(msgs).map((x) => x.seq)).toEqual(Array.from({ length: 220 }, (_, i) => i));
    expect(b1.stats.duplicates + b2.stats.duplicates).toBeGreaterThan(0);
    expect(b1.stats.batches + b2.stats.batches - (b1.stats.duplicates + b2.stats.duplicates)).toBe(220);

    await b1.close();
    bridges = bridges.filter((x) => x !== b1);
    await b2.close();
    bridges = bridges.filter((x) => x !== b2);
    const b3 = await bridge({ name: "twin-3" });
    await waitFor(() => lastSeq(b3, "twins") === 219, 3_000, "restarted bridge caught up");
    expect(b3.stats.batches).toBe(0); // everything up to the stream's last batch is only re-learned
    await e.publish([freshStored()]);
    const later = await kvUntil("twins", (m) => m.length >= 221);
    expect(later).toHaveLength(221);
    expect(later.at(-1)?.msgId).toBe(`twins:${epochName(0, firstTs(e) * 1000)}:220`);
  });

  it("malformed frames are counted and dead-lettered; the bridge keeps publishing good batches", async () => {
    const e = await engine();
    await podFor("bad", e);
    const b = await bridge();
    await warm(b, "bad", e);
    const good = e.seq - 1;
    const topic = Buffer.from(e.topic);
    await e.sendRaw([topic, seqFrame(good + 1)]);
    await e.sendRaw([topic, Buffer.alloc(7), Buffer.from([0x90])]);
    await e.publishPayload(Buffer.from("this is not msgpack"));
    await e.publishPayload(new Packr({ useRecords: false }).pack(["yesterday", []]));
    await e.publishPayload(Buffer.alloc(10 * 1024 * 1024, 0x91));
    const bad: unknown[] = [encodeEvent(freshStored(), "map"), ["BlockStored", [1n], null, [1, 2, 3], 2], ["BlockEvicted", [1n]]];
    await e.publishPayload(encodeBatch(e.ts, bad));
    await waitFor(() => lastSeq(b, "bad") === good + 4, 5_000, "bridge past the bad batches");
    // Beyond libzmq's limit (4 x --max-frame-bytes) the engine's session is dropped: the bridge
    // must notice and resubscribe.
    await e.sendRaw([topic, seqFrame(good + 5), Buffer.alloc(20 * 1024 * 1024)]);
    await waitFor(() => b.stats.socketsRecreated >= 1, 3_000, "SUB recreated");
    await e.publish([freshStored()]);
    await e.publish([freshStored()]);
    // A fresh SUB can miss what is published before its subscription registers (ZMQ's slow
    // joiner; likelier on a loaded machine). A real engine keeps publishing, and the next batch
    // reveals the gap, which replay repairs: do the same until the stream has both batches.
    await waitFor(
      async () => {
        if (await kvHas("bad", good + 6)) return true;
        await e.publish([freshStored()]);
        return false;
      },
      10_000,
      `batch ${good + 6} in the KV stream`,
      300,
    );

    const msgs = await kvUntil("bad", (m) => batches(m).some((x) => x.seq === good + 6));
    const seqs = batches(msgs).map((x) => x.seq);
    for (const want of [good + 4, good + 5, good + 6]) expect(seqs).toContain(want);
    expect(new Set(seqs).size).toBe(seqs.length);
    expect(msgs.some((m) => m.ev.type === "kv-cleared")).toBe(false);
    expect(batches(msgs).find((x) => x.seq === good + 4)?.events).toHaveLength(1);
    expect(b.stats).toMatchObject({ malformed: 5, oversize: 1, invalidEvents: 1, unknownEvents: 1, deadLetters: 6 });

    const dlq = await env.nats.js.consumers.get(streamName("jr", "DLQ"), { filter_subjects: env.subjects.deadLetter("kv") });
    const letters: Array<{ reason: string; pod?: string; size: string | undefined; body: number; payload?: string; seq?: string }> = [];
    await waitFor(() => b.stats.deadLetters === 6, 1_000);
    const it = await dlq.fetch({ max_messages: 6, expires: 2_000 });
    for await (const m of it) {
      letters.push({
        reason: m.headers?.get(KvDlqHeaders.reason) ?? "",
        pod: m.headers?.get(KvDlqHeaders.pod),
        size: m.headers?.get(KvDlqHeaders.size),
        body: m.data.length,
        payload: m.headers?.get(KvDlqHeaders.payload),
        seq: m.headers?.get(KvDlqHeaders.engineSeq) || undefined,
      });
      if (letters.length === 6) break;
    }
    expect(letters.every((l) => l.pod === "bad")).toBe(true);
    expect(letters.map((l) => l.reason.replace(/:.*/, ""))).toEqual([
      "live message has 2 frames, expected 3",
      "sequence frame is 7 bytes, expected 8",
      "msgpack",
      "EventBatch ts is not a timestamp",
      "payload of 10485760 bytes exceeds the 4194304-byte limit",
      "invalid events skipped",
    ]);
    // By default the envelope only: sizes, no payload byte.
    expect(letters.every((l) => l.body === 0 && l.payload === "omitted")).toBe(true);
    expect(letters[2]).toMatchObject({ size: String("this is not msgpack".length), seq: String(good + 1) });
    expect(letters[4]).toMatchObject({ size: String(10 * 1024 * 1024) });
  });

  it("a malformed batch's prompt token ids never reach the DLQ by default; --dlq-payloads keeps the batch, bounded", async () => {
    // Token ids no other test uses: a BlockStored with one id too many for its block (an invalid
    // event: the batch is dead-lettered), and a batch whose timestamp is not one (undecodable).
    const ids = [912_345_671, 912_345_672, 912_345_673, 912_345_674, 912_345_675];
    const stored = (tokens: number[]) => encodeEvent({ type: "BlockStored", hashes: [BigInt(tokenBase++)], parent: null, tokens, blockSize: 4 }, "map");
    const payloads = (e: TestEngine) => [encodeBatch(e.ts, [stored(ids)]), new Packr({ useRecords: false }).pack(["yesterday", [stored(ids.slice(0, 4))]])];
    const digest = (b: Uint8Array) => createHash("sha256").update(b).digest("hex").slice(0, 16);
    const run = async (pod: string, o: Partial<KvBridgeOptions>) => {
      const e = await engine();
      await podFor(pod, e);
      // Every bridge still running would bridge every pod, and the first bridge's letter of a
      // batch is the only one the DLQ keeps (its Msg-Id names the batch): each run closes its own.
      const b = await bridge({ name: `bridge-${pod}`, ...o });
      await warm(b, pod, e);
      const sent = payloads(e);
      for (const p of sent) await e.publishPayload(p);
      await waitFor(() => b.stats.deadLetters === 2, 5_000, `${pod}: two dead letters`);
      const letters = await kvLetters(pod, 2, `bridge-${pod}`);
      await b.close();
      // Out of the next bridge's way (it would bridge this pod too).
      await env.publishPod({ pod, address: "127.0.0.1:9", action: "remove" });
      pods.delete(pod);
      return { sent, letters };
    };

    const off = await run("tok-default", {});
    expect(off.letters.map((l) => l.headers.get(KvDlqHeaders.reason).replace(/:.*/, ""))).toEqual(["invalid events skipped", "EventBatch ts is not a timestamp"]);
    for (const [i, l] of off.letters.entries()) {
      const p = off.sent[i] as Buffer;
      expect(l.data).toHaveLength(0);
      expect(l.headers.get(KvDlqHeaders.payload)).toBe("omitted");
      expect(l.headers.get(KvDlqHeaders.type)).toBe("EventBatch");
      expect(l.headers.get(KvDlqHeaders.size)).toBe(String(p.length));
      expect(l.headers.get(KvDlqHeaders.digest)).toBe(digest(p));
      // Not a token id anywhere: no body, and no header names one.
      const text = [...l.headers.keys()].map((k) => `${k}: ${l.headers.get(k)}`).join("\n");
      for (const id of ids) expect(text).not.toContain(String(id));
    }

    const limit = 64;
    const on = await run("tok-kept", { deadLetters: { policy: { keepPayloads: true, maxPayloadBytes: 1024 } } });
    const small = await run("tok-bounded", { deadLetters: { policy: { keepPayloads: true, maxPayloadBytes: limit } } });
    for (const [i, l] of on.letters.entries()) {
      const p = on.sent[i] as Buffer;
      expect(l.headers.get(KvDlqHeaders.payload)).toBe("whole");
      expect(Buffer.compare(Buffer.from(l.data), p)).toBe(0);
      expect(l.headers.get(KvDlqHeaders.digest)).toBe(digest(p));
    }
    // The ids as msgpack writes them (uint32: 0xce, big-endian): there in the kept batch.
    const packed = (id: number) => Buffer.from([0xce, id >>> 24, (id >>> 16) & 0xff, (id >>> 8) & 0xff, id & 0xff]);
    for (const id of ids) expect(Buffer.from(on.letters[0]?.data ?? []).includes(packed(id))).toBe(true);
    for (const [i, l] of small.letters.entries()) {
      const p = small.sent[i] as Buffer;
      expect(l.headers.get(KvDlqHeaders.payload)).toBe("prefix");
      expect(Buffer.compare(Buffer.from(l.data), p.subarray(0, limit))).toBe(0);
      expect(l.headers.get(KvDlqHeaders.size)).toBe(String(p.length));
    }
  });

  it("shards pods across replicas and follows pod changes: not ready, new endpoint, removal", async () => {
    const e1 = await engine();
    const e2 = await engine();
    const names = Array.from({ length: 8 }, (_, i) => `shard-pod-${i}`);
    for (const p of names) await podFor(p, e1);
    const shards = [0, 1].map((i) => ({ index: i, count: 2 }));
    const [s0, s1] = await Promise.all(shards.map((shard) => bridge({ shard })));
    const owned = (b: KvBridgeHandle) => b.pods().map((p) => p.pod).sort();
    await waitFor(() => owned(s0 as KvBridgeHandle).length + owned(s1 as KvBridgeHandle).length === 8, 3_000, "pods bridged");
    expect(owned(s0 as KvBridgeHandle)).toEqual(names.filter((p) => ownsPod({ index: 0, count: 2 }, p)).sort());
    expect(owned(s1 as KvBridgeHandle)).toEqual(names.filter((p) => ownsPod({ index: 1, count: 2 }, p)).sort());

    const pod = names.find((p) => ownsPod({ index: 0, count: 2 }, p)) as string;
    const b = s0 as KvBridgeHandle;
    const has = () => b.pods().find((p) => p.pod === pod);
    await podFor(pod, e1, { ready: false });
    await waitFor(() => !has(), 2_000, "not-ready pod dropped");
    await podFor(pod, e2);
    await waitFor(() => has()?.endpoint === e2.endpoint, 2_000, "new endpoint");
    await warm(b, pod, e2);
    await env.publishPod({ pod, address: "127.0.0.1:9" });
    await waitFor(() => !has(), 2_000, "pod without kvEvents dropped");
    await podFor(pod, e2);
    await waitFor(() => !!has(), 2_000, "back");
    await env.publishPod({ pod, address: "127.0.0.1:9", action: "remove" });
    await waitFor(() => !has(), 2_000, "removed pod dropped");
    expect(b.stats.pods).toBe(owned(b).length);
  });
});

function firstTs(e: TestEngine): number {
  const first = e.buffer[0];
  if (!first) throw new Error("engine has no batches");
  const decoded = new Packr({ useRecords: false }).unpack(first.payload) as [number];
  return decoded[0];
}
