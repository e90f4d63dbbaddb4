/**
 * The response store on a real nats-server: what a turn leaves is read back by its tenant only,
 * chains expand from it, deletions and expiry hide it, malformed records are dead-lettered, and the
 * locations it writes are what a gateway's fold reads.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { decodeEvent } from "../../schemas/validate.js";
import { storeDigest, tenantDigest } from "../../schemas/responses.js";
import { streamName } from "../../streams/definitions.js";
import { STREAM_EVENT_TYPES } from "../../streams/event-types.js";
import { quietLog, startTestEnv, type TestEnv } from "../../test/harness/env.js";
import { expandInput, inputItems, walkChain } from "../routing/responses/chain.js";
import { GatewayState } from "../views/gateway-state.js";
import { type RecordedTurn, ResponseStore } from "./response-store.js";

let env: TestEnv;
beforeAll(async () => {
  env = await startTestEnv();
});
afterAll(async () => env?.stop());

const T0 = Date.now();
const turn = (id: string, o: Partial<RecordedTurn> = {}): RecordedTurn => ({
  id, owner: "alice", model: "m/llama", pod: "pod-1", gateway: "gw-a", createdAt: T0, store: true,
  input: [{ type: "message", role: "user", content: `q ${id}` }],
  output: [{ type: "message", role: "assistant", content: [{ type: "output_text", text: `a ${id}` }] }],
  ...o,
});

describe("response store", () => {
  it("keeps a turn's items for its tenant only, and a chain expands from it", async () => {
    const store = new ResponseStore({ nats: env.nats, prefix: "jr", log: quietLog, name: "t1" });
    expect(await store.record(turn("resp_s1", { instructions: "be terse" }))).toEqual({ stored: true });
    await store.record(turn("resp_s2", { previousResponseId: "resp_s1" }));
    const got = await store.get("alice", "resp_s2");
    expect(got).toMatchObject({ id: "resp_s2", model: "m/llama", pod: "pod-1", previousResponseId: "resp_s1", input: [{ content: "q resp_s2" }] });
    expect((await store.get("alice", "resp_s1"))?.instructions).toBe("be terse");
    // Another tenant reads another subject: nothing.
    expect(await store.get("bob", "resp_s2")).toBeUndefined();
    const w = await walkChain("resp_s2", store.turns("alice"));
    if (!w.ok) throw new Error(`chain broken at ${w.id}`);
    expect(expandInput(w.turns, inputItems("next") ?? [])?.input.map((i) => (typeof i.content === "string" ? i.content : "out"))).toEqual(["q resp_s1", "out", "q resp_s2", "out", "next"]);
    expect((await walkChain("resp_s2", store.turns("bob"))).ok).toBe(false);
  });

  it("store: false keeps no items, only where the response lives", async () => {
    const store = new ResponseStore({ nats: env.nats, prefix: "jr", log: quietLog, name: "t2" });
    expect(await store.record(turn("resp_nostore", { store: false }))).toEqual({ stored: false });
    expect(await store.get("alice", "resp_nostore")).toBeUndefined();
  });

  it("a turn too large for one message is kept as a location only, and counted", async () => {
    const store = new ResponseStore({ nats: env.nats, prefix: "jr", log: quietLog, name: "t3" });
    const huge = [{ type: "message", role: "user", content: "x".repeat(env.nats.nc.info?.max_payload ?? 1024 * 1024) }];
    expect(await store.record(turn("resp_huge", { input: huge }))).toEqual({ stored: false });
    expect(store.counters.tooLarge).toBe(1);
  });

  it("a deletion hides the response from its tenant and removes its location from every fold; another tenant cannot delete it", async () => {
    const store = new ResponseStore({ nats: env.nats, prefix: "jr", log: quietLog, name: "t4" });
    await store.record(turn("resp_del"));
    expect(await store.delete("bob", "resp_del", "gw-b")).toBe(false);
    expect(await store.get("alice", "resp_del")).toBeDefined();
    expect(await store.delete("alice", "resp_del", "gw-a")).toBe(true);
    expect(await store.get("alice", "resp_del")).toBeUndefined();
    expect(await store.delete("alice", "resp_del", "gw-a")).toBe(false);
    // The RESPONSES stream, folded as a gateway does (last per subject), no longer holds it.
    const state = new GatewayState({ self: "x" });
    const c = await env.nats.js.consumers.get(streamName("jr", "RESPONSES"));
    const info = await c.info();
    const it = await c.fetch({ max_messages: info.num_pending, expires: 2_000 });
    for await (const m of it) {
      const d = decodeEvent(m.data, STREAM_EVENT_TYPES.RESPONSES);
      if (d.ok) state.apply(d.event, { stream: "responses", subject: m.subject, seq: m.seq, serverTs: Math.floor(m.info.timestampNanos / 1e6) });
      if (m.info.pending === 0) break;
    }
    expect(state.responses.get("resp_del", Date.now())).toBeUndefined();
    expect(state.responses.get("resp_s1", Date.now())).toMatchObject({ pod: "pod-1", model: "m/llama", tenant: tenantDigest("alice"), stored: true });
    expect(state.responses.get("resp_nostore", Date.now())).toMatchObject({ stored: false });
  });

  it("a response past its expiry is not served, whatever the stream still holds", async () => {
    let now = T0;
    const store = new ResponseStore({ nats: env.nats, prefix: "jr", log: quietLog, name: "t5", retentionMs: 1_000, now: () => now });
    await store.record(turn("resp_old"));
    expect(await store.get("alice", "resp_old")).toBeDefined();
    now = T0 + 1_000;
    expect(await store.get("alice", "resp_old")).toBeUndefined();
  });

  it("a malformed record on a response's subject is dead-lettered, counted and treated as absent", async () => {
    const store = new ResponseStore({ nats: env.nats, prefix: "jr", log: quietLog, name: "t6" });
    const subject = store.subjects.responseStored(storeDigest(tenantDigest("alice"), "resp_bad"));
    await env.nats.js.publish(subject, new TextEncoder().encode('{"type":"stored-response","id":"resp_bad"}'));
    expect(await store.get("alice", "resp_bad")).toBeUndefined();
    // A valid record copied onto another tenant's subject names the wrong tenant.
    const good = await store.record(turn("resp_copy"));
    expect(good.stored).toBe(true);
    const copied = (await env.nats.jsm.streams.getMessage(store.streams.store, { last_by_subj: store.subjects.responseStored(storeDigest(tenantDigest("alice"), "resp_copy")) }))?.data;
    await env.nats.js.publish(store.subjects.responseStored(storeDigest(tenantDigest("bob"), "resp_copy")), copied as Uint8Array);
    expect(await store.get("bob", "resp_copy")).toBeUndefined();
    expect(store.counters.malformed).toBe(2);
    const dlq = streamName("jr", "DLQ");
    let n = 0;
    for (let i = 0; i < 100 && n < 2; i++) {
      n = (await env.nats.jsm.streams.info(dlq, { subjects_filter: "jr.dlq.respstore" })).state.subjects?.["jr.dlq.respstore"] ?? 0;
      if (n < 2) await new Promise((r) => setTimeout(r, 20));
    }
    expect(n).toBe(2);
  });

  it("the streams are bounded by bytes and age, one message per subject", async () => {
    for (const key of ["RESPONSES", "RESPONSE_STORE"] as const) {
      const c = (await env.nats.jsm.streams.info(streamName("jr", key))).config;
      expect(c.max_bytes).toBeGreaterThan(0);
      expect(c.max_age).toBe(30 * 86_400 * 1e9);
      expect(c.max_msgs_per_subject).toBe(1);
    }
  });
});
