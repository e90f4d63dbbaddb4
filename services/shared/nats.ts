/**
 * One way to connect to NATS for every jetroute process.
 *
 * `noAsyncTraces`: the v3 client otherwise builds an Error with a stack trace for every request
 * (every JetStream publish), which more than halves publish throughput.
 *
 * Authentication and TLS come from the environment variables the `nats` CLI reads, so every
 * command gets them without flags of its own:
 *
 * | variable | meaning |
 * |---|---|
 * | `NATS_CREDS` | path of a `.creds` file (user JWT + nkey seed; decentralized auth) |
 * | `NATS_NKEY` | path of a file holding a user nkey seed (`SU...`) |
 * | `NATS_USER` + `NATS_PASSWORD` | user and password |
 * | `NATS_TOKEN` | authentication token |
 * | `NATS_CA` | PEM CA bundle that signs the server certificate: TLS is required and verified |
 * | `NATS_CERT` + `NATS_KEY` | PEM client certificate and key: mutual TLS |
 *
 * At most one authentication method may be set. `user:password@` (or `token@`) in a server URL
 * is accepted as well (the v3 client ignores URL credentials, so they are taken out of the URL
 * here), but not together with one of the variables. Files are checked when connecting, with an
 * error that names the variable and the path, and re-read on every reconnect, so a rotated
 * Secret is picked up without a restart. Secrets (passwords, tokens, seeds) never appear in
 * errors or descriptions.
 *
 * `natsAuthFromEnv` and `resolveNatsSecurity` are pure; `natsSecurityOptions` does the file I/O.
 */
import { readFileSync } from "node:fs";
import net from "node:net";
import tls from "node:tls";
import { type JetStreamClient, type JetStreamManager, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  type Authenticator,
  connect,
  credsAuthenticator,
  type NatsConnection,
  type NodeConnectionOptions,
  nkeyAuthenticator,
  tokenAuthenticator,
  usernamePasswordAuthenticator,
} from "@nats-io/transport-node";
import { isStreamNotFound } from "../../streams/errors.js";

export interface NatsHandles {
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  /** How the connection authenticates and encrypts, without secrets (for logs). */
  security: string;
}

export const DEFAULT_NATS_URL = "nats://127.0.0.1:4222";

/** The environment variables read, by role. */
export const NATS_ENV = {
  creds: "NATS_CREDS",
  nkey: "NATS_NKEY",
  user: "NATS_USER",
  password: "NATS_PASSWORD",
  token: "NATS_TOKEN",
  ca: "NATS_CA",
  cert: "NATS_CERT",
  key: "NATS_KEY",
} as const;

export type NatsEnv = Readonly<Record<string, string | undefined>>;

export type NatsAuth =
  | { method: "none" }
  | { method: "creds"; file: string }
  | { method: "nkey"; file: string }
  | { method: "user-password"; user: string; password: string; from: "env" | "url" }
  | { method: "token"; token: string; from: "env" | "url" };

export interface NatsTlsFiles {
  caFile?: string;
  certFile?: string;
  keyFile?: string;
}

export interface NatsSecurity {
  auth: NatsAuth;
  /** Present when TLS is required (any of NATS_CA, NATS_CERT/NATS_KEY set). */
  tls?: NatsTlsFiles;
}

/** A configuration mistake, found before any connection attempt. */
export class NatsConfigError extends Error {
  override name = "NatsConfigError";
}

/** Unset and empty are the same: an optional Kubernetes secretKeyRef leaves the variable unset. */
function envValue(env: NatsEnv, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v === "" ? undefined : v;
}

/**
 * Authentication and TLS settings from the environment (pure). Throws NatsConfigError on
 * conflicting or incomplete settings.
 */
