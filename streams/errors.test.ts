import { JetStreamApiError, StorageType } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNats, type NatsHandles } from "../services/shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../services/shared/nats-server.js";
import { ApiErrorCode, currentSubjectSequence, isConsumerNotFound, isStreamNotFound, isWrongLastSequence } from "./errors.js";

const PREDICATES = { isStreamNotFound, isConsumerNotFound, isWrongLastSequence };
type Predicate = keyof typeof PREDICATES;

/** What `p` rejects with (fails the test if it resolves). */
async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    (v) => expect.fail(`expected a rejection, got ${JSON.stringify(v)}`),
    (err: unknown) => err,
  );
}

/** The predicates `err` satisfies: exactly one for every failure provoked below. */
const matching = (err: unknown): Predicate[] => (Object.keys(PREDICATES) as Predicate[]).filter((k) => PREDICATES[k](err));

describe("JetStream error predicates - provoked on nats-server 2.9", () => {
  let server: NatsServerHandle;
  let h: NatsHandles;
  beforeAll(async () => {
    server = await startNatsServer();
    h = await connectNats(server.url);
    await h.jsm.streams.add({ name: "ERRS", subjects: ["errs.>"], storage: StorageType.File });
  });
  afterAll(async () => {
    await h?.nc.close();
    await server?.stop();
  });

  it("stream not found (10059): info on a missing stream, a consumer of a missing stream", async () => {
    for (const err of [await rejection(h.jsm.streams.info("NO_SUCH_STREAM")), await rejection(h.jsm.consumers.info("NO_SUCH_STREAM", "c"))]) {
      expect(err).toBeInstanceOf(JetStreamApiError);
      expect((err as JetStreamApiError).code).toBe(ApiErrorCode.StreamNotFound);
      expect(matching(err)).toEqual(["isStreamNotFound"]);
    }
  });

  it("consumer not found (10014): info on a missing consumer of an existing stream", async () => {
    const err = await rejection(h.jsm.consumers.info("ERRS", "no-such-consumer"));
    expect((err as JetStreamApiError).code).toBe(ApiErrorCode.ConsumerNotFound);
    expect(matching(err)).toEqual(["isConsumerNotFound"]);
  });

  it("wrong last sequence (10071): a stale expected-last-subject-sequence publish names the subject's sequence", async () => {
    await h.js.publish("errs.a", "1");
    const { seq } = await h.js.publish("errs.a", "2");
    const err = await rejection(h.js.publish("errs.a", "3", { expect: { lastSubjectSequence: seq - 1 } }));
    expect((err as JetStreamApiError).code).toBe(ApiErrorCode.StreamWrongLastSequence);
    expect(matching(err)).toEqual(["isWrongLastSequence"]);
    expect(currentSubjectSequence(err)).toBe(seq);
    // Expecting 0 means "nothing on the subject yet": refused the same way, naming the sequence.
    expect(currentSubjectSequence(await rejection(h.js.publish("errs.a", "4", { expect: { lastSubjectSequence: 0 } })))).toBe(seq);
  });

  it("wrong last sequence (10071) from KV: create over a live key, update or delete against a stale revision", async () => {
    const kv = await new Kvm(h.js).create("errs-kv", { history: 1, storage: StorageType.File });
    const first = await kv.create("k", "v1");
    const second = await kv.update("k", "v2", first);
    const refusals = [await rejection(kv.create("k", "v3")), await rejection(kv.update("k", "v3", first)), await rejection(kv.delete("k", { previousSeq: first }))];
    for (const err of refusals) {
      expect(matching(err)).toEqual(["isWrongLastSequence"]);
      expect(currentSubjectSequence(err)).toBe(second);
    }
  });

  it("no message found (10037) never reaches the predicates: the client resolves a get as null", async () => {
    expect(await h.jsm.streams.getMessage("ERRS", { last_by_subj: "errs.nothing-here" })).toBeNull();
    expect(await h.jsm.streams.getMessage("ERRS", { seq: 999_999 })).toBeNull();
  });

  it("other failures match none, and neither does a lookalike message", async () => {
    const otherApiError = await rejection(h.jsm.streams.add({ name: "ERRS2", subjects: ["errs.>"], storage: StorageType.File }));
    expect(otherApiError).toBeInstanceOf(JetStreamApiError);
    expect(matching(otherApiError)).toEqual([]);
    expect(currentSubjectSequence(otherApiError)).toBeUndefined();
    const lookalikes = [new Error("wrong last sequence: 5"), new Error("stream not found"), new Error("consumer not found"), undefined, "wrong last sequence"];
    for (const err of lookalikes) {
      expect(matching(err)).toEqual([]);
      expect(currentSubjectSequence(err)).toBeUndefined();
    }
  });
});
