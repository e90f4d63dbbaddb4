import * as grpc from "@grpc/grpc-js";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  ExtProcClient,
  ExtProcExchangeEndedError,
  ExtProcSpuriousResponseError,
  ExtProcStreamClosedError,
  ExtProcStreamError,
  ExtProcTimeoutError,
  applyHeaderSetEntries,
} from "./envoy-client.js";
import { waitFor } from "../../test/harness/wait.js";
import { startNoopExtProc, type NoopExtProcServer } from "./noop-server.js";
import { loadExtProc } from "./protos.js";
import type { ProcessingRequest, ProcessingResponse } from "./types.js";
import { fromProtoStruct, headersToRecord, setHeader, toProtoStruct } from "./wire.js";

const REQ = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "front.local", "content-type": "application/json" };

/** A scriptable ext_proc server recording what arrives, for behaviours the no-op server never shows. */
async function startScripted(
  onMessage: (req: ProcessingRequest, call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => void,
  opts: { finishOnHalfClose?: boolean; finishDelayMs?: number } = {},
) {
  const received: ProcessingRequest[] = [];
  const events: string[] = [];
  const server = new grpc.Server();
  server.addService(loadExtProc().service, {
    Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
      call.on("data", (req: ProcessingRequest) => {
        received.push(req);
        onMessage(req, call);
      });
      call.on("end", () => {
        events.push("end");
        if (opts.finishOnHalfClose === false) return;
        const finish = () => {
          events.push(call.cancelled ? "finish-after-cancel" : "finish");
          call.end();
        };
        if (opts.finishDelayMs) setTimeout(finish, opts.finishDelayMs);
        else finish();
      });
      call.on("cancelled", () => events.push("cancelled"));
    },
  });
  const port = await new Promise<number>((res, rej) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))),
  );
  return { port, received, events, close: () => server.forceShutdown() };
}

describe("envoy-client - against the no-op server", () => {
  let noop: NoopExtProcServer;
  let client: ExtProcClient;
  beforeAll(async () => {
    noop = await startNoopExtProc({ endpoint: "10.0.0.7:8000" });
    client = new ExtProcClient(`127.0.0.1:${noop.port}`);
  });
  afterAll(async () => {
    client.close();
    await noop.close();
  });

  it("runs all four phases and decodes the endpoint header and envoy.lb metadata", async () => {
    const ex = client.open();
    const h = await ex.requestHeaders(REQ);
    expect(h).toMatchObject({ kind: "continue", clearRouteCache: false, headerMutation: { set: {}, remove: [] } });
    const b = await ex.requestBody(Buffer.from(JSON.stringify({ model: "m", messages: [] })));
    if (b.kind !== "continue") throw new Error("expected continue");
    expect(b.headerMutation.set).toEqual({ "x-gateway-destination-endpoint": "10.0.0.7:8000" });
    expect(b.headerMutation.entries[0]?.action).toBe("overwrite-or-add");
    expect(b.clearRouteCache).toBe(true);
    expect(b.dynamicMetadata).toEqual({ "envoy.lb": { "x-gateway-destination-endpoint": "10.0.0.7:8000" } });
    expect((await ex.responseHeaders(200, { "content-type": "text/event-stream" })).kind).toBe("continue");
    expect((await ex.responseBodyChunk(Buffer.from("data: 1\n\n"), false)).kind).toBe("continue");
    expect((await ex.responseBodyChunk(Buffer.alloc(0), true)).kind).toBe("continue");
    await ex.end();
    expect(ex.closed).toBe(true);
    await expect(ex.responseBodyChunk(Buffer.from("late"), true)).rejects.toBeInstanceOf(ExtProcExchangeEndedError);
  });

  it("names the endpoint on the headers reply when the request has no body", async () => {
    const ex = client.open();
    const h = await ex.requestHeaders({ ...REQ, ":method": "GET" }, true);
    expect(h.kind === "continue" && h.headerMutation.set["x-gateway-destination-endpoint"]).toBe("10.0.0.7:8000");
    await ex.end();
  });

  it("rejects request headers without the pseudo headers Envoy always sends", async () => {
    const ex = client.open();
    await expect(ex.requestHeaders({ "content-type": "x" })).rejects.toThrow(/:method/);
    ex.cancel();
  });
});

