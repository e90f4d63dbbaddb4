/**
 * TLS and mutual TLS on the ext_proc port: Envoy's ext_proc cluster can use a TLS transport
 * socket; with a client CA only clients holding a certificate it signed get a routing answer.
 * Certificates are made with openssl at test time (createTestPki).
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import { createTestPki, type TestPki } from "../services/shared/nats-server.js";
import { MODEL, startTestEnv, type TestEnv } from "./harness/env.js";

const headers = { ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json" };
const body = Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }] }));

describe("ext_proc over TLS", () => {
  let env: TestEnv;
  let pki: TestPki;
  const dir = mkdtempSync(path.join(os.tmpdir(), "jetroute-extproc-tls-"));
  beforeAll(async () => {
    pki = createTestPki(path.join(dir, "pki"));
    env = await startTestEnv();
    await env.publishPod({ pod: "pod-0", address: "127.0.0.1:9400" });
  });
  afterAll(async () => {
    await env?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Routes one request; the phase result kind, or the error's message. */
  async function attempt(port: number, credentials: grpc.ChannelCredentials): Promise<string> {
    const c = new ExtProcClient(`localhost:${port}`, { credentials, messageTimeoutMs: 3_000 });
    try {
      const ex = c.open();
      await ex.requestHeaders(headers);
      const r = await ex.requestBody(body);
      ex.cancel();
      return r.kind;
    } catch (err) {
      return `refused: ${(err as Error).message}`;
    } finally {
      c.close();
    }
  }
  const ca = () => readFileSync(pki.caFile);

  it("TLS: a client that trusts the CA routes; a plaintext client does not", async () => {
    const gw = await env.gateway({ id: "tls", tls: { certFile: pki.serverCertFile, keyFile: pki.serverKeyFile } });
    expect(await attempt(gw.port, grpc.credentials.createSsl(ca()))).toBe("continue");
    expect(await attempt(gw.port, grpc.credentials.createInsecure())).toMatch(/^refused/);
    expect(await attempt(gw.port, grpc.credentials.createSsl(readFileSync(pki.otherCaFile)))).toMatch(/^refused/);
  });

  it("mutual TLS: only a client certificate signed by the client CA is let in", async () => {
    const gw = await env.gateway({ id: "mtls", tls: { certFile: pki.serverCertFile, keyFile: pki.serverKeyFile, clientCaFile: pki.caFile } });
    const withCert = (certFile: string, keyFile: string) => grpc.credentials.createSsl(ca(), readFileSync(keyFile), readFileSync(certFile));
    expect(await attempt(gw.port, withCert(pki.clientCertFile, pki.clientKeyFile))).toBe("continue");
    expect(await attempt(gw.port, grpc.credentials.createSsl(ca()))).toMatch(/^refused/);
    expect(await attempt(gw.port, withCert(pki.otherClientCertFile, pki.otherClientKeyFile))).toMatch(/^refused/);
  });

  it("a missing certificate file stops the gateway at start with an error naming it", async () => {
    await expect(env.gateway({ id: "tls-bad", tls: { certFile: path.join(dir, "nope.pem"), keyFile: pki.serverKeyFile } })).rejects.toThrow(/ext_proc TLS certificate .*nope\.pem/);
  });
});
