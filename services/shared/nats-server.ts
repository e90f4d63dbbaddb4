/**
 * Real nats-server processes for the demo, tests and benchmarks: JetStream on, free ports,
 * a temp store dir each, stopped (and the dir removed) by `stop()`. Optionally with
 * authentication (users, nkeys or a token) and TLS (server-verified or mutual), written into the
 * generated config file; `createTestPki` makes throw-away certificates for that with `openssl`,
 * `createTestOperator` a decentralized-auth (JWT) setup with a user `.creds` file.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { nkeys } from "@nats-io/transport-node";

export interface NatsServerHandle {
  url: string;
  port: number;
  storeDir: string;
  proc: ChildProcess;
  /** SIGTERM, then SIGKILL if the server has not exited within `graceMs` (default 10 s); removes the store dir it made. */
  stop(graceMs?: number): Promise<void>;
  /** Stops with SIGKILL, keeping the store dir (crash tests restart on it). */
  kill(): Promise<void>;
}

export function natsServerBinary(): string {
  const explicit = process.env.NATS_SERVER_BIN;
  if (explicit) return explicit;
  for (const p of ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"]) {
    try {
      execFileSync(p, ["--version"], { stdio: "ignore" });
      return p;
    } catch {
      /* try the next */
    }
  }
  try {
    execFileSync("nats-server", ["--version"], { stdio: "ignore" });
    return "nats-server";
  } catch {
    throw new Error("nats-server not found: install it with `apt-get install -y nats-server` (Debian) or set NATS_SERVER_BIN");
  }
}

export async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => resolve(typeof addr === "object" && addr ? addr.port : 0));
    });
  });
}

async function waitForPort(port: number, proc: ChildProcess, timeoutMs: number, log: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`nats-server exited with ${proc.exitCode}: ${log()}`);
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, "127.0.0.1");
      s.once("connect", () => {
        s.destroy();
        resolve(true);
      });
      s.once("error", () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`nats-server did not listen on ${port} within ${timeoutMs} ms: ${log()}`);
}

function stopProc(proc: ChildProcess, signal: NodeJS.Signals, killAfterMs?: number): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const t = killAfterMs === undefined ? undefined : setTimeout(() => proc.kill("SIGKILL"), killAfterMs);
    proc.once("exit", () => {
      clearTimeout(t);
      resolve();
    });
    proc.kill(signal);
  });
}

export interface NatsServerAuth {
  /** User/password pairs. */
  users?: Array<{ user: string; password: string }>;
  /** Public user nkeys (`U...`); clients sign the server's nonce with the matching seed. */
  nkeys?: string[];
  /** A single token; nats-server does not combine it with users or nkeys. */
  token?: string;
}

export interface NatsServerTls {
  certFile: string;
  keyFile: string;
  /** CA bundle for client certificates (required with `verify`). */
  caFile?: string;
  /** Mutual TLS: require a client certificate signed by `caFile`. */
  verify?: boolean;
}

export interface StartOptions {
  port?: number;
  storeDir?: string;
  /** Extra config file text (cluster blocks etc.). */
  config?: string;
  serverName?: string;
  auth?: NatsServerAuth;
  tls?: NatsServerTls;
}

/** nats-server config strings: double-quoted with JSON escapes, which its parser accepts. */
const q = (s: string) => JSON.stringify(s);

/** The `authorization` and `tls` blocks for `opts` (pure). */
export function securityConfig(auth?: NatsServerAuth, tls?: NatsServerTls): string {
  const out: string[] = [];
  if (auth) {
    const users = [
      ...(auth.users ?? []).map((u) => `    { user: ${q(u.user)}, password: ${q(u.password)} }`),
      ...(auth.nkeys ?? []).map((k) => `    { nkey: ${q(k)} }`),
    ];
    if (auth.token !== undefined && users.length > 0) throw new Error("nats-server cannot combine a token with users or nkeys");
    if (auth.token === undefined && users.length === 0) throw new Error("auth: give users, nkeys or a token");
    out.push(auth.token !== undefined ? `authorization {\n  token: ${q(auth.token)}\n}` : `authorization {\n  users: [\n${users.join("\n")}\n  ]\n}`);
  }
  if (tls) {
    if (tls.verify && !tls.caFile) throw new Error("tls.verify needs tls.caFile");
    const lines = [`  cert_file: ${q(tls.certFile)}`, `  key_file: ${q(tls.keyFile)}`, "  timeout: 5"];
    if (tls.caFile) lines.push(`  ca_file: ${q(tls.caFile)}`);
    if (tls.verify) lines.push("  verify: true");
    out.push(`tls {\n${lines.join("\n")}\n}`);
  }
  return out.join("\n");
}

