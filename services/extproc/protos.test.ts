/** Replies serialised once (`preEncoded`) reach a real gRPC client exactly as the same reply encoded per write. */
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient } from "./envoy-client.js";
import { loadExtProc, preEncoded } from "./protos.js";
import type { ProcessingRequest, ProcessingResponse } from "./types.js";
import { Headers, setHeader } from "./wire.js";

const REQ = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "front.local", "content-type": "application/json" };
const headersReply = (): ProcessingResponse => ({
  request_headers: { response: { status: "CONTINUE", header_mutation: { remove_headers: ["x-gateway-destination-endpoint"], set_headers: [setHeader(Headers.targetPod, "10.0.0.1:8000")] }, clear_route_cache: true } },
});

describe("protos - pre-encoded replies", () => {
  let server: grpc.Server;
  let port = 0;
  // Odd streams get the reply encoded per write, even streams the one encoded once.
  let streams = 0;
  const once = preEncoded(headersReply());
  beforeAll(async () => {
    server = new grpc.Server();
    server.addService(loadExtProc().service, {
      Process: (call: grpc.ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => {
        const n = ++streams;
        call.on("data", () => call.write(n % 2 === 0 ? once : headersReply()));
        call.on("end", () => call.end());
      },
    });
    port = await new Promise<number>((res, rej) => server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? rej(e) : res(p))));
  });
  afterAll(() => server.forceShutdown());

  it("arrive identical to the same reply encoded per write, again and again", async () => {
    const client = new ExtProcClient(`127.0.0.1:${port}`);
    const seen = [];
    for (let i = 0; i < 4; i++) {
      const ex = client.open();
      seen.push(await ex.requestHeaders(REQ));
      ex.cancel();
    }
    client.close();
    expect(seen[0]).toMatchObject({ kind: "continue" });
    expect(seen[0]).toEqual(seen[1]);
    expect(seen[1]).toEqual(seen[2]);
    expect(seen[2]).toEqual(seen[3]);
  });

  it("are frozen: a change could not reach the wire", () => {
    const r = preEncoded({ response_body: { response: { status: "CONTINUE" as const } } });
    expect(Object.isFrozen(r)).toBe(true);
    expect(() => {
      (r as { response_body?: unknown }).response_body = undefined;
    }).toThrow();
  });
});
