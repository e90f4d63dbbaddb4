/**
 * NATS authentication and TLS against real nats-servers: every method the NATS_* variables
 * select (user/password, token, nkey, creds) and TLS (server-verified, mutual) is accepted with
 * the right settings and refused, with a message that says what to change, without them. Then
 * real jetroute processes (`streams apply`, `pod-watcher`) connect to a secured server with
 * nothing but environment variables.
 *
 * Certificates are made with `openssl` (createTestPki), nkeys and JWTs with the nkeys module the
 * NATS client re-exports (createTestOperator).
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { nkeys } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyStreams } from "../streams/apply.js";
import { streamName } from "../streams/definitions.js";
import { connectNats, type NatsEnv } from "../services/shared/nats.js";
import { createTestOperator, createTestPki, type NatsServerHandle, type StartOptions, startNatsServer, type TestPki } from "../services/shared/nats-server.js";
import { spawnJetroute } from "../services/shared/processes.js";
import { waitFor } from "./harness/wait.js";

const dir = mkdtempSync(path.join(os.tmpdir(), "jetroute-nats-security-"));
let pki: TestPki;
const servers: NatsServerHandle[] = [];

beforeAll(() => {
  pki = createTestPki(path.join(dir, "pki"));
});
afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop()));
  rmSync(dir, { recursive: true, force: true });
});

async function server(opts: StartOptions): Promise<NatsServerHandle> {
  const s = await startNatsServer(opts);
  servers.push(s);
  return s;
}

/** Connects with exactly `env` (not the test runner's environment) and makes a JetStream call. */
async function accepted(url: string, env: NatsEnv): Promise<{ tls: boolean; security: string }> {
  const h = await connectNats(url, "nats-security-test", env);
  try {
    await h.jsm.getAccountInfo();
    await h.nc.flush();
    return { tls: h.nc.info?.tls_required === true, security: h.security };
  } finally {
    await h.nc.close();
  }
}

async function refused(url: string, env: NatsEnv): Promise<string> {
  try {
    const h = await connectNats(url, "nats-security-test", env);
    await h.nc.close();
  } catch (err) {
    expect((err as Error).name).toBe("NatsConnectError");
    return (err as Error).message;
  }
  throw new Error(`connected to ${url} with ${JSON.stringify(Object.keys(env))}, expected a refusal`);
}

const seedFile = (name: string, kp: ReturnType<typeof nkeys.createUser>) => {
  const p = path.join(dir, name);
  writeFileSync(p, `${new TextDecoder().decode(kp.getSeed())}\n`, { mode: 0o600 });
  return p;
};

