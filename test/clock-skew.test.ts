/**
 * A gateway host whose clock is off by ±5 s: liveness is read on the broker's time, so no peer's
 * charges are dropped for it, and its own charges are still released and seen by the peers.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const headers = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json" };
const body = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }] }));

describe("clock skew - one gateway host's clock is off by 5 s", () => {
  let env: TestEnv;
  beforeAll(async () => {
    env = await startTestEnv();
    for (let i = 0; i < 3; i++) await env.publishPod({ pod: `pod-${i}`, address: `127.0.0.1:${9300 + i}` });
  });
  afterAll(async () => env?.stop());

  it.each([5_000, -5_000])("skew %i ms: peers' charges are kept, own charges are released and seen by peers", async (skew) => {
    const tag = skew > 0 ? "ahead" : "behind";
    const skewed = await env.gateway({ id: `skew-${tag}`, clock: () => Date.now() + skew });
    const peer = await env.gateway({ id: `peer-${tag}` });
    await waitFor(() => skewed.views.ledger.rank(Date.now()).count >= 1 && peer.views.ledger.liveGateways(Date.now()).includes(skewed.id), 5_000, "the replicas to see each other");
    const peerClient = new ExtProcClient(`127.0.0.1:${peer.port}`);
    const held = [];
    for (let i = 0; i < 4; i++) {
      const ex = peerClient.open();
      await ex.requestHeaders(headers);
      expect((await ex.requestBody(body)).kind).toBe("continue");
      held.push(ex);
    }
    await waitFor(() => skewed.views.ledger.chargesOf(peer.id) === 4, 3_000, "the peer's charges at the skewed gateway");
    // Several heartbeat timeouts (3 x 200 ms) and sweeps later, they are still there.
    const t0 = Date.now();
    await waitFor(() => Date.now() - t0 > 1_500, 3_000, "a few heartbeat timeouts");
    expect(skewed.views.ledger.chargesOf(peer.id)).toBe(4);
    // The skewed gateway's own charges reach the peer and go away when the requests end.
    const c = new ExtProcClient(`127.0.0.1:${skewed.port}`);
    const ex = c.open();
    await ex.requestHeaders(headers);
    expect((await ex.requestBody(body)).kind).toBe("continue");
    await waitFor(() => peer.views.ledger.chargesOf(skewed.id) === 1, 3_000, "the skewed gateway's charge at the peer");
    await ex.responseHeaders(200, { "content-type": "application/json" });
    await ex.responseBodyChunk(Buffer.from("{}"), true);
    await ex.end();
    await waitFor(() => peer.views.ledger.chargesOf(skewed.id) === 0 && skewed.director.inFlight.size === 0, 3_000, "its release everywhere");
    for (const h of held) h.cancel();
    await waitFor(() => skewed.views.ledger.chargesOf(peer.id) === 0, 3_000, "the peer's releases at the skewed gateway");
    c.close();
    peerClient.close();
    await skewed.close();
    await peer.close();
  }, 30_000);
});
