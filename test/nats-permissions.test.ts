/**
 * The NATS users and permissions shipped in deploy/nats/values.yaml (`config.merge.accounts`),
 * on a real nats-server started with exactly that block: the file is read and rendered the way
 * the Helm chart renders it (YAML to the server's JSON-compatible config, `<< $VAR >>` as an
 * unquoted variable reference the server resolves from its environment), so this checks the
 * shipped configuration, not a copy.
 *
 * Each user does its job with real jetroute processes (admin: `streams apply`, `config set`,
 * `config add-key --admin`; pod-watcher: publishes pods; gateway: turns ready, routes a request,
 * publishes its charge and decision) and is refused everything else: the client's
 * PermissionViolationError (a JetStream publish is a request, so the client fails exactly that
 * request) and the server's own "Publish Violation" log line, never a timeout or a sleep.
 *
 * Consumers: each process may open them only on the streams it follows (harness/nats-consumer-streams.ts
 * has the rule), proved both ways: the real processes follow their streams without a refusal, and
 * a consumer anywhere else, in particular a push consumer aimed at a subject the gateways act on
 * (nats-server#8274: the deliver subject is not checked against publish permissions), is refused
 * at creation, so no such consumer exists. Where the permissions cannot refuse it (a gateway follows
 * CHARGES, which it also writes), signed records do: a gateway started with the public keys ignores
 * the API key and the pod such a consumer would plant (and the same records stored by hand).
 */
import { randomBytes } from "node:crypto";
import http from "node:http";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import { errors } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { ExtProcClient } from "../services/extproc/envoy-client.js";
import { apiKeyBucketKey, hashApiKey } from "../services/gateway/auth.js";
import { generateSigningKeyPair } from "../streams/signatures.js";
import { connectNats, type NatsHandles } from "../services/shared/nats.js";
import { PacedPullReader } from "../services/shared/paced-pull.js";
import { type NatsServerHandle, startNatsServer } from "../services/shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../services/shared/processes.js";
import { AUTOSCALE_KEY_PREFIX } from "../schemas/autoscale.js";
import { configBucketName, filesBucketName, leaseBucketName, snapshotBucketName, streamName } from "../streams/definitions.js";
import { isConsumerNotFound } from "../streams/errors.js";
import { namespaceOf } from "../streams/pools.js";
import { Family, Subjects } from "../streams/subjects.js";
import { encodeToken } from "../streams/tokens.js";
import { MODEL_CONFIG_KEY_PREFIX } from "../schemas/config.js";
import { consumerAllowances, expectedConsumerAllowances } from "./harness/nats-consumer-streams.js";
import { waitFor } from "./harness/wait.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const VALUES = path.join(ROOT, "deploy/nats/values.yaml");
const MODEL = "perm/model";
const subjects = new Subjects("jr");
/** The example gateway pools, one directory each under deploy/pools (the Component `pool` aside). */
/** The stream a consumer API subject (or allowance) names. */
const CONSUMER_API_STREAM = /^\$JS\.API\.CONSUMER\.(?:CREATE|INFO|MSG\.NEXT|DELETE)\.([^.]+)/;
const POOLS = readdirSync(path.join(ROOT, "deploy/pools"), { withFileTypes: true })
  .filter((d) => d.isDirectory() && d.name !== "pool")
  .map((d) => d.name)
  .sort();

interface Permissions {
  publish?: { allow?: string[]; deny?: string[] };
  subscribe?: { allow?: string[]; deny?: string[] };
}
interface ShippedUser {
  user: string;
  password: string;
  permissions: Permissions;
}

/** The accounts block of the shipped values, and each user's password variable. */
function shippedAccounts(): { accounts: Record<string, { jetstream?: unknown; users: ShippedUser[] }>; passwordVar: Map<string, string> } {
  const values = parse(readFileSync(VALUES, "utf8")) as { config?: { merge?: { accounts?: Record<string, { users: ShippedUser[] }> } } };
  const accounts = values.config?.merge?.accounts;
  if (!accounts) throw new Error(`${VALUES}: no config.merge.accounts`);
  const passwordVar = new Map<string, string>();
  for (const a of Object.values(accounts)) {
    for (const u of a.users) {
      const m = /^<< \$([A-Z0-9_]+) >>$/.exec(u.password);
      if (!m?.[1]) throw new Error(`${VALUES}: user ${u.user}: the password must be a << $VAR >> reference, not a literal`);
      passwordVar.set(u.user, m[1]);
    }
  }
  return { accounts, passwordVar };
}

/** As the chart renders `merge`: JSON, with `<< x >>` strings unquoted. */
function renderNatsConfig(block: unknown): string {
  return JSON.stringify(block, null, 2).replace(/"<< (.*?) >>"/g, "$1");
}

const dir = mkdtempSync(path.join(os.tmpdir(), "jetroute-nats-permissions-"));
const { accounts, passwordVar } = shippedAccounts();
const passwords = new Map<string, string>();
let server: NatsServerHandle;
/** The server's permission-violation log lines, as they arrive. */
const violations: string[] = [];
const violationWaiters: Array<{ re: RegExp; resolve: (line: string) => void }> = [];
const conns: NatsHandles[] = [];
const procs: ServiceProcess[] = [];

/** Every NATS_* variable blanked, so the runner's environment cannot leak into a child. */
const BLANK = { NATS_CREDS: "", NATS_NKEY: "", NATS_USER: "", NATS_PASSWORD: "", NATS_TOKEN: "", NATS_CA: "", NATS_CERT: "", NATS_KEY: "" };
const envOf = (user: string) => ({ ...BLANK, NATS_USER: user, NATS_PASSWORD: passwords.get(user) ?? "" });

async function as(user: string): Promise<NatsHandles> {
  const h = await connectNats(server.url, `perm-test-${user}`, envOf(user));
  conns.push(h);
  return h;
}

/** Resolves with the server's violation line for `user` and `subject` (already logged or to come). */
function serverViolation(user: string, subject: string | RegExp): Promise<string> {
  const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const re = new RegExp(`Publish Violation - User "${esc(user)}", Subject "${typeof subject === "string" ? esc(subject) : subject.source}"`);
  const seen = violations.find((l) => re.test(l));
  if (seen) return Promise.resolve(seen);
  // The server logs the refusal as it sends the -ERR, so it is here within milliseconds of the
  // client's error; the bound only turns a missing line into a readable failure.
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`the server logged no violation matching ${re}; seen: ${violations.join("\n")}`)), 5_000);
    violationWaiters.push({ re, resolve: (l) => {
        clearTimeout(t);
        resolve(l);
      } });
  });
}

type PermissionViolation = InstanceType<typeof errors.PermissionViolationError>;

/**
 * The PermissionViolationError behind a failed call. A core request fails with it directly; the
 * JetStream and KV clients wrap it in a RequestError whose `cause` it is.
 */
function permissionViolation(err: unknown): PermissionViolation | undefined {
  for (let e = err; e instanceof Error; e = e.cause) if (e instanceof errors.PermissionViolationError) return e;
  return undefined;
}