describe("envoy-client - wire behaviour", () => {
  let server: Awaited<ReturnType<typeof startScripted>> | undefined;
  let client: ExtProcClient | undefined;
  afterEach(() => {
    client?.close();
    server?.close();
    client = undefined;
    server = undefined;
  });

  it("sends pseudo headers first as raw_value bytes and metadata_context on every message", async () => {
    server = await startScripted((req, call) => call.write({ [req.request as string]: { response: {} } }));
    client = new ExtProcClient(`127.0.0.1:${server.port}`);
    const hint = { "envoy.lb.subset_hint": { "x-gateway-destination-endpoint-subset": ["10.0.0.1:8000", "10.0.0.2:8000"] } };
    const ex = client.open({ metadataContext: hint });
    await ex.requestHeaders({ "x-b": ["1", "2"], ...REQ });
    await ex.requestBody(Buffer.from("{}"));
    await ex.end();
    const [first, second] = server.received;
    const keys = first?.request_headers?.headers?.headers?.map((h) => h.key);
    expect(keys?.slice(0, 4)).toEqual([":authority", ":path", ":method", ":scheme"]);
    expect(keys?.filter((k) => k === "x-b")).toHaveLength(2);
    const authority = first?.request_headers?.headers?.headers?.[0];
    expect(Buffer.from(authority?.raw_value ?? []).toString()).toBe("front.local");
    expect(authority?.value ?? "").toBe("");
    expect(headersToRecord(first?.request_headers?.headers)[":scheme"]).toBe("http");
    for (const m of [first, second]) {
      const ns = m?.metadata_context?.filter_metadata?.["envoy.lb.subset_hint"];
      expect(fromProtoStruct(ns)).toEqual(hint["envoy.lb.subset_hint"]);
    }
    expect(second?.request_body?.end_of_stream).toBe(true);
  });

  it("decodes an immediate response (status enum by name, headers, body) and ends the exchange", async () => {
    server = await startScripted((_req, call) =>
      call.write({
        immediate_response: {
          status: { code: 429 },
          headers: { set_headers: [setHeader("content-type", "application/json")] },
          body: Buffer.from('{"error":"slow down"}'),
          details: "shed",
        },
      }),
    );
    client = new ExtProcClient(`127.0.0.1:${server.port}`);
    const ex = client.open();
    const r = await ex.requestHeaders(REQ);
    expect(r).toEqual({
      kind: "immediate",
      status: 429,
      headers: { "content-type": "application/json" },
      body: Buffer.from('{"error":"slow down"}'),
      details: "shed",
    });
    expect(ex.closed).toBe(true);
    await expect(ex.requestBody(Buffer.from("{}"))).rejects.toBeInstanceOf(ExtProcExchangeEndedError);
    // Envoy stops talking to the processor after an immediate response: it closes the stream itself.
    await waitFor(() => server?.events.includes("end") ?? false, 5_000, "the server to see the stream end");
  });

  it("fails when a reply names another phase", async () => {
    server = await startScripted((_req, call) => call.write({ response_headers: { response: {} } }));
    client = new ExtProcClient(`127.0.0.1:${server.port}`);
    await expect(client.open().requestHeaders(REQ)).rejects.toBeInstanceOf(ExtProcSpuriousResponseError);
  });

  it("times out a message whose reply never comes", async () => {
    server = await startScripted(() => {});
    client = new ExtProcClient(`127.0.0.1:${server.port}`, { messageTimeoutMs: 100 });
    const t0 = Date.now();
    await expect(client.open().requestHeaders(REQ)).rejects.toBeInstanceOf(ExtProcTimeoutError);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(90);
    await waitFor(() => server?.events.includes("cancelled") ?? false, 5_000, "the server to see the stream cancelled");
  });

  it("reports a server error status and a clean close while a reply is awaited", async () => {
    server = await startScripted((req, call) => {
      if (req.request === "request_headers") call.emit("error", { code: grpc.status.RESOURCE_EXHAUSTED, details: "full" });
      else call.end();
    });
    client = new ExtProcClient(`127.0.0.1:${server.port}`);
    const err = await client.open().requestHeaders(REQ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ExtProcStreamError);
    expect((err as ExtProcStreamError).code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    await expect(client.open().requestBody(Buffer.from("{}"))).rejects.toBeInstanceOf(ExtProcStreamClosedError);
  });

  it("reports connection refused as UNAVAILABLE", async () => {
    const free = await startScripted(() => {});
    const port = free.port;
    free.close();
    client = new ExtProcClient(`127.0.0.1:${port}`);
    const err = await client.open().requestHeaders(REQ).catch((e: unknown) => e);
    expect((err as ExtProcStreamError).code).toBe(grpc.status.UNAVAILABLE);
  });

  it("cancel() reaches the server as a cancelled stream and rejects the awaited reply", async () => {
    server = await startScripted(() => {}, { finishOnHalfClose: false });
    client = new ExtProcClient(`127.0.0.1:${server.port}`);
    const ex = client.open();
    const p = ex.requestHeaders(REQ);
    await waitFor(() => server?.received.length === 1, 5_000, "the headers on the server");
    ex.cancel();
    await expect(p).rejects.toBeInstanceOf(ExtProcExchangeEndedError);
    await waitFor(() => server?.events.includes("cancelled") ?? false, 5_000, "the server to see the stream cancelled");
    // grpc-js servers see a client cancel as a half-close ("end") followed by "cancelled".
    expect(server.events).toEqual(["end", "cancelled"]);
  });

  const answerEach = (req: ProcessingRequest, call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) =>
    call.write({ [req.request as string]: { response: {} } });

  it("end() in graceful mode half-closes and waits for the server's status", async () => {
    server = await startScripted(answerEach, { finishDelayMs: 80 });
    client = new ExtProcClient(`127.0.0.1:${server.port}`);
    const ex = client.open();
    await ex.requestHeaders(REQ, true);
    const t0 = Date.now();
    await ex.end();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(70);
    // grpc-js 1.14 servers emit "cancelled" when any stream closes, even after a clean finish.
    await waitFor(() => server?.events.length === 3, 5_000, "three stream events on the server");
    expect(server.events).toEqual(["end", "finish", "cancelled"]);
  });

  it("end() in graceful mode cancels a server that never finishes", async () => {
    server = await startScripted(answerEach, { finishOnHalfClose: false });
    client = new ExtProcClient(`127.0.0.1:${server.port}`, { gracefulCloseTimeoutMs: 100 });
    const ex = client.open();
    await ex.requestHeaders(REQ, true);
    const t0 = Date.now();
    await ex.end();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(90);
    await waitFor(() => server?.events.includes("cancelled") ?? false, 5_000, "the server to see the stream cancelled");
    expect(server.events).toEqual(["end", "cancelled"]);
  });

  it("end() in reset mode half-closes then cancels at once, as older Envoy does", async () => {
    server = await startScripted(answerEach, { finishDelayMs: 80 });
    client = new ExtProcClient(`127.0.0.1:${server.port}`, { closeMode: "reset" });
    const ex = client.open();
    await ex.requestHeaders(REQ, true);
    const t0 = Date.now();
    await ex.end();
    expect(Date.now() - t0).toBeLessThan(50);
    await waitFor(() => server?.events.length === 3, 5_000, "three stream events on the server");
    expect(server.events).toEqual(["end", "cancelled", "finish-after-cancel"]);
  });

  it("decodes remove_headers, append semantics, clear_body and body replacement", async () => {
    server = await startScripted((req, call) => {
      if (req.request === "request_headers") {
        call.write({
          request_headers: {
            response: {
              header_mutation: {
                remove_headers: ["X-Drop"],
                set_headers: [
                  { header: { key: "x-a", raw_value: Buffer.from("1") }, append: { value: true } } as never,
                  { header: { key: "x-b", value: "legacy" }, append_action: "ADD_IF_ABSENT" },
                  { header: { key: "x-c", raw_value: Buffer.from("3") }, append_action: "OVERWRITE_IF_EXISTS" },
                ],
              },
            },
          },
          dynamic_metadata: toProtoStruct({ ns: { list: [1, "two", true, null], nested: { k: "v" } } }),
        });
      } else if (req.request === "request_body") {
        call.write({ request_body: { response: { body_mutation: { body: Buffer.from("new body") } } } });
      } else {
        call.write({ response_body: { response: { body_mutation: { clear_body: true } } } });
      }
    });
    client = new ExtProcClient(`127.0.0.1:${server.port}`);
    const ex = client.open();
    const h = await ex.requestHeaders(REQ);
    if (h.kind !== "continue") throw new Error("expected continue");
    expect(h.headerMutation.remove).toEqual(["x-drop"]);
    expect(h.headerMutation.entries).toEqual([
      { key: "x-a", value: "1", action: "append" },
      { key: "x-b", value: "legacy", action: "add-if-absent" },
      { key: "x-c", value: "3", action: "overwrite-if-exists" },
    ]);
    expect(h.dynamicMetadata).toEqual({ ns: { list: [1, "two", true, null], nested: { k: "v" } } });
    const target: Record<string, string> = { "x-a": "0", "x-b": "kept" };
    applyHeaderSetEntries(target, h.headerMutation.entries);
    expect(target).toEqual({ "x-a": "0, 1", "x-b": "kept" });
    const b = await ex.requestBody(Buffer.from("old"));
    expect(b.kind === "continue" && b.bodyMutation?.toString()).toBe("new body");
    const c = await ex.responseBodyChunk(Buffer.from("chunk"), true);
    expect(c.kind === "continue" && c.bodyMutation?.length).toBe(0);
    await ex.end();
  });
});
