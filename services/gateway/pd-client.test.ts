/** The P/D leg client against a real HTTP server: headers sent, and how each failure is classified. */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort } from "../shared/nats-server.js";
import { PdHttpClient } from "./pd-client.js";
import { LegError } from "../routing/stages/pd-legs.js";

describe("pd-client - one POST per leg", () => {
  let server: http.Server;
  let address = "";
  const seen: Array<Record<string, string | string[] | undefined>> = [];
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      seen.push(req.headers);
      if (req.url === "/hang") return; // never answers
      if (req.url === "/big") return void res.end(Buffer.alloc(2048, 120));
      if (req.url === "/trickle") {
        // Headers at once, then a byte every 20 ms for ever: no pause is long, the whole is.
        res.writeHead(200, { "content-type": "application/json" });
        const t = setInterval(() => res.write(" "), 20);
        res.on("close", () => clearInterval(t));
        return;
      }
      req.resume();
      req.on("end", () => res.writeHead(req.url === "/busy" ? 503 : 200, { "content-type": "application/json" }).end('{"ok":true}'));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  const failureOf = (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => (e instanceof LegError ? e.failure : e));

  it("sends the body with its length and the engines' API key; an engine status comes back as an answer", async () => {
    const c = new PdHttpClient({ engineApiKey: "sk-engine" });
    const ok = await c.post(address, "/v1/chat/completions", Buffer.from('{"a":1}'), { "content-type": "application/json", "x-request-id": "jr-1" }, { timeoutMs: 2_000 });
    expect([ok.status, ok.body.toString()]).toEqual([200, '{"ok":true}']);
    expect(seen.at(-1)).toMatchObject({ authorization: "Bearer sk-engine", "content-length": "7", "x-request-id": "jr-1" });
    expect((await c.post(address, "/busy", Buffer.from("{}"), {}, { timeoutMs: 2_000 })).status).toBe(503);
    await c.close();
  });

  it("one deadline covers the whole attempt: an answer that keeps trickling still times out", async () => {
    const c = new PdHttpClient();
    const t0 = performance.now();
    expect(await failureOf(c.post(address, "/trickle", Buffer.from("{}"), {}, { timeoutMs: 300 }))).toEqual({ kind: "timeout" });
    expect(performance.now() - t0).toBeLessThan(3_000);
    await c.close();
  });

  it("classifies a timeout, a refused connection, a client cancel and an oversized answer", async () => {
    const c = new PdHttpClient({ maxAnswerBytes: 1024 });
    expect(await failureOf(c.post(address, "/hang", Buffer.from("{}"), {}, { timeoutMs: 100 }))).toEqual({ kind: "timeout" });
    const closed = `127.0.0.1:${await freePort()}`;
    expect(await failureOf(c.post(closed, "/x", Buffer.from("{}"), {}, { timeoutMs: 2_000 }))).toEqual({ kind: "connect", code: "ECONNREFUSED" });
    const ctl = new AbortController();
    const pending = failureOf(c.post(address, "/hang", Buffer.from("{}"), {}, { signal: ctl.signal, timeoutMs: 5_000 }));
    ctl.abort();
    expect(await pending).toEqual({ kind: "cancelled" });
    expect(await failureOf(c.post(address, "/big", Buffer.from("{}"), {}, { timeoutMs: 2_000 }))).toEqual({ kind: "connect", code: "answer-too-large" });
    expect(seen.at(-1)?.authorization).toBeUndefined();
    await c.close();
  });
});
