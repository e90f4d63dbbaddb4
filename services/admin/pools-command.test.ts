/**
 * `jetroute config set-pool | list-pools | delete-pool`, `streams apply --pool` and the pool flags
 * of the long-running commands, as an operator runs them: the built CLI (bin/jetroute.js ->
 * dist/) against a real nats-server, checked by exit code, by what it prints, and by what it left
 * in JetStream.
 */
import { spawn } from "node:child_process";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { POOL_KEY_PREFIX } from "../../schemas/config.js";
import { configBucketName, streamName } from "../../streams/definitions.js";
import { namespaceOf } from "../../streams/pools.js";
import { connectNats, type NatsHandles } from "../shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../shared/nats-server.js";
import { cliPath } from "../shared/processes.js";

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `jetroute <args>` to its end (a command that does not end fails the test by its timeout). */
function jetroute(args: string[], timeoutMs = 20_000): Promise<Run> {
  return new Promise((resolve, reject) => {
    const proc = spawn(process.execPath, [cliPath(), ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NATS_URL: "" } });
    let stdout = "";
    let stderr = "";
    proc.stdout.on("data", (d: Buffer) => {
      stdout += d.toString();
    });
    proc.stderr.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`jetroute ${args.join(" ")} did not end within ${timeoutMs} ms; stderr: ${stderr.slice(-2000)}`));
    }, timeoutMs);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const POOL_STREAMS = ["PODS", "LOAD", "KV", "CHARGES", "DECISIONS", "DLQ", "AUTOSCALE", "ADAPTERS"] as const;

