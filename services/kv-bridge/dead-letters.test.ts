/**
 * The kv-bridge's dead letters on a real nats-server: a bad engine batch read again (a restarted
 * bridge replays the engine from its last published batch) adds no second entry; a different batch
 * under the same engine sequence (the engine restarted) does; so does every letter without one.
 */
import { createHash } from "node:crypto";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { waitFor } from "../../test/harness/wait.js";
import { startTestEnv, type TestEnv } from "../../test/harness/env.js";
import { DeadLetterLog } from "../shared/dead-letter.js";
import type { NatsHandles } from "../shared/nats.js";
import { type KvDeadLetter, KvDeadLetters, KvDlqHeaders } from "./dead-letters.js";

let env: TestEnv;
let nats: NatsHandles;
const dlq = streamName("jr", "DLQ");

beforeAll(async () => {
  env = await startTestEnv();
  nats = env.nats;
});
afterAll(async () => env?.stop());

const entries = async () => (await nats.jsm.streams.info(dlq)).state.messages;

describe("kv-bridge dead letters - one entry per engine batch", () => {
  it("the same bad batch read again adds none; another batch under the same seq, or one without a seq, adds one", async () => {
    const counters = { deadLetters: 0, deadLetterErrors: 0 };
    const silent = pino({ level: "silent" });
    const letters = new KvDeadLetters(counters, nats.js, new Subjects(), "bridge", silent, () => 1 << 20, { log: new DeadLetterLog() });
    const batch = (bytes: string, engineSeq?: number): KvDeadLetter => ({
      model: "org/m", pod: "p0", endpoint: "tcp://p0:5557", source: "replay", reason: "undecodable payload",
      frames: [Buffer.from(bytes)], type: "EventBatch", ...(engineSeq !== undefined ? { engineSeq } : {}),
    });
    // Publishes from one connection are stored in order: once a last marker letter is in, every
    // letter sent before it has been stored or dropped.
    const settled = async (marker: string) => {
      const want = createHash("sha256").update(marker).digest("hex").slice(0, 16);
      await waitFor(async () => (await nats.jsm.streams.getMessage(dlq, { last_by_subj: "jr.dlq.kv" }).catch(() => null))?.header.get(KvDlqHeaders.digest) === want, 10_000, `the marker ${marker} stored`, 20);
    };
    letters.send(batch("garbage", 7));
    letters.send(batch("garbage", 7)); // the restarted bridge's replay reads it again
    letters.send(batch("marker 1", 100));
    await settled("marker 1");
    expect(await entries()).toBe(2);

    letters.send(batch("other garbage", 7)); // the engine restarted: seq 7 is another batch
    letters.send(batch("envelope without a seq"));
    letters.send(batch("envelope without a seq")); // no seq: nothing says it is the same message
    letters.send(batch("marker 2", 101));
    await settled("marker 2");
    expect(await entries()).toBe(6);
    expect(counters).toEqual({ deadLetters: 7, deadLetterErrors: 0 });
  });
});
