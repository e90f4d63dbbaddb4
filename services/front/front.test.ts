import { once } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { loadExtProc } from "../extproc/protos.js";
import type { ProcessingRequest, ProcessingResponse } from "../extproc/types.js";
import { headersToRecord, setHeader } from "../extproc/wire.js";
import { waitFor } from "../../test/harness/wait.js";
import { type FrontServer, startFront } from "./front.js";

const silent = pino({ level: "silent" });

interface StreamRecord {
  messages: ProcessingRequest[];
  /** "half-close" when the front ended the stream, "cancel" when it reset it. */
  events: string[];
}

type Script = (req: ProcessingRequest, rec: StreamRecord) => ProcessingResponse | undefined;

/** A tiny ext_proc server on Envoy's real protos; `script` answers each message (undefined = never). */
async function startTestExtProc(script: Script) {
  const streams: StreamRecord[] = [];
  const server = new grpc.Server();
  server.addService(loadExtProc().service, {
    Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
      const rec: StreamRecord = { messages: [], events: [] };
      streams.push(rec);
      call.on("data", (req: ProcessingRequest) => {
        rec.messages.push(req);
        const reply = script(req, rec);
        if (reply) call.write(reply);
      });
      // grpc-js reports a client cancel as a half-close followed shortly by "cancelled"; give the
      // reset time to land before deciding which one this was.
      call.on("end", () =>
        setTimeout(() => {
          if (call.cancelled) rec.events.push("cancel");
          else {
            rec.events.push("half-close");
            call.end();
          }
        }, 30),
      );
    },
  });
  const port = await new Promise<number>((res, rej) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))),
  );
  return { port, streams, close: () => server.forceShutdown() };
}

const cont = (phase: string, response: Record<string, unknown> = {}): ProcessingResponse => ({ [phase]: { response } }) as ProcessingResponse;

/** Routes every request to `endpoint` on the body reply; continues everything else. */
function router(endpoint: string, extra: Partial<Record<string, Script>> = {}): Script {
  return (req, rec) => {
    const phase = req.request as string;
    const custom = extra[phase]?.(req, rec);
    if (custom) return custom;
    if (phase === "request_body" || (phase === "request_headers" && req.request_headers?.end_of_stream)) {
      return cont(phase, { header_mutation: { set_headers: [setHeader("x-gateway-destination-endpoint", endpoint)] }, clear_route_cache: true });
    }
    return cont(phase);
  };
}

interface UpstreamRecord {
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  aborted: boolean;
}