export function natsAuthFromEnv(env: NatsEnv): NatsSecurity {
  const creds = envValue(env, NATS_ENV.creds);
  const nkey = envValue(env, NATS_ENV.nkey);
  const user = envValue(env, NATS_ENV.user);
  const password = envValue(env, NATS_ENV.password);
  const token = envValue(env, NATS_ENV.token);

  const set: string[] = [];
  if (creds !== undefined) set.push(NATS_ENV.creds);
  if (nkey !== undefined) set.push(NATS_ENV.nkey);
  if (user !== undefined || password !== undefined) set.push(`${NATS_ENV.user}/${NATS_ENV.password}`);
  if (token !== undefined) set.push(NATS_ENV.token);
  if (set.length > 1) {
    throw new NatsConfigError(
      `conflicting NATS authentication settings: ${set.join(" and ")} are set; set exactly one of ${NATS_ENV.creds}, ${NATS_ENV.nkey}, ${NATS_ENV.user}+${NATS_ENV.password} or ${NATS_ENV.token}`,
    );
  }

  let auth: NatsAuth = { method: "none" };
  if (creds !== undefined) auth = { method: "creds", file: creds };
  else if (nkey !== undefined) auth = { method: "nkey", file: nkey };
  else if (token !== undefined) auth = { method: "token", token, from: "env" };
  else if (user !== undefined || password !== undefined) {
    if (user === undefined) throw new NatsConfigError(`${NATS_ENV.password} is set without ${NATS_ENV.user}`);
    if (password === undefined) throw new NatsConfigError(`${NATS_ENV.user} is set without ${NATS_ENV.password}; set both (for token authentication use ${NATS_ENV.token})`);
    auth = { method: "user-password", user, password, from: "env" };
  }

  const caFile = envValue(env, NATS_ENV.ca);
  const certFile = envValue(env, NATS_ENV.cert);
  const keyFile = envValue(env, NATS_ENV.key);
  if (certFile !== undefined && keyFile === undefined) throw new NatsConfigError(`${NATS_ENV.cert} is set without ${NATS_ENV.key}: a client certificate needs its private key`);
  if (keyFile !== undefined && certFile === undefined) throw new NatsConfigError(`${NATS_ENV.key} is set without ${NATS_ENV.cert}: a private key needs its client certificate`);
  if (caFile === undefined && certFile === undefined) return { auth };
  const tls: NatsTlsFiles = {};
  if (caFile !== undefined) tls.caFile = caFile;
  if (certFile !== undefined) tls.certFile = certFile;
  if (keyFile !== undefined) tls.keyFile = keyFile;
  return { auth, tls };
}

/**
 * scheme://userinfo@host:port. The userinfo runs to the last `@` (a host has none), so a password
 * with an unescaped `/` or `@` in it is still taken out whole rather than half-logged.
 */
const USERINFO = /^((?:[a-z][a-z0-9+.-]*:\/\/)?)(.*)@([^@]*)$/is;

/** `url` with any `user:password@` or `token@` removed (pure; for logs and error messages). */
export function redactNatsUrl(url: string): string {
  const m = USERINFO.exec(url);
  return m ? `${m[1]}${m[3]}` : url;
}

