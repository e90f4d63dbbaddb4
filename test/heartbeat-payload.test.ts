/**
 * Heartbeats at peak load against a real nats-server with the default 1 MiB max_payload: a
 * gateway holding 10,000 charges publishes its heartbeat as parts sized from the server's
 * max_payload, through the outbox, onto CHARGES; a peer's follower folds them into its ledger.
 * Every charge arrives, nothing is dropped, and the next beat removes exactly what it no longer
 * lists. (Unsplit, this heartbeat is over 1 MiB: the publish was refused and the peer declared
 * the gateway dead — at exactly the load where it mattered most.)
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GatewayHeartbeat } from "../schemas/events.js";
import { heartbeatOf } from "../services/gateway/heartbeat.js";
import type { RoutedRequest } from "../services/routing/request.js";
import { StreamFollower } from "../services/shared/follower.js";
import { connectNats, type NatsHandles } from "../services/shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../services/shared/nats-server.js";
import { Outbox } from "../services/shared/publish.js";
import { ChargeLedger } from "../services/views/charge-ledger.js";
import { applyStreams } from "../streams/apply.js";
import { streamName } from "../streams/definitions.js";
import { Subjects } from "../streams/subjects.js";
import { MODEL, quietLog, waitFor } from "./harness/env.js";

const GATEWAY = "gw-7f9c2d";
const IN_FLIGHT = 10_000;
const MiB = 1024 * 1024;

/** What the director holds per routed request, as far as the heartbeat reads it (ids as it makes them). */
const routed = (i: number, now: number): RoutedRequest =>
  ({
    chargeId: (i + 1).toString(36),
    pod: { model: MODEL, pod: `llama-8b-decode-5d9f7c8b4-${(i % 16).toString(36).padStart(5, "x")}` },
    promptTokens: 200 + ((i * 7919) % 30_000),
    startedAt: now - (i % 60_000),
    ...(i % 3 === 0 ? { firstChunkAt: now } : {}),
  }) as unknown as RoutedRequest;

