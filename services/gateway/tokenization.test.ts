import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { quietLog, waitFor } from "../../test/harness/env.js";
import { type SimFleet, startSimFleet } from "../sim/fleet.js";
import { tokenizeChat } from "../tokenizer/sim-tokenizer.js";
import { approximateTokens } from "../tokenizer/prompt-tokens.js";
import { cacheEntryBytes, Tokenizer } from "./tokenization.js";

const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Hello there" },
];

describe("tokenization - remote, local, approximate", () => {
  let fleet: SimFleet;
  let slow: http.Server;
  let slowAddress = "";
  beforeAll(async () => {
    fleet = await startSimFleet({ pods: 1, model: "m", kvEvents: false, logger: quietLog });
    slow = http.createServer(() => undefined); // never answers
    await new Promise<void>((r) => slow.listen(0, "127.0.0.1", r));
    slowAddress = `127.0.0.1:${(slow.address() as { port: number }).port}`;
  });
  afterAll(async () => {
    slow?.closeAllConnections();
    slow?.close();
    await fleet?.close();
  });

  it("remote asks the engine's /tokenize with messages (chat template applied) and caches the answer", async () => {
    const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 1_000 });
    const address = fleet.pods[0]?.address as string;
    const a = await t.tokenize("m", { messages }, address);
    expect(a.mode).toBe("remote");
    expect(Array.from(a.tokens)).toEqual(tokenizeChat(messages, { addGenerationPrompt: true }));
    const b = await t.tokenize("m", { messages }, address);
    expect(b.cached).toBe(true);
    expect(t.stats).toMatchObject({ remote: 1, cacheHits: 1, fallbacks: 0 });
  });

  it("a slow engine makes that request approximate, counted", async () => {
    const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 100 });
    const r = await t.tokenize("m", { messages }, slowAddress);
    expect(r.mode).toBe("approximate");
    expect(r.tokens).toEqual(approximateTokens({ messages }));
    expect(t.stats.fallbacks).toBe(1);
  });

  it("an answer whose ids are not integers in 0..2^32-1 is not used: that request is approximate, counted, not cached", async () => {
    const answers: unknown[][] = [[1, 1.5], [1, -1], [1, 2 ** 32 + 5], [1, "2"]];
    let next = 0;
    const bad = http.createServer((_req, res) => {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ tokens: answers[next++ % answers.length] }));
    });
    await new Promise<void>((r) => bad.listen(0, "127.0.0.1", r));
    try {
      const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 1_000 });
      const address = `127.0.0.1:${(bad.address() as { port: number }).port}`;
      for (let i = 0; i < answers.length; i++) {
        const r = await t.tokenize("m", { messages }, address);
        expect(r.mode).toBe("approximate");
        expect(r.tokens).toEqual(approximateTokens({ messages }));
      }
      expect(next).toBe(answers.length);
      expect(t.stats).toMatchObject({ cacheHits: 0, fallbacks: answers.length });
    } finally {
      bad.closeAllConnections();
      bad.close();
    }
  });

  it("modes are per model", async () => {
    const t = new Tokenizer({ defaultMode: "approximate", modes: { exact: "local" } });
    expect(Array.from((await t.tokenize("exact", { messages }, undefined)).tokens)).toEqual(tokenizeChat(messages, { addGenerationPrompt: true }));
    expect((await t.tokenize("other", { messages }, undefined)).mode).toBe("approximate");
  });
});

/** A fake engine: `/tokenize` answers one token per prompt character; `/endless` never stops answering. */
async function startFakeEngine(): Promise<{ address: string; sent: () => number; closed: () => number; close(): Promise<void> }> {
  let sent = 0;
  let closed = 0;
  const srv = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d: Buffer) => {
      body += d.toString();
    });
    req.on("end", () => {
      const prompt = (JSON.parse(body || "{}") as { prompt?: string }).prompt ?? "";
      if (prompt.startsWith("endless")) {
        // Chunked, no content-length: only reading with a cap stops it.
        res.writeHead(200, { "content-type": "application/json" });
        res.write('{"tokens":[1');
        const chunk = ",1".repeat(32 * 1024);
        const pump = () => {
          while (!res.destroyed && res.write(chunk)) sent += chunk.length;
          if (!res.destroyed) res.once("drain", pump);
        };
        res.on("close", () => void closed++);
        pump();
        return;
      }
      if (prompt.startsWith("declared")) {
        // Says it is huge up front: refused before a byte of the body is read.
        res.writeHead(200, { "content-type": "application/json", "content-length": String(512 * 1024 * 1024) });
        res.write('{"tokens":[');
        res.on("close", () => void closed++);
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ tokens: Array.from({ length: prompt.length }, (_, i) => i % 50_000) }));
    });
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  return {
    address: `127.0.0.1:${(srv.address() as { port: number }).port}`,
    sent: () => sent,
    closed: () => closed,
    async close() {
      srv.closeAllConnections();
      await new Promise((r) => srv.close(r));
    },
  };
}