export async function startNatsServer(opts: StartOptions = {}): Promise<NatsServerHandle> {
  const port = opts.port ?? (await freePort());
  const storeDir = opts.storeDir ?? mkdtempSync(path.join(os.tmpdir(), "jetroute-nats-"));
  const confPath = path.join(storeDir, "nats.conf");
  writeFileSync(
    confPath,
    [
      `port: ${port}`,
      `host: 127.0.0.1`,
      `server_name: ${opts.serverName ?? `jr-${port}`}`,
      // Streams reserve their max_bytes against this limit; nats-server's default (75 % of the free
      // disk at start) made a test file that applies the full set of streams under a dozen prefixes
      // fail on a fuller disk. The reservation is a bound, not an allocation: what is stored stays
      // within each stream's own max_bytes.
      `jetstream { store_dir: "${path.join(storeDir, "js")}", max_file_store: 1T }`,
      `max_payload: 8MB`,
      securityConfig(opts.auth, opts.tls),
      opts.config ?? "",
    ].join("\n"),
  );
  const proc = spawn(natsServerBinary(), ["-c", confPath], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  proc.stderr?.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  await waitForPort(port, proc, 10_000, () => stderr);
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    storeDir,
    proc,
    async stop(graceMs = 10_000) {
      await stopProc(proc, "SIGTERM", graceMs);
      if (!opts.storeDir) rmSync(storeDir, { recursive: true, force: true });
    },
    async kill() {
      await stopProc(proc, "SIGKILL");
    },
  };
}

export interface NatsClusterHandle {
  servers: NatsServerHandle[];
  urls: string[];
  stop(): Promise<void>;
}

/** A 3-node JetStream cluster on loopback (for fault tests: kill a node, the streams stay up). */
export async function startNatsCluster(size = 3): Promise<NatsClusterHandle> {
  const clientPorts = await Promise.all(Array.from({ length: size }, () => freePort()));
  const clusterPorts = await Promise.all(Array.from({ length: size }, () => freePort()));
  const routes = clusterPorts.map((p) => `nats-route://127.0.0.1:${p}`).join(", ");
  const servers = await Promise.all(
    clientPorts.map((port, i) =>
      startNatsServer({
        port,
        serverName: `jr-node-${i}`,
        config: `cluster { name: jetroute-test, listen: 127.0.0.1:${clusterPorts[i]}, routes: [ ${routes} ] }`,
      }),
    ),
  );
  return {
    servers,
    urls: servers.map((s) => s.url),
    async stop() {
      await Promise.all(servers.map((s) => s.stop()));
    },
  };
}

// ---------------------------------------------------------------- throw-away certificates

export interface TestPki {
  dir: string;
  /** The CA that signs everything below. */
  caFile: string;
  /** Server certificate for 127.0.0.1 and localhost. */
  serverCertFile: string;
  serverKeyFile: string;
  /** Client certificate (extendedKeyUsage clientAuth). */
  clientCertFile: string;
  clientKeyFile: string;
  /** An unrelated CA, and a client certificate it signed: both must be refused. */
  otherCaFile: string;
  otherClientCertFile: string;
  otherClientKeyFile: string;
}

const OPENSSL_CONFIG = `[req]
distinguished_name = dn
prompt = no
[dn]
CN = jetroute-test
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
`;

function openssl(args: string[], cwd: string): void {
  try {
    execFileSync("openssl", args, { cwd, stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, OPENSSL_CONF: path.join(cwd, "openssl.cnf") } });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: Buffer };
    if (e.code === "ENOENT") throw new Error("openssl not found: the TLS tests make their certificates with it (`apt-get install -y openssl`)");
    throw new Error(`openssl ${args[0]} failed: ${e.stderr?.toString() ?? e.message}`);
  }
}

/**
 * A CA, a server certificate (127.0.0.1, localhost), a client certificate, and an unrelated CA
 * with its own client certificate, all P-256, valid for two days, in `dir` (created if needed).
 * Uses the `openssl` binary: it is part of every Debian/Ubuntu base system.
 */
