/**
 * A follower reading in paced batches (`paceMs`, paced-pull.ts) on a real nats-server: every
 * message once and in stream order, at catch-up and live; far fewer requests than messages while
 * they flow; the doorbell reads the first message after a quiet spell without waiting for a pace;
 * `readNow` cuts a pace short; a consumer deleted under it is reopened after the last sequence.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PodEvent } from "../../schemas/events.js";
import { streamName } from "../../streams/definitions.js";
import { Subjects } from "../../streams/subjects.js";
import { startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { StreamFollower } from "./follower.js";
import { createLogger } from "./log.js";

const MODEL = "org/paced";
const silent = createLogger("test", "silent");
const subjects = new Subjects();
const stream = streamName("jr", "PODS");
let env: TestEnv;
let n = 0;

beforeAll(async () => {
  env = await startTestEnv();
});
afterAll(async () => env?.stop());

/** Publishes `count` pod events, each on its own pod (PODS keeps a few per subject), all at once. */
async function publish(count: number): Promise<void> {
  const pending: Array<Promise<unknown>> = [];
  for (let i = 0; i < count; i++) {
    const pod = `paced-${n++}`;
    const ev: PodEvent = { type: "pod", action: "upsert", model: MODEL, pod, address: "10.0.0.1:8000", ready: true, engine: "vllm", ts: Date.now() };
    pending.push(env.nats.js.publish(subjects.pod(MODEL, pod), JSON.stringify(ev)));
  }
  await Promise.all(pending);
}

function reader(paceMs: number, seqs: number[]): StreamFollower<"pod"> {
  return new StreamFollower({
    nats: env.nats, subjects, log: silent, name: "paced", family: "pods", types: ["pod"], stream, startAt: { kind: "all" },
    paceMs, probeEveryMs: 200,
    onEvent: (ev, m) => {
      if (ev.model === MODEL) seqs.push(m.seq);
    },
  });
}

const inOrderOnce = (seqs: number[]) => seqs.every((s, i) => i === 0 || s > (seqs[i - 1] as number));

describe("StreamFollower with paceMs", () => {
  it("catches up on a stored backlog in batches, then folds live traffic once each, in order, with few requests", async () => {
    await publish(2_500);
    const seqs: number[] = [];
    const f = reader(20, seqs);
    await f.start();
    await f.whenCaughtUp();
    await waitFor(() => seqs.length === 2_500, 10_000, () => `backlog folded (${seqs.length} of 2500)`);
    // 1,024 per batch request, plus the doorbell left once it ran dry.
    expect(f.readRequests).toBeLessThanOrEqual(6);
    const before = f.readRequests;
    await publish(300);
    await waitFor(() => seqs.length === 2_800, 10_000, () => `live messages folded (${seqs.length} of 2800)`);
    expect(inOrderOnce(seqs)).toBe(true);
    expect(f.applied).toBeGreaterThanOrEqual(2_800);
    // Unpaced, each of the 300 would be its own delivery; paced, a request brings many.
    expect(f.readRequests - before).toBeLessThan(100);
    await f.stop();
  });

  it("the doorbell reads the first message after a quiet spell; readNow cuts a long pace short", async () => {
    const seqs: number[] = [];
    // A pace far longer than the test: only the doorbell and readNow can bring messages in time.
    const f = reader(600_000, seqs);
    await f.start();
    await f.whenCaughtUp();
    // The backlog's last batch was not filled, so the next is a pace away: readNow asks at once,
    // finds nothing, and leaves the doorbell (two more requests).
    const r0 = f.readRequests;
    await waitFor(() => {
      f.readNow();
      return f.readRequests >= r0 + 2;
    }, 3_000, () => "readNow's empty batch and the doorbell after it");
    const base = seqs.length;
    await publish(1);
    await waitFor(() => seqs.length === base + 1, 3_000, () => "the doorbell to bring the first message");
    await publish(5);
    // The doorbell rang, so the next batch is a pace away: nothing arrives by itself.
    const before = f.readRequests;
    f.readNow();
    await waitFor(() => seqs.length === base + 6, 3_000, () => `readNow to bring the rest (${seqs.length - base} of 6)`);
    expect(f.readRequests).toBe(before + 1);
    expect(inOrderOnce(seqs)).toBe(true);
    await f.stop();
  });

  it("a consumer deleted under it is reopened after the last sequence: nothing lost, nothing twice", async () => {
    const seqs: number[] = [];
    const f = reader(5, seqs);
    await f.start();
    await f.whenCaughtUp();
    const base = seqs.length;
    await env.nats.jsm.consumers.delete(stream, f.consumerName);
    await publish(50);
    await waitFor(() => f.reopens >= 1 && seqs.length === base + 50, 10_000, () => `reopened (${f.reopens}) and folded the 50 (${seqs.length - base})`);
    expect(inOrderOnce(seqs)).toBe(true);
    await f.stop();
  });
});
