/**
 * Strict mode's committer on a real nats-server: the compare-and-set, the server's refusals and
 * the cursor's answer to them, and what a lost race leaves behind (the routed-prefix history).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ChargeEvent, KvRouted } from "../../schemas/events.js";
import { applyStreams } from "../../streams/apply.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { Director, type RoutedRequest, type RouteInput } from "../routing/director.js";
import { chatBody, MemorySink, MODEL, stateWithPods } from "../routing/stages/testing.js";
import { acked, Outbox } from "../shared/publish.js";
import type { GatewayState } from "../views/gateway-state.js";
import { createPrefixSupport } from "./prefix-support.js";
import { StrictCommitter } from "./strict-commit.js";
import { type SubjectCursor, SubjectCursors } from "./subject-cursor.js";
import type { Tokenizer } from "./tokenization.js";

const SELF = "gw-a";
const PEER = "gw-b";

let env: TestEnv;
beforeAll(async () => {
  env = await startTestEnv();
});
afterAll(async () => env?.stop());

function strictDirector(state: GatewayState, extra: Partial<ConstructorParameters<typeof Director>[0]> = {}) {
  return new Director({ gatewayId: SELF, defaultStrategy: "least-request", chargeTtlMs: 60_000, state, sink: new MemorySink(), strictFor: () => true, consistency: "strict", ...extra });
}

const peerCharge = (pod: string, id: string): ChargeEvent => ({ type: "charge", id, gateway: PEER, model: MODEL, pod, ts: Date.now(), ttlMs: 60_000, promptTokens: 10 });

describe("strict commit - the cursor follows the server when a pod's charges left the stream", () => {
  it("after the pod's last charge aged out (max_age), the next strict commit wins on its second try, without falling back", async () => {
    // A namespace of its own whose CHARGES stream keeps messages for 1 s.
    const prefix = "aged";
    const subjects = new Subjects(prefix);
    await applyStreams(env.nats.nc, env.nats.jsm, { prefix });
    const stream = streamName(prefix, "CHARGES");
    const { config } = await env.nats.jsm.streams.info(stream);
    await env.nats.jsm.streams.update(stream, { ...config, max_age: 1_000_000_000, duplicate_window: 1_000_000_000 });

    const state = stateWithPods(1, SELF);
    const director = strictDirector(state);
    const cursors = new SubjectCursors();
    const strict = new StrictCommitter({ js: env.nats.js, subjects, cursor: cursors });
    director.useStrictCommitter(strict);
    const input = (id: string): RouteInput => ({ headers: { "x-request-id": id }, body: chatBody(MODEL) });
    const subject = subjects.charges(MODEL, "p0");

    const first = await director.route(input("r1"));
    expect(strict.stats).toMatchObject({ committed: 1, conflicts: 0, fallbacks: 0 });
    const onStream = await env.nats.jsm.streams.getMessage(stream, { last_by_subj: subject });
    expect(onStream?.json<ChargeEvent>().id).toBe(first.chargeId);
    // The follower's echo of our own charge: the view now starts at that sequence.
    cursors.seen(subject, onStream?.seq as number);
    expect(cursors.lastSeq(subject)).toBe(onStream?.seq);
    director.finish(first, "completed", { status: 200 });

    await waitFor(async () => (await env.nats.jsm.streams.info(stream)).state.messages === 0, 10_000, "the charge to age out of the stream", 50);

    // The server now says the subject's last sequence is 0; the cursor still says 1.
    const second = await director.route(input("r2"));
    expect(strict.stats, JSON.stringify(strict.stats)).toMatchObject({ committed: 2, conflicts: 1, fallbacks: 0 });
    const now = await env.nats.jsm.streams.getMessage(stream, { last_by_subj: subject });
    expect(now?.json<ChargeEvent>().id).toBe(second.chargeId);
    expect(cursors.lastSeq(subject)).toBe(now?.seq);
    director.finish(second, "completed", { status: 200 });
  });
});

describe("strict commit - the routed prefix goes out for the committed pod only", () => {
  it("a pick that lost its compare-and-set and was re-selected publishes exactly one kv-routed event, naming the pod the charge was committed to", async () => {
    const { subjects } = env;
    const chargesStream = streamName(subjects.prefix, "CHARGES");
    const kvStream = streamName(subjects.prefix, "KV");
    const state = stateWithPods(2, SELF);
    const cursors = new SubjectCursors();

    // This replica's CHARGES follower, delivering on demand: stream messages up to a sequence are
    // applied to the fold when the test (or the committer, waiting for a winner) asks for them.
    let delivered = 0;
    const deliver = async (upTo: number) => {
      for (; delivered < upTo; ) {
        const m = await env.nats.jsm.streams.getMessage(chargesStream, { seq: delivered + 1 });
        delivered++;
        if (!m) continue;
        const ev = m.json<ChargeEvent>();
        if (ev.gateway !== SELF) state.apply(ev, { stream: "charges", subject: m.subject, seq: m.seq, serverTs: Date.now() });
        cursors.seen(m.subject, m.seq);
      }
    };
    const cursor: SubjectCursor = {
      lastSeq: (s) => cursors.lastSeq(s),
      note: (s, seq) => cursors.note(s, seq),
      reset: (s, seq) => cursors.reset(s, seq),
      predatesView: (seq) => cursors.predatesView(seq),
      async waitFor(s, seq, ms) {
        await deliver(seq);
        return cursors.waitFor(s, seq, ms);
      },
    };

    const fired: KvRouted[] = [];
    const outbox = new (class extends Outbox {
      override fire(subject: string, ev: unknown): void {
        if ((ev as { type?: string }).type === "kv-routed") fired.push(ev as KvRouted);
        super.fire(subject, ev);
      }
    })(env.nats.nc);
    const tokenizer = { tokenize: () => Promise.reject(new Error("the prompt comes as token ids")) } as unknown as Tokenizer;
    const prefix = createPrefixSupport({ gatewayId: SELF, state, tokenizer, subjects, outbox });
    const director = strictDirector(state, { prefix });
    const strict = new StrictCommitter({ js: env.nats.js, subjects, cursor });
    director.useStrictCommitter(strict);

    // The peer's charge on p1 is in our view; its two later charges on p0 are not yet: we pick p0
    // (fewest in flight), lose its compare-and-set, see the peer's charges, and re-select p1.
    const seen = await acked(env.nats.js, subjects.charges(MODEL, "p1"), peerCharge("p1", "b1"));
    await deliver(seen.seq);
    await acked(env.nats.js, subjects.charges(MODEL, "p0"), peerCharge("p0", "b2"));
    await acked(env.nats.js, subjects.charges(MODEL, "p0"), peerCharge("p0", "b3"));

    const tokens = Uint32Array.from({ length: 64 }, (_, i) => 1_000 + i);
    const input: RouteInput = {
      headers: { "x-request-id": "race-1", "routing-strategy": "prefix-cache", ":path": "/v1/completions" },
      body: Buffer.from(JSON.stringify({ model: MODEL, prompt: Array.from(tokens), max_tokens: 4 })),
    };
    const r: RoutedRequest = await director.route(input);
    // Exactly one routed prefix left this replica, for p1 and the committed charge. (Had the lost
    // pick's routed prefix been recorded, it would also have drawn the re-selection back to p0.)
    expect(fired.map((e) => ({ pod: e.pod, charge: e.charge }))).toEqual([{ pod: "p1", charge: r.chargeId }]);
    expect(strict.stats, JSON.stringify(strict.stats)).toMatchObject({ committed: 1, conflicts: 1, fallbacks: 0 });
    expect(r.pod.pod).toBe("p1");
    await waitFor(async () => (await env.nats.jsm.streams.info(kvStream)).state.messages >= 1, 5_000, "the kv-routed event on the KV stream", 20);
    const onKv = await env.nats.jsm.streams.getMessage(kvStream, { last_by_subj: subjects.kv(MODEL, "p1") });
    expect(onKv?.json<KvRouted>()).toMatchObject({ type: "kv-routed", pod: "p1", gateway: SELF, charge: r.chargeId });
    expect(await env.nats.jsm.streams.getMessage(kvStream, { last_by_subj: subjects.kv(MODEL, "p0") })).toBeNull();
    // And this replica's own routed-prefix history holds the prompt on p1 only.
    const match = prefix.match(MODEL, state.pods.readyPods(MODEL), tokens, Date.now(), "ids");
    expect(match.info.matched("p1")).toBe(4);
    expect(match.info.matched("p0")).toBe(0);
    director.finish(r, "completed", { status: 200 });
  });
});

describe("strict commit - a stream that takes no writes (a failover without a leader yet)", () => {
  it("each charge on a pod falls back within its own failoverWaitMs, not after the publish timeouts of the charges queued before it", async () => {
    // No stream for this namespace, and a plain subscriber on the pod's charge subject: every
    // publish reaches a responder that never acknowledges, as when the stream has no leader.
    const subjects = new Subjects("stalled");
    const swallowed = env.nats.nc.subscribe(subjects.charges(MODEL, "p0"));
    try {
      const state = stateWithPods(1, SELF);
      const director = strictDirector(state);
      const strict = new StrictCommitter({ js: env.nats.js, subjects, cursor: new SubjectCursors(), failoverWaitMs: 400 });
      director.useStrictCommitter(strict);
      const started = performance.now();
      const took = await Promise.all(
        Array.from({ length: 8 }, async (_, i) => {
          await director.route({ headers: { "x-request-id": `stall-${i}` }, body: chatBody(MODEL) });
          return performance.now() - started;
        }),
      );
      expect(strict.stats).toMatchObject({ committed: 0, committedAfterError: 0, fallbacks: 8 });
      // Each gave up 400 ms (+ one 100 ms minimum ack timeout) after it arrived; queued behind the
      // others' timeouts, the last would have waited at least 8 x 400 ms.
      expect(Math.max(...took), took.map(Math.round).join(",")).toBeLessThan(2_000);
    } finally {
      swallowed.unsubscribe();
    }
  });
});
