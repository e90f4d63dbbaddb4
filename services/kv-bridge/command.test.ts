import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { Command, CommanderError } from "commander";
import { describe, expect, it } from "vitest";
import type { KvBatch } from "../../schemas/events.js";
import { startTestEnv, waitFor } from "../../test/harness/env.js";
import { registerKvBridgeCommand } from "./command.js";
import { TestEngine } from "./test-engine.js";

async function runInProcess(args: string[]): Promise<{ error: CommanderError | undefined; stderr: string }> {
  let stderr = "";
  const program = new Command("jetroute").exitOverride().configureOutput({ writeErr: (s) => (stderr += s), writeOut: () => {} });
  registerKvBridgeCommand(program);
  try {
    await program.parseAsync(["kv-bridge", ...args], { from: "user" });
    return { error: undefined, stderr };
  } catch (err) {
    if (err instanceof CommanderError) return { error: err, stderr };
    throw err;
  }
}

describe("jetroute kv-bridge flags", () => {
  it.each([
    [["--shard", "2/2"], "--shard"],
    [["--shard", "one"], "--shard"],
    [["--replay-timeout-ms", "abc"], "--replay-timeout-ms"],
    [["--max-frame-bytes", "10"], "--max-frame-bytes"],
    [["--window", "0"], "--window"],
  ])("rejects %j with an error naming %s", async (args, name) => {
    const { error, stderr } = await runInProcess(args);
    expect(error?.exitCode).toBe(1);
    expect(stderr).toContain(name);
  });
});

describe("jetroute kv-bridge process", () => {
  it("prints one JSON line, bridges a pod's batches, and exits 0 on SIGTERM", async () => {
    const env = await startTestEnv();
    const engine = await new TestEngine().start();
    const script = [
      'import { Command } from "commander";',
      'import { registerKvBridgeCommand } from "./services/kv-bridge/command.ts";',
      'const program = new Command("jetroute");',
      "registerKvBridgeCommand(program);",
      'await program.parseAsync(process.argv.slice(1), { from: "user" });',
    ].join("\n");
    const child = spawn(
      process.execPath,
      ["--import", "tsx", "--input-type=module", "-e", script, "--", "kv-bridge", "--nats", env.server.url, "--shard", "0/1", "--replay-timeout-ms", "200"],
      { cwd: process.cwd(), stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, JETROUTE_LOG_LEVEL: "warn" } },
    );
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
      expect(JSON.parse((await lines.next()).value as string)).toEqual({ kvBridge: "0/1", prefix: "jr", nats: [env.server.url] });
      const got: KvBatch[] = [];
      const sub = env.nats.nc.subscribe(env.subjects.all("kv"), { callback: (_e, m) => void got.push(m.json<KvBatch>()) });
      await env.publishPod({ pod: "cli-pod", address: "127.0.0.1:9", kvEvents: { endpoint: engine.endpoint, replayEndpoint: engine.replayEndpoint, topic: engine.topic } });
      await engine.publish([{ type: "BlockStored", hashes: [1n], parent: null, tokens: [1, 2], blockSize: 2 }]);
      await waitFor(() => got.length > 0, 5_000, "a batch from the bridge process");
      expect(got[0]).toMatchObject({ type: "kv", pod: "cli-pod", seq: 0 });
      sub.unsubscribe();
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
    } finally {
      child.kill("SIGKILL");
      await engine.close();
      await env.stop();
    }
  });
});
