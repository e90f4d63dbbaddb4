/**
 * The batch store's fold on a real nats-server: a restarted process replays the job stream and the
 * results stream; every stored result must count for its batch however long the job stream is, or
 * the batch's finished items run again.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { quietLog, startTestEnv, type TestEnv } from "../../test/harness/env.js";
import type { JobEvent } from "./model.js";
import { BatchStore } from "./store.js";

let env: TestEnv;
beforeAll(async () => {
  env = await startTestEnv();
});
afterAll(async () => env?.stop());

const batchId = (i: number) => `batch_${i.toString(16).padStart(32, "0")}`;

describe("batch store - restart replay", () => {
  it("a restarted store counts every stored result, even of batches created after a long job history", async () => {
    const writer = new BatchStore({ nats: env.nats, log: quietLog, name: "writer" });
    await writer.start();
    // A long job history first (file events), so the job replay takes longer than the results replay.
    const enc = new TextEncoder();
    for (let i = 0; i < 3_000; i += 500) {
      await Promise.all(
        Array.from({ length: 500 }, (_, k) => {
          const id = `file-${String(i + k).padStart(24, "0")}`;
          const ev = { type: "file", action: "created", file: { id, bytes: 10, created_at: 1, filename: "in.jsonl", purpose: "batch", owner: "u" }, at: 1 };
          return env.nats.js.publish(writer.subjects.batchFile(id), enc.encode(JSON.stringify(ev)));
        }),
      );
    }
    // More batches than the view buffers results for ahead of their created event.
    const BATCHES = 150;
    const now = Date.now();
    for (let i = 0; i < BATCHES; i++) {
      const created: JobEvent = { type: "batch", event: "created", at: now, batch: { id: batchId(i), owner: "u", endpoint: "/v1/chat/completions", input_file_id: "file-x", completion_window: "24h", metadata: null, total: 2, created_at: now, expires_at: now + 86_400_000 } };
      expect(await writer.publishJob(batchId(i), created, 0)).toBeGreaterThan(0);
    }
    await Promise.all(Array.from({ length: BATCHES }, (_, i) => writer.publishResult({ type: "batch-result", batch: batchId(i), line: 0, custom_id: "c0", response: { status_code: 200, request_id: "r", body: {} }, error: null, at: now })));
    writer.close();

    const restarted = new BatchStore({ nats: env.nats, log: quietLog, name: "restarted" });
    await restarted.start();
    try {
      const notDone = Array.from({ length: BATCHES }, (_, i) => i).filter((i) => !restarted.view.isDone(batchId(i), 0));
      expect(notDone).toEqual([]);
      expect(restarted.view.isDone(batchId(0), 1)).toBe(false);
      expect(restarted.view.live.get(batchId(BATCHES - 1))?.completed).toBe(1);
    } finally {
      restarted.close();
    }
  }, 60_000);
});
