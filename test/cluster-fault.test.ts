/**
 * Fault test on a 3-node JetStream cluster (R3 streams): killing the node a gateway is connected
 * to must not stop routing, nor the flow of charges between replicas.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyStreams } from "../streams/apply.js";
import { Subjects } from "../streams/subjects.js";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import { type GatewayHandle, startGateway } from "../services/gateway/gateway.js";
import { connectNats, type NatsHandles } from "../services/shared/nats.js";
import { type NatsClusterHandle, startNatsCluster } from "../services/shared/nats-server.js";
import { acked } from "../services/shared/publish.js";
import { Kvm } from "@nats-io/kv";
import { configBucketName } from "../streams/definitions.js";
import { apiKeyBucketKey, generateApiKey, hashApiKey } from "../services/gateway/auth.js";
import { MODEL, quietLog, waitFor } from "./harness/env.js";

/** A 3-node cluster with jetroute's streams at R3 (JetStream answers once a meta leader is elected: retried until then). */
async function clusterWithStreams(): Promise<{ cluster: NatsClusterHandle; admin: NatsHandles }> {
  const cluster = await startNatsCluster(3);
  let admin: NatsHandles | undefined;
  let refusal: unknown;
  await waitFor(
    async () => {
      try {
        admin ??= await connectNats(cluster.urls);
        await applyStreams(admin.nc, admin.jsm, { replicas: 3 });
        return true;
      } catch (err) {
        refusal = err;
        return false;
      }
    },
    30_000,
    () => `the cluster to take jetroute's streams (last refusal: ${String(refusal)})`,
    250,
  );
  return { cluster, admin: admin as NatsHandles };
}

describe("cluster - a NATS node dies under the gateways", () => {
  let cluster: NatsClusterHandle;
  let admin: NatsHandles;
  const gateways: GatewayHandle[] = [];
  beforeAll(async () => {
    ({ cluster, admin } = await clusterWithStreams());
    const s = new Subjects();
    for (let i = 0; i < 4; i++) {
      await acked(admin.js, s.pod(MODEL, `pod-${i}`), { type: "pod", action: "upsert", model: MODEL, pod: `pod-${i}`, address: `127.0.0.1:${8700 + i}`, ready: true, engine: "vllm", ts: Date.now() });
    }
  }, 60_000);
  afterAll(async () => {
    for (const g of gateways) await g.close();
    await admin?.nc.close();
    await cluster?.stop();
  });

  it("keeps routing and sharing charges after the gateway's own node is killed", async () => {
    const [n0, n1, n2] = cluster.urls as [string, string, string];
    // Each gateway lists every node but starts on a different one.
    const a = await startGateway({ nats: [n0, n1, n2], id: "gw-a", port: 0, host: "127.0.0.1", adminPort: -1, log: quietLog, heartbeatIntervalMs: 200, shutdownGraceMs: 100 });
    const b = await startGateway({ nats: [n1, n2, n0], id: "gw-b", port: 0, host: "127.0.0.1", adminPort: -1, log: quietLog, heartbeatIntervalMs: 200, shutdownGraceMs: 100 });
    gateways.push(a, b);
    await Promise.all([a.whenReady(), b.whenReady()]);
    const client = new ExtProcClient(`127.0.0.1:${a.port}`);
    const route = async () => {
      const ex = client.open();
      await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw" });
      const r = await ex.requestBody(Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }] })));
      expect(r.kind).toBe("continue");
    };
    await route();
    await waitFor(() => b.views.ledger.chargesOf("gw-a") === 1, 5_000, "charge before the fault");

    const serverOfA = a.nats.nc.getServer();
    const victim = cluster.servers.find((s) => serverOfA.includes(String(s.port)));
    expect(victim).toBeDefined();
    await victim?.kill();

    // Routing never depended on the broker being up: the view is in memory.
    const killedAt = performance.now();
    let routed = 1;
    await route();
    routed++;
    // Charges are fire-and-forget: one published while the stream elects a new leader can be lost
    // (it only under-counts until its release). Keep routing until charges flow again.
    await waitFor(
      async () => {
        if (b.views.ledger.chargesOf("gw-a") >= 2) return true;
        await route();
        routed++;
        return false;
      },
      40_000,
      "charges to flow again after the node failure",
      250,
    );
    const recovery = performance.now() - killedAt;
    for (let i = 0; i < 5; i++) await route();
    // Charges lost in the failover come back with A's next heartbeat, which lists all it holds:
    // B converges on exactly A's outstanding charges.
    const converged = await waitFor(() => b.views.ledger.chargesOf("gw-a") === a.director.inFlight.size, 5_000, "B to converge on A's charges");
    expect(a.director.inFlight.size).toBe(routed + 5);
    console.log(
      `killed ${serverOfA}: charges reached the other replica again after ${recovery.toFixed(0)} ms; B holds all ${a.director.inFlight.size} of A's charges ${converged.toFixed(0)} ms later (healed by heartbeat: ${b.views.ledger.reconciledAdded})`,
    );
    expect(a.ready()).toBe(true);
    client.close();
  }, 60_000);
});