/**
 * `fn` must fail with the client's PermissionViolationError for a publish to `subject` (or one
 * matching it: consumer names are the client's), and the server must log it.
 */
async function refused(user: string, subject: string | RegExp, fn: () => Promise<unknown>): Promise<void> {
  let err: unknown;
  try {
    await fn();
  } catch (e) {
    err = e;
  }
  const pe = permissionViolation(err);
  expect(pe, `${user} publishing to ${subject} should have been refused, got ${String(err)}`).toBeInstanceOf(errors.PermissionViolationError);
  expect(pe?.operation).toBe("publish");
  if (typeof subject === "string") expect(pe?.subject).toBe(subject);
  else expect(pe?.subject).toMatch(subject);
  expect(await serverViolation(user, typeof subject === "string" ? subject : (pe?.subject as string))).toBeTruthy();
}

async function run(name: string, args: string[], user: string): Promise<{ code: number | null; json: Array<Record<string, unknown>>; log: string }> {
  const logFile = path.join(dir, `${name}.log`);
  const p = spawnJetroute(name, [...args, "--nats", server.url], { env: envOf(user), logFile });
  const code = await p.exited;
  return { code, json: p.jsonLines as Array<Record<string, unknown>>, log: readFileSync(logFile, "utf8") };
}

beforeAll(async () => {
  // The server resolves each `$VAR` from its own environment, as in the chart's container.env.
  for (const [user, v] of passwordVar) {
    // The recipe values.yaml gives: nats-server parses the variable's value as a config token,
    // so it must start with a letter (a leading digit reads as a number or a date and fails).
    const pw = `p${randomBytes(24).toString("hex")}`;
    passwords.set(user, pw);
    process.env[v] = pw;
  }
  server = await startNatsServer({ config: `accounts: ${renderNatsConfig(accounts)}` });
  let buf = "";
  server.proc.stderr?.on("data", (d: Buffer) => {
    buf += d.toString();
    const lines = buf.split("\n");
    buf = lines.pop() ?? "";
    for (const line of lines) {
      if (!/Violation/.test(line)) continue;
      violations.push(line);
      for (const w of [...violationWaiters]) {
        if (w.re.test(line)) {
          violationWaiters.splice(violationWaiters.indexOf(w), 1);
          w.resolve(line);
        }
      }
    }
  });
}, 30_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => p.stop()));
  await Promise.all(conns.map((c) => c.nc.close().catch(() => undefined)));
  await server?.stop();
  for (const v of passwordVar.values()) delete process.env[v];
  rmSync(dir, { recursive: true, force: true });
});

describe("the shipped NATS permissions (deploy/nats/values.yaml)", () => {
  it("name the subjects and buckets of prefix jr that streams/ defines, one user per process", () => {
    const users = Object.values(accounts).flatMap((a) => a.users);
    expect(users.map((u) => u.user).sort()).toEqual(["jr-admin", "jr-analyst", "jr-autoscaler", "jr-batch-api", "jr-batch-worker", "jr-gateway", "jr-kv-bridge", "jr-metrics-scraper", "jr-pod-watcher"]);
    const families = Object.values(Family) as string[];
    // The example gateway pools of deploy/pools have their own lease and snapshot buckets.
    const pools = POOLS.map((p) => namespaceOf("jr", p).prefix);
    const buckets = [configBucketName("jr"), leaseBucketName("jr"), snapshotBucketName("jr"), filesBucketName("jr"), ...pools.flatMap((p) => [leaseBucketName(p), snapshotBucketName(p)])];
    for (const u of users) {
      for (const s of [...(u.permissions.publish?.allow ?? []), ...(u.permissions.publish?.deny ?? [])]) {
        const fam = /^jr\.(?:pool\.\*\.)?([^.]+)\.>$/.exec(s);
        if (s.startsWith("jr.")) expect(fam && families.includes(fam[1] ?? ""), `${u.user}: ${s} is not a jr.<family>.> or jr.pool.*.<family>.> of streams/subjects.ts`).toBe(true);
        const b = /^\$(?:KV|O)\.([^.]+)\.>$/.exec(s);
        if (b) expect(buckets, `${u.user}: ${s} names no bucket of streams/definitions.ts`).toContain(b[1]);
      }
    }
  });

  it("let each process open consumers only on the streams it follows (the analyst on every stream)", () => {
    expect(consumerAllowances("JR_PODS")).toEqual(["$JS.API.CONSUMER.CREATE.JR_PODS.>", "$JS.API.CONSUMER.INFO.JR_PODS.*", "$JS.API.CONSUMER.MSG.NEXT.JR_PODS.*", "$JS.API.CONSUMER.DELETE.JR_PODS.*"]);
    expect(() => consumerAllowances("JR_*")).toThrow(/not a stream name/);
    for (const u of Object.values(accounts).flatMap((a) => a.users)) {
      const want = expectedConsumerAllowances(u.user, "jr", POOLS);
      if (want === undefined) {
        expect(u.user).toBe("jr-admin");
        continue;
      }
      const got = (u.permissions.publish?.allow ?? []).filter((s) => s.startsWith("$JS.API.CONSUMER.")).sort();
      expect(got, `${u.user}: its consumer allowances`).toEqual(want);
      // The scraper and the kv-bridge, which publish load samples and KV events, open consumers on PODS only.
      if (u.user === "jr-metrics-scraper" || u.user === "jr-kv-bridge") expect(new Set(got.map((s) => CONSUMER_API_STREAM.exec(s)?.[1]))).toEqual(new Set(["JR_PODS", "JR_POOL_CHAT_PODS", "JR_POOL_CODE_PODS"]));
    }
  });
});