export function createTestPki(dir: string): TestPki {
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, "openssl.cnf"), OPENSSL_CONFIG);
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  const ca = (name: string) => openssl(["req", "-x509", "-config", "openssl.cnf", "-extensions", "ca_ext", ...ec, "-keyout", `${name}.key`, "-out", `${name}.pem`, "-days", "2", "-subj", `/CN=${name}`], dir);
  const leaf = (name: string, signer: string, ext: string, cn: string) => {
    openssl(["req", "-new", "-config", "openssl.cnf", ...ec, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${cn}`], dir);
    const serial = `0x${Date.now().toString(16)}${Math.floor(Math.random() * 0xffff).toString(16)}`;
    openssl(["x509", "-req", "-in", `${name}.csr`, "-CA", `${signer}.pem`, "-CAkey", `${signer}.key`, "-set_serial", serial, "-days", "2", "-extfile", "openssl.cnf", "-extensions", ext, "-out", `${name}.pem`], dir);
  };
  ca("ca");
  ca("other-ca");
  leaf("server", "ca", "server_ext", "localhost");
  leaf("client", "ca", "client_ext", "jetroute-client");
  leaf("other-client", "other-ca", "client_ext", "jetroute-client");
  const f = (n: string) => path.join(dir, n);
  return {
    dir,
    caFile: f("ca.pem"),
    serverCertFile: f("server.pem"),
    serverKeyFile: f("server.key"),
    clientCertFile: f("client.pem"),
    clientKeyFile: f("client.key"),
    otherCaFile: f("other-ca.pem"),
    otherClientCertFile: f("other-client.pem"),
    otherClientKeyFile: f("other-client.key"),
  };
}

// ---------------------------------------------------------------- throw-away decentralized auth

export interface TestOperator {
  /** Config text for `startNatsServer({ config })`: operator, system account, memory resolver. */
  config: string;
  /** Creds file (user JWT + seed) of a user of the JetStream-enabled account. */
  credsFile: string;
  /** Creds file of a user signed by an account the server does not know: must be refused. */
  foreignCredsFile: string;
}

type KeyPair = ReturnType<typeof nkeys.createAccount>;

/** A NATS JWT (v2 claims, ed25519-nkey) for `subject`, signed by `issuer`. */
function natsJwt(issuer: KeyPair, subject: string, name: string, nats: Record<string, unknown>): string {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const head = b64({ typ: "JWT", alg: "ed25519-nkey" });
  const body = b64({ jti: `${Date.now().toString(36)}${Math.random().toString(36).slice(2)}`, iat: Math.floor(Date.now() / 1000), iss: issuer.getPublicKey(), name, sub: subject, nats: { ...nats, version: 2 } });
  const sig = Buffer.from(issuer.sign(new TextEncoder().encode(`${head}.${body}`))).toString("base64url");
  return `${head}.${body}.${sig}`;
}

function credsText(userJwt: string, seed: Uint8Array): string {
  return [
    "-----BEGIN NATS USER JWT-----",
    userJwt,
    "------END NATS USER JWT------",
    "",
    "-----BEGIN USER NKEY SEED-----",
    new TextDecoder().decode(seed),
    "------END USER NKEY SEED------",
    "",
  ].join("\n");
}

/**
 * An operator, a system account, an account with unlimited JetStream and one user of it, all
 * minted here with nkeys; the creds files are written to `dir` (created if needed).
 */
export function createTestOperator(dir: string): TestOperator {
  mkdirSync(dir, { recursive: true });
  const unlimited = { subs: -1, data: -1, payload: -1, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 };
  const operator = nkeys.createOperator();
  const system = nkeys.createAccount();
  const account = nkeys.createAccount();
  const stranger = nkeys.createAccount();
  const operatorJwt = natsJwt(operator, operator.getPublicKey(), "jetroute-test", { type: "operator" });
  const systemJwt = natsJwt(operator, system.getPublicKey(), "SYS", { type: "account", limits: unlimited });
  const accountJwt = natsJwt(operator, account.getPublicKey(), "jetroute", {
    type: "account",
    limits: { ...unlimited, mem_storage: -1, disk_storage: -1, streams: -1, consumer: -1 },
  });
  const user = (signer: KeyPair, file: string) => {
    const u = nkeys.createUser();
    const jwt = natsJwt(signer, u.getPublicKey(), "jetroute-user", { type: "user", pub: {}, sub: {}, subs: -1, data: -1, payload: -1 });
    writeFileSync(file, credsText(jwt, u.getSeed()), { mode: 0o600 });
    return file;
  };
  return {
    config: [
      `operator: ${q(operatorJwt)}`,
      `system_account: ${system.getPublicKey()}`,
      "resolver: MEMORY",
      `resolver_preload: {\n  ${system.getPublicKey()}: ${q(systemJwt)}\n  ${account.getPublicKey()}: ${q(accountJwt)}\n}`,
    ].join("\n"),
    credsFile: user(account, path.join(dir, "user.creds")),
    foreignCredsFile: user(stranger, path.join(dir, "foreign.creds")),
  };
}
