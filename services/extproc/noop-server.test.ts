import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient, ExtProcStreamError } from "./envoy-client.js";
import { startNoopExtProc, type NoopExtProcServer } from "./noop-server.js";
import type { ProcessingRequest } from "./types.js";

const REQ = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "x" };

describe("noop-server - the benchmark baseline", () => {
  let noop: NoopExtProcServer;
  let client: ExtProcClient;
  beforeAll(async () => {
    noop = await startNoopExtProc();
    client = new ExtProcClient(`127.0.0.1:${noop.port}`);
  });
  afterAll(async () => {
    client.close();
    await noop.close();
  });

  it("continues every phase and names the default endpoint only on the body reply", async () => {
    const ex = client.open();
    const results = [
      await ex.requestHeaders(REQ),
      await ex.requestBody(Buffer.from("{}")),
      await ex.responseHeaders(200, {}),
      await ex.responseBodyChunk(Buffer.from("x"), true),
    ];
    await ex.end();
    expect(results.map((r) => r.kind)).toEqual(["continue", "continue", "continue", "continue"]);
    expect(results.map((r) => (r.kind === "continue" ? r.headerMutation.set["x-gateway-destination-endpoint"] : "immediate"))).toEqual([
      undefined,
      "127.0.0.1:8000",
      undefined,
      undefined,
    ]);
  });

  it("ends a stream carrying a message this processing mode never sends with INVALID_ARGUMENT", async () => {
    const ex = client.open();
    const err = await ex.send("request_body", { request_trailers: { trailers: {} } } as ProcessingRequest).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ExtProcStreamError);
    expect((err as ExtProcStreamError).code).toBe(grpc.status.INVALID_ARGUMENT);
  });

  it("accepts a 4 MiB buffered body, which grpc-js' default limit would refuse", async () => {
    const ex = client.open();
    await ex.requestHeaders(REQ);
    const r = await ex.requestBody(Buffer.alloc(4 * 1024 * 1024, "a"));
    expect(r.kind).toBe("continue");
    ex.cancel();
  });

  it("closes while a client still holds a stream open", async () => {
    const other = await startNoopExtProc({ endpoint: "10.1.1.1:9" });
    const c = new ExtProcClient(`127.0.0.1:${other.port}`);
    const ex = c.open();
    const r = await ex.requestHeaders(REQ, true);
    expect(r.kind === "continue" && r.headerMutation.set["x-gateway-destination-endpoint"]).toBe("10.1.1.1:9");
    const t0 = Date.now();
    await other.close();
    expect(Date.now() - t0).toBeLessThan(1_000);
    c.close();
  });
});
