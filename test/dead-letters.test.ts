/**
 * Bad input on every subject family a gateway consumes is counted, logged and copied to the
 * dead-letter stream with its origin, and the consumer keeps applying the good events after it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeliverPolicy } from "@nats-io/jetstream";
import { streamName } from "../streams/definitions.js";
import { DlqHeaders } from "../services/shared/dead-letter.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

describe("dead letters - malformed events never stop a consumer", () => {
  let env: TestEnv;
  let gw: GatewayHandle;
  beforeAll(async () => {
    env = await startTestEnv();
    gw = await env.gateway({ id: "gw-dlq" });
  });
  afterAll(async () => env?.stop());

  it("dead-letters bad pods, load, charges and heartbeat messages and applies the good ones after them", async () => {
    const s = env.subjects;
    const bad: Array<[string, string]> = [
      [s.pod(MODEL, "p1"), "{not json"],
      [s.pod(MODEL, "p2"), JSON.stringify({ type: "pod", action: "upsert", model: MODEL, pod: "p2", address: "no-port", ready: true, engine: "vllm", ts: 1 })],
      [s.load(MODEL, "p1"), JSON.stringify({ type: "load", model: MODEL, pod: "p1", ts: "yesterday", stale: false, load: null })],
      [s.charges(MODEL, "p1"), JSON.stringify({ type: "charge", id: "c1", gateway: "other", model: MODEL, pod: "p1" })],
      [s.charges(MODEL, "p1"), JSON.stringify({ type: "pod" })],
      [s.heartbeat("other"), "\u00ff\u00fe binary"],
    ];
    for (const [subject, data] of bad) await env.nats.js.publish(subject, data);
    // A good event after each bad one proves each consumer is still alive.
    await env.publishPod({ pod: "good-pod", address: "127.0.0.1:9999" });
    const now = Date.now();
    await env.nats.js.publish(s.load(MODEL, "good-pod"), JSON.stringify({ type: "load", model: MODEL, pod: "good-pod", ts: now, stale: true, load: null }));
    await env.nats.js.publish(s.heartbeat("other"), JSON.stringify({ type: "heartbeat", gateway: "other", ts: now, intervalMs: 1000, startedAt: now, state: "up" }));
    await env.nats.js.publish(s.charges(MODEL, "good-pod"), JSON.stringify({ type: "charge", id: "c2", gateway: "other", model: MODEL, pod: "good-pod", ts: now, ttlMs: 60000, promptTokens: 1 }));

    await waitFor(() => gw.views.ledger.outstanding(MODEL, "good-pod").requests === 1, 3_000, "good charge applied");
    expect(gw.views.pods.get(MODEL, "good-pod")?.address).toBe("127.0.0.1:9999");
    expect(gw.views.load.get(MODEL, "good-pod")?.stale).toBe(true);

    const dlq = await env.nats.jsm.streams.info(streamName("jr", "DLQ"));
    const consumer = await env.nats.js.consumers.get(streamName("jr", "DLQ"), { deliver_policy: DeliverPolicy.All });
    const letters: Array<{ subject: string; origin: string | undefined; reason: string | undefined; seq: string | undefined; data: string }> = [];
    const iter = await consumer.fetch({ max_messages: 50, expires: 1000 });
    for await (const m of iter) {
      letters.push({ subject: m.subject, origin: m.headers?.get(DlqHeaders.subject), reason: m.headers?.get(DlqHeaders.reason), seq: m.headers?.get(DlqHeaders.seq), data: m.string() });
      if (letters.length === bad.length) break;
    }
    expect(dlq.config.subjects).toEqual(["jr.dlq.>"]);
    expect(letters.map((l) => l.origin).sort()).toEqual(bad.map(([subj]) => subj).sort());
    expect(new Set(letters.map((l) => l.subject))).toEqual(new Set(["jr.dlq.pods", "jr.dlq.load", "jr.dlq.charges"]));
    // Byte-for-byte copies, with a reason an operator can act on and the original sequence.
    expect(letters.map((l) => l.data).sort()).toEqual(bad.map(([, d]) => d).sort());
    expect(letters.find((l) => l.data === "{not json")?.reason).toMatch(/invalid JSON/);
    expect(letters.find((l) => l.data.includes("no-port"))?.reason).toMatch(/address/);
    expect(letters.every((l) => Number(l.seq) > 0)).toBe(true);
  });
});