describe("NATS authentication from NATS_* variables", () => {
  it("user/password: refused without credentials or with a wrong password (never echoed), accepted from env or URL", async () => {
    const s = await server({ auth: { users: [{ user: "alice", password: "s3cret-pw" }] } });
    expect(await refused(s.url, {})).toMatch(/Authorization Violation: the server requires authentication: set NATS_CREDS, NATS_NKEY, NATS_USER and NATS_PASSWORD, or NATS_TOKEN/);
    const wrong = await refused(s.url, { NATS_USER: "alice", NATS_PASSWORD: "wr0ng-pw" });
    expect(wrong).toMatch(/the server rejected the credentials from NATS_USER\+NATS_PASSWORD/);
    expect(wrong).not.toContain("wr0ng-pw");

    expect((await accepted(s.url, { NATS_USER: "alice", NATS_PASSWORD: "s3cret-pw" })).security).toMatch(/user "alice"/);
    // The v3 client ignores credentials in a URL; connectNats moves them into an authenticator.
    expect((await accepted(s.url.replace("nats://", "nats://alice:s3cret-pw@"), {})).security).toMatch(/from the server URL/);
    const wrongUrl = await refused(s.url.replace("nats://", "nats://alice:wr0ng-pw@"), {});
    expect(wrongUrl).toMatch(/rejected the credentials from the server URL/);
    expect(wrongUrl).not.toContain("wr0ng-pw");
  });

  it("token", async () => {
    const s = await server({ auth: { token: "t0ken-abc" } });
    expect(await refused(s.url, {})).toMatch(/requires authentication/);
    expect(await refused(s.url, { NATS_TOKEN: "t0ken-xyz" })).toMatch(/rejected the credentials from NATS_TOKEN/);
    await accepted(s.url, { NATS_TOKEN: "t0ken-abc" });
  });

  it("nkey: the seed file of the configured public key, not another one", async () => {
    const user = nkeys.createUser();
    const s = await server({ auth: { nkeys: [user.getPublicKey()] } });
    expect(await refused(s.url, {})).toMatch(/requires authentication/);
    expect(await refused(s.url, { NATS_NKEY: seedFile("other.nk", nkeys.createUser()) })).toMatch(/rejected the credentials from NATS_NKEY/);
    expect((await accepted(s.url, { NATS_NKEY: seedFile("user.nk", user) })).security).toMatch(/nkey seed file NATS_NKEY=/);
    // An unreadable seed file fails before any connection attempt, naming the variable and path.
    const missing = path.join(dir, "missing.nk");
    await expect(connectNats(s.url, "t", { NATS_NKEY: missing })).rejects.toThrow(`NATS_NKEY=${missing}: cannot read the file (no such file)`);
  });

  it("creds (decentralized JWT auth): the account's user is accepted with JetStream, a stranger's user refused", async () => {
    const op = createTestOperator(path.join(dir, "operator"));
    const s = await server({ config: op.config });
    expect(await refused(s.url, {})).toMatch(/requires authentication/);
    expect(await refused(s.url, { NATS_CREDS: op.foreignCredsFile })).toMatch(/rejected the credentials from NATS_CREDS/);
    const h = await connectNats(s.url, "t", { NATS_CREDS: op.credsFile });
    try {
      await h.jsm.streams.add({ name: "CREDS_CHECK", subjects: ["creds.check"] });
      expect((await h.js.publish("creds.check", "x")).seq).toBe(1);
    } finally {
      await h.nc.close();
    }
  });

  it("conflicting settings fail before connecting", async () => {
    const s = await server({ auth: { token: "t" } });
    await expect(connectNats(s.url, "t", { NATS_TOKEN: "t", NATS_USER: "u", NATS_PASSWORD: "p" })).rejects.toThrow(/conflicting NATS authentication settings/);
    await expect(connectNats(s.url.replace("nats://", "nats://t@"), "t", { NATS_TOKEN: "t" })).rejects.toThrow(/server URL carries credentials and NATS_TOKEN/);
  });
});

