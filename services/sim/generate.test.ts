import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import type { SimClock } from "./clock.js";
import { SimEngine } from "./engine.js";
import { testEngineConfig } from "./testing.js";
import { type HeldBlocks, serveGeneration } from "./generate.js";

const config = testEngineConfig;

/**
 * A loaded host: wall time passes between any two readings, so simulated time jumps ahead of the
 * engine. Every reading is `stepMs` later than the one before.
 */
function jumpingClock(stepMs: number): SimClock {
  let t = 0;
  return {
    now: () => (t += stepMs),
    at: (_atMs, fn) => {
      const timer = setTimeout(fn, 0);
      return () => clearTimeout(timer);
    },
  };
}

const servers: http.Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

describe("serveGeneration", () => {
  it("a held request the engine finishes inside submit (its clock behind the host's) still hands over its blocks", async () => {
    // Each reading of the clock 10 s later: the prefill step (64 tokens, 64 ms) is over before
    // submit returns, so the engine finishes the request synchronously.
    const engine = new SimEngine(config, jumpingClock(10_000));
    const handed: HeldBlocks[] = [];
    const server = http.createServer((_req, res) => {
      serveGeneration(
        res,
        engine,
        { model: "m", promptTokens: Array.from({ length: 64 }, (_, i) => 100 + i), maxTokens: 1, stream: false, includeUsage: false, seed: 1, cacheSalt: undefined },
        "completion",
        "req-sync",
        {
          hold: {
            async after(kv) {
              handed.push(kv);
              return { kv_transfer_params: { remote_block_ids: kv.blockIds } };
            },
          },
        },
      );
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const res = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`, { method: "POST" });
    const body = (await res.json()) as { kv_transfer_params?: { remote_block_ids: number[] }; usage?: { completion_tokens: number } };
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(handed).toHaveLength(1);
    // The prompt's 64 tokens, 16 a block: its 4 blocks are handed over to the decode.
    expect(body.kv_transfer_params?.remote_block_ids).toHaveLength(4);
    expect(body.usage?.completion_tokens).toBe(1);
    handed[0]?.release();
    engine.close();
  });
});
