/**
 * NATS connection settings from the environment: the pure resolution (conflicts, incomplete
 * pairs, URL credentials), the file checks, the descriptions and hints (never a secret).
 * The same settings against real nats-servers are in test/nats-security.test.ts.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { nkeys } from "@nats-io/transport-node";
import { afterAll, describe, expect, it } from "vitest";
import {
  connectFailureHint,
  describeNatsSecurity,
  NatsConfigError,
  type NatsSecurity,
  natsAuthFromEnv,
  natsSecurityOptions,
  redactNatsUrl,
  resolveNatsSecurity,
} from "./nats.js";

describe("natsAuthFromEnv", () => {
  it("no variables: no authentication, no TLS requirement", () => {
    expect(natsAuthFromEnv({})).toEqual({ auth: { method: "none" } });
    // Empty counts as unset (an optional secretKeyRef to a missing key leaves nothing behind, a
    // ConfigMap may carry an empty value).
    expect(natsAuthFromEnv({ NATS_USER: "", NATS_PASSWORD: "", NATS_TOKEN: "", NATS_CA: "" })).toEqual({ auth: { method: "none" } });
  });

  it("each authentication method on its own", () => {
    expect(natsAuthFromEnv({ NATS_CREDS: "/s/u.creds" }).auth).toEqual({ method: "creds", file: "/s/u.creds" });
    expect(natsAuthFromEnv({ NATS_NKEY: "/s/u.nk" }).auth).toEqual({ method: "nkey", file: "/s/u.nk" });
    expect(natsAuthFromEnv({ NATS_USER: "alice", NATS_PASSWORD: " p w " }).auth).toEqual({ method: "user-password", user: "alice", password: " p w ", from: "env" });
    expect(natsAuthFromEnv({ NATS_TOKEN: "t0k" }).auth).toEqual({ method: "token", token: "t0k", from: "env" });
  });

  it("more than one method is a conflict naming the variables", () => {
    const cases: Array<[Record<string, string>, string[]]> = [
      [{ NATS_CREDS: "a", NATS_NKEY: "b" }, ["NATS_CREDS", "NATS_NKEY"]],
      [{ NATS_CREDS: "a", NATS_TOKEN: "t" }, ["NATS_CREDS", "NATS_TOKEN"]],
      [{ NATS_USER: "u", NATS_PASSWORD: "p", NATS_TOKEN: "t" }, ["NATS_USER/NATS_PASSWORD", "NATS_TOKEN"]],
      [{ NATS_NKEY: "n", NATS_USER: "u" }, ["NATS_NKEY", "NATS_USER/NATS_PASSWORD"]],
    ];
    for (const [env, names] of cases) {
      let err: unknown;
      try {
        natsAuthFromEnv(env);
      } catch (e) {
        err = e;
      }
      expect(err, JSON.stringify(env)).toBeInstanceOf(NatsConfigError);
      const msg = (err as Error).message;
      expect(msg).toMatch(/conflicting/);
      for (const n of names) expect(msg).toContain(n);
      expect(msg).not.toMatch(/\bp\b|\bt\b/); // values are never quoted
    }
  });

  it("user and password come as a pair", () => {
    expect(() => natsAuthFromEnv({ NATS_USER: "alice" })).toThrow(/NATS_USER is set without NATS_PASSWORD/);
    expect(() => natsAuthFromEnv({ NATS_PASSWORD: "secret-pw" })).toThrow(/NATS_PASSWORD is set without NATS_USER/);
    expect(() => natsAuthFromEnv({ NATS_PASSWORD: "secret-pw" })).not.toThrow(/secret-pw/);
  });

  it("TLS: CA alone = verified server TLS; cert + key = mutual TLS; cert and key only together", () => {
    expect(natsAuthFromEnv({ NATS_CA: "/t/ca.pem" })).toEqual({ auth: { method: "none" }, tls: { caFile: "/t/ca.pem" } });
    expect(natsAuthFromEnv({ NATS_CA: "/t/ca.pem", NATS_CERT: "/t/c.pem", NATS_KEY: "/t/c.key", NATS_TOKEN: "x" })).toEqual({
      auth: { method: "token", token: "x", from: "env" },
      tls: { caFile: "/t/ca.pem", certFile: "/t/c.pem", keyFile: "/t/c.key" },
    });
    // Client certificate, server verified against the system CAs.
    expect(natsAuthFromEnv({ NATS_CERT: "/t/c.pem", NATS_KEY: "/t/c.key" }).tls).toEqual({ certFile: "/t/c.pem", keyFile: "/t/c.key" });
    expect(() => natsAuthFromEnv({ NATS_CERT: "/t/c.pem" })).toThrow(/NATS_CERT is set without NATS_KEY/);
    expect(() => natsAuthFromEnv({ NATS_CA: "/t/ca.pem", NATS_KEY: "/t/c.key" })).toThrow(/NATS_KEY is set without NATS_CERT/);
  });

  it("ignores unrelated variables and does not read files", () => {
    expect(natsAuthFromEnv({ NATS_URL: "nats://x:4222", PATH: "/bin", NATS_CREDS: "/does/not/exist" }).auth).toEqual({ method: "creds", file: "/does/not/exist" });
  });
});

describe("resolveNatsSecurity: server URLs", () => {
  it("splits comma lists and takes credentials out of the URLs", () => {
    expect(resolveNatsSecurity(["nats://a:4222, nats://b:4222", "c:4222"], {})).toEqual({ servers: ["nats://a:4222", "nats://b:4222", "c:4222"], security: { auth: { method: "none" } } });
    const up = resolveNatsSecurity("nats://alice:p%40ss@a:4222,nats://b:4222", {});
    expect(up.servers).toEqual(["nats://a:4222", "nats://b:4222"]);
    expect(up.security.auth).toEqual({ method: "user-password", user: "alice", password: "p@ss", from: "url" });
    expect(resolveNatsSecurity("tok3n@a:4222", {}).security.auth).toEqual({ method: "token", token: "tok3n", from: "url" });
  });

  it("URL credentials conflict with NATS_* authentication and with other URLs' credentials", () => {
    expect(() => resolveNatsSecurity("nats://alice:pw@a:4222", { NATS_TOKEN: "t" })).toThrow(/server URL carries credentials and NATS_TOKEN/);
    expect(() => resolveNatsSecurity(["nats://alice:pw@a:4222", "nats://bob:pw@b:4222"], {})).toThrow(/different credentials/);
    // TLS variables combine with URL credentials.
    expect(resolveNatsSecurity("nats://alice:pw@a:4222", { NATS_CA: "/ca.pem" }).security.tls).toEqual({ caFile: "/ca.pem" });
  });

  it("redacts credentials for logs", () => {
    expect(redactNatsUrl("nats://alice:s3cret@host:4222")).toBe("nats://host:4222");
    expect(redactNatsUrl("s3cret@host:4222")).toBe("host:4222");
    expect(redactNatsUrl("tls://host:4222")).toBe("tls://host:4222");
    // Unescaped `/` and `@` in a password: the whole userinfo goes, none of it is logged.
    expect(redactNatsUrl("nats://alice:p/ss@w0rd@host:4222")).toBe("nats://host:4222");
    expect(redactNatsUrl("nats://alice:a@b/c@host:4222")).toBe("nats://host:4222");
    expect(resolveNatsSecurity("nats://alice:p/ss@w0rd@host:4222", {})).toMatchObject({ servers: ["nats://host:4222"], security: { auth: { method: "user-password", user: "alice", password: "p/ss@w0rd" } } });
  });
});

describe("describeNatsSecurity and connectFailureHint never show a secret", () => {
  const secrets: NatsSecurity[] = [
    { auth: { method: "user-password", user: "alice", password: "PW-SECRET", from: "env" } },
    { auth: { method: "token", token: "TOKEN-SECRET", from: "env" }, tls: { caFile: "/ca.pem" } },
    { auth: { method: "user-password", user: "alice", password: "PW-SECRET", from: "url" }, tls: { caFile: "/ca.pem", certFile: "/c.pem", keyFile: "/c.key" } },
  ];
  it("describes the method and the files, not the secret", () => {
    for (const s of secrets) {
      const d = describeNatsSecurity(s);
      expect(d).not.toMatch(/SECRET/);
      for (const e of [{ name: "AuthorizationError", message: "Authorization Violation" }, { name: "TimeoutError", message: "timeout" }]) expect(connectFailureHint(e, s, "ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE")).not.toMatch(/SECRET/);
    }
    expect(describeNatsSecurity(secrets[0] as NatsSecurity)).toMatch(/user "alice" with password from NATS_USER\+NATS_PASSWORD; TLS only if the server requires it/);
    expect(describeNatsSecurity(secrets[2] as NatsSecurity)).toMatch(/password from the server URL; TLS required \(CA NATS_CA=\/ca.pem, client certificate NATS_CERT=\/c.pem\)/);
    expect(describeNatsSecurity({ auth: { method: "creds", file: "/s/u.creds" } })).toMatch(/credentials file NATS_CREDS=\/s\/u.creds/);
  });

  it("hints: missing or rejected credentials, untrusted server, missing or refused client certificate", () => {
    const none: NatsSecurity = { auth: { method: "none" } };
    const authErr = { name: "AuthorizationError", message: "Authorization Violation" };
    expect(connectFailureHint(authErr, none)).toMatch(/requires authentication: set NATS_CREDS, NATS_NKEY, NATS_USER and NATS_PASSWORD, or NATS_TOKEN/);
    expect(connectFailureHint(authErr, { auth: { method: "nkey", file: "/n" } })).toMatch(/rejected the credentials from NATS_NKEY/);
    const untrusted = { message: "unable to verify the first certificate", code: "UNABLE_TO_VERIFY_LEAF_SIGNATURE" };
    expect(connectFailureHint(untrusted, none)).toMatch(/set NATS_CA/);
    expect(connectFailureHint(untrusted, { auth: { method: "none" }, tls: { caFile: "/other.pem" } })).toMatch(/not signed by the CA in NATS_CA=\/other.pem/);
    expect(connectFailureHint({ message: "server does not support 'tls'" }, { auth: { method: "none" }, tls: { caFile: "/ca.pem" } })).toMatch(/NATS_CA is set but the server does not offer TLS/);
    const timeout = { name: "TimeoutError", message: "timeout" };
    expect(connectFailureHint(timeout, { auth: { method: "none" }, tls: { caFile: "/ca.pem" } }, "ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE")).toMatch(/requires a client certificate: set NATS_CERT and NATS_KEY/);
    expect(connectFailureHint(timeout, { auth: { method: "none" }, tls: { caFile: "/ca.pem", certFile: "/c.pem", keyFile: "/c.key" } }, "ERR_SSL_TLSV1_ALERT_UNKNOWN_CA")).toMatch(/refused the client certificate NATS_CERT=\/c.pem/);
    expect(connectFailureHint({ message: "connection refused" }, none)).toBe("");
  });
});

describe("natsSecurityOptions: the files", () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), "jetroute-nats-opts-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const file = (name: string, text: string) => {
    const p = path.join(dir, name);
    writeFileSync(p, text);
    return p;
  };
  const PEM_CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  const PEM_KEY = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";

  it("an unreadable file fails with the variable and the path", () => {
    const missing = path.join(dir, "missing.creds");
    for (const [env, variable] of [
      [{ NATS_CREDS: missing }, "NATS_CREDS"],
      [{ NATS_NKEY: missing }, "NATS_NKEY"],
      [{ NATS_CA: missing }, "NATS_CA"],
      [{ NATS_CERT: missing, NATS_KEY: file("k.pem", PEM_KEY) }, "NATS_CERT"],
      [{ NATS_CERT: file("c.pem", PEM_CERT), NATS_KEY: missing }, "NATS_KEY"],
    ] as const) {
      expect(() => natsSecurityOptions(natsAuthFromEnv(env))).toThrow(new NatsConfigError(`${variable}=${missing}: cannot read the file (no such file)`));
    }
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_CA: dir }))).toThrow(/NATS_CA=.*: cannot read the file \(is a directory\)/);
  });

  it("a file with the wrong content fails at start, not at the first connection", () => {
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_NKEY: file("bad.nk", "SUNOTASEED\n") }))).toThrow(/NATS_NKEY=.*bad.nk: not a valid nkey seed file \(nkeys: /);
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_NKEY: file("bad.nk", "SUNOTASEED\n") }))).not.toThrow(/SUNOTASEED/);
    const account = new TextDecoder().decode(nkeys.createAccount().getSeed());
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_NKEY: file("account.nk", account) }))).toThrow(/NATS_NKEY=.*account.nk: not a user nkey seed/);
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_NKEY: file("public.nk", nkeys.createUser().getPublicKey()) }))).toThrow(/not a user nkey seed/);
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_CREDS: file("bad.creds", "just text\n") }))).toThrow(/NATS_CREDS=.*bad.creds: not a valid NATS credentials file/);
    // Swapped certificate and key.
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_CERT: file("k2.pem", PEM_KEY), NATS_KEY: file("c2.pem", PEM_CERT) }))).toThrow(/NATS_CERT=.*k2.pem: not a PEM certificate/);
    expect(() => natsSecurityOptions(natsAuthFromEnv({ NATS_CA: file("k3.pem", PEM_KEY) }))).toThrow(/NATS_CA=.*: not a PEM certificate/);
  });

  it("an nkey seed file (trailing newline) signs the nonce with that key; the seed is re-read on reconnect", () => {
    const kp = nkeys.createUser();
    const seedFile = file("user.nk", `${new TextDecoder().decode(kp.getSeed())}\n`);
    const { authenticator, tls } = natsSecurityOptions(natsAuthFromEnv({ NATS_NKEY: seedFile }));
    expect(tls).toBeUndefined();
    const auth = (authenticator as (nonce?: string) => { nkey?: string; sig?: string })("n0nce");
    expect(auth.nkey).toBe(kp.getPublicKey());
    expect(kp.verify(new TextEncoder().encode("n0nce"), nkeys.decode(auth.sig as string))).toBe(true);

    const rotated = nkeys.createUser();
    writeFileSync(seedFile, new TextDecoder().decode(rotated.getSeed()));
    expect((authenticator as (nonce?: string) => { nkey?: string })("n0nce").nkey).toBe(rotated.getPublicKey());
    rmSync(seedFile); // momentarily gone (Secret update): the last good seed is used
    expect((authenticator as (nonce?: string) => { nkey?: string })("n0nce").nkey).toBe(rotated.getPublicKey());
  });

  it("a creds file (CRLF line ends too) yields the JWT and a signature by its seed", () => {
    const kp = nkeys.createUser();
    const jwt = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzdWIiOiJVIn0.c2ln";
    const creds = ["-----BEGIN NATS USER JWT-----", jwt, "------END NATS USER JWT------", "", "-----BEGIN USER NKEY SEED-----", new TextDecoder().decode(kp.getSeed()), "------END USER NKEY SEED------", ""].join("\r\n");
    const { authenticator } = natsSecurityOptions(natsAuthFromEnv({ NATS_CREDS: file("u.creds", creds) }));
    const auth = (authenticator as (nonce?: string) => { jwt?: string; nkey?: string; sig?: string })("abc");
    expect(auth.jwt).toBe(jwt);
    expect(auth.nkey).toBe(kp.getPublicKey());
    expect(kp.verify(new TextEncoder().encode("abc"), nkeys.decode(auth.sig as string))).toBe(true);
  });

  it("user/password and token pass through; TLS passes file names (re-read by the client on reconnect)", () => {
    const up = natsSecurityOptions(natsAuthFromEnv({ NATS_USER: "alice", NATS_PASSWORD: "pw" }));
    expect((up.authenticator as () => unknown)()).toEqual({ user: "alice", pass: "pw" });
    const tok = natsSecurityOptions(natsAuthFromEnv({ NATS_TOKEN: "t0k" }));
    expect((tok.authenticator as () => unknown)()).toEqual({ auth_token: "t0k" });
    const ca = file("ca.pem", PEM_CERT);
    const cert = file("client.pem", PEM_CERT);
    const key = file("client.key", PEM_KEY.replace(/PRIVATE KEY/g, "EC PRIVATE KEY"));
    expect(natsSecurityOptions(natsAuthFromEnv({ NATS_CA: ca, NATS_CERT: cert, NATS_KEY: key }))).toEqual({ tls: { caFile: ca, certFile: cert, keyFile: key } });
    expect(natsSecurityOptions(natsAuthFromEnv({}))).toEqual({});
  });
});
