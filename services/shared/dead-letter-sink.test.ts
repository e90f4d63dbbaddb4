/**
 * Dead letters on a real nats-server: a reader that reboots (or a second replica) re-reading the
 * same bad stream messages adds no second DLQ entry, and a DLQ that refuses every publish is
 * counted in full but logged at a bounded rate.
 */
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { applyStreams } from "../../streams/apply.js";
import { waitFor } from "../../test/harness/wait.js";
import { startTestEnv, type TestEnv } from "../../test/harness/env.js";
import { DeadLetterLog, DlqHeaders } from "./dead-letter.js";
import { StreamFollower } from "./follower.js";
import { createLogger, type Logger } from "./log.js";
import type { NatsHandles } from "./nats.js";

const MODEL = "org/model";
const silent = createLogger("test", "silent");
let env: TestEnv;
let nats: NatsHandles;
const subjects = new Subjects();
const dlq = streamName("jr", "DLQ");

beforeAll(async () => {
  env = await startTestEnv();
  nats = env.nats;
});
afterAll(async () => env?.stop());

function loadReader(name: string, o: { log?: Logger; failureLog?: DeadLetterLog } = {}): StreamFollower<"load"> {
  return new StreamFollower({
    nats, subjects, name, log: o.log ?? silent, family: "load", types: ["load"],
    stream: streamName("jr", "LOAD"), startAt: { kind: "all" }, probeEveryMs: 60_000,
    onEvent: () => undefined,
    deadLetters: { log: new DeadLetterLog(), ...(o.failureLog ? { failureLog: o.failureLog } : {}) },
  });
}

/** Each dead letter's origin (`<stream>:<seq>`) in the DLQ, one per entry. */
async function origins(): Promise<string[]> {
  const out: string[] = [];
  const n = (await nats.jsm.streams.info(dlq)).state.messages;
  for (let seq = 1; out.length < n; seq++) {
    const m = await nats.jsm.streams.getMessage(dlq, { seq }).catch(() => undefined);
    if (m) out.push(`${m.header.get(DlqHeaders.stream)}:${m.header.get(DlqHeaders.seq)}`);
  }
  return out;
}

describe("dead-letter sink - one DLQ entry per bad stream message", () => {
  it("a reader that reboots and re-reads the same bad messages adds no entry; a new bad message still gets one", async () => {
    const bad = ["{not json", JSON.stringify({ type: "load", model: MODEL, pod: "p1", ts: "yesterday" }), JSON.stringify({ type: "pod" })];
    for (const [i, d] of bad.entries()) await nats.js.publish(subjects.load(MODEL, `p${i}`), d);
    const first = loadReader("reader");
    await first.start();
    await waitFor(() => first.deadLetters.stored === bad.length, 10_000, () => `the first reader's ${bad.length} entries stored (${first.deadLetters.stored})`);
    await first.stop();
    expect(await origins()).toHaveLength(bad.length);

    // The same reader after a reboot, and another replica: every bad message read again.
    const again = [loadReader("reader"), loadReader("reader-2")];
    await Promise.all(again.map((f) => f.start()));
    const settled = (f: StreamFollower<"load">) => f.deadLetters.stored + f.deadLetters.duplicates + f.deadLetters.failed;
    await waitFor(() => again.every((f) => settled(f) === bad.length), 10_000, () => `the re-reads' publishes acknowledged (${again.map(settled).join(", ")})`);
    for (const f of again) expect(f.deadLetters).toMatchObject({ count: bad.length, stored: 0, duplicates: bad.length, failed: 0 });
    expect(await origins()).toHaveLength(bad.length);

    await nats.js.publish(subjects.load(MODEL, "p9"), "{also not json");
    const reader = again[0] as StreamFollower<"load">;
    await waitFor(() => reader.deadLetters.stored === 1 || (again[1] as StreamFollower<"load">).deadLetters.stored === 1, 10_000, "the new bad message stored once");
    await waitFor(() => again.every((f) => settled(f) === bad.length + 1), 10_000, "both replicas' publishes acknowledged");
    const o = await origins();
    expect(o).toHaveLength(bad.length + 1);
    expect(new Set(o).size).toBe(o.length);
    await Promise.all(again.map((f) => f.stop()));
  });

  it("a DLQ that refuses every publish: each failure counted, the log bounded to the rate plus one summary", async () => {
    let now = 0;
    const lines: Array<{ msg?: string; level?: number; notLogged?: number; failedPublishes?: number }> = [];
    const log: Logger = pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s)) });
    const failureLog = new DeadLetterLog({ linesPerInterval: 3, intervalMs: 60_000, now: () => now, level: "error", summary: { msg: "failures held back", countField: "failedPublishes" } });
    await nats.jsm.streams.delete(dlq);
    const reader = loadReader("reader-no-dlq", { log, failureLog });
    try {
      const before = (await nats.jsm.streams.info(streamName("jr", "LOAD"))).state.messages;
      const n = 40;
      for (let i = 0; i < n; i++) await nats.js.publish(subjects.load(MODEL, `flood-${i}`), `{"bad":${i}}`);
      await reader.start();
      await waitFor(() => reader.deadLetters.failed === before + n, 20_000, () => `${before + n} failed publishes counted (${reader.deadLetters.failed})`);
      const failures = () => lines.filter((l) => l.msg === "dead-letter publish failed");
      expect(failures()).toHaveLength(3);
      expect(failures().every((l) => l.level === 50)).toBe(true);
      now = 60_000;
      failureLog.flush();
      expect(lines.filter((l) => l.msg === "failures held back")).toEqual([expect.objectContaining({ notLogged: before + n - 3, failedPublishes: before + n })]);
    } finally {
      await reader.stop();
      await applyStreams(nats.nc, nats.jsm);
    }
  });
});
