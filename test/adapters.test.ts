/**
 * LoRA adapters as a managed resource, end to end (docs/adapters.md): declarations in the config
 * bucket (`jetroute config set-adapter`, refused field by field) and as ModelAdapters through the
 * real `kubectl` against the API stand-in; `adapter-controller` loading and unloading through the
 * simulator's vLLM runtime LoRA API; gateways routing an adapter only where its load succeeded and
 * holding its requests in the waiting room while it is placed; failover when a hosting pod goes, an
 * adapter back on a pod restarted empty, max_loras never exceeded, a failed load ending in Failed,
 * deletion, and a controller killed mid-placement.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ADAPTER_KEY_PREFIX, type AdapterPlacement } from "../schemas/adapters.js";
import { MODEL_CONFIG_KEY_PREFIX } from "../schemas/config.js";
import type { DecisionRecord } from "../schemas/events.js";
import { type AdapterControllerHandle, startAdapterController } from "../services/adapters/controller.js";
import { pollKubeDeclarations, watchConfigDeclarations } from "../services/adapters/declarations.js";
import { startFront, type FrontServer } from "../services/front/front.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { KubeStandin } from "../services/kube-standin/server.js";
import { loadKubeConfig } from "../services/pod-watcher/kubernetes.js";
import { StreamFollower } from "../services/shared/follower.js";
import { type SimFleet, startSimFleet } from "../services/sim/fleet.js";
import { configBucketName, streamName } from "../streams/definitions.js";
import { configRecordSubject, generateSigningKeyPair, RecordSigner, RecordVerifier } from "../streams/signatures.js";
import { encodeToken } from "../streams/tokens.js";
import { runJetroute } from "./harness/cli.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const run = promisify(execFile);
type Pod = SimFleet["pods"][number];

describe("managed LoRA adapters: declare, place, route, fail over, delete", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let front: FrontServer;
  let gw: GatewayHandle;
  let ctl: AdapterControllerHandle | undefined;
  let base = "";
  const decisions: DecisionRecord[] = [];
  const closers: Array<() => Promise<void>> = [];
  let kv: Awaited<ReturnType<Kvm["open"]>>;

  const startController = (o: { id?: string; maxLoras?: number } = {}) =>
    startAdapterController({ nats: env.server.url, prefix: "jr", id: o.id ?? "ctl-a", tickMs: 100, maxLoras: o.maxLoras ?? 2, unloadGraceMs: 100, retryDelayMs: 20, failureBackoffMs: 60_000, log: quietLog });
  const declare = (name: string, spec: object) => kv.put(`${ADAPTER_KEY_PREFIX}${encodeToken(name)}`, JSON.stringify(spec));
  const engineAdapters = async (p: Pod) => ((await (await fetch(`http://${p.address}/v1/models`)).json()) as { data: Array<{ id: string; parent: string | null }> }).data.filter((m) => m.parent).map((m) => m.id).sort();
  const everyEngine = async () => Object.fromEntries(await Promise.all(fleet.pods.map(async (p) => [p.name, await engineAdapters(p)] as const)));
  const record = (a: string) => ctl?.records().get(a);
  const loadedOn = (a: string) => (record(a)?.pods ?? []).filter((p) => p.state === "loaded").map((p) => p.pod).sort();
  const complete = (model: string) => fetch(`${base}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model, prompt: "Translate to SQL: all users", max_tokens: 2 }) });

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 3, model: MODEL, lora: { maxLoras: 2, loadMs: 150 }, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, labels: { app: "llama", tier: p.name.endsWith("2") ? "spare" : "main" } });
    kv = await new Kvm(env.nats.js).open(configBucketName("jr"));
    // The base model's waiting room: an adapter's requests wait up to 10 s for a replica.
    await kv.put(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(MODEL)}`, JSON.stringify({ flowControl: { waitingRoomTtlMs: 10_000 } }));
    gw = await env.gateway({ id: "gw-adapters" });
    front = await startFront({ port: 0, host: "127.0.0.1", gateways: [`127.0.0.1:${gw.port}`], logger: quietLog });
    base = `http://127.0.0.1:${front.port}`;
    const f = new StreamFollower({ nats: env.nats, subjects: env.subjects, log: quietLog, name: "test-decisions", family: "decisions", types: ["decision"] as const, stream: streamName("jr", "DECISIONS"), startAt: { kind: "all" }, onEvent: (d: DecisionRecord) => void decisions.push(d) });
    await f.start();
    closers.push(() => f.stop());
    ctl = await startController();
    await ctl.whenReady();
  }, 60_000);
  afterAll(async () => {
    await ctl?.close();
    await front?.close();
    for (const c of closers.reverse()) await c().catch(() => undefined);
    await fleet?.close();
    await env?.stop();
  });

  it("config set-adapter refuses a bad declaration field by field, and stores a good one", async () => {
    const nats = ["--nats", env.server.url];
    const bad = async (name: string, json: string) => runJetroute(["config", "set-adapter", name, ...nats, "--json", json]);
    let r = await bad("sql", JSON.stringify({ baseModel: MODEL }));
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("/artifactURL: required");
    r = await bad("sql", JSON.stringify({ baseModel: MODEL, artifactURL: "ftp://x" }));
    expect(r.stderr).toMatch(/\/artifactURL: must start with one of s3:\/\//);
    r = await bad("sql", JSON.stringify({ baseModel: MODEL, artifactURL: "hf://org/sql", replicas: 1, maxReplicas: 3 }));
    expect(r.stderr).toContain("/replicas: a fixed count excludes minReplicas/maxReplicas");
    r = await bad("sql", JSON.stringify({ baseModel: MODEL, artifactURL: "hf://org/sql", minReplicas: 3, maxReplicas: 1 }));
    expect(r.stderr).toContain("/minReplicas: 3 is above /maxReplicas 1");
    r = await bad("sql", JSON.stringify({ baseModel: MODEL, artifactURL: "hf://org/sql", replicas: -1 }));
    expect(r.stderr).toMatch(/\/replicas: Expected integer to be greater or equal to 0/);
    r = await bad("Bad_Name", JSON.stringify({ baseModel: MODEL, artifactURL: "hf://org/sql" }));
    expect(r.stderr).toMatch(/invalid adapter name "Bad_Name"/);
    r = await bad("sql", "{not json");
    expect(r.stderr).toMatch(/not valid JSON/);
    expect(await kv.get(`${ADAPTER_KEY_PREFIX}sql`)).toBeNull();
    // Named like a base model: its own baseModel, or a model pods were published for (it would take that model's traffic).
    r = await bad("sql", JSON.stringify({ baseModel: "sql", artifactURL: "hf://org/sql" }));
    expect(r.stderr).toMatch(/its name is its own baseModel/);
    await env.publishPod({ pod: "qwen-0", address: "127.0.0.1:9", model: "qwen", ready: false });
    r = await bad("qwen", JSON.stringify({ baseModel: MODEL, artifactURL: "hf://org/qwen" }));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/pods serve a base model of that name/);
    expect(await kv.get(`${ADAPTER_KEY_PREFIX}qwen`)).toBeNull();
    await env.publishPod({ pod: "qwen-0", address: "127.0.0.1:9", model: "qwen", ready: false, action: "remove" });
    r = await runJetroute(["config", "set-adapter", "sql", ...nats, "--json", JSON.stringify({ apiVersion: "model.aibrix.ai/v1alpha1", kind: "ModelAdapter", metadata: { name: "sql" }, spec: { baseModel: MODEL, artifactURL: "hf://org/sql-lora", podSelector: { matchLabels: { tier: "main" } }, replicas: 1 } })]);
    expect(r.stderr).toBe("");
    expect(r.stdout).toMatch(/stored adapter sql/);
  }, 120_000);

  it("the controller places it on a selected pod; gateways route to it only once loaded; adapters list shows it", async () => {
    await waitFor(() => loadedOn("sql").length === 1, 10_000, "sql loaded on one pod");
    const host = loadedOn("sql")[0] as string;
    expect(["sim-0", "sim-1"]).toContain(host); // sim-2 is tier=spare: not selected
    await waitFor(() => gw.views.pods.readyPods("sql").length === 1, 5_000, "the gateway routes sql");
    expect(gw.views.pods.readyPods("sql").map((p) => p.pod)).toEqual([host]);
    const hist = record("sql");
    expect(hist?.phase).toBe("Running");
    for (let i = 0; i < 4; i++) {
      const res = await complete("sql");
      expect(res.status).toBe(200);
      await res.text();
    }
    await waitFor(() => decisions.filter((d) => d.model === "sql").length >= 4, 5_000, "decision records");
    expect(new Set(decisions.filter((d) => d.model === "sql").map((d) => d.pick))).toEqual(new Set([host]));
    const list = await runJetroute(["adapters", "list", "--nats", env.server.url]);
    expect(list.stdout).toMatch(new RegExp(`sql\\s+${MODEL.replace(/[/.]/g, ".")}\\s+Running\\s+1\\s+1\\s+.*${host}`));
  }, 60_000);

  it("scale from zero: a request for an unplaced adapter waits in the waiting room while it loads, and the wait is recorded", async () => {
    await declare("chat", { baseModel: MODEL, artifactURL: "/adapters/chat", minReplicas: 0, maxReplicas: 2 });
    await waitFor(() => record("chat")?.phase === "Pending" && gw.views.pods.knows("chat"), 5_000, "chat declared, not placed (no demand), known to the gateway");
    expect(gw.views.pods.knows("chat")).toBe(true);
    expect(gw.views.pods.readyPods("chat")).toEqual([]);
    const t0 = Date.now();
    const res = await complete("chat");
    expect(res.status).toBe(200);
    await res.text();
    const waited = Date.now() - t0;
    expect(waited).toBeGreaterThanOrEqual(150); // the simulated load takes 150 ms
    await waitFor(() => decisions.some((d) => d.model === "chat"), 5_000, "chat decision");
    const d = decisions.find((x) => x.model === "chat") as DecisionRecord & { flow?: { waitMs: number } };
    expect(d.flow?.waitMs).toBeGreaterThan(0);
    const moves = record("chat");
    expect(loadedOn("chat").length).toBe(1);
    expect(moves?.demand).toBeDefined();
  }, 30_000);

  it("never loads beyond max_loras: what does not fit waits, the engines never refuse a load", async () => {
    // sql and chat hold one slot each; 4 slots are left for 6 wanted replicas.
    for (const n of ["a1", "a2", "a3"]) await declare(n, { baseModel: MODEL, artifactURL: `/adapters/${n}`, replicas: 2 });
    await waitFor(() => loadedOn("a1").length === 2 && loadedOn("a2").length === 2, 10_000, "a1 and a2 on two pods each");
    await ctl?.idle();
    expect(record("a3")?.phase).toBe("Pending");
    expect(record("a3")?.desired).toBe(2);
    const engines = await everyEngine();
    for (const list of Object.values(engines)) expect(list.length).toBeLessThanOrEqual(2);
    expect(Object.values(engines).flat().filter((a) => a === "a3")).toEqual([]);
    expect(ctl?.stats.failedCalls).toBe(0);
    for (const n of ["a1", "a2", "a3"]) await kv.delete(`${ADAPTER_KEY_PREFIX}${n}`);
    await waitFor(async () => Object.values(await everyEngine()).every((l) => !l.some((a) => /^a\d$/.test(a))), 10_000, "a1..a3 unloaded after deletion");
  }, 40_000);

  it("a load that keeps failing ends in a visible Failed after maxAttempts, and is not retried there", async () => {
    await declare("broken", { baseModel: MODEL, artifactURL: "s3://bucket/broken", replicas: 1, maxAttempts: 2 });
    await waitFor(() => record("broken")?.phase === "Failed", 10_000, "broken Failed");
    const r = record("broken") as AdapterPlacement;
    expect(r.failed?.[0]).toMatchObject({ attempts: 2 });
    expect(r.failed?.[0]?.error).toMatch(/404: No adapter found for s3:\/\/bucket\/broken/);
    await kv.delete(`${ADAPTER_KEY_PREFIX}broken`);
  }, 30_000);

  it("failover: the hosting pod goes, the adapter is loaded elsewhere; a pod restarted empty gets it back", async () => {
    await declare("sql", { baseModel: MODEL, artifactURL: "hf://org/sql-lora", replicas: 1 });
    await waitFor(() => loadedOn("sql").length === 1, 10_000, "sql loaded");
    const host = loadedOn("sql")[0] as string;
    const hostPod = fleet.pods.find((p) => p.name === host) as Pod;
    // The pod goes: its watcher removes it.
    await env.publishPod({ pod: host, address: hostPod.address, action: "remove" });
    await waitFor(() => loadedOn("sql").length === 1 && loadedOn("sql")[0] !== host, 10_000, "sql placed on another pod");
    const other = loadedOn("sql")[0] as string;
    await waitFor(() => gw.views.pods.readyPods("sql").map((p) => p.pod).join() === other, 5_000, "routed to the new host only");
    await env.publishPod({ pod: host, address: hostPod.address, labels: { app: "llama", tier: "main" } });
    // The new host restarts empty: it gets sql back (or sql goes to another pod), and requests keep succeeding.
    fleet.restart(other);
    await waitFor(async () => loadedOn("sql").length === 1 && (await engineAdapters(fleet.pods.find((p) => p.name === loadedOn("sql")[0]) as Pod)).includes("sql"), 10_000, "sql loaded again after the restart");
    const res = await complete("sql");
    expect(res.status).toBe(200);
    await res.text();
  }, 40_000);

  it("deleted: unloaded everywhere, and the gateway answers 404 for it", async () => {
    await kv.delete(`${ADAPTER_KEY_PREFIX}sql`);
    await waitFor(async () => Object.values(await everyEngine()).every((l) => !l.includes("sql")), 10_000, "sql unloaded everywhere");
    await waitFor(() => !gw.views.pods.knows("sql"), 5_000, "the gateway forgot sql");
    const res = await complete("sql");
    expect(res.status).toBe(404);
  }, 30_000);

  it("a controller killed mid-placement loses nothing: the next one finishes the placement", async () => {
    await ctl?.close();
    ctl = await startAdapterController({ nats: env.server.url, prefix: "jr", id: "ctl-dying", tickMs: 100, maxLoras: 2, unloadGraceMs: 100, retryDelayMs: 20, log: quietLog });
    await ctl.whenReady();
    await declare("late", { baseModel: MODEL, artifactURL: "/adapters/late", replicas: 2 });
    await waitFor(() => (record("late")?.pods ?? []).some((p) => p.state === "loading"), 10_000, "late loading");
    // Killed while the engine loads (150 ms): no record of the outcome is published.
    await ctl.nats.nc.close();
    await ctl.close().catch(() => undefined);
    // What it was doing is only in its records: the engines hold nothing of it yet.
    expect(Object.values(await everyEngine()).flat()).not.toContain("late");
    ctl = await startController({ id: "ctl-next" });
    await ctl.whenReady();
    await waitFor(() => loadedOn("late").length === 2 && record("late")?.controller === "ctl-next", 10_000, "late on two pods, recorded by the next controller");
    const engines = await everyEngine();
    expect(Object.values(engines).filter((l) => l.includes("late")).length, JSON.stringify({ engines, rec: record("late") })).toBe(2);
    await waitFor(() => gw.views.pods.readyPods("late").length === 2, 5_000, "routable on both");
  }, 40_000);
});

describe("ModelAdapter through kubectl: apply, status subresource, delete", () => {
  let env: TestEnv;
  let fleet: SimFleet;
  let kube: KubeStandin;
  let ctl: AdapterControllerHandle;
  let kubeconfig = "";
  const kubectl = async (...args: string[]) => (await run("kubectl", args, { env: { ...process.env, KUBECONFIG: kubeconfig }, timeout: 20_000 })).stdout.trim();

  beforeAll(async () => {
    env = await startTestEnv();
    fleet = await startSimFleet({ pods: 2, model: MODEL, lora: { maxLoras: 2 }, logger: quietLog });
    for (const p of fleet.pods) await env.publishPod({ pod: p.name, address: p.address, labels: { app: "llama" } });
    kube = await new KubeStandin({ bookmarkIntervalMs: 200 }).start();
    const dir = mkdtempSync(path.join(tmpdir(), "jr-adapters-"));
    kubeconfig = path.join(dir, "kubeconfig");
    kube.writeKubeconfig(kubeconfig);
    const log = quietLog;
    ctl = await startAdapterController({ nats: env.server.url, prefix: "jr", id: "ctl-kube", tickMs: 100, maxLoras: 2, unloadGraceMs: 50, retryDelayMs: 20, kube: pollKubeDeclarations(loadKubeConfig(kubeconfig), { pollMs: 200, log }), log });
    await ctl.whenReady();
  }, 60_000);
  afterAll(async () => {
    await ctl?.close();
    await fleet?.close();
    await kube?.stop();
    await env?.stop();
  });

  it("kubectl applies an AIBrix ModelAdapter; the controller loads it and writes phase, instances and conditions to its status", async () => {
    const file = path.join(path.dirname(kubeconfig), "ma.yaml");
    writeFileSync(file, `apiVersion: model.aibrix.ai/v1alpha1
kind: ModelAdapter
metadata:
  name: sql-lora
  namespace: default
spec:
  baseModel: ${MODEL}
  artifactURL: huggingface://org/sql-lora
  podSelector:
    matchLabels:
      app: llama
  replicas: 1
`);
    expect(await kubectl("apply", "--validate=false", "-f", file)).toBe("modeladapter.model.aibrix.ai/sql-lora created");
    await waitFor(async () => (await kubectl("get", "modeladapter", "sql-lora", "-o", "jsonpath={.status.phase}")) === "Running", 15_000, "status Running");
    const instances = await kubectl("get", "ma", "sql-lora", "-o", "jsonpath={.status.instances[*]} {.status.readyReplicas} {.status.desiredReplicas}");
    expect(instances).toMatch(/^sim-\d 1 1$|^\S+ 1 1$/);
    const pod = instances.split(" ")[0] as string;
    const models = (await (await fetch(`http://${fleet.pods.find((p) => p.name === pod)?.address}/v1/models`)).json()) as { data: Array<{ id: string; root?: string }> };
    expect(models.data.find((m) => m.id === "sql-lora")?.root).toBe("org/sql-lora");
    expect(await kubectl("get", "ma", "sql-lora", "-o", 'jsonpath={range .status.conditions[*]}{.type}={.status}/{.reason} {end}')).toBe("Initialized=True/Validated Scheduled=True/Placed Ready=True/Loaded");
    // The spec is the user's: a write to the object does not touch status (the status subresource does).
    await kubectl("patch", "ma", "sql-lora", "--type=merge", "-p", '{"status":{"phase":"Pending"}}');
    expect(await kubectl("get", "ma", "sql-lora", "-o", "jsonpath={.status.phase}")).toBe("Running");
  }, 40_000);

  it("an invalid ModelAdapter gets a Failed status naming the field; delete unloads the adapter", async () => {
    const file = path.join(path.dirname(kubeconfig), "bad.yaml");
    writeFileSync(file, `apiVersion: model.aibrix.ai/v1alpha1
kind: ModelAdapter
metadata:
  name: bad-lora
spec:
  baseModel: ${MODEL}
  artifactURL: ftp://nowhere/x
`);
    await kubectl("apply", "--validate=false", "-f", file);
    await waitFor(async () => (await kubectl("get", "ma", "bad-lora", "-o", "jsonpath={.status.phase}")) === "Failed", 15_000, "bad-lora Failed");
    expect(await kubectl("get", "ma", "bad-lora", "-o", "jsonpath={.status.conditions[0].reason}: {.status.conditions[0].message}")).toMatch(/^InvalidSpec: \/artifactURL: must start with one of/);
    expect(await kubectl("delete", "ma", "sql-lora")).toBe('modeladapter.model.aibrix.ai "sql-lora" deleted');
    await waitFor(async () => {
      const lists = await Promise.all(fleet.pods.map(async (p) => ((await (await fetch(`http://${p.address}/v1/models`)).json()) as { data: Array<{ id: string }> }).data.map((m) => m.id)));
      return lists.every((l) => !l.includes("sql-lora"));
    }, 15_000, "sql-lora unloaded");
    await waitFor(() => !ctl.records().has("sql-lora"), 5_000, "its record deleted");
  }, 40_000);
});

describe("signed adapter declarations: with the operator's keys, only signed ones are placed", () => {
  let env: TestEnv;
  beforeAll(async () => {
    env = await startTestEnv();
  }, 60_000);
  afterAll(async () => {
    await env?.stop();
  });

  it("unsigned and wrongly signed declarations are refused and counted; a refused update keeps the previous value", async () => {
    const operator = generateSigningKeyPair();
    const other = generateSigningKeyPair();
    const bucket = configBucketName("jr");
    const kv = await new Kvm(env.nats.js).open(bucket);
    const stats = { refusedSignature: 0 };
    const src = await watchConfigDeclarations(env.nats, "jr", quietLog, { operator: new RecordVerifier(operator.publicKeyPem) }, stats);
    try {
      const key = (n: string) => `${ADAPTER_KEY_PREFIX}${encodeToken(n)}`;
      const spec = (n: string) => ({ baseModel: MODEL, artifactURL: `hf://org/${n}` });
      const signed = (pem: string, n: string, s: object) => JSON.stringify(new RecordSigner(pem).sign(configRecordSubject(bucket, key(n)), s, Date.now()));
      await kv.put(key("good"), signed(operator.privateKeyPem, "good", spec("good")));
      await kv.put(key("plain"), JSON.stringify(spec("plain")));
      await kv.put(key("forged"), signed(other.privateKeyPem, "forged", spec("forged")));
      await waitFor(() => src.current().has("good") && stats.refusedSignature === 2, 5_000, "the signed declaration taken, two refused");
      expect(src.current().get("good")).toMatchObject({ spec: spec("good") });
      expect(src.current().get("good")?.error).toBeUndefined();
      expect([...src.current().keys()]).toEqual(["good"]);
      // An unsigned overwrite of a signed declaration: refused, the signed spec stays.
      await kv.put(key("good"), JSON.stringify({ baseModel: MODEL, artifactURL: "hf://evil/weights" }));
      await waitFor(() => stats.refusedSignature === 3, 5_000, "the unsigned update refused");
      expect(src.current().get("good")?.spec?.artifactURL).toBe("hf://org/good");
    } finally {
      src.stop();
    }
  }, 60_000);
});
