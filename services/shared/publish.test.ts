/**
 * The outbox against a real nats-server: one write per loop turn while the connection is open,
 * and never an exception once it is draining or closed (a gateway shutting down may still record
 * a late request's decision).
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
    expect(outbox.published).toBe(0);
  });
});