describe("each user does its job", () => {
  it("admin: `streams apply`, `config set`, `config add-key --admin`, `config list-keys`", async () => {
    const apply = await run("streams-apply", ["streams", "apply"], "jr-admin");
    expect(apply.code, apply.log).toBe(0);
    const set = await run("config-set", ["config", "set", MODEL, "--json", JSON.stringify({ lockedRoutingStrategy: "least-request" })], "jr-admin");
    expect(set.code, set.log).toBe(0);
    const add = await run("add-key", ["config", "add-key", "--user", "ops", "--admin", "--json"], "jr-admin");
    expect(add.code, add.log).toBe(0);
    expect(add.json[0]).toMatchObject({ user: "ops", admin: true });
    const list = await run("list-keys", ["config", "list-keys", "--json"], "jr-admin");
    expect(list.code, list.log).toBe(0);
    expect(list.json).toEqual([expect.objectContaining({ user: "ops", admin: true, status: "active" })]);
  }, 60_000);

  it("pod-watcher publishes pods; a gateway on its own user turns ready, routes a request, publishes its charge and decision", async () => {
    const pods = path.join(dir, "pods.yaml");
    writeFileSync(pods, `pods:\n  - name: perm-pod-0\n    model: ${MODEL}\n    address: 127.0.0.1:18000\n    engine: vllm\n`);
    const watcher = spawnJetroute("pod-watcher", ["pod-watcher", "--static", pods, "--no-probe", "--nats", server.url], { env: envOf("jr-pod-watcher"), logFile: path.join(dir, "pod-watcher.log") });
    procs.push(watcher);
    const gw = spawnJetroute("gateway", ["gateway", "--nats", server.url, "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--heartbeat-ms", "200", "--snapshot-interval-ms", "1000"], {
      env: envOf("jr-gateway"),
      logFile: path.join(dir, "gateway.log"),
    });
    procs.push(gw);
    const started = await gw.waitForLine<{ gateway: string; port: number; adminPort: number }>((l) => typeof l.port === "number", 30_000);

    const admin = await as("jr-admin");
    const ready = async () => (await fetch(`http://127.0.0.1:${started.adminPort}/readyz`)).status === 200;
    // One budget for turning ready, routing and taking the lease.
    const deadline = Date.now() + 20_000;
    const left = () => Math.max(0, deadline - Date.now());
    const log = () => readFileSync(path.join(dir, "gateway.log"), "utf8").slice(-2000);
    await waitFor(ready, left(), () => `the gateway to turn ready: ${log()}`, 50);

    // Route one request over ext_proc; the pod may reach the gateway just after readiness.
    const decisions = admin.nc.subscribe(subjects.all("decisions"));
    const charges = admin.nc.subscribe(subjects.all("charges"));
    await admin.nc.flush();
    const c = new ExtProcClient(`127.0.0.1:${started.port}`);
    try {
      let endpoint: string | undefined;
      await waitFor(
        async () => {
          const ex = c.open();
          await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", "x-request-id": `perm-${Date.now()}` });
          const b = await ex.requestBody(Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello" }] })));
          ex.cancel();
          if (b.kind !== "immediate") endpoint = b.headerMutation.set["x-gateway-destination-endpoint"] as string;
          return endpoint !== undefined;
        },
        left(),
        "the gateway to route to perm-pod-0",
        50,
      );
      expect(endpoint).toBe("127.0.0.1:18000");
      // The pod reached PODS through the pod-watcher's user.
      const podMsg = await admin.jsm.streams.getMessage(streamName("jr", "PODS"), { last_by_subj: subjects.pod(MODEL, "perm-pod-0") });
      expect(podMsg?.subject).toBe(subjects.pod(MODEL, "perm-pod-0"));
    } finally {
      c.close();
    }
    for await (const m of charges) {
      expect(m.subject).toBe(subjects.charges(MODEL, "perm-pod-0"));
      break;
    }
    for await (const m of decisions) {
      expect(m.subject).toBe(subjects.decisions(MODEL));
      break;
    }
    // The gateway took the snapshot lease (compare-and-set writes to the lease bucket) with its
    // own user. (It writes a snapshot only once the prefix index changes; the object store
    // allowances are exercised by the denial test below from the other side.)
    const leases = await new Kvm(admin.nc).open(leaseBucketName("jr"));
    await waitFor(async () => (await leases.get("snapshotter.prefix-index"))?.operation === "PUT", left(), () => `the snapshot lease to be taken: ${log()}`, 50);
    expect((await leases.get("snapshotter.prefix-index"))?.json<{ holder: string }>().holder).toBe(started.gateway);
    // Heartbeats, KV watch, lease and snapshot bucket access all ran without a single refusal.
    expect(violations.filter((l) => /User "jr-(gateway|pod-watcher)"/.test(l))).toEqual([]);
  }, 60_000);

  it("metrics-scraper, kv-bridge and analyst read PODS; each publishes its own family", async () => {
    for (const [user, family] of [
      ["jr-metrics-scraper", "load"],
      ["jr-kv-bridge", "kv"],
    ] as const) {
      const h = await as(user);
      const ack = await h.js.publish(`jr.${family}.${MODEL.replace("/", "_")}.p`, "{}");
      expect(ack.stream).toBe(streamName("jr", family === "load" ? "LOAD" : "KV"));
    }
    for (const user of ["jr-metrics-scraper", "jr-kv-bridge", "jr-analyst"]) {
      const h = await as(user);
      const consumer = await h.js.consumers.get(streamName("jr", "PODS"), { filter_subjects: subjects.all("pods") });
      const m = await consumer.next({ expires: 5_000 });
      expect(m?.subject, user).toMatch(/^jr\.pods\./);
      await consumer.delete();
      // KV reads (direct get) of the config bucket: the model config the admin stored above.
      const kv = await new Kvm(h.nc).open(configBucketName("jr"));
      expect((await kv.get(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(MODEL)}`))?.json(), user).toEqual({ lockedRoutingStrategy: "least-request" });
    }
  }, 30_000);

  it("a metrics-scraper and a kv-bridge on their own users follow PODS (their only consumers)", async () => {
    const scraper = spawnJetroute("metrics-scraper", ["metrics-scraper", "--interval-ms", "1000", "--no-read-models", "--nats", server.url], {
      env: envOf("jr-metrics-scraper"),
      logFile: path.join(dir, "metrics-scraper.log"),
    });
    procs.push(scraper);
    const bridge = spawnJetroute("kv-bridge", ["kv-bridge", "--nats", server.url], { env: envOf("jr-kv-bridge"), logFile: path.join(dir, "kv-bridge.log") });
    procs.push(bridge);
    // Each announces itself only once its PODS follower is open (a refused consumer stops the start).
    await bridge.waitForLine((l) => typeof l.kvBridge === "string", 30_000);
    const scraperLog = () => readFileSync(path.join(dir, "metrics-scraper.log"), "utf8");
    await waitFor(
      async () => {
        if (scraper.proc.exitCode !== null) throw new Error(`the metrics-scraper exited (${scraper.proc.exitCode}): ${scraperLog().slice(-2000)}`);
        return /"msg":"scraping"/.test(scraperLog());
      },
      30_000,
      () => `the metrics-scraper to start: ${scraperLog().slice(-2000)}`,
      50,
    );
    expect(violations.filter((l) => /User "jr-(metrics-scraper|kv-bridge)"/.test(l) && l.includes("CONSUMER"))).toEqual([]);
  }, 60_000);
});

describe("the autoscaler on its own user", () => {
  it("follows the fleet's streams and the config bucket, holds its lease and publishes its recommendations; publishes no pods or charges", async () => {
    const admin = await as("jr-admin");
    const kv = await new Kvm(admin.nc).open(configBucketName("jr"));
    await kv.put(`${AUTOSCALE_KEY_PREFIX}perm`, JSON.stringify({ model: MODEL, algorithm: "kpa", metric: "ledger.inFlight", target: 4, minReplicas: 1, maxReplicas: 3, intervalMs: 200, scrapeIntervalMs: 200, stableWindowMs: 1000, panicWindowMs: 1000 }));
    const proc = spawnJetroute("autoscaler", ["autoscaler", "--leader-election", "--lease-ms", "3000", "--tick-ms", "200", "--nats", server.url], { env: envOf("jr-autoscaler"), logFile: path.join(dir, "autoscaler.log") });
    procs.push(proc);
    const log = () => readFileSync(path.join(dir, "autoscaler.log"), "utf8");
    const consumer = await admin.js.consumers.get(streamName("jr", "AUTOSCALE"), { filter_subjects: "jr.autoscale.perm" });
    const m = await consumer.next({ expires: 30_000 });
    expect(m?.json<{ policy: string }>().policy, log().slice(-2000)).toBe("perm");
    await consumer.delete();
    expect(log()).toContain("autoscaler lease acquired");
    expect(violations.filter((l) => l.includes('User "jr-autoscaler"'))).toEqual([]);
    await refused("jr-autoscaler", /^jr\.pods\./, async () => (await as("jr-autoscaler")).js.publish(`jr.pods.${MODEL.replace("/", "_")}.x`, "{}"));
    await refused("jr-autoscaler", /^jr\.charges\./, async () => (await as("jr-autoscaler")).js.publish(`jr.charges.${MODEL.replace("/", "_")}.x`, "{}"));
    await kv.delete(`${AUTOSCALE_KEY_PREFIX}perm`);
  }, 60_000);
});

describe("each denial", () => {
  const apiKeyPut = (h: NatsHandles) => async () => {
    const kv = await new Kvm(h.nc).open(configBucketName("jr"));
    await kv.put(apiKeyBucketKey(hashApiKey("jr-forged")), JSON.stringify({ user: "mallory", createdAt: 0, admin: true }));
  };
  const apiKeySubject = `$KV.${configBucketName("jr")}.${apiKeyBucketKey(hashApiKey("jr-forged"))}`;

  it("gateway: no pods, no load samples, no config or API keys, no stream deletion", async () => {
    const h = await as("jr-gateway");
    const pod = subjects.pod(MODEL, "forged");
    await refused("jr-gateway", pod, () => h.js.publish(pod, "{}"));
    const load = subjects.load(MODEL, "forged");
    await refused("jr-gateway", load, () => h.js.publish(load, "{}"));
    await refused("jr-gateway", apiKeySubject, apiKeyPut(h));
    await refused("jr-gateway", `$JS.API.STREAM.DELETE.${streamName("jr", "PODS")}`, () => h.jsm.streams.delete(streamName("jr", "PODS")));
    await refused("jr-gateway", `$JS.API.STREAM.PURGE.${streamName("jr", "CHARGES")}`, () => h.jsm.streams.purge(streamName("jr", "CHARGES")));
  });

  it("gateway: records where responses live and stores them (base prefix); the pod-watcher and the analyst may not", async () => {
    const d = "0".repeat(32);
    const gw = await as("jr-gateway");
    expect((await gw.js.publish(subjects.responseLocation(d), "{}")).stream).toBe(streamName("jr", "RESPONSES"));
    expect((await gw.js.publish(subjects.responseStored(d), "{}")).stream).toBe(streamName("jr", "RESPONSE_STORE"));
    expect(await gw.jsm.streams.getMessage(streamName("jr", "RESPONSE_STORE"), { last_by_subj: subjects.responseStored(d) })).not.toBeNull();
    for (const user of ["jr-pod-watcher", "jr-analyst"] as const) {
      const h = await as(user);
      for (const s of [subjects.responseLocation(d), subjects.responseStored(d)]) await refused(user, s, () => h.js.publish(s, "{}"));
    }
  });

  it("gateway: its paced CHARGES reader (--fold-pace-ms) creates its named consumer and reads", async () => {
    const h = await as("jr-gateway");
    const got: string[] = [];
    const lost: string[] = [];
    const reader = new PacedPullReader({
      nc: h.nc, jsm: h.jsm, apiPrefix: h.js.apiPrefix, stream: streamName("jr", "CHARGES"), start: { deliver_policy: DeliverPolicy.New }, paceMs: 5,
      onMessage: (subject) => got.push(subject),
      onLost: (why) => lost.push(why),
    });
    try {
      await reader.open();
      const s = subjects.charges(MODEL, "paced-perm");
      await h.js.publish(s, "{}");
      await waitFor(() => got.includes(s), 10_000, () => `the paced reader to read ${s} (lost: ${lost.join("; ")})`, 20);
      expect(lost).toEqual([]);
    } finally {
      await reader.close();
    }
  });

  it("pod-watcher: no charges, releases, heartbeats or decisions", async () => {
    const h = await as("jr-pod-watcher");
    for (const s of [subjects.charges(MODEL, "p"), subjects.releases(MODEL, "p"), subjects.heartbeat("forged-gw"), subjects.decisions(MODEL), subjects.load(MODEL, "p")]) {
      await refused("jr-pod-watcher", s, () => h.js.publish(s, "{}"));
    }
  });

  it("metrics-scraper: no pods, no charges; kv-bridge: no pods, no charges", async () => {
    for (const user of ["jr-metrics-scraper", "jr-kv-bridge"]) {
      const h = await as(user);
      for (const s of [subjects.pod(MODEL, "forged"), subjects.charges(MODEL, "p")]) await refused(user, s, () => h.js.publish(s, "{}"));
    }
  });

  it("analyst: publishes nothing (no family, no config, no snapshot, no stream change)", async () => {
    const h = await as("jr-analyst");
    for (const family of Object.values(Family)) {
      const s = `jr.${family}.x.y`;
      await refused("jr-analyst", s, () => h.js.publish(s, "{}"));
    }
    await refused("jr-analyst", apiKeySubject, apiKeyPut(h));
    const lease = `$KV.${leaseBucketName("jr")}.snapshot`;
    await refused("jr-analyst", lease, async () => (await new Kvm(h.nc).open(leaseBucketName("jr"))).put("snapshot", "{}"));
    await refused("jr-analyst", `$JS.API.STREAM.CREATE.JR_EVIL`, () => h.jsm.streams.add({ name: "JR_EVIL", subjects: ["evil.>"] }));
    // Object store writes start with a chunk publish under $O.<bucket>.C.
    let err: unknown;
    try {
      await (await new Objm(h.nc).open(snapshotBucketName("jr"))).putBlob({ name: "forged" }, new Uint8Array([1]));
    } catch (e) {
      err = e;
    }
    // The chunk is a plain publish (refused on the server, reported asynchronously); the first
    // request to fail is the purge of the object's old chunks.
    expect(permissionViolation(err), String(err)).toBeInstanceOf(errors.PermissionViolationError);
    expect(await serverViolation("jr-analyst", new RegExp(`\\$O\\.${snapshotBucketName("jr")}\\.C\\.[^"]+`))).toBeTruthy();
    const admin = await as("jr-admin");
    expect(await (await new Objm(admin.nc).open(snapshotBucketName("jr"))).info("forged")).toBeNull();
  });
});

describe("consumers only on the streams a process follows", () => {
  const config = `KV_${configBucketName("jr")}`;
  const consumerCreate = (stream: string) => new RegExp(`^\\$JS\\.API\\.CONSUMER\\.CREATE\\.${stream}\\.[^.]+`);
  /** No consumer of that name exists on `stream` (the admin asks the server). */
  const noConsumer = async (stream: string, name: string) => {
    const admin = await as("jr-admin");
    const err = await admin.jsm.consumers.info(stream, name).then(() => undefined, (e: unknown) => e);
    expect(isConsumerNotFound(err), `${stream} should have no consumer ${name}, got ${String(err)}`).toBe(true);
  };

  it("metrics-scraper and kv-bridge: no consumer on CHARGES, DECISIONS, LOAD, KV or the config bucket (no KV watch either)", async () => {
    for (const user of ["jr-metrics-scraper", "jr-kv-bridge"]) {
      const h = await as(user);
      for (const stream of [streamName("jr", "CHARGES"), streamName("jr", "DECISIONS"), streamName("jr", "LOAD"), streamName("jr", "KV"), config]) {
        await refused(user, `$JS.API.CONSUMER.CREATE.${stream}.probe`, () => h.jsm.consumers.add(stream, { name: "probe", ack_policy: AckPolicy.None }));
      }
      // The client's own path, as a gateway's config watch takes it: an ordered push consumer.
      await refused(user, consumerCreate(config), async () => (await new Kvm(h.nc).open(configBucketName("jr"))).watch());
      // Nor on another pool's streams than PODS.
      const pooledCharges = streamName(namespaceOf("jr", "chat").prefix, "CHARGES");
      await refused(user, `$JS.API.CONSUMER.CREATE.${pooledCharges}.probe`, () => h.jsm.consumers.add(pooledCharges, { name: "probe", ack_policy: AckPolicy.None }));
    }
  });

  it("pod-watcher: no consumer on CHARGES, LOAD or KV; the gateway none on DECISIONS", async () => {
    const pw = await as("jr-pod-watcher");
    for (const stream of [streamName("jr", "CHARGES"), streamName("jr", "LOAD"), streamName("jr", "KV")]) {
      await refused("jr-pod-watcher", `$JS.API.CONSUMER.CREATE.${stream}.probe`, () => pw.jsm.consumers.add(stream, { name: "probe", ack_policy: AckPolicy.None }));
    }
    const gw = await as("jr-gateway");
    const decisions = streamName("jr", "DECISIONS");
    await refused("jr-gateway", `$JS.API.CONSUMER.CREATE.${decisions}.probe`, () => gw.jsm.consumers.add(decisions, { name: "probe", ack_policy: AckPolicy.None }));
  });

  it("deliver-subject injection (nats-server#8274): a push consumer aimed at what the gateways act on is refused at creation", async () => {
    const forged = apiKeyBucketKey(hashApiKey("jr-injected"));
    const apiKeySubject = `$KV.${configBucketName("jr")}.${forged}`;
    const podSubject = subjects.pod(MODEL, "injected");
    // 1. The scraper writes what it may (a load sample subject) holding an admin API key record,
    //    then asks LOAD to deliver it into the config bucket: it would mint an admin key.
    const scraper = await as("jr-metrics-scraper");
    const loadSubject = subjects.load(MODEL, "injected");
    await scraper.js.publish(loadSubject, JSON.stringify({ user: "mallory", createdAt: 0, admin: true }));
    await refused("jr-metrics-scraper", `$JS.API.CONSUMER.CREATE.${streamName("jr", "LOAD")}.inject.${loadSubject}`, () =>
      scraper.jsm.consumers.add(streamName("jr", "LOAD"), { name: "inject", filter_subject: loadSubject, deliver_subject: apiKeySubject, deliver_policy: DeliverPolicy.All, ack_policy: AckPolicy.None }),
    );
    await noConsumer(streamName("jr", "LOAD"), "inject");
    // Nor through an allowed subject: the server takes the stream from the subject and refuses a
    // request naming another one.
    const smuggled = await scraper.nc.request(
      `$JS.API.CONSUMER.CREATE.${streamName("jr", "PODS")}.inject`,
      JSON.stringify({ stream_name: streamName("jr", "LOAD"), config: { name: "inject", filter_subject: loadSubject, deliver_subject: apiKeySubject, deliver_policy: "all", ack_policy: "none" } }),
    );
    expect(smuggled.json<{ error?: { description?: string } }>().error?.description, smuggled.string()).toBeTruthy();
    await noConsumer(streamName("jr", "LOAD"), "inject");
    await noConsumer(streamName("jr", "PODS"), "inject");
    // 2. The kv-bridge and the scraper copy config-bucket records onto a pod subject or an API key
    //    subject: the copies would land in PODS or the bucket, which the gateways fold.
    for (const user of ["jr-kv-bridge", "jr-metrics-scraper"]) {
      const h = await as(user);
      for (const [name, deliver] of [
        ["inject-pod", podSubject],
        ["inject-key", apiKeySubject],
      ] as const) {
        await refused(user, `$JS.API.CONSUMER.CREATE.${config}.${name}`, () =>
          h.jsm.consumers.add(config, { name, deliver_subject: deliver, deliver_policy: DeliverPolicy.All, ack_policy: AckPolicy.None }),
        );
        await noConsumer(config, name);
      }
    }
    // Nothing reached what the gateways act on: no such pod, no such key.
    const admin = await as("jr-admin");
    expect(await admin.jsm.streams.getMessage(streamName("jr", "PODS"), { last_by_subj: podSubject }), "PODS should hold nothing on the injected pod's subject").toBeNull();
    expect(await (await new Kvm(admin.nc).open(configBucketName("jr"))).get(forged)).toBeNull();
  });
});

describe("signed records: a planted record that reaches the bucket or PODS anyway changes nothing a gateway acts on", () => {
  const SIGNED_MODEL = "perm/signed";
  const PLANTED_MODEL = "perm/planted";
  const opKey = generateSigningKeyPair();
  const podKey = generateSigningKeyPair();
  const file = (name: string, text: string) => {
    const f = path.join(dir, name);
    writeFileSync(f, text, { mode: 0o600 });
    return f;
  };

  it("a gateway with the public keys refuses unsigned and injected API keys and pods, and acts on signed ones", async () => {
    const opPriv = file("operator.key", opKey.privateKeyPem);
    const opPub = file("operator.pub", opKey.publicKeyPem);
    const podPriv = file("pods.key", podKey.privateKeyPem);
    const podPub = file("pods.pub", podKey.publicKeyPem);
    // The operator signs a key; a key written without the signing key stands for one written around the CLI.
    const signedKey = await run("add-key-signed", ["config", "add-key", "--user", "signed-alice", "--json", "--signing-key", opPriv], "jr-admin");
    expect(signedKey.code, signedKey.log).toBe(0);
    const unsignedKey = await run("add-key-unsigned", ["config", "add-key", "--user", "unsigned-bob", "--json"], "jr-admin");
    expect(unsignedKey.code, unsignedKey.log).toBe(0);
    const pods = path.join(dir, "signed-pods.yaml");
    writeFileSync(pods, `pods:\n  - name: signed-pod-0\n    model: ${SIGNED_MODEL}\n    address: 127.0.0.1:18010\n    engine: vllm\n`);
    const watcher = spawnJetroute("signed-pod-watcher", ["pod-watcher", "--static", pods, "--no-probe", "--source", "signed", "--signing-key", podPriv, "--nats", server.url], {
      env: envOf("jr-pod-watcher"),
      logFile: path.join(dir, "signed-pod-watcher.log"),
    });
    procs.push(watcher);

    // The injection itself, as a compromised gateway would try it: its own CHARGES subject holds an
    // admin API key record and a pod event, and push consumers on CHARGES (a stream it follows, so
    // the creation is allowed) deliver them onto an API key subject and a pod subject.
    const malloryKey = "jr-mallory-planted";
    const plantedKeySubject = `$KV.${configBucketName("jr")}.${apiKeyBucketKey(hashApiKey(malloryKey))}`;
    const plantedPodSubject = subjects.pod(PLANTED_MODEL, "planted-0");
    const plantedPod = { type: "pod", action: "upsert", model: PLANTED_MODEL, pod: "planted-0", address: "127.0.0.1:18099", ready: true, engine: "vllm", ts: Date.now() };
    const compromised = await as("jr-gateway");
    const stash = subjects.charges(PLANTED_MODEL, "stash");
    await compromised.js.publish(stash, JSON.stringify({ user: "mallory", createdAt: Date.now(), admin: true }));
    const stashPod = subjects.charges(PLANTED_MODEL, "stash-pod");
    await compromised.js.publish(stashPod, JSON.stringify(plantedPod));
    const injected: string[] = [];
    for (const [name, filter, deliver] of [
      ["inject-key", stash, plantedKeySubject],
      ["inject-pod", stashPod, plantedPodSubject],
    ] as const) {
      // Whether the server creates and delivers it depends on its version (nats-server#8274): both outcomes are fine here.
      await compromised.jsm.consumers
        .add(streamName("jr", "CHARGES"), { name, filter_subject: filter, deliver_subject: deliver, deliver_policy: DeliverPolicy.All, ack_policy: AckPolicy.None })
        .then(() => injected.push(name), () => undefined);
    }
    // And as if the server had delivered them (as newer servers are reported to): the same records
    // stored where the gateways read them, by the one user allowed to write there.
    const admin = await as("jr-admin");
    await (await new Kvm(admin.nc).open(configBucketName("jr"))).put(apiKeyBucketKey(hashApiKey(malloryKey)), JSON.stringify({ user: "mallory", createdAt: Date.now(), admin: true }));
    await admin.js.publish(plantedPodSubject, JSON.stringify(plantedPod));

    const gw = spawnJetroute(
      "signed-gateway",
      ["gateway", "--nats", server.url, "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--no-snapshots", "--auth", "required", "--config-public-key", opPub, "--pod-public-key", podPub],
      { env: envOf("jr-gateway"), logFile: path.join(dir, "signed-gateway.log") },
    );
    procs.push(gw);
    const started = await gw.waitForLine<{ port: number; adminPort: number }>((l) => typeof l.port === "number", 30_000);
    const deadline = Date.now() + 30_000;
    const left = () => Math.max(0, deadline - Date.now());
    const log = () => readFileSync(path.join(dir, "signed-gateway.log"), "utf8").slice(-3000);
    await waitFor(async () => (await fetch(`http://127.0.0.1:${started.adminPort}/readyz`)).status === 200, left(), () => `the signed gateway to turn ready: ${log()}`, 50);
    const c = new ExtProcClient(`127.0.0.1:${started.port}`);
    type Outcome = { kind: "routed"; endpoint: string } | { kind: "refused"; status: number };
    const send = async (key: string, model: string): Promise<Outcome> => {
      const ex = c.open();
      try {
        const h = await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", authorization: `Bearer ${key}`, "x-request-id": `perm-signed-${Date.now()}` });
        if (h.kind === "immediate") return { kind: "refused", status: h.status };
        const b = await ex.requestBody(Buffer.from(JSON.stringify({ model, messages: [{ role: "user", content: "hello" }] })));
        if (b.kind === "immediate") return { kind: "refused", status: b.status };
        return { kind: "routed", endpoint: b.headerMutation.set["x-gateway-destination-endpoint"] as string };
      } finally {
        ex.cancel();
      }
    };
    try {
      const aliceKey = signedKey.json[0]?.key as string;
      // The signed key, and the signed pod-watcher's pod: routed.
      let routed: Outcome | undefined;
      await waitFor(async () => (routed = await send(aliceKey, SIGNED_MODEL)).kind === "routed", left(), () => `the signed key to route to signed-pod-0 (last: ${JSON.stringify(routed)}): ${log()}`, 50);
      expect(routed).toEqual({ kind: "routed", endpoint: "127.0.0.1:18010" });
      // The planted admin key and the key written unsigned: not keys at all.
      expect(await send(malloryKey, SIGNED_MODEL)).toEqual({ kind: "refused", status: 401 });
      expect(await send(unsignedKey.json[0]?.key as string, SIGNED_MODEL)).toEqual({ kind: "refused", status: 401 });
      // The planted pod is no pod: its model is unknown (404), never routed to 127.0.0.1:18099.
      expect(await send(aliceKey, PLANTED_MODEL)).toMatchObject({ kind: "refused", status: 404 });
      const metrics = await (await fetch(`http://127.0.0.1:${started.adminPort}/metrics`)).text();
      const refusedCount = (records: string) => Number(new RegExp(`jetroute_gateway_records_refused_signature\\{[^}]*records="${records}"[^}]*reason="unsigned"[^}]*\\} (\\d+)`).exec(metrics)?.[1] ?? 0);
      expect(refusedCount("config"), metrics).toBeGreaterThanOrEqual(2);
      expect(refusedCount("pods"), metrics).toBeGreaterThanOrEqual(1);
      expect(log()).toMatch(/signature/);
    } finally {
      c.close();
      for (const name of injected) await compromised.jsm.consumers.delete(streamName("jr", "CHARGES"), name).catch(() => undefined);
    }
  }, 90_000);
});

describe("gateway pools on the per-process users (deploy/pools)", () => {
  const POOL = "chat";
  const POOLED_MODEL = "perm/pooled";
  const ns = namespaceOf("jr", POOL);
  const pooled = new Subjects(ns.prefix);

  it("every example pool's lease bucket and snapshot store are open to the gateway (and its leases to the pod-watcher)", () => {
    expect(POOLS).toEqual(["chat", "code"]);
    const allow = (user: string) => Object.values(accounts).flatMap((a) => a.users).find((u) => u.user === user)?.permissions.publish?.allow ?? [];
    for (const p of POOLS) {
      const prefix = namespaceOf("jr", p).prefix;
      expect(allow("jr-gateway")).toEqual(
        expect.arrayContaining([
          `$KV.${leaseBucketName(prefix)}.>`,
          `$O.${snapshotBucketName(prefix)}.>`,
          `$JS.API.STREAM.PURGE.OBJ_${snapshotBucketName(prefix)}`,
          `$JS.API.STREAM.CREATE.KV_${leaseBucketName(prefix)}`,
          `$JS.API.STREAM.CREATE.OBJ_${snapshotBucketName(prefix)}`,
        ]),
      );
      expect(allow("jr-pod-watcher")).toContain(`$KV.${leaseBucketName(prefix)}.pod-watcher.>`);
    }
  });

  it("admin sets the pool; its pod-watcher (with a lease), scraper, kv-bridge and gateway do their jobs on their own users", async () => {
    const set = await run("set-pool", ["config", "set-pool", POOL, "--models", POOLED_MODEL], "jr-admin");
    expect(set.code, set.log).toBe(0);
    const pods = path.join(dir, "pool-pods.yaml");
    writeFileSync(pods, `pods:\n  - name: pool-pod-0\n    model: ${POOLED_MODEL}\n    address: 127.0.0.1:18001\n    engine: vllm\n`);
    const watcher = spawnJetroute("pool-pod-watcher", ["pod-watcher", "--static", pods, "--no-probe", "--pool", POOL, "--leader-election", "--nats", server.url], {
      env: envOf("jr-pod-watcher"),
      logFile: path.join(dir, "pool-pod-watcher.log"),
    });
    procs.push(watcher);
    const gw = spawnJetroute("pool-gateway", ["gateway", "--pool", POOL, "--nats", server.url, "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--heartbeat-ms", "200", "--snapshot-interval-ms", "1000"], {
      env: envOf("jr-gateway"),
      logFile: path.join(dir, "pool-gateway.log"),
    });
    procs.push(gw);
    const started = await gw.waitForLine<{ gateway: string; port: number; adminPort: number; pool: string }>((l) => typeof l.port === "number", 30_000);
    expect(started.pool).toBe(POOL);
    const admin = await as("jr-admin");
    // One budget for turning ready, routing and taking the lease.
    const deadline = Date.now() + 30_000;
    const left = () => Math.max(0, deadline - Date.now());
    const log = () => readFileSync(path.join(dir, "pool-gateway.log"), "utf8").slice(-2000);
    await waitFor(async () => (await fetch(`http://127.0.0.1:${started.adminPort}/readyz`)).status === 200, left(), () => `the pool gateway to turn ready: ${log()}`, 50);
    const charges = admin.nc.subscribe(pooled.all("charges"));
    await admin.nc.flush();
    const c = new ExtProcClient(`127.0.0.1:${started.port}`);
    try {
      let endpoint: string | undefined;
      await waitFor(
        async () => {
          const ex = c.open();
          await ex.requestHeaders({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", "x-request-id": `perm-pool-${Date.now()}` });
          const b = await ex.requestBody(Buffer.from(JSON.stringify({ model: POOLED_MODEL, messages: [{ role: "user", content: "hello" }] })));
          ex.cancel();
          if (b.kind !== "immediate") endpoint = b.headerMutation.set["x-gateway-destination-endpoint"] as string;
          return endpoint !== undefined;
        },
        left(),
        () => `the pool gateway to route to pool-pod-0: ${log()}`,
        50,
      );
      expect(endpoint).toBe("127.0.0.1:18001");
    } finally {
      c.close();
    }
    for await (const m of charges) {
      expect(m.subject).toBe(pooled.charges(POOLED_MODEL, "pool-pod-0"));
      break;
    }
    // The pod reached the pool's PODS through the pod-watcher's user; the watcher took its lease in the pool's bucket.
    const podMsg = await admin.jsm.streams.getMessage(streamName(ns.prefix, "PODS"), { last_by_subj: pooled.pod(POOLED_MODEL, "pool-pod-0") });
    expect(podMsg?.subject).toBe(pooled.pod(POOLED_MODEL, "pool-pod-0"));
    const leases = await new Kvm(admin.nc).open(leaseBucketName(ns.prefix));
    await waitFor(async () => (await leases.get("snapshotter.prefix-index"))?.operation === "PUT", left(), () => `the pool's snapshot lease to be taken: ${log()}`, 50);
    const watcherLeases: string[] = [];
    for await (const k of await leases.keys("pod-watcher.>")) watcherLeases.push(k);
    expect(watcherLeases.length, "the pod-watcher's lease in the pool's bucket").toBe(1);
    // The pool's load and KV families, as the scraper and the bridge publish them.
    for (const [user, family, key] of [
      ["jr-metrics-scraper", "load", "LOAD"],
      ["jr-kv-bridge", "kv", "KV"],
    ] as const) {
      const h = await as(user);
      const ack = await h.js.publish(`${ns.prefix}.${family}.perm_pooled.p`, "{}");
      expect(ack.stream).toBe(streamName(ns.prefix, key));
    }
    // The gateway's usage summaries (per-user limits across pools) land in the base prefix's JR_USAGE.
    const gwUser = await as("jr-gateway");
    expect((await gwUser.js.publish(`jr.usage.${POOL}.perm-gw.1`, "{}")).stream).toBe(streamName("jr", "USAGE"));
    expect(violations.filter((l) => /User "jr-(gateway|pod-watcher|metrics-scraper|kv-bridge)"/.test(l) && l.includes(".pool."))).toEqual([]);
  }, 60_000);

  it("in a pool as outside: the gateway publishes no pods or load, the pod-watcher no charges", async () => {
    const gw = await as("jr-gateway");
    for (const s of [pooled.pod(POOLED_MODEL, "forged"), pooled.load(POOLED_MODEL, "forged")]) await refused("jr-gateway", s, () => gw.js.publish(s, "{}"));
    const pw = await as("jr-pod-watcher");
    for (const s of [pooled.charges(POOLED_MODEL, "p"), pooled.decisions(POOLED_MODEL)]) await refused("jr-pod-watcher", s, () => pw.js.publish(s, "{}"));
  });
});

describe("the Batch API on its own users (batch-api, batch-worker)", () => {
  const BATCH_KEY = "jr-perm-batch-tenant-key-0000000000000000";
  const jsonl = (n: number) => `${Array.from({ length: n }, (_, i) => JSON.stringify({ custom_id: `p-${i}`, method: "POST", url: "/v1/chat/completions", body: { model: MODEL, messages: [{ role: "user", content: `item ${i}` }] } })).join("\n")}\n`;

  it("batch-api (--auth required) and batch-worker run a batch end to end, cancel, and delete a file, without a refusal", async () => {
    const admin = await as("jr-admin");
    await (await new Kvm(admin.nc).open(configBucketName("jr"))).put(apiKeyBucketKey(hashApiKey(BATCH_KEY)), JSON.stringify({ user: "perm-tenant", createdAt: Date.now() }));
    // The worker's target: an engine stand-in over real HTTP (the routing plane is not under test here).
    const engine = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ id: "chatcmpl-perm", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }] }));
      });
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    const enginePort = (engine.address() as { port: number }).port;
    const apiLog = path.join(dir, "batch-api.log");
    const workerLog = path.join(dir, "batch-worker.log");
    const logs = () => `${readFileSync(apiLog, "utf8").slice(-1500)}\n${readFileSync(workerLog, "utf8").slice(-1500)}`;
    try {
      const api = spawnJetroute("batch-api", ["batch-api", "--port", "0", "--auth", "required", "--nats", server.url], { env: envOf("jr-batch-api"), logFile: apiLog });
      procs.push(api);
      const { port } = await api.waitForLine<{ service: string; port: number }>((l) => l.service === "batch-api", 30_000);
      const worker = spawnJetroute("batch-worker", ["batch-worker", "--target", `http://127.0.0.1:${enginePort}`, "--concurrency", "4", "--ack-wait-ms", "5000", "--nats", server.url], { env: envOf("jr-batch-worker"), logFile: workerLog });
      procs.push(worker);
      await worker.waitForLine((l) => l.service === "batch-worker", 30_000);
      const at = `http://127.0.0.1:${port}`;
      const auth = { authorization: `Bearer ${BATCH_KEY}` };
      // The key reached batch-api through its config-bucket watch.
      const upload = async (n: number) => {
        const form = new FormData();
        form.set("purpose", "batch");
        form.set("file", new Blob([jsonl(n)]), "perm.jsonl");
        return await fetch(`${at}/v1/files`, { method: "POST", body: form, headers: auth });
      };
      let up: Response | undefined;
      await waitFor(async () => {
        up = await upload(3);
        return up.status !== 401;
      }, 10_000, () => `the API key to reach batch-api: ${logs()}`, 50);
      expect(up?.status, logs()).toBe(200);
      const file = (await (up as Response).json()) as { id: string };
      const create = (input_file_id: string) => fetch(`${at}/v1/batches`, { method: "POST", headers: { ...auth, "content-type": "application/json" }, body: JSON.stringify({ input_file_id, endpoint: "/v1/chat/completions", completion_window: "24h" }) });
      const b = (await (await create(file.id)).json()) as { id: string };
      let done: { status?: string; output_file_id?: string; request_counts?: unknown } = {};
      await waitFor(async () => {
        done = (await (await fetch(`${at}/v1/batches/${b.id}`, { headers: auth })).json()) as typeof done;
        return done.status === "completed";
      }, 30_000, () => `the batch to complete (${JSON.stringify(done)}): ${logs()}`, 50);
      expect(done.request_counts).toEqual({ total: 3, completed: 3, failed: 0 });
      const out = (await (await fetch(`${at}/v1/files/${done.output_file_id}/content`, { headers: auth })).text()).trim().split("\n");
      expect(out.map((l) => (JSON.parse(l) as { custom_id: string }).custom_id).sort()).toEqual(["p-0", "p-1", "p-2"]);
      // The worker's acks went through: nothing is left pending on the shared work consumer.
      await waitFor(async () => (await admin.jsm.consumers.info(streamName("jr", "BATCH_WORK"), "batch-workers")).num_ack_pending === 0, 10_000, "the worker's acks to land");
      // Cancel (purges the batch's queued items) and a file deletion (purges its chunks).
      const b2 = (await (await create(file.id)).json()) as { id: string };
      expect((await fetch(`${at}/v1/batches/${b2.id}/cancel`, { method: "POST", headers: auth })).status).toBe(200);
      expect((await fetch(`${at}/v1/files/${file.id}`, { method: "DELETE", headers: auth })).status).toBe(200);
      expect(violations.filter((l) => /User "jr-batch-(api|worker)"/.test(l)), logs()).toEqual([]);
      // Its purge of the work queue and of a file, directly, as the two calls above make them.
      const h = await as("jr-batch-api");
      await h.jsm.streams.purge(streamName("jr", "BATCH_WORK"), { filter: subjects.batchWork("0".repeat(24)) });
      expect(violations.filter((l) => /User "jr-batch-(api|worker)"/.test(l))).toEqual([]);
    } finally {
      engine.close();
    }
  }, 90_000);

  it("batch-worker: no job events, items, files, API keys, purges; no consumer on the files or the config bucket", async () => {
    const h = await as("jr-batch-worker");
    for (const s of [subjects.batchJob("0".repeat(24)), subjects.batchFile("file-forged"), subjects.batchWork("0".repeat(24)), subjects.pod(MODEL, "forged"), subjects.charges(MODEL, "p")]) {
      await refused("jr-batch-worker", s, () => h.js.publish(s, "{}"));
    }
    await refused("jr-batch-worker", apiKeySubjectOf("jr-forged-by-worker"), apiKeyPutAs(h, "jr-forged-by-worker"));
    // An object write: its chunk publish, or the purge the client sends when that fails, is refused; nothing is stored.
    await refused("jr-batch-worker", /^(?:\$O\.jr-files\.|\$JS\.API\.STREAM\.PURGE\.OBJ_jr-files$)/, async () => (await new Objm(h.nc).open(filesBucketName("jr"))).putBlob({ name: "forged" }, new Uint8Array([1])));
    expect(await (await new Objm((await as("jr-admin")).nc).open(filesBucketName("jr"))).info("forged")).toBeNull();
    await refused("jr-batch-worker", `$JS.API.STREAM.PURGE.${streamName("jr", "BATCH_WORK")}`, () => h.jsm.streams.purge(streamName("jr", "BATCH_WORK")));
    for (const stream of [`OBJ_${filesBucketName("jr")}`, `KV_${configBucketName("jr")}`, streamName("jr", "CHARGES")]) {
      await refused("jr-batch-worker", `$JS.API.CONSUMER.CREATE.${stream}.probe`, () => h.jsm.consumers.add(stream, { name: "probe", ack_policy: AckPolicy.None }));
    }
  });

  it("batch-api: no results, pods, charges, API keys, stream changes; no consumer on the work queue", async () => {
    const h = await as("jr-batch-api");
    for (const s of [subjects.batchResult("0".repeat(24)), subjects.pod(MODEL, "forged"), subjects.charges(MODEL, "p"), subjects.decisions(MODEL)]) {
      await refused("jr-batch-api", s, () => h.js.publish(s, "{}"));
    }
    await refused("jr-batch-api", apiKeySubjectOf("jr-forged-by-api"), apiKeyPutAs(h, "jr-forged-by-api"));
    await refused("jr-batch-api", `$JS.API.STREAM.DELETE.${streamName("jr", "BATCH")}`, () => h.jsm.streams.delete(streamName("jr", "BATCH")));
    await refused("jr-batch-api", `$JS.API.STREAM.PURGE.${streamName("jr", "BATCH_RESULTS")}`, () => h.jsm.streams.purge(streamName("jr", "BATCH_RESULTS")));
    for (const stream of [streamName("jr", "BATCH_WORK"), streamName("jr", "CHARGES"), streamName("jr", "PODS")]) {
      await refused("jr-batch-api", `$JS.API.CONSUMER.CREATE.${stream}.probe`, () => h.jsm.consumers.add(stream, { name: "probe", ack_policy: AckPolicy.None }));
    }
  });
});

function apiKeySubjectOf(token: string): string {
  return `$KV.${configBucketName("jr")}.${apiKeyBucketKey(hashApiKey(token))}`;
}

function apiKeyPutAs(h: NatsHandles, token: string): () => Promise<void> {
  return async () => {
    const kv = await new Kvm(h.nc).open(configBucketName("jr"));
    await kv.put(apiKeyBucketKey(hashApiKey(token)), JSON.stringify({ user: "mallory", createdAt: 0, admin: true }));
  };
}
