/**
 * The outbox against a real nats-server: one write per loop turn while the connection is open,
 * and never an exception once it is draining or closed (a gateway shutting down may still record
 * a late request's decision). A message the client refuses (too large for the server's
 * max_payload, an invalid subject) is dropped alone and counted; the rest of the turn still goes.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNats } from "./nats.js";
import { type NatsServerHandle, startNatsServer } from "./nats-server.js";
import { Outbox } from "./publish.js";

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
    await new Promise((r) => setTimeout(r, 50));
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
      await new Promise((r) => setTimeout(r, 50));
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
    await new Promise((r) => setTimeout(r, 50));
    expect(got).toEqual(["t.1", "t.3"]);
    expect(outbox).toMatchObject({ published: 2, dropped: 1, droppedFailed: 1, droppedTooLarge: 0, droppedClosed: 0 });
    await pub.nc.close();
    await sub.nc.close();
  });
});