describe("heartbeat payload - 10,000 in-flight charges at the default 1 MiB max_payload", () => {
  let server: NatsServerHandle;
  let pub: NatsHandles;
  let sub: NatsHandles;
  const subjects = new Subjects();
  beforeAll(async () => {
    // The test harness raises max_payload to 8 MB; production servers mostly run nats-server's default.
    server = await startNatsServer({ config: "max_payload: 1MB" });
    pub = await connectNats(server.url);
    sub = await connectNats(server.url);
    await applyStreams(pub.nc, pub.jsm);
  });
  afterAll(async () => {
    await pub?.nc.close();
    await sub?.nc.close();
    await server?.stop();
  });

  it("every charge reaches the peer's ledger, nothing is dropped, and the next beat removes exactly the released ones", async () => {
    const maxPayload = pub.nc.info?.max_payload ?? 0;
    expect(maxPayload).toBe(MiB);
    const maxBytes = Math.floor(maxPayload * 0.9);
    const now = Date.now();
    const inFlight = new Map(Array.from({ length: IN_FLIGHT }, (_, i) => [i, routed(i, now)] as const));
    const input = { gateway: GATEWAY, now, intervalMs: 1_000, startedAt: now - 60_000, chargeTtlMs: 600_000, maxListed: 20_000, maxBytes };

    // Unsplit, the list does not fit: this is the message the server used to refuse.
    const [whole] = heartbeatOf({ ...input, beat: 0, maxBytes: undefined }, "up", inFlight.values());
    const wholeBytes = Buffer.byteLength(JSON.stringify(whole));
    expect(wholeBytes).toBeGreaterThan(maxPayload);

    const ledger = new ChargeLedger({ self: "gw-peer", heartbeatTimeoutMs: 3_000 });
    const received: GatewayHeartbeat[] = [];
    const follower = new StreamFollower({
      nats: sub, subjects, log: quietLog, name: "heartbeat-payload", family: "charges", types: ["charge", "release", "heartbeat"] as const,
      stream: streamName(subjects.prefix, "CHARGES"), filter: subjects.heartbeat(GATEWAY), startAt: { kind: "all" },
      onEvent: (ev, m) => {
        if (ev.type === "heartbeat") received.push(ev);
        ledger.applyFromStream(ev, m.serverTs, Date.now(), m.seq);
      },
    });
    await follower.start();
    const outbox = new Outbox(pub.nc);
    try {
      const beat1 = heartbeatOf({ ...input, beat: 1 }, "up", inFlight.values());
      const sizes = beat1.map((p) => Buffer.byteLength(JSON.stringify(p)));
      for (const s of sizes) expect(s).toBeLessThanOrEqual(maxBytes);
      expect(beat1.length).toBe(Math.ceil(wholeBytes / maxBytes));
      expect(beat1.flatMap((p) => p.outstanding ?? [])).toHaveLength(IN_FLIGHT);
      // Measured sizes, for the record (npx vitest run test/heartbeat-payload.test.ts --reporter=verbose shows them).
      console.info(
        `heartbeat: ${IN_FLIGHT} charges = ${wholeBytes} bytes unsplit (${(wholeBytes / IN_FLIGHT).toFixed(1)} B/charge); ${beat1.length} parts of at most ${maxBytes} B: ${sizes.join(", ")}`,
      );
      for (const p of beat1) outbox.fire(subjects.heartbeat(GATEWAY), p);
      await waitFor(() => received.length === beat1.length, 10_000, "every part of beat 1 read back from CHARGES");
      expect(outbox).toMatchObject({ published: beat1.length, dropped: 0 });
      expect(received.map((p) => [p.beat, p.part, p.parts])).toEqual(beat1.map((_, i) => [1, i, beat1.length]));
      expect(ledger.chargesOf(GATEWAY)).toBe(IN_FLIGHT);
      expect(ledger.reconciledAdded).toBe(IN_FLIGHT);
      expect(ledger.isAlive(GATEWAY, Date.now())).toBe(true);
      const held = new Set(ledger.dump(Date.now()).charges.map(([key]) => key));
      for (const r of inFlight.values()) expect(held.has(`${GATEWAY}/${r.chargeId}`)).toBe(true);
      // Decoding state travelled too: a third of the charges are past their first token.
      const perPod = Array.from({ length: 16 }, (_, k) => ledger.outstanding(MODEL, `llama-8b-decode-5d9f7c8b4-${k.toString(36).padStart(5, "x")}`));
      expect(perPod.reduce((a, o) => a + o.requests, 0)).toBe(IN_FLIGHT);
      expect(perPod.reduce((a, o) => a + (o.requests - o.prefillRequests), 0)).toBe(Math.ceil(IN_FLIGHT / 3));

      // 100 requests end and their releases are lost: the next beat no longer lists them.
      const released = new Set<string>();
      for (let i = 0; i < IN_FLIGHT; i += IN_FLIGHT / 100) {
        released.add(`${GATEWAY}/${inFlight.get(i)?.chargeId}`);
        inFlight.delete(i);
      }
      expect(released.size).toBe(100);
      const beat2 = heartbeatOf({ ...input, now: now + 1_000, beat: 2 }, "up", inFlight.values());
      for (const p of beat2) outbox.fire(subjects.heartbeat(GATEWAY), p);
      await waitFor(() => received.length === beat1.length + beat2.length, 10_000, "every part of beat 2 read back");
      expect(outbox).toMatchObject({ published: beat1.length + beat2.length, dropped: 0 });
      expect(ledger.chargesOf(GATEWAY)).toBe(IN_FLIGHT - 100);
      expect(ledger.reconciledRemoved).toBe(100);
      expect(ledger.incompleteBeats).toBe(0);
      const after = new Set(ledger.dump(Date.now()).charges.map(([key]) => key));
      for (const key of held) expect(after.has(key)).toBe(!released.has(key));

      // And the unsplit message, offered to an outbox: refused and counted, not thrown, nothing else lost.
      const other = new Outbox(pub.nc);
      other.fire(subjects.heartbeat("gw-unsplit"), whole);
      expect(other).toMatchObject({ dropped: 1, droppedTooLarge: 1, published: 0 });
    } finally {
      await follower.stop();
    }
  }, 30_000);
});
