/**
 * A gateway process killed with SIGKILL publishes nothing more: its charges must stop counting
 * in the other replicas once its heartbeat lapses, with no manual cleanup.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import { spawnJetroute, type ServiceProcess } from "../services/shared/processes.js";
import { MODEL, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

describe("gateway crash - charges of a dead replica expire by heartbeat", () => {
  let env: TestEnv;
  let victim: ServiceProcess | undefined;
  beforeAll(async () => {
    env = await startTestEnv();
    for (let i = 0; i < 4; i++) await env.publishPod({ pod: `pod-${i}`, address: `127.0.0.1:${8500 + i}` });
  });
  afterAll(async () => {
    await victim?.kill();
    await env?.stop();
  });

  it("kill -9 of a gateway: its charges leave the survivor's ledger within the heartbeat timeout", async () => {
    const survivor = await env.gateway({ id: "survivor", heartbeatIntervalMs: 200, heartbeatTimeoutMs: 600 });
    victim = spawnJetroute("victim", [
      "gateway", "--nats", env.server.url, "--port", "0", "--admin-port", "-1", "--host", "127.0.0.1", "--id", "victim", "--heartbeat-ms", "200", "--heartbeat-timeout-ms", "600",
    ]);
    const { port } = await victim.waitForLine<{ port: number }>((v) => typeof v.port === "number");
    const client = new ExtProcClient(`127.0.0.1:${port}`);
    const body = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hold on" }] }));
    // Six requests in flight through the victim, never finished.
    for (let i = 0; i < 6; i++) {
      const ex = client.open();
      await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw" });
      const r = await ex.requestBody(body);
      expect(r.kind).toBe("continue");
    }
    await waitFor(() => survivor.views.ledger.chargesOf("victim") === 6, 3_000, "victim's charges at the survivor");
    const pods = ["pod-0", "pod-1", "pod-2", "pod-3"];
    const total = () => pods.reduce((n, p) => n + survivor.views.ledger.outstanding(MODEL, p).requests, 0);
    expect(total()).toBe(6);

    const killedAt = performance.now();
    await victim.kill();
    client.close();
    const gone = await waitFor(() => survivor.views.ledger.chargesOf("victim") === 0, 5_000, "victim's charges to expire");
    const elapsed = performance.now() - killedAt;
    console.log(`victim's 6 charges stopped counting ${elapsed.toFixed(0)} ms after SIGKILL (heartbeat timeout 600 ms)`);
    // Not before the last heartbeat could have lapsed, and not long after: timeout + one sweep + slack.
    expect(elapsed).toBeGreaterThan(300);
    expect(gone).toBeLessThan(600 + 250 + 500);
    expect(total()).toBe(0);
    expect(survivor.views.ledger.isAlive("victim", Date.now())).toBe(false);
  });

  it("kill -9 of one of 3 gateways mid-burst: its charges expire, nothing is released twice, the ledgers return to zero", async () => {
    const s1 = await env.gateway({ id: "s1", heartbeatIntervalMs: 200, heartbeatTimeoutMs: 600 });
    const s2 = await env.gateway({ id: "s2", heartbeatIntervalMs: 200, heartbeatTimeoutMs: 600 });
    const v = spawnJetroute("victim2", ["gateway", "--nats", env.server.url, "--port", "0", "--admin-port", "-1", "--host", "127.0.0.1", "--id", "victim2", "--heartbeat-ms", "200", "--heartbeat-timeout-ms", "600"]);
    victim = v;
    const { port } = await v.waitForLine<{ port: number }>((x) => typeof x.port === "number");
    const releases = new Map<string, number>();
    const sub = env.nats.nc.subscribe(env.subjects.all("releases"), {
      callback: (_e, m) => {
        // A `release`, or a `releases` batch of one gateway's releases on one pod.
        const r = m.json<{ gateway: string; id?: string; releases?: Array<{ id: string }> }>();
        for (const id of r.releases ? r.releases.map((x) => x.id) : [r.id]) {
          const k = `${r.gateway}/${id}`;
          releases.set(k, (releases.get(k) ?? 0) + 1);
        }
      },
    });
    await env.nats.nc.flush();
    const clients = [new ExtProcClient(`127.0.0.1:${s1.port}`), new ExtProcClient(`127.0.0.1:${s2.port}`), new ExtProcClient(`127.0.0.1:${port}`)];
    const body = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "burst" }] }));
    const open = await Promise.all(
      Array.from({ length: 30 }, async (_, i) => {
        const ex = (clients[i % 3] as ExtProcClient).open();
        await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw" });
        await ex.requestBody(body);
        return { ex, i };
      }),
    );
    await waitFor(() => s1.views.ledger.size === 30 && s2.views.ledger.size === 30, 3_000, "every replica to see the 30 charges");
    await v.kill();
    // The survivors finish their own requests normally.
    await Promise.all(
      open
        .filter(({ i }) => i % 3 !== 2)
        .map(async ({ ex }) => {
          await ex.responseHeaders(200, { "content-type": "application/json" });
          await ex.responseBodyChunk(Buffer.from("{}"), true);
          await ex.end();
        }),
    );
    const drained = await waitFor(() => s1.views.ledger.size === 0 && s2.views.ledger.size === 0, 3_000, "ledgers back to zero");
    await waitFor(() => releases.size >= 20, 3_000, "the survivors' 20 releases on the test's subscription");
    // No event marks "nothing released twice": a window in which a second release would arrive.
    await new Promise((r) => setTimeout(r, 200));
    sub.unsubscribe();
    for (const c of clients) c.close();
    console.log(`3 replicas, 30 requests, one killed: ledgers at zero ${drained.toFixed(0)} ms after the survivors finished; ${releases.size} releases seen`);
    expect([...releases.values()].every((n) => n === 1)).toBe(true);
    expect(releases.size).toBe(20);
    expect([...releases.keys()].every((k) => !k.startsWith("victim2/"))).toBe(true);
  });
});