describe("tokenization - bounded in bytes: what is read and what is cached", () => {
  let engine: Awaited<ReturnType<typeof startFakeEngine>>;
  beforeAll(async () => {
    engine = await startFakeEngine();
  });
  afterAll(async () => engine?.close());

  it("an endless /tokenize answer is cut at the cap (not buffered whole, not waited out): that request is approximate, counted", async () => {
    const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 10_000, maxResponseBytes: 256 * 1024 });
    const t0 = performance.now();
    const r = await t.tokenize("m", { prompt: "endless please" }, engine.address);
    expect(performance.now() - t0).toBeLessThan(5_000);
    expect(r.mode).toBe("approximate");
    expect(r.tokens).toEqual(approximateTokens({ prompt: "endless please" }));
    expect(t.stats).toMatchObject({ remote: 1, fallbacks: 1, oversized: 1, cacheEntries: 0 });
    // The connection was closed on the engine: it stops sending instead of streaming forever.
    await waitFor(() => engine.closed() > 0, 5_000, "the engine to see its connection closed");
    expect(engine.closed()).toBeGreaterThan(0);
  });

  it("a content-length over the cap is refused before reading the body", async () => {
    const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 10_000 }); // default cap: 8 MiB
    const r = await t.tokenize("m", { prompt: "declared huge" }, engine.address);
    expect(r.mode).toBe("approximate");
    expect(t.stats).toMatchObject({ fallbacks: 1, oversized: 1 });
  });

  it("a few huge prompts cannot push the cache past its byte bound; least recently used go first", async () => {
    const cacheBytes = 512 * 1024;
    const t = new Tokenizer({ defaultMode: "remote", timeoutMs: 5_000, cacheBytes });
    // ~50,000 tokens each, kept as a Uint32Array: ~200 KB apiece, so at most two fit.
    const prompt = (c: string) => c.repeat(50_000);
    for (const c of ["a", "b", "c"]) {
      const r = await t.tokenize("m", { prompt: prompt(c) }, engine.address);
      expect(r).toMatchObject({ mode: "remote" });
      expect(r.tokens).toHaveLength(50_000);
      expect(t.stats.cacheBytes).toBeLessThanOrEqual(cacheBytes);
    }
    expect(t.stats).toMatchObject({ cacheEntries: 2, cacheEvicted: 1 });
    expect(t.stats.cacheBytes).toBe(2 * cacheEntryBytes("x".repeat(28), new Array(50_000).fill(0)));
    // "b" used again: "c" becomes the least recently used and is the one a new prompt evicts.
    expect((await t.tokenize("m", { prompt: prompt("b") }, engine.address)).cached).toBe(true);
    await t.tokenize("m", { prompt: prompt("d") }, engine.address);
    expect((await t.tokenize("m", { prompt: prompt("b") }, engine.address)).cached).toBe(true);
    expect((await t.tokenize("m", { prompt: prompt("c") }, engine.address)).cached).toBeUndefined();
    expect(t.stats.cacheBytes).toBeLessThanOrEqual(cacheBytes);
    // One result larger than the whole bound is used but never cached (it would evict everything).
    const big = await t.tokenize("m", { prompt: "e".repeat(200_000) }, engine.address);
    expect(big.tokens).toHaveLength(200_000);
    expect(t.stats.cacheEntries).toBe(2);
    expect(t.stats.cacheBytes).toBeLessThanOrEqual(cacheBytes);
  });
});
