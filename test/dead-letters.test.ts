/**
 * Bad input on every subject family a gateway consumes is counted, logged and recorded on the
 * dead-letter stream with its origin (the payload itself only when the process opted in), and the
 * consumer keeps applying the good events after it. A flood of bad messages writes a bounded
 * number of log lines, and the metrics still count every one.
 */
import { createHash } from "node:crypto";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeliverPolicy, type JsMsg } from "@nats-io/jetstream";
import { applyStreams } from "../streams/apply.js";
import { streamName } from "../streams/definitions.js";
import { DEAD_LETTER_DEFAULTS, DlqHeaders, deadLetterPolicy, setDeadLetterPolicy } from "../services/shared/dead-letter.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

let env: TestEnv;
/** What every gateway of this file logs: the dead-letter log rate is per process, shared by all. */
const lines: Array<{ msg?: string; notLogged?: number }> = [];
const log = pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s)) });

describe("dead letters - malformed events never stop a consumer", () => {
  let gw: GatewayHandle;
  beforeAll(async () => {
    env = await startTestEnv();
    gw = await env.gateway({ id: "gw-dlq", adminPort: 0, log });
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
    const letters = (await readLetters(0, bad.length)).map((m) => ({
      subject: m.subject,
      origin: m.headers?.get(DlqHeaders.subject),
      reason: m.headers?.get(DlqHeaders.reason),
      seq: m.headers?.get(DlqHeaders.seq),
      type: m.headers?.get(DlqHeaders.type) || undefined,
      size: Number(m.headers?.get(DlqHeaders.size)),
      digest: m.headers?.get(DlqHeaders.digest),
      payload: m.headers?.get(DlqHeaders.payload),
      body: m.data.length,
    }));
    expect(dlq.config.subjects).toEqual(["jr.dlq.>"]);
    expect(letters.map((l) => l.origin).sort()).toEqual(bad.map(([subj]) => subj).sort());
    expect(new Set(letters.map((l) => l.subject))).toEqual(new Set(["jr.dlq.pods", "jr.dlq.load", "jr.dlq.charges"]));
    // The envelope only, by default: size and digest tell the payloads apart, no byte of them is kept.
    expect(letters.every((l) => l.body === 0 && l.payload === "omitted")).toBe(true);
    expect(letters.map((l) => `${l.size} ${l.digest}`).sort()).toEqual(bad.map(([, d]) => `${Buffer.byteLength(d)} ${digest(d)}`).sort());
    const of = (d: string) => letters.find((l) => l.digest === digest(d));
    // A reason an operator can act on, the event type when the payload names a known one, the original sequence.
    expect(of("{not json")?.reason).toMatch(/invalid JSON/);
    expect(of("{not json")?.type).toBeUndefined();
    expect(of((bad[1] as [string, string])[1])).toMatchObject({ reason: expect.stringMatching(/address/), type: "pod" });
    expect(of((bad[3] as [string, string])[1])?.type).toBe("charge");
    expect(letters.every((l) => Number(l.seq) > 0)).toBe(true);
  });

  it("with --dlq-payloads (the process's policy) an entry keeps the payload, up to its bound", async () => {
    const before = (await env.nats.jsm.streams.info(streamName("jr", "DLQ"))).state.messages;
    const saved = deadLetterPolicy();
    setDeadLetterPolicy({ keepPayloads: true, maxPayloadBytes: 16 });
    try {
      const small = JSON.stringify({ type: "load" });
      const big = JSON.stringify({ type: "load", model: MODEL, pod: "p-big", ts: "not a time", stale: false, load: null });
      await env.nats.js.publish(env.subjects.load(MODEL, "p-small"), small);
      await env.nats.js.publish(env.subjects.load(MODEL, "p-big"), big);
      const letters = await readLetters(before, 2);
      const byOrigin = new Map(letters.map((m) => [m.headers?.get(DlqHeaders.subject), m]));
      const s = byOrigin.get(env.subjects.load(MODEL, "p-small"));
      const b = byOrigin.get(env.subjects.load(MODEL, "p-big"));
      expect(s?.string()).toBe(small);
      expect(s?.headers?.get(DlqHeaders.payload)).toBe("whole");
      expect(b?.string()).toBe(big.slice(0, 16));
      expect(b?.headers?.get(DlqHeaders.payload)).toBe("prefix");
      expect(b?.headers?.get(DlqHeaders.size)).toBe(String(big.length));
      expect(b?.headers?.get(DlqHeaders.digest)).toBe(digest(big));
    } finally {
      setDeadLetterPolicy(saved);
    }
  });

  it("a booting gateway re-reading 1,000 bad messages writes a bounded number of log lines; the metrics count every one", async () => {
    const n = 1_000;
    // Distinct subjects: PODS keeps the last few per subject, a booting gateway reads the last of each.
    await Promise.all(Array.from({ length: n }, (_, i) => env.nats.js.publish(env.subjects.pod(MODEL, `flood-${i}`), `{"type":"pod","bad":${i}}`)));
    const booted = await env.gateway({ id: "gw-dlq-boot", adminPort: 0, log });
    const gauge = async (g: GatewayHandle) => {
      const text = await (await fetch(`http://127.0.0.1:${g.adminPort}/metrics`)).text();
      const line = text.split("\n").find((l) => l.startsWith("jetroute_gateway_dead_letters{") && l.includes('view="pods"'));
      return Number(line?.split(" ").at(-1));
    };
    // Every one counted: the booting gateway (from the stream) as many as the running one (live),
    // the flood and whatever bad pods came before it.
    let counts: number[] = [];
    await waitFor(async () => {
      counts = await Promise.all([gw, booted].map(gauge));
      return counts[0] === counts[1] && (counts[0] ?? 0) >= n;
    }, 10_000, () => `${n} dead letters or more counted alike by both gateways (${counts.join(", ")})`);
    // Over 2,000 dead letters in this process (both gateways read the flood; the booting one all at
    // once), yet per interval only the first few are logged, plus one summary line: the file runs
    // well within two intervals.
    const deadLetterLines = lines.filter((l) => /dead.letter/.test(l.msg ?? ""));
    expect(deadLetterLines.length).toBeGreaterThan(0);
    expect(deadLetterLines.length).toBeLessThanOrEqual(2 * (DEAD_LETTER_DEFAULTS.logLinesPerInterval + 1));
  });

  it("a DLQ stream that refuses every dead letter: each failure in the metrics, the log at the bounded rate", async () => {
    const dlq = streamName("jr", "DLQ");
    await env.nats.jsm.streams.delete(dlq);
    try {
      const n = 200;
      await Promise.all(Array.from({ length: n }, (_, i) => env.nats.js.publish(env.subjects.load(MODEL, `no-dlq-${i}`), `{"type":"load","bad":${i}}`)));
      let failures = 0;
      await waitFor(async () => {
        const text = await (await fetch(`http://127.0.0.1:${gw.adminPort}/metrics`)).text();
        const line = text.split("\n").find((l) => l.startsWith("jetroute_gateway_dead_letter_publish_failures{") && l.includes('view="load"'));
        failures = Number(line?.split(" ").at(-1));
        return failures >= n;
      }, 10_000, () => `${n} failed dead-letter publishes counted (${failures})`, 50);
      const failureLines = lines.filter((l) => l.msg === "dead-letter publish failed");
      expect(failureLines.length).toBeGreaterThan(0);
      expect(failureLines.length).toBeLessThanOrEqual(DEAD_LETTER_DEFAULTS.logLinesPerInterval);
    } finally {
      await applyStreams(env.nats.nc, env.nats.jsm);
    }
  });
});

function digest(s: string): string {
  return createHash("sha256").update(s).digest("hex").slice(0, 16);
}

/** `count` dead letters from the DLQ, starting after stream sequence `after`. */
async function readLetters(after: number, count: number): Promise<JsMsg[]> {
  const out: JsMsg[] = [];
  await waitFor(
    async () => {
      const c = await env.nats.js.consumers.get(streamName("jr", "DLQ"), { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: after + out.length + 1 });
      const it = await c.fetch({ max_messages: count - out.length, expires: 1_000 });
      for await (const m of it) {
        out.push(m);
        if (out.length === count) break;
      }
      return out.length === count;
    },
    5_000,
    () => `${count} dead letters (${out.length} read)`,
  );
  return out;
}