describe("jetroute config set-pool / list-pools / delete-pool, streams apply --pool (CLI on a real nats-server)", () => {
  let server: NatsServerHandle;
  let nats: NatsHandles;
  const cli = (...args: string[]) => jetroute([...args, "--nats", server.url]);
  const streamNames = async () => {
    const names: string[] = [];
    for await (const s of nats.jsm.streams.list()) names.push(s.config.name);
    return names.sort();
  };
  const poolEntry = async (pool: string) => {
    const e = await (await new Kvm(nats.nc).open(configBucketName("jr"))).get(`${POOL_KEY_PREFIX}${pool}`);
    return e?.operation === "PUT" ? e.json() : undefined;
  };

  beforeAll(async () => {
    // A bare server: no `streams apply` has run, as on a fresh install where the pool Job may come first.
    server = await startNatsServer();
    nats = await connectNats(server.url);
  });
  afterAll(async () => {
    await nats?.nc.close();
    await server?.stop();
  });

  it("config commands on a NATS without the config bucket say what to run, instead of `stream not found`", async () => {
    const r = await cli("config", "list-pools");
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("the config bucket jr-config does not exist: run `jetroute streams apply` first");
  });

  it("set-pool on a fresh NATS creates the pool's streams and buckets and the config bucket, and stores the entry", async () => {
    const r = await cli("config", "set-pool", "chat", "--models", "org/chat-8b, org/chat-70b", "--description", "chat assistants");
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    const ns = namespaceOf("jr", "chat");
    for (const key of POOL_STREAMS) expect(r.stdout).toContain(`created   ${streamName(ns.prefix, key)}`);
    expect(r.stdout).toContain("created   KV_jr-config");
    expect(r.stdout).toMatch(/stored pool chat: 2 models \(revision \d+\)/);
    const names = await streamNames();
    for (const key of POOL_STREAMS) expect(names).toContain(`JR_POOL_CHAT_${key}`);
    // The pool's own lease and snapshot buckets; the config bucket is the base prefix's, shared.
    expect(names).toEqual(expect.arrayContaining(["KV_jr-config", "KV_jr_pool_chat-leases", "OBJ_jr_pool_chat-snapshots"]));
    expect(names.some((n) => n.startsWith("KV_jr_pool_chat-config"))).toBe(false);
    // Only the pool's namespace: the unpooled streams were not created by it.
    expect(names).not.toContain("JR_PODS");
    // The pool's streams capture its subjects.
    expect((await nats.jsm.streams.info("JR_POOL_CHAT_CHARGES")).config.subjects).toEqual(expect.arrayContaining(["jr.pool.chat.charges.>"]));
    expect(await poolEntry("chat")).toEqual({ models: ["org/chat-8b", "org/chat-70b"], description: "chat assistants" });
  });

  it("a second pool listing a model of the first is refused with exit 2, naming that pool, and creates nothing", async () => {
    const before = await streamNames();
    const r = await cli("config", "set-pool", "code", "--models", "org/coder-7b,org/chat-70b");
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('"org/chat-70b" already in pool "chat"');
    expect(r.stderr).toContain("jetroute config set-pool chat --models");
    expect(await poolEntry("code")).toBeUndefined();
    expect(await streamNames()).toEqual(before);
    // Without the clash the same pool is accepted.
    const ok = await cli("config", "set-pool", "code", "--models", "org/coder-7b");
    expect(ok.code).toBe(0);
    expect(await poolEntry("code")).toEqual({ models: ["org/coder-7b"] });
  });

  it("set-pool of an existing pool replaces its models (its own models are no clash) and leaves its streams as they are", async () => {
    const r = await cli("config", "set-pool", "chat", "--models", "org/chat-8b,org/chat-70b,org/chat-405b", "--description", "chat assistants");
    expect(r.code).toBe(0);
    expect(r.stdout).not.toContain("created");
    expect(r.stdout).toMatch(/stored pool chat: 3 models/);
  });

  it("list-pools prints every pool, by name, one JSON line each", async () => {
    const r = await cli("config", "list-pools");
    expect(r.code).toBe(0);
    expect(
      r.stdout
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l)),
    ).toEqual([
      { pool: "chat", models: ["org/chat-8b", "org/chat-70b", "org/chat-405b"], description: "chat assistants" },
      { pool: "code", models: ["org/coder-7b"] },
    ]);
  });

  it("list-pools shows an entry that does not validate instead of failing on it", async () => {
    const kv = await new Kvm(nats.nc).open(configBucketName("jr"));
    await kv.put(`${POOL_KEY_PREFIX}broken`, "{not json");
    const r = await cli("config", "list-pools");
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('{"pool":"broken","invalid":"not JSON"}');
    expect(r.stdout).toContain('"pool":"chat"');
    await kv.delete(`${POOL_KEY_PREFIX}broken`);
  });

  it("invalid pool names are refused with a message saying what a pool name is, by every command that takes one", async () => {
    const rule = "a pool name is 1-32 lower-case letters, digits and inner dashes";
    const setPool = await cli("config", "set-pool", "BAD", "--models", "m");
    expect(setPool.code).toBe(2);
    expect(setPool.stderr).toContain(`invalid pool: ${rule}, got "BAD"`);
    const del = await cli("config", "delete-pool", "BAD");
    expect(del.code).toBe(2);
    expect(del.stderr).toContain(rule);
    const cases = [
      ["streams", "apply", "--pool", "BAD"],
      ["streams", "apply", "--pool", "a.b"],
      ["gateway", "--pool", "BAD", "--port", "0", "--admin-port", "-1"],
      ["pod-watcher", "--pool", "-x", "--static", "/nonexistent"],
      ["metrics-scraper", "--pool", "x".repeat(33)],
      ["kv-bridge", "--pool", "BAD"],
    ];
    const runs = await Promise.all(cases.map((args) => cli(...args)));
    for (const [i, args] of cases.entries()) {
      const r = runs[i] as Run;
      expect(r.code, args.join(" ")).not.toBe(0);
      expect(r.stderr, args.join(" ")).toContain("option '--pool <name>' argument");
      expect(r.stderr, args.join(" ")).toContain(rule);
    }
    expect((await streamNames()).filter((n) => /BAD|_A\.B/i.test(n))).toEqual([]);
    // Eight CLI processes, six of them at once: each a Node start-up, slow on a loaded 2-core host.
  }, 90_000);

  it("--models without --pool is refused by the gateway and the pod-watcher", async () => {
    const gw = await cli("gateway", "--models", "x", "--port", "0", "--admin-port", "-1");
    expect(gw.code).not.toBe(0);
    expect(gw.stderr).toContain("--models names a pool's models: it needs --pool");
    const pw = await cli("pod-watcher", "--models", "x", "--static", "/nonexistent");
    expect(pw.code).toBe(2);
    expect(`${pw.stdout}${pw.stderr}`).toContain("--models names a pool's models: it needs --pool");
  });

  it("streams apply --pool is idempotent: a rerun changes nothing", async () => {
    const first = await cli("streams", "apply", "--pool", "code");
    expect(first.code).toBe(0);
    const again = await cli("streams", "apply", "--pool", "code");
    expect(again.code).toBe(0);
    const lines = again.stdout.trim().split("\n");
    expect(lines.length).toBe(POOL_STREAMS.length + 3); // the streams, the shared config bucket, leases, snapshots
    for (const l of lines) expect(l).toMatch(/^unchanged /);
    for (const key of POOL_STREAMS) expect(again.stdout).toContain(`unchanged JR_POOL_CODE_${key}`);
    expect(again.stdout).toContain("unchanged KV_jr-config");
    // A pooled apply leaves the pool assignments alone.
    expect(await poolEntry("code")).toEqual({ models: ["org/coder-7b"] });
  });

  it("delete-pool removes the entry (the streams stay); a pool that is not there is an error", async () => {
    const r = await cli("config", "delete-pool", "code");
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("deleted pool code");
    expect(await poolEntry("code")).toBeUndefined();
    expect(await streamNames()).toContain("JR_POOL_CODE_PODS");
    const list = await cli("config", "list-pools");
    expect(list.stdout).not.toContain('"pool":"code"');
    const again = await cli("config", "delete-pool", "code");
    expect(again.code).toBe(1);
    expect(again.stderr).toContain("no pool code");
    // Its model is free again for another pool.
    expect((await cli("config", "set-pool", "chat", "--models", "org/chat-8b,org/coder-7b")).code).toBe(0);
  });
});