async function startUpstream(handler: (req: http.IncomingMessage, res: http.ServerResponse, rec: UpstreamRecord) => void) {
  const seen: UpstreamRecord[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const rec: UpstreamRecord = { headers: req.headers, body: Buffer.concat(chunks), aborted: false };
      seen.push(rec);
      res.on("close", () => {
        if (!res.writableFinished) rec.aborted = true;
      });
      handler(req, res, rec);
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const port = (server.address() as AddressInfo).port;
  return {
    endpoint: `127.0.0.1:${port}`,
    seen,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

interface ClientResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

function send(port: number, opts: { method?: string; path?: string; headers?: Record<string, string>; body?: string | Buffer } = {}) {
  return new Promise<ClientResponse>((resolve, reject) => {
    const req = http.request(
      { host: "127.0.0.1", port, method: opts.method ?? "POST", path: opts.path ?? "/v1/chat/completions", headers: opts.headers, agent: false },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(opts.body);
  });
}

const chatBody = JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] });
const jsonHeaders = { "content-type": "application/json" };

describe("front - proxying through ext_proc", () => {
  const cleanups: Array<() => unknown> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  });
  async function setup(script: (upstream: string) => Script, upstreamHandler: Parameters<typeof startUpstream>[0], frontOpts: { messageTimeoutMs?: number; maxRequestBodyBytes?: number } = {}) {
    const upstream = await startUpstream(upstreamHandler);
    cleanups.push(upstream.close);
    const ext = await startTestExtProc(script(upstream.endpoint));
    cleanups.push(ext.close);
    const front: FrontServer = await startFront({ port: 0, gateways: [`127.0.0.1:${ext.port}`], logger: silent, ...frontOpts });
    cleanups.push(front.close);
    return { upstream, ext, front };
  }

  it("streams SSE chunks to the client as the upstream produces them", async () => {
    let clientGotFirst!: () => void;
    const firstSeen = new Promise<void>((r) => (clientGotFirst = r));
    let upstreamWaited = "";
    const { ext, front } = await setup(
      (ep) => router(ep),
      (_req, res) => {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write("data: 1\n\n");
        const timeout = new Promise<string>((r) => setTimeout(() => r("timed out"), 3_000));
        void Promise.race([firstSeen.then(() => "client saw chunk 1"), timeout]).then((what) => {
          upstreamWaited = what;
          res.end("data: [DONE]\n\n");
        });
      },
    );
    const body = await new Promise<string>((resolve, reject) => {
      const req = http.request({ port: front.port, host: "127.0.0.1", method: "POST", path: "/v1/chat/completions", headers: jsonHeaders }, (res) => {
        let text = "";
        res.on("data", (c: Buffer) => {
          text += c.toString();
          if (text.includes("data: 1")) clientGotFirst();
        });
        res.on("end", () => resolve(text));
      });
      req.on("error", reject);
      req.end(chatBody);
    });
    expect(upstreamWaited).toBe("client saw chunk 1");
    expect(body).toBe("data: 1\n\ndata: [DONE]\n\n");
    await waitFor(() => ext.streams[0]?.events.length === 1, 5_000, "the ext_proc stream's half-close");
    const phases = ext.streams[0]?.messages.map((m) => m.request);
    expect(phases).toEqual(["request_headers", "request_body", "response_headers", "response_body", "response_body", "response_body"]);
    const bodies = ext.streams[0]?.messages.filter((m) => m.request === "response_body").map((m) => m.response_body);
    expect(bodies?.map((b) => Buffer.from(b?.body ?? []).toString())).toEqual(["data: 1\n\n", "data: [DONE]\n\n", ""]);
    expect(bodies?.map((b) => b?.end_of_stream ?? false)).toEqual([false, false, true]);
    expect(ext.streams[0]?.events).toEqual(["half-close"]);
  });

  it("sends Envoy's request headers and applies header and body mutations to the upstream request", async () => {
    const { ext, front, upstream } = await setup(
      (ep) =>
        router(ep, {
          request_headers: () => cont("request_headers", { header_mutation: { remove_headers: ["x-drop"], set_headers: [setHeader("x-early", "1")] } }),
          request_body: () =>
            cont("request_body", {
              header_mutation: { set_headers: [setHeader("x-gateway-destination-endpoint", `${ep},10.9.9.9:1`), setHeader("x-routed-by", "test")] },
              body_mutation: { body: Buffer.from('{"model":"rewritten"}') },
            }),
        }),
      (_req, res) => res.end("ok"),
    );
    const r = await send(front.port, { headers: { ...jsonHeaders, "x-drop": "secret", "x-keep": "yes" }, body: chatBody });
    expect(r.status).toBe(200);
    expect(r.body).toBe("ok");
    const up = upstream.seen[0];
    expect(up?.headers["x-routed-by"]).toBe("test");
    expect(up?.headers["x-early"]).toBe("1");
    expect(up?.headers["x-keep"]).toBe("yes");
    expect(up?.headers["x-drop"]).toBeUndefined();
    expect(up?.body.toString()).toBe('{"model":"rewritten"}');
    expect(up?.headers["content-length"]).toBe(String(Buffer.byteLength('{"model":"rewritten"}')));
    const sent = headersToRecord(ext.streams[0]?.messages[0]?.request_headers?.headers);
    expect(sent).toMatchObject({ ":method": "POST", ":path": "/v1/chat/completions", ":scheme": "http", "x-forwarded-proto": "http", "x-forwarded-for": "127.0.0.1" });
    expect(sent[":authority"]).toBe(`127.0.0.1:${front.port}`);
    expect(sent["x-request-id"]).toMatch(/^[0-9a-f-]{36}$/);
    expect(ext.streams[0]?.messages[0]?.request_headers?.end_of_stream ?? false).toBe(false);
  });

  it("passes the client's authorization header to the processor and, unless removed, to the upstream", async () => {
    const { ext, front, upstream } = await setup(
      (ep) => router(ep),
      (_req, res) => res.end("ok"),
    );
    const r = await send(front.port, { headers: { ...jsonHeaders, authorization: "Bearer jr-test-key" }, body: chatBody });
    expect(r.status).toBe(200);
    expect(headersToRecord(ext.streams[0]?.messages[0]?.request_headers?.headers).authorization).toBe("Bearer jr-test-key");
    expect(upstream.seen[0]?.headers.authorization).toBe("Bearer jr-test-key");
  });

  it("passes an immediate response through with its status, headers and body", async () => {
    const { front, upstream } = await setup(
      () => (req) =>
        req.request === "request_headers"
          ? {
              immediate_response: {
                status: { code: 429 },
                headers: { set_headers: [setHeader("content-type", "application/json"), setHeader("retry-after", "1")] },
                body: Buffer.from('{"error":{"message":"shed","code":429}}'),
              },
            }
          : undefined,
      (_req, res) => res.end("should not be reached"),
    );
    const r = await send(front.port, { headers: jsonHeaders, body: chatBody });
    expect(r.status).toBe(429);
    expect(r.headers["content-type"]).toBe("application/json");
    expect(r.headers["retry-after"]).toBe("1");
    expect(r.body).toBe('{"error":{"message":"shed","code":429}}');
    expect(upstream.seen).toHaveLength(0);
  });

  it("gives an immediate response without a content type Envoy's text/plain", async () => {
    const { front } = await setup(
      () => (req) => (req.request === "request_body" ? { immediate_response: { status: { code: 400 }, body: Buffer.from("bad") } } : cont(req.request as string)),
      (_req, res) => res.end(),
    );
    const r = await send(front.port, { headers: jsonHeaders, body: chatBody });
    expect([r.status, r.headers["content-type"], r.body]).toEqual([400, "text/plain", "bad"]);
  });

  it("applies response body mutations chunk by chunk", async () => {
    const { front } = await setup(
      (ep) =>
        router(ep, {
          response_body: (req) => {
            const text = Buffer.from(req.response_body?.body ?? []).toString();
            return cont("response_body", { body_mutation: { body: Buffer.from(text.toUpperCase()) } });
          },
          response_headers: () => cont("response_headers", { header_mutation: { set_headers: [setHeader("x-served-by", "gw")] } }),
        }),
      (_req, res) => {
        res.writeHead(200, { "content-type": "text/plain", "content-length": "5" });
        res.end("hello");
      },
    );
    const r = await send(front.port, { headers: jsonHeaders, body: chatBody });
    expect([r.status, r.body, r.headers["x-served-by"]]).toEqual([200, "HELLO", "gw"]);
  });

  it("cancels the ext_proc stream and aborts the upstream when the client disconnects", async () => {
    const { ext, front, upstream } = await setup(
      (ep) => router(ep),
      (_req, res) => {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write("data: 1\n\n");
        // Never finishes on its own: only the disconnect can end this request.
      },
    );
    await new Promise<void>((resolve, reject) => {
      const req = http.request({ port: front.port, host: "127.0.0.1", method: "POST", path: "/v1/chat/completions", headers: jsonHeaders }, (res) => {
        res.once("data", () => {
          req.destroy();
          resolve();
        });
      });
      req.on("error", () => {});
      req.on("timeout", () => reject(new Error("no first chunk")));
      req.end(chatBody);
    });
    await waitFor(() => (ext.streams[0]?.events.length ?? 0) > 0 && upstream.seen[0]?.aborted === true, 5_000, "the ext_proc stream's cancel and the upstream abort");
    expect(ext.streams[0]?.events).toEqual(["cancel"]);
    expect(upstream.seen[0]?.aborted).toBe(true);
  });

  it("answers 503 in the OpenAI error shape when the gateway names no endpoint, through the response phases", async () => {
    const { ext, front } = await setup(
      () => (req) => cont(req.request as string),
      (_req, res) => res.end(),
    );
    const r = await send(front.port, { headers: jsonHeaders, body: chatBody });
    expect(r.status).toBe(503);
    expect(r.headers["content-type"]).toBe("application/json");
    const err = JSON.parse(r.body) as { error: { message: string; type: string; code: number; param: null } };
    expect(err.error).toMatchObject({ type: "api_error", code: 503, param: null });
    expect(err.error.message).toMatch(/no healthy upstream/);
    const rh = ext.streams[0]?.messages.find((m) => m.request === "response_headers");
    expect(headersToRecord(rh?.response_headers?.headers)[":status"]).toBe("503");
  });

  it("answers 502 when the upstream refuses the connection", async () => {
    const dead = await startUpstream(() => {});
    const deadEndpoint = dead.endpoint;
    dead.close();
    const { front } = await setup(
      () => router(deadEndpoint),
      (_req, res) => res.end(),
    );
    const r = await send(front.port, { headers: jsonHeaders, body: chatBody });
    expect(r.status).toBe(502);
    expect(JSON.parse(r.body)).toMatchObject({ error: { type: "api_error", code: 502, param: null } });
  });

  it("answers 500 when the ext_proc stream fails and 504 when a reply times out", async () => {
    const failing = await setup(
      () => (req) => (req.request === "request_body" ? undefined : cont(req.request as string)),
      (_req, res) => res.end(),
      { messageTimeoutMs: 150 },
    );
    const timedOut = await send(failing.front.port, { headers: jsonHeaders, body: chatBody });
    expect(timedOut.status).toBe(504);
    expect(JSON.parse(timedOut.body)).toMatchObject({ error: { code: 504 } });

    const ext = await startTestExtProc(() => undefined);
    cleanups.push(ext.close);
    const server = new grpc.Server();
    server.addService(loadExtProc().service, {
      Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) =>
        call.on("data", () => call.emit("error", { code: grpc.status.INTERNAL, details: "boom" })),
    });
    const port = await new Promise<number>((res, rej) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))),
    );
    cleanups.push(() => server.forceShutdown());
    const front = await startFront({ port: 0, gateways: [`127.0.0.1:${port}`], logger: silent });
    cleanups.push(front.close);
    const r = await send(front.port, { headers: jsonHeaders, body: chatBody });
    expect(r.status).toBe(500);
    expect(JSON.parse(r.body)).toMatchObject({ error: { type: "api_error", code: 500, message: `ext_proc_error_gRPC_error_${grpc.status.INTERNAL}` } });
  });

  it("answers 413 when the body exceeds the buffer limit", async () => {
    const { front, upstream } = await setup(
      (ep) => router(ep),
      (_req, res) => res.end(),
      { maxRequestBodyBytes: 1024 },
    );
    const r = await send(front.port, { headers: jsonHeaders, body: Buffer.alloc(4096, "a") });
    expect(r.status).toBe(413);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 413, type: "invalid_request_error" } });
    expect(upstream.seen).toHaveLength(0);
  });

  it("skips a gateway that refuses connections and round-robins over the rest", async () => {
    const upstream = await startUpstream((_req, res) => res.end("ok"));
    cleanups.push(upstream.close);
    const a = await startTestExtProc(router(upstream.endpoint));
    const b = await startTestExtProc(router(upstream.endpoint));
    const dead = await startTestExtProc(() => undefined);
    dead.close();
    cleanups.push(a.close, b.close);
    const front = await startFront({ port: 0, gateways: [`127.0.0.1:${dead.port}`, `127.0.0.1:${a.port}`, `127.0.0.1:${b.port}`], logger: silent });
    cleanups.push(front.close);
    const results = [];
    for (let i = 0; i < 6; i++) results.push(await send(front.port, { headers: jsonHeaders, body: chatBody }));
    expect(results.map((r) => r.status)).toEqual([200, 200, 200, 200, 200, 200]);
    expect(a.streams.length).toBeGreaterThanOrEqual(2);
    expect(b.streams.length).toBeGreaterThanOrEqual(2);
  });

  it("sends a body-less request's headers with end_of_stream and no body message", async () => {
    const { ext, front } = await setup(
      (ep) => router(ep),
      (_req, res) => res.end("models"),
    );
    const r = await send(front.port, { method: "GET", path: "/v1/models" });
    expect([r.status, r.body]).toEqual([200, "models"]);
    expect(ext.streams[0]?.messages[0]?.request_headers?.end_of_stream).toBe(true);
    expect(ext.streams[0]?.messages.map((m) => m.request)).not.toContain("request_body");
  });
});