describe("cluster - the config watch outlives its NATS node", () => {
  let cluster: NatsClusterHandle;
  let admin: NatsHandles;
  const gateways: GatewayHandle[] = [];
  beforeAll(async () => {
    ({ cluster, admin } = await clusterWithStreams());
    await acked(admin.js, new Subjects().pod(MODEL, "pod-0"), { type: "pod", action: "upsert", model: MODEL, pod: "pod-0", address: "127.0.0.1:8800", ready: true, engine: "vllm", ts: Date.now() });
  }, 60_000);
  afterAll(async () => {
    for (const g of gateways) await g.close();
    await admin?.nc.close();
    await cluster?.stop();
  });

  it("applies an API key revoked after the gateway's NATS node died: the config watch comes back", async () => {
    const live = cluster.servers;
    const urls = cluster.urls;
    const g = await startGateway({ nats: urls, id: "gw-auth", port: 0, host: "127.0.0.1", adminPort: -1, log: quietLog, heartbeatIntervalMs: 200, shutdownGraceMs: 100, auth: "required" });
    gateways.push(g);
    await g.whenReady();
    const kv = await new Kvm(admin.nc).open(configBucketName("jr"));
    const key = generateApiKey();
    const hash = hashApiKey(key);
    await kv.put(apiKeyBucketKey(hash), JSON.stringify({ user: "eve", createdAt: Date.now() }));
    await waitFor(() => g.apiKeys.get(hash) !== undefined, 5_000, "the key at the gateway");
    const client = new ExtProcClient(`127.0.0.1:${g.port}`);
    const status = async () => {
      const ex = client.open();
      const r = await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", authorization: `Bearer ${key}` });
      ex.cancel();
      return r.kind === "immediate" ? r.status : 200;
    };
    expect(await status()).toBe(200);
    const own = live.find((s) => g.nats.nc.getServer().includes(String(s.port)));
    expect(own).toBeDefined();
    await own?.kill();
    // Revoked through a surviving node, after the failover.
    let refusal: unknown;
    await waitFor(
      async () => {
        try {
          await kv.put(apiKeyBucketKey(hash), JSON.stringify({ user: "eve", createdAt: 1, disabled: true, revokedAt: Date.now() }));
          return true;
        } catch (err) {
          refusal = err;
          return false;
        }
      },
      30_000,
      () => `the revocation to be written through a surviving node (last refusal: ${String(refusal)})`,
      250,
    );
    const took = await waitFor(() => g.apiKeys.get(hash)?.disabled === true, 20_000, "the revocation to reach the gateway");
    expect(await status()).toBe(401);
    console.log(`revocation applied at the gateway ${took.toFixed(0)} ms after it was written through a surviving node`);
    client.close();
  }, 60_000);
});
