/**
 * The outbox against a real nats-server: one write per loop turn while the connection is open,
 * and never an exception once it is draining or closed (a gateway shutting down may still record
 * a late request's decision). A message the client refuses (too large for the server's
 * max_payload, an invalid subject) is dropped alone and counted; the rest of the turn still goes.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNats } from "./nats.js";
import { type NatsServerHandle, startNatsServer } from "./nats-server.js";
import { MAX_RELEASE_BATCH, type ReleaseEvent } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { Outbox, ReleaseBatcher } from "./publish.js";
import { waitFor } from "../../test/harness/wait.js";

describe("outbox", () => {
  let server: NatsServerHandle;
  beforeAll(async () => {
    server = await startNatsServer();
  });
  afterAll(async () => server?.stop());

  it("publishes what was fired, in order", async () => {
    const pub = await connectNats(server.url);
    const sub = await connectNats(server.url);
    const got: string[] = [];
    sub.nc.subscribe("t.>", { callback: (_e, m) => void got.push(m.string()) });
    await sub.nc.flush();
    const outbox = new Outbox(pub.nc);
    for (let i = 0; i < 5; i++) outbox.fire(`t.${i}`, { i });
    await new Promise((r) => setImmediate(r));
    await pub.nc.flush();
    await waitFor(() => got.length >= 5, 5_000, "the five messages on the subscription");
    expect(got).toEqual([0, 1, 2, 3, 4].map((i) => JSON.stringify({ i })));
    expect(outbox.published).toBe(5);
    await pub.nc.close();
    await sub.nc.close();
  });

  it("drops, counted, what is fired while the connection drains or after it closed; nothing throws", async () => {
    const pub = await connectNats(server.url);
    const outbox = new Outbox(pub.nc);
    outbox.fire("t.queued", { before: "drain" }); // queued for the next loop turn...
    const drained = pub.nc.drain(); // ...which comes after the drain has started
    outbox.fire("t.during", { during: "drain" });
    await new Promise((r) => setImmediate(r));
    await drained;
    outbox.fire("t.after", { after: "close" });
    await new Promise((r) => setImmediate(r));
    expect(outbox.dropped).toBe(3);
    expect(outbox.droppedClosed).toBe(3);
    expect(outbox.published).toBe(0);
  });

  it("refuses, counted, a message larger than the server's max_payload; the rest of the turn is published", async () => {
    const small = await startNatsServer({ config: "max_payload: 64KB" });
    try {
      const pub = await connectNats(small.url);
      const sub = await connectNats(small.url);
      expect(pub.nc.info?.max_payload).toBe(64 * 1024);
      const got: string[] = [];
      sub.nc.subscribe("t.>", { callback: (_e, m) => void got.push(m.subject) });
      await sub.nc.flush();
      const outbox = new Outbox(pub.nc);
      outbox.fire("t.before", { i: 1 });
      expect(() => outbox.fire("t.huge", { pad: "x".repeat(70 * 1024) })).not.toThrow();
      outbox.fire("t.after", { i: 2 });
      await new Promise((r) => setImmediate(r));
      await pub.nc.flush();
      // A huge message, had it been sent, would arrive between the two (one connection keeps order).
      await waitFor(() => got.length >= 2, 5_000, "two messages on the subscription");
      expect(got).toEqual(["t.before", "t.after"]);
      expect(outbox).toMatchObject({ published: 2, dropped: 1, droppedTooLarge: 1, droppedClosed: 0, droppedFailed: 0 });
      expect(outbox.drops()).toEqual({ closed: 0, tooLarge: 1, failed: 0 });
      await pub.nc.close();
      await sub.nc.close();
    } finally {
      await small.stop();
    }
  });

  it("a publish that throws at flush skips only that message: the rest of the queue is published", async () => {
    const pub = await connectNats(server.url);
    const sub = await connectNats(server.url);
    const got: string[] = [];
    sub.nc.subscribe("t.>", { callback: (_e, m) => void got.push(m.subject) });
    await sub.nc.flush();
    const outbox = new Outbox(pub.nc);
    outbox.fire("t.1", { i: 1 });
    outbox.fire("t.bad subject", { i: 2 }); // the client throws on whitespace in a subject
    outbox.fire("t.3", { i: 3 });
    await new Promise((r) => setImmediate(r));
    await pub.nc.flush();
    // The bad one, had it been sent, would arrive between the two (one connection keeps order).
    await waitFor(() => got.length >= 2, 5_000, "two messages on the subscription");
    expect(got).toEqual(["t.1", "t.3"]);
    expect(outbox).toMatchObject({ published: 2, dropped: 1, droppedFailed: 1, droppedTooLarge: 0, droppedClosed: 0 });
    await pub.nc.close();
    await sub.nc.close();
  });
});

describe("release batcher", () => {
  let server: NatsServerHandle;
  beforeAll(async () => {
    server = await startNatsServer();
  });
  afterAll(async () => server?.stop());

  const rel = (id: string, pod: string, extra: Partial<ReleaseEvent> = {}): ReleaseEvent => ({ type: "release", id, gateway: "gw-a", model: "m", pod, ts: 1_000 + Number.parseInt(id, 36), outcome: "completed", ...extra });

  async function wire() {
    const pub = await connectNats(server.url);
    const sub = await connectNats(server.url);
    const got: Array<{ subject: string; ev: Record<string, unknown> }> = [];
    sub.nc.subscribe("rb.>", { callback: (_e, m) => void got.push({ subject: m.subject, ev: m.json() }) });
    await sub.nc.flush();
    const close = async () => {
      await pub.nc.close();
      await sub.nc.close();
    };
    return { outbox: new Outbox(pub.nc), got, close };
  }

  it("sends a pod's releases of one window as one schema-valid `releases`, in order, stamped with the charge count; a lone one as a plain `release`", async () => {
    const w = await wire();
    let made = 7;
    const b = new ReleaseBatcher(w.outbox, (model, pod) => `rb.${model}.${pod}`, 5, () => made);
    b.add(rel("1", "p0", { promptTokens: 10, chargedPromptTokens: 9, chargedAt: 900, completionTokens: 3, user: "alice" }));
    b.add(rel("2", "p1"));
    made = 8;
    b.add(rel("3", "p0"));
    await waitFor(() => w.got.length === 2, 5_000, "one message per pod");
    const p0 = w.got.find((g) => g.subject === "rb.m.p0")?.ev;
    const p1 = w.got.find((g) => g.subject === "rb.m.p1")?.ev;
    expect(checkEvent("releases", p0).ok).toBe(true);
    expect(p0).toEqual({
      type: "releases", gateway: "gw-a", model: "m", pod: "p0",
      releases: [
        { id: "1", ts: 1_001, outcome: "completed", promptTokens: 10, chargedPromptTokens: 9, chargedAt: 900, completionTokens: 3, user: "alice", afterCharge: 7 },
        { id: "3", ts: 1_003, outcome: "completed", afterCharge: 8 },
      ],
    });
    expect(checkEvent("release", p1).ok).toBe(true);
    expect(p1).toEqual({ ...rel("2", "p1"), afterCharge: 7 });
    // The own-echo marker a gateway skips its echoes by is in the batch.
    expect(JSON.stringify(p0)).toContain('"gateway":"gw-a",');
    expect([b.batches, b.batched]).toEqual([1, 2]);
    await w.close();
  });

  it("flush() sends at once (before a heartbeat, at shutdown); a full batch goes without waiting; window 0 sends each release on its own", async () => {
    const w = await wire();
    const b = new ReleaseBatcher(w.outbox, (model, pod) => `rb.${model}.${pod}`, 60_000, () => 1, 3);
    b.add(rel("1", "p0"));
    b.add(rel("2", "p0"));
    b.flush();
    await waitFor(() => w.got.length === 1, 5_000, "the flushed batch");
    expect((w.got[0]?.ev.releases as unknown[] | undefined)?.length).toBe(2);
    for (const id of ["3", "4", "5"]) b.add(rel(id, "p0"));
    await waitFor(() => w.got.length === 2, 5_000, "the full batch");
    expect((w.got[1]?.ev.releases as Array<{ id: string }> | undefined)?.map((r) => r.id)).toEqual(["3", "4", "5"]);
    b.flush();
    const none = new ReleaseBatcher(w.outbox, (model, pod) => `rb.${model}.${pod}`, 0, () => 1);
    none.add(rel("6", "p0"));
    none.add(rel("7", "p0"));
    await waitFor(() => w.got.length === 4, 5_000, "two plain releases");
    expect(w.got.slice(2).map((g) => g.ev.type)).toEqual(["release", "release"]);
    await w.close();
  });

  it("a batch too large for the server's max_payload is split until it fits: nothing dropped", async () => {
    const w = await wire();
    const b = new ReleaseBatcher(w.outbox, (model, pod) => `rb.${model}.${pod}`, 60_000, () => 1, MAX_RELEASE_BATCH, () => 4_000);
    const user = "u".repeat(200);
    for (let i = 1; i <= 40; i++) b.add(rel(i.toString(36), "p0", { user }));
    b.flush();
    await waitFor(() => w.got.flatMap((g) => (g.ev.releases as unknown[] | undefined) ?? [g.ev]).length === 40, 5_000, "all 40 releases");
    expect(w.got.length).toBeGreaterThan(1);
    expect(w.got.every((g) => JSON.stringify(g.ev).length <= 3_600)).toBe(true);
    expect(w.got.flatMap((g) => (g.ev.releases as Array<{ id: string }>).map((r) => r.id))).toEqual(Array.from({ length: 40 }, (_, i) => (i + 1).toString(36)));
    expect(w.outbox.dropped).toBe(0);
    await w.close();
  });
});
