import { describe, expect, it } from "vitest";
import type { KvBatch } from "../../schemas/events.js";
import { checkEvent } from "../../schemas/validate.js";
import { epochName, splitBatch } from "./pod-bridge.js";

const hex = (i: number) => (0x1000000000000000n + BigInt(i) * 7919n).toString(16);

describe("kv-bridge pod bridge - pure parts", () => {
  it("splits a batch over max_payload into parts that reassemble to the same blocks, in order", () => {
    const n = 1000;
    const msg: KvBatch = {
      type: "kv", model: "m", pod: "p", epoch: "0@1", seq: 9, ts: 1, dpRank: 0,
      events: [
        { kind: "all-cleared" },
        { kind: "stored", engineHashes: Array.from({ length: n }, (_, i) => hex(i)), routerHashes: Array.from({ length: n }, (_, i) => hex(i + n)), parentEngineHash: "abc", blockSize: 16, medium: "GPU", lora: null },
        { kind: "removed", engineHashes: Array.from({ length: 500 }, (_, i) => hex(i)), medium: null },
      ],
    };
    const limit = 8 * 1024;
    const parts = splitBatch(msg, limit);
    expect(parts.length).toBeGreaterThan(5);
    for (const p of parts) {
      expect(Buffer.byteLength(JSON.stringify(p))).toBeLessThanOrEqual(limit);
      expect(p).toMatchObject({ seq: 9, epoch: "0@1", pod: "p" });
      expect(checkEvent("kv", p).ok).toBe(true);
    }
    const events = parts.flatMap((p) => p.events);
    expect(events[0]).toEqual({ kind: "all-cleared" });
    const stored = events.filter((e) => e.kind === "stored");
    expect(stored.flatMap((e) => e.engineHashes)).toEqual(msg.events[1]?.kind === "stored" ? msg.events[1].engineHashes : []);
    expect(stored.flatMap((e) => e.routerHashes)).toEqual(Array.from({ length: n }, (_, i) => hex(i + n)));
    // Each piece's parent is the last block of the piece before it.
    expect(stored.map((e) => e.parentEngineHash)).toEqual(["abc", ...stored.slice(0, -1).map((e) => e.engineHashes.at(-1))]);
    expect(events.filter((e) => e.kind === "removed").flatMap((e) => e.engineHashes)).toHaveLength(500);
    expect(events.at(-1)?.kind).toBe("removed");
  });

  it("names epochs after the anchor batch's seq and engine time in microseconds", () => {
    expect(epochName(0, 1700000000.5 * 1000)).toBe("0@1700000000500000");
    expect(epochName(12, 1700000000123.25)).toBe("12@1700000000123250");
  });
});