describe("NATS TLS from NATS_CA, NATS_CERT, NATS_KEY", () => {
  it("server TLS: verified against NATS_CA; refused without it or with another CA", async () => {
    const s = await server({ tls: { certFile: pki.serverCertFile, keyFile: pki.serverKeyFile } });
    expect(await refused(s.url, {})).toMatch(/the server's certificate is not trusted: set NATS_CA/);
    expect(await refused(s.url, { NATS_CA: pki.otherCaFile })).toMatch(/not signed by the CA in NATS_CA=.*other-ca\.pem/);
    const ok = await accepted(s.url, { NATS_CA: pki.caFile });
    expect(ok.tls).toBe(true);
    expect(ok.security).toMatch(/TLS required \(CA NATS_CA=/);
  });

  it("NATS_CA makes TLS mandatory: a plain server is refused", async () => {
    const s = await server({});
    expect(await refused(s.url, { NATS_CA: pki.caFile })).toMatch(/NATS_CA is set but the server does not offer TLS/);
    expect((await accepted(s.url, {})).tls).toBe(false);
  });

  it("mutual TLS: needs a client certificate signed by the server's CA", async () => {
    const s = await server({ tls: { certFile: pki.serverCertFile, keyFile: pki.serverKeyFile, caFile: pki.caFile, verify: true } });
    // With TLS 1.3 the client only learns of the refusal by its handshake timeout (5 s each).
    expect(await refused(s.url, { NATS_CA: pki.caFile })).toMatch(/the server requires a client certificate: set NATS_CERT and NATS_KEY/);
    expect(await refused(s.url, { NATS_CA: pki.caFile, NATS_CERT: pki.otherClientCertFile, NATS_KEY: pki.otherClientKeyFile })).toMatch(
      /the server refused the client certificate NATS_CERT=.*other-client\.pem/,
    );
    expect((await accepted(s.url, { NATS_CA: pki.caFile, NATS_CERT: pki.clientCertFile, NATS_KEY: pki.clientKeyFile })).tls).toBe(true);
    await expect(connectNats(s.url, "t", { NATS_CA: pki.caFile, NATS_CERT: pki.clientCertFile })).rejects.toThrow(/NATS_CERT is set without NATS_KEY/);
  }, 45_000);
});

describe("jetroute processes on a secured NATS, configured by environment only", () => {
  /** Every NATS_* variable blanked, so the runner's own environment cannot leak into the child. */
  const BLANK = { NATS_CREDS: "", NATS_NKEY: "", NATS_USER: "", NATS_PASSWORD: "", NATS_TOKEN: "", NATS_CA: "", NATS_CERT: "", NATS_KEY: "" };
  let s: NatsServerHandle;
  let env: Record<string, string>;
  beforeAll(async () => {
    s = await server({ auth: { users: [{ user: "jetroute", password: "pr0cess-pw" }] }, tls: { certFile: pki.serverCertFile, keyFile: pki.serverKeyFile, caFile: pki.caFile, verify: true } });
    env = { ...BLANK, NATS_USER: "jetroute", NATS_PASSWORD: "pr0cess-pw", NATS_CA: pki.caFile, NATS_CERT: pki.clientCertFile, NATS_KEY: pki.clientKeyFile };
  });

  it("`jetroute streams apply` creates the streams over mutual TLS + password; without the password it exits with the reason", async () => {
    const denyLog = path.join(dir, "streams-denied.log");
    const denied = spawnJetroute("streams-denied", ["streams", "apply", "--nats", s.url], { env: { ...env, NATS_USER: "", NATS_PASSWORD: "" }, logFile: denyLog });
    expect(await denied.exited).not.toBe(0);
    const stderr = readFileSync(denyLog, "utf8");
    expect(stderr).toMatch(/the server requires authentication: set NATS_CREDS/);

    const log = path.join(dir, "streams.log");
    const apply = spawnJetroute("streams", ["streams", "apply", "--nats", s.url], { env, logFile: log });
    expect(await apply.exited, readFileSync(log, "utf8")).toBe(0);
    expect(readFileSync(log, "utf8")).not.toContain("pr0cess-pw");

    const h = await connectNats(s.url, "t", env);
    try {
      expect((await h.jsm.streams.info(streamName("jr", "PODS"))).config.name).toBe("JR_PODS");
    } finally {
      await h.nc.close();
    }
  });

  it("a long-running publisher (pod-watcher) publishes through the secured connection", async () => {
    const pods = path.join(dir, "pods.yaml");
    writeFileSync(pods, "pods:\n  - name: secure-pod-0\n    model: secure/model\n    address: 127.0.0.1:1\n    engine: vllm\n");
    const log = path.join(dir, "pod-watcher.log");
    const h = await connectNats(s.url, "t", env);
    await applyStreams(h.nc, h.jsm, { prefix: "jr", replicas: 1 }); // idempotent; lets this test run alone
    const watcher = spawnJetroute("pod-watcher", ["pod-watcher", "--static", pods, "--no-probe", "--nats", s.url], { env, logFile: log });
    try {
      const stream = streamName("jr", "PODS");
      let subjects: Record<string, number> = {};
      // Until the pod itself is there (the source's heartbeat subject may come first).
      const hasPod = () => Object.keys(subjects).some((k) => k.endsWith(".secure-pod-0"));
      await waitFor(
        async () => {
          if (watcher.proc.exitCode !== null) throw new Error(`pod-watcher exited: ${readFileSync(log, "utf8")}`);
          subjects = (await h.jsm.streams.info(stream, { subjects_filter: ">" })).state.subjects ?? {};
          return hasPod();
        },
        15_000,
        () => `the pod on PODS (subjects: ${Object.keys(subjects).join(", ")})`,
        100,
      );
      expect(Object.keys(subjects).some((k) => k.endsWith(".secure-pod-0"))).toBe(true);
    } finally {
      await h.nc.close();
      await watcher.stop();
    }
    expect(readFileSync(log, "utf8")).not.toContain("pr0cess-pw");
  });
});
