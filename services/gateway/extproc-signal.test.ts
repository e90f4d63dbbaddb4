/**
 * The abort signal the ext_proc adapter hands to routing: made only when routing reads it, and
 * aborted when Envoy's stream goes away while the request is still being worked on (a P/D prefill
 * leg, a request held by flow control). Real gRPC, a router that never answers.
 */
import { afterEach, describe, expect, it } from "vitest";
import type { RoutedRequest, RouteInput } from "../routing/director.js";
import { chatBody } from "../routing/stages/testing.js";
import type { RequestRouter } from "./extproc-server.js";
import { ExtProcTestServers } from "../../test/harness/extproc.js";
import { waitFor } from "../../test/harness/wait.js";

const REQ = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json" };

/** Routing that never completes; records each input and, with `read`, reads its signal at once. */
function pendingRouter(read: boolean) {
  const inputs: RouteInput[] = [];
  const signals: AbortSignal[] = [];
  const router: RequestRouter = {
    route(input) {
      inputs.push(input);
      if (read && input.signal) signals.push(input.signal);
      return new Promise<RoutedRequest>(() => undefined);
    },
    firstToken: () => undefined,
    finish: () => false,
    reject: () => undefined,
  };
  return { router, inputs, signals };
}

const servers = new ExtProcTestServers();
afterEach(() => servers.closeAll());

describe("ext_proc adapter - the stream's abort signal", () => {
  it("a stream cancelled while routing is under way aborts the signal routing holds", async () => {
    const p = pendingRouter(true);
    const client = await servers.serve({ router: p.router });
    const ex = client.open();
    await ex.requestHeaders(REQ);
    void ex.requestBody(chatBody()).catch(() => undefined);
    await waitFor(() => p.signals.length === 1, 5_000);
    const signal = p.signals[0] as AbortSignal;
    expect(signal.aborted).toBe(false);
    ex.cancel();
    await waitFor(() => signal.aborted, 5_000);
    expect((signal.reason as Error).name).toBe("AbortError");
  });

  it("a signal first read after the stream was cancelled is already aborted", async () => {
    const p = pendingRouter(false);
    const client = await servers.serve({ router: p.router });
    // A second stream on the same connection: once its routing started, the first stream's cancel has been handled.
    const ex = client.open();
    await ex.requestHeaders(REQ);
    void ex.requestBody(chatBody()).catch(() => undefined);
    await waitFor(() => p.inputs.length === 1, 5_000);
    ex.cancel();
    const later = client.open();
    await later.requestHeaders(REQ);
    void later.requestBody(chatBody()).catch(() => undefined);
    await waitFor(() => p.inputs.length === 2, 5_000);
    await waitFor(() => (p.inputs[0] as RouteInput).signal?.aborted === true, 5_000);
    expect((p.inputs[1] as RouteInput).signal?.aborted).toBe(false);
    later.cancel();
  });
});
