/**
 * Engine and endpoint answers are bounded (docs/security.md, "Threat model"): the calls the
 * jetroute processes make to engines follow no redirect, read at most a bound of each answer
 * (refusing early on a declared `content-length`) and drop error bodies unread. Real HTTP servers
 * stand for hostile engines.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { EmbeddingClient } from "../services/gateway/embeddings.js";
import { PdHttpClient } from "../services/gateway/pd-client.js";
import { ModelDiscovery } from "../services/pod-watcher/model-discovery.js";
import { BodyTooLargeError, declaredTooLarge, readBodyCapped } from "../services/shared/http-body.js";
import type { PodInfo } from "../services/views/pod-set.js";
import { waitFor } from "./harness/env.js";

interface Engine {
  address: string;
  requests: number;
  /** Bytes of answer body written before the client went away. */
  sent: number;
  closed: boolean;
  server: http.Server;
}

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

async function engine(handle: (req: http.IncomingMessage, res: http.ServerResponse, e: Engine) => void): Promise<Engine> {
  const e = { address: "", requests: 0, sent: 0, closed: false } as Engine;
  e.server = http.createServer((req, res) => {
    e.requests++;
    res.on("close", () => {
      e.closed = true;
    });
    req.resume();
    req.on("end", () => handle(req, res, e));
  });
  servers.push(e.server);
  await new Promise<void>((r) => e.server.listen(0, "127.0.0.1", r));
  e.address = `127.0.0.1:${(e.server.address() as AddressInfo).port}`;
  return e;
}

/** Streams `total` bytes of JSON-ish filler, chunked, honouring backpressure, until done or the client leaves. */
function stream(res: http.ServerResponse, e: Engine, total: number, head = '{"data":[', status = 200) {
  res.writeHead(status, { "content-type": "application/json" });
  res.write(head);
  const chunk = Buffer.alloc(256 * 1024, "1");
  const more = () => {
    while (e.sent < total && !res.destroyed) {
      e.sent += chunk.length;
      if (!res.write(chunk)) return void res.once("drain", more);
    }
    if (!res.destroyed) res.end("]}");
  };
  more();
}

const podAt = (address: string): PodInfo => ({ model: "embed", pod: "e0", address, ready: true, engine: "vllm" }) as unknown as PodInfo;

describe("the body cap rule", () => {
  it("refuses on a declared content-length above the bound; a missing or odd header refuses nothing", () => {
    expect(declaredTooLarge("2000000", 1_000_000)).toBe(true);
    expect(declaredTooLarge("1000000", 1_000_000)).toBe(false);
    expect(declaredTooLarge(null, 1)).toBe(false);
    expect(declaredTooLarge("-5", 1)).toBe(false);
    expect(declaredTooLarge("1e9", 1)).toBe(false);
    expect(declaredTooLarge(["5000"], 10)).toBe(true);
  });

  it("readBodyCapped refuses a declared 150 MiB answer at once, before its body comes", async () => {
    const e = await engine((_req, res) => {
      res.writeHead(200, { "content-length": String(150 * 1024 * 1024) });
      res.write("{");
      // ...and nothing more: a reader that waited for the body would hang here.
    });
    const res = await fetch(`http://${e.address}/`);
    await expect(readBodyCapped(res, 1024 * 1024, "answer")).rejects.toBeInstanceOf(BodyTooLargeError);
    await waitFor(() => e.closed, 5_000, "the connection to close");
  });
});

describe("embeddings (virtual models' similarity signals)", () => {
  it("a redirect is refused: the prompts are not re-posted to the redirect target", async () => {
    const target = await engine((_req, res) => res.end(JSON.stringify({ data: [{ index: 0, embedding: [1, 0] }] })));
    const redirector = await engine((_req, res) => {
      res.writeHead(307, { location: `http://${target.address}/v1/embeddings` });
      res.end();
    });
    const events: string[] = [];
    const c = new EmbeddingClient({ readyPods: () => [podAt(redirector.address)], observe: (x) => void events.push(x) });
    expect(await c.embed("embed", ["secret prompt"], 3_000)).toBeUndefined();
    expect(redirector.requests).toBe(1);
    expect(target.requests).toBe(0);
    expect(events).toContain("error");
  });

  it("an answer streaming 150 MiB is cut at the bound, not read whole", async () => {
    const e = await engine((_req, res, eng) => stream(res, eng, 150 * 1024 * 1024));
    const c = new EmbeddingClient({ readyPods: () => [podAt(e.address)], maxAnswerBytes: 2 * 1024 * 1024 });
    expect(await c.embed("embed", ["x"], 4_000)).toBeUndefined();
    await waitFor(() => e.closed, 5_000, "the engine's connection to close");
    // The bound plus what the socket buffers held: far from 150 MiB.
    expect(e.sent).toBeLessThan(32 * 1024 * 1024);
  });

  it("an error answer's body is dropped unread", async () => {
    const e = await engine((_req, res, eng) => stream(res, eng, 150 * 1024 * 1024, "", 500));
    const c = new EmbeddingClient({ readyPods: () => [podAt(e.address)] });
    expect(await c.embed("embed", ["x"], 4_000)).toBeUndefined();
    await waitFor(() => e.closed, 5_000, "the engine's connection to close");
    expect(e.sent).toBeLessThan(32 * 1024 * 1024);
  });
});

describe("model discovery (GET /v1/models of InferencePool endpoints)", () => {
  it("a 150 MiB answer is cut at 1 MiB, not read whole before the check", async () => {
    const e = await engine((_req, res, eng) => stream(res, eng, 150 * 1024 * 1024));
    const d = new ModelDiscovery({ changed: () => undefined, timeoutMs: 20_000 });
    d.track([e.address]);
    await waitFor(() => d.attempted(e.address), 20_000, "the ask to end");
    d.stop();
    expect(d.known.has(e.address)).toBe(false);
    await waitFor(() => e.closed, 5_000, "the engine's connection to close");
    expect(e.sent).toBeLessThan(32 * 1024 * 1024);
  });

  it("a redirect is not followed", async () => {
    const target = await engine((_req, res) => res.end(JSON.stringify({ object: "list", data: [{ id: "team-b/private-model", object: "model" }] })));
    const redirector = await engine((_req, res) => {
      res.writeHead(302, { location: `http://${target.address}/v1/models` });
      res.end();
    });
    const d = new ModelDiscovery({ changed: () => undefined });
    d.track([redirector.address]);
    await waitFor(() => d.attempted(redirector.address), 5_000, "the ask to end");
    d.stop();
    expect(d.known.has(redirector.address)).toBe(false);
    expect(target.requests).toBe(0);
  });
});

describe("P/D prefill legs", () => {
  it("an answer declaring more than the bound is refused at its headers, not waited for", async () => {
    const e = await engine((_req, res) => {
      res.writeHead(200, { "content-length": String(10 * 1024 * 1024) });
      res.write("{");
    });
    const c = new PdHttpClient({ maxAnswerBytes: 1024 * 1024 });
    try {
      await expect(c.post(e.address, "/v1/completions", Buffer.from("{}"), { "content-type": "application/json" }, { timeoutMs: 10_000 })).rejects.toMatchObject({ failure: { kind: "connect", code: "answer-too-large" } });
    } finally {
      await c.close();
    }
  });
});