function decodeUserinfo(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

/**
 * Server URLs split on commas, credentials taken out of them, and the settings of the
 * environment (pure). Credentials in a URL are `user:password@host` or `token@host`; several
 * URLs may carry them only if they agree.
 */
export function resolveNatsSecurity(servers: string | readonly string[], env: NatsEnv): { servers: string[]; security: NatsSecurity } {
  const list = (typeof servers === "string" ? [servers] : [...servers]).flatMap((s) => s.split(",")).map((s) => s.trim()).filter(Boolean);
  let urlAuth: NatsAuth | undefined;
  let urlAuthKey: string | undefined;
  const stripped = list.map((s) => {
    const m = USERINFO.exec(s);
    if (!m) return s;
    const info = m[2] as string;
    const colon = info.indexOf(":");
    const auth: NatsAuth =
      colon < 0
        ? { method: "token", token: decodeUserinfo(info), from: "url" }
        : { method: "user-password", user: decodeUserinfo(info.slice(0, colon)), password: decodeUserinfo(info.slice(colon + 1)), from: "url" };
    if (urlAuthKey !== undefined && urlAuthKey !== info) throw new NatsConfigError("the NATS server URLs carry different credentials; use the same on every URL, or none and the NATS_* variables");
    urlAuthKey = info;
    urlAuth = auth;
    return `${m[1]}${m[3]}`;
  });
  const security = natsAuthFromEnv(env);
  if (urlAuth) {
    if (security.auth.method !== "none") {
      throw new NatsConfigError(`conflicting NATS authentication settings: a server URL carries credentials and ${describeAuthSource(security.auth)} is set; use one or the other`);
    }
    security.auth = urlAuth;
  }
  return { servers: stripped, security };
}

function describeAuthSource(auth: NatsAuth): string {
  switch (auth.method) {
    case "none":
      return "nothing";
    case "creds":
      return NATS_ENV.creds;
    case "nkey":
      return NATS_ENV.nkey;
    case "user-password":
      return auth.from === "url" ? "the server URL" : `${NATS_ENV.user}+${NATS_ENV.password}`;
    case "token":
      return auth.from === "url" ? "the server URL" : NATS_ENV.token;
  }
}

/** A one-line description without secrets, e.g. `auth: nkey seed from NATS_NKEY=/etc/nats/user.nk; TLS: CA NATS_CA=/etc/nats/ca.pem`. */
export function describeNatsSecurity(sec: NatsSecurity): string {
  const a = sec.auth;
  let auth: string;
  switch (a.method) {
    case "none":
      auth = "no authentication";
      break;
    case "creds":
      auth = `auth: credentials file ${NATS_ENV.creds}=${a.file}`;
      break;
    case "nkey":
      auth = `auth: nkey seed file ${NATS_ENV.nkey}=${a.file}`;
      break;
    case "user-password":
      auth = `auth: user ${JSON.stringify(a.user)} with password from ${describeAuthSource(a)}`;
      break;
    case "token":
      auth = `auth: token from ${describeAuthSource(a)}`;
      break;
  }
  if (!sec.tls) return `${auth}; TLS only if the server requires it, verified against the system CAs`;
  const parts: string[] = [sec.tls.caFile !== undefined ? `CA ${NATS_ENV.ca}=${sec.tls.caFile}` : "system CAs"];
  if (sec.tls.certFile !== undefined) parts.push(`client certificate ${NATS_ENV.cert}=${sec.tls.certFile}`);
  return `${auth}; TLS required (${parts.join(", ")})`;
}

// ---------------------------------------------------------------- file I/O

export type ReadFile = (file: string) => Buffer;

function readOrThrow(variable: string, file: string, read: ReadFile): Buffer {
  try {
    return read(file);
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const why = e.code === "ENOENT" ? "no such file" : e.code === "EACCES" ? "permission denied" : e.code === "EISDIR" ? "is a directory" : (e.code ?? e.message);
    throw new NatsConfigError(`${variable}=${file}: cannot read the file (${why})`);
  }
}

/** CRLF line ends break the client's creds parser. */
const normalise = (b: Buffer) => Buffer.from(b.toString("utf8").replace(/\r\n/g, "\n"));

/**
 * A reader for the authenticator: the file as it is now (rotated Secrets are picked up on the
 * next reconnect), or the last good content when it is momentarily unreadable.
 */
function rereading(file: string, first: Uint8Array, transform: (b: Buffer) => Uint8Array, read: ReadFile): () => Uint8Array {
  let last = first;
  return () => {
    try {
      last = transform(read(file));
    } catch {
      /* keep the last good content */
    }
    return last;
  };
}

function checkedAuthenticator(variable: string, file: string, what: string, make: () => Authenticator): Authenticator {
  const a = make();
  try {
    // Signing a nonce parses the file the way every (re)connect will; the message of a failure
    // names what is wrong (bad seed, no JWT block) without quoting the content.
    a("jetroute-check");
  } catch (err) {
    throw new NatsConfigError(`${variable}=${file}: not a valid ${what} (${(err as Error).message})`);
  }
  return a;
}

function checkPem(variable: string, file: string, content: Buffer, marker: RegExp, what: string): void {
  if (!marker.test(content.toString("utf8"))) throw new NatsConfigError(`${variable}=${file}: not a PEM ${what}`);
}

/**
 * The client options (`authenticator`, `tls`) for resolved settings. Reads and checks every
 * file now, so a wrong path or a swapped file fails at start with the variable's name.
 */
export function natsSecurityOptions(sec: NatsSecurity, read: ReadFile = readFileSync): Pick<NodeConnectionOptions, "authenticator" | "tls"> {
  const out: Pick<NodeConnectionOptions, "authenticator" | "tls"> = {};
  const a = sec.auth;
  switch (a.method) {
    case "none":
      break;
    case "creds": {
      const first = normalise(readOrThrow(NATS_ENV.creds, a.file, read));
      out.authenticator = checkedAuthenticator(NATS_ENV.creds, a.file, "NATS credentials file", () => credsAuthenticator(rereading(a.file, first, normalise, read)));
      break;
    }
    case "nkey": {
      const seed = (b: Buffer) => new TextEncoder().encode(b.toString("utf8").trim());
      const first = seed(readOrThrow(NATS_ENV.nkey, a.file, read));
      // "SU": a user seed. An account or operator seed, or a public key, would sign as the wrong
      // identity or not at all.
      if (first[0] !== 0x53 || first[1] !== 0x55) throw new NatsConfigError(`${NATS_ENV.nkey}=${a.file}: not a user nkey seed (the file must hold one line starting with SU)`);
      out.authenticator = checkedAuthenticator(NATS_ENV.nkey, a.file, "nkey seed file", () => nkeyAuthenticator(rereading(a.file, first, seed, read)));
      break;
    }
    case "user-password":
      out.authenticator = usernamePasswordAuthenticator(a.user, a.password);
      break;
    case "token":
      out.authenticator = tokenAuthenticator(a.token);
      break;
  }
  if (sec.tls) {
    const { caFile, certFile, keyFile } = sec.tls;
    const cert = /-----BEGIN CERTIFICATE-----/;
    if (caFile !== undefined) checkPem(NATS_ENV.ca, caFile, readOrThrow(NATS_ENV.ca, caFile, read), cert, "certificate (CA bundle)");
    if (certFile !== undefined) checkPem(NATS_ENV.cert, certFile, readOrThrow(NATS_ENV.cert, certFile, read), cert, "certificate");
    if (keyFile !== undefined) checkPem(NATS_ENV.key, keyFile, readOrThrow(NATS_ENV.key, keyFile, read), /-----BEGIN [A-Z ]*PRIVATE KEY-----/, "private key");
    // File names, not contents: the client re-reads them on every (re)connect.
    out.tls = { ...sec.tls };
  }
  return out;
}

// ---------------------------------------------------------------- connecting

/** Handshake timeout per attempt (the client's default is 20 s; the Go client's 2 s). */
export const NATS_CONNECT_TIMEOUT_MS = 5_000;

const TLS_TRUST_CODES = new Set([
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_GET_ISSUER_CERT",
  "CERT_SIGNATURE_FAILURE",
]);

/**
 * What to tell the operator about a failed first connection (pure). `tlsAlert` is the error code
 * of a TLS probe made after the failure (see `probeTls`), if any.
 */
export function connectFailureHint(err: unknown, sec: NatsSecurity, tlsAlert?: string): string {
  const e = err as { name?: string; message?: string; code?: string; cause?: { code?: string; message?: string } };
  const code = e.code ?? e.cause?.code ?? "";
  const msg = `${e.message ?? ""} ${e.cause?.message ?? ""}`.toLowerCase();
  const cert = sec.tls?.certFile;
  if (e.name === "AuthorizationError" || msg.includes("authorization violation")) {
    return sec.auth.method === "none"
      ? `the server requires authentication: set ${NATS_ENV.creds}, ${NATS_ENV.nkey}, ${NATS_ENV.user} and ${NATS_ENV.password}, or ${NATS_ENV.token}`
      : `the server rejected the credentials from ${describeAuthSource(sec.auth)}`;
  }
  if (TLS_TRUST_CODES.has(code)) {
    return sec.tls?.caFile !== undefined
      ? `the server's certificate is not signed by the CA in ${NATS_ENV.ca}=${sec.tls.caFile}`
      : `the server's certificate is not trusted: set ${NATS_ENV.ca} to the CA bundle that signed it`;
  }
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID") return "the server's certificate does not name the host of the server URL";
  if (code === "CERT_HAS_EXPIRED") return "the server's certificate has expired";
  if (sec.tls && msg.includes("does not support 'tls'")) return `${cert !== undefined ? NATS_ENV.cert : NATS_ENV.ca} is set but the server does not offer TLS`;
  if (tlsAlert !== undefined) {
    if (/CERTIFICATE_REQUIRED|BAD_CERTIFICATE|HANDSHAKE_FAILURE/.test(tlsAlert) && cert === undefined) return `the server requires a client certificate: set ${NATS_ENV.cert} and ${NATS_ENV.key}`;
    if (/ALERT/.test(tlsAlert) && cert !== undefined) return `the server refused the client certificate ${NATS_ENV.cert}=${cert} (${tlsAlert})`;
    return `TLS failed: ${tlsAlert}`;
  }
  if (e.name === "TimeoutError" || msg.trim() === "timeout") {
    return sec.tls ? "no NATS handshake in time; the TLS session was set up, so check the server's TLS client-certificate settings" : "no NATS handshake in time";
  }
  return "";
}

/**
 * After a failed first connection with TLS: upgrades one plain connection the way the client
 * does (INFO line, then TLS) and reports the TLS alert the server sends, if any. With TLS 1.3 a
 * refused client certificate only arrives after the client considers the handshake done, and the
 * client then waits for its handshake timeout without saying why.
 */
async function probeTls(server: string, files: NatsTlsFiles, read: ReadFile): Promise<string | undefined> {
  let host: string;
  let port: number;
  try {
    const u = new URL(server.includes("://") ? server : `nats://${server}`);
    host = u.hostname.replace(/^\[|\]$/g, "");
    port = Number(u.port || 4222);
  } catch {
    return undefined;
  }
  const opts: tls.ConnectionOptions = { servername: net.isIP(host) ? undefined : host, rejectUnauthorized: false };
  try {
    if (files.caFile !== undefined) opts.ca = read(files.caFile);
    if (files.certFile !== undefined) opts.cert = read(files.certFile);
    if (files.keyFile !== undefined) opts.key = read(files.keyFile);
  } catch {
    return undefined;
  }
  return await new Promise<string | undefined>((resolve) => {
    const sock = net.connect(port, host);
    let secure: tls.TLSSocket | undefined;
    let info = "";
    const finish = (r: string | undefined) => {
      clearTimeout(timer);
      secure?.destroy();
      sock.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => finish(undefined), 2_000);
    sock.once("error", () => finish(undefined));
    sock.on("data", (d: Buffer) => {
      info += d.toString("latin1");
      if (!info.includes("\r\n")) return;
      sock.removeAllListeners("data");
      secure = tls.connect({ ...opts, socket: sock });
      secure.once("error", (err: NodeJS.ErrnoException) => finish(err.code ?? err.message));
      secure.once("close", () => finish(undefined));
      // A TLS 1.3 server verifies the client certificate after the client's Finished: give its
      // alert a moment to arrive.
      secure.once("secureConnect", () => setTimeout(() => finish(undefined), 500));
    });
  });
}

export class NatsConnectError extends Error {
  override name = "NatsConnectError";
}

/**
 * Connects with the settings of `env` (default: the process environment). A failure throws a
 * NatsConnectError naming the servers (without credentials), the settings in use and, when it
 * can tell, what to change.
 */
export async function connectNats(servers: string | string[] = process.env.NATS_URL ?? DEFAULT_NATS_URL, name?: string, env: NatsEnv = process.env): Promise<NatsHandles> {
  const resolved = resolveNatsSecurity(servers, env);
  const options = natsSecurityOptions(resolved.security);
  const security = describeNatsSecurity(resolved.security);
  let nc: NatsConnection;
  try {
    nc = await connect({
      servers: resolved.servers,
      name,
      noAsyncTraces: true,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
      timeout: NATS_CONNECT_TIMEOUT_MS,
      ...options,
    });
  } catch (err) {
    const e = err as Error;
    const first = resolved.servers[0];
    const alert = resolved.security.tls && first !== undefined && e.name === "TimeoutError" ? await probeTls(first, resolved.security.tls, readFileSync) : undefined;
    const hint = connectFailureHint(err, resolved.security, alert);
    const where = resolved.servers.map(redactNatsUrl).join(",");
    throw new NatsConnectError(`cannot connect to NATS at ${where} (${security}): ${e.message}${hint ? `: ${hint}` : ""}`, { cause: err });
  }
  const js = jetstream(nc);
  // Without JetStream (or before a fresh cluster elects its meta leader) this fails: the
  // connection would otherwise stay, reconnecting forever, and keep the process alive.
  const jsm = await jetstreamManager(nc).catch(async (err: unknown) => {
    await nc.close().catch(() => undefined);
    throw err;
  });
  return { nc, js, jsm, security };
}

/**
 * Fails with an operator's message when `stream` does not exist (`jetroute streams apply` was not
 * run); the connection is closed first, so a service refusing to start leaves nothing open.
 */
export async function requireStream(nats: NatsHandles, stream: string): Promise<void> {
  try {
    await nats.jsm.streams.info(stream);
  } catch (err) {
    await nats.nc.close();
    if (isStreamNotFound(err)) throw new Error(`stream ${stream} does not exist: run \`jetroute streams apply\` first`);
    throw err;
  }
}
