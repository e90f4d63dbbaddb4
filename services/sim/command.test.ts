import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { Value } from "@sinclair/typebox/value";
import { Command, CommanderError } from "commander";
import { describe, expect, it } from "vitest";
import { KvEventsEndpoint } from "../../schemas/events.js";
import { StaticPod } from "../pod-watcher/static-pods.js";
import { registerSimCommand } from "./command.js";

/** Runs `sim` in-process with commander's exits turned into exceptions; returns what it printed to stderr. */
async function runInProcess(args: string[]): Promise<{ error: CommanderError | undefined; stderr: string }> {
  let stderr = "";
  const program = new Command("jetroute")
    .exitOverride()
    .configureOutput({ writeErr: (s) => (stderr += s), writeOut: () => {} });
  registerSimCommand(program);
  try {
    await program.parseAsync(["sim", ...args], { from: "user" });
    return { error: undefined, stderr };
  } catch (err) {
    if (err instanceof CommanderError) return { error: err, stderr };
    throw err;
  }
}

describe("jetroute sim flags", () => {
  it.each([
    [["--pods", "0"], "--pods"],
    [["--pods", "two"], "--pods"],
    [["--engine", "tgi"], "--engine"],
    [["--time-scale", "0"], "--time-scale"],
    [["--prefill-ms-per-token", "-1"], "--prefill-ms-per-token"],
    [["--base-port", "70000"], "--base-port"],
    [["--max-model-len", "999999", "--pods", "1"], "--max-model-len"],
    [["--max-batch", "64", "--max-num-batched-tokens", "32", "--pods", "1"], "--max-num-batched-tokens"],
    [["--kv-events-encoding", "json"], "--kv-events-encoding"],
    [["--kv-events-replay-layout", "map"], "--kv-events-replay-layout"],
    [["--kv-cache-blocks", "64", "--kv-capacity-tokens", "1024", "--pods", "1"], "--kv-cache-blocks"],
    [["--role", "both"], "--role"],
    [["--roleset", "a b", "--pods", "1"], "--roleset"],
    [["--disagg-timeout-ms", "-5"], "--disagg-timeout-ms"],
    [["--bootstrap-base-port", "65535", "--pods", "2"], "--bootstrap-base-port"],
    [["--scheduling-policy", "edf"], "--scheduling-policy"],
    [["--priority-scheduling-preemption-threshold", "-1"], "--priority-scheduling-preemption-threshold"],
  ])("rejects %j with an error naming %s", async (args, name) => {
    const { error, stderr } = await runInProcess(args);
    expect(error?.exitCode).toBe(1);
    expect(stderr).toContain(name);
  });
});

describe("jetroute sim process", () => {
  it("prints one JSON line per pod, serves them, and exits 0 on SIGTERM", async () => {
    const script = [
      'import { Command } from "commander";',
      'import { registerSimCommand } from "./services/sim/command.ts";',
      'const program = new Command("jetroute");',
      "registerSimCommand(program);",
      'await program.parseAsync(process.argv.slice(1), { from: "user" });',
    ].join("\n");
    const child = spawn(
      process.execPath,
      ["--import", "tsx", "--input-type=module", "-e", script, "--", "sim", "--pods", "2", "--engine", "vllm,sglang", "--time-scale", "50", "--role", "decode,prefill", "--roleset", "rs-1", "--scheduling-policy", "priority,fcfs"],
      { cwd: process.cwd(), stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, JETROUTE_LOG_LEVEL: "warn" } },
    );
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      const pods: Array<{ pod: string; address: string; engine: string; model: string; kvEvents?: unknown; role?: string; bootstrapPort?: number }> = [];
      for await (const line of createInterface({ input: child.stdout })) {
        const parsed = JSON.parse(line);
        if ("pod" in parsed) pods.push(parsed);
        if (pods.length === 2) break;
      }
      expect(pods.map((p) => [p.pod, p.engine, p.model])).toEqual([
        ["sim-0", "vllm", "demo/llama-3.1-8b"],
        ["sim-1", "sglang", "demo/llama-3.1-8b"],
      ]);
      // The vLLM pod's line carries the pod event schema's kvEvents field; SGLang pods publish none.
      expect(pods[0]?.kvEvents).toEqual({
        endpoint: expect.stringMatching(/^tcp:\/\/127\.0\.0\.1:\d+$/),
        replayEndpoint: expect.stringMatching(/^tcp:\/\/127\.0\.0\.1:\d+$/),
        topic: "kv-events",
      });
      expect(Value.Check(KvEventsEndpoint, pods[0]?.kvEvents)).toBe(true);
      expect(pods[1]).not.toHaveProperty("kvEvents");
      // P/D fields: role and roleset on every line, bootstrapPort on the SGLang prefill pod only.
      expect(pods.map((p) => [p.role, (p as { roleset?: string }).roleset])).toEqual([
        ["decode", "rs-1"],
        ["prefill", "rs-1"],
      ]);
      expect(pods[0]).not.toHaveProperty("bootstrapPort");
      expect(pods[1]?.bootstrapPort).toBeGreaterThan(0);
      // Priority scheduling is reported on the pod that runs it only.
      expect(pods.map((p) => (p as { schedulingPolicy?: string }).schedulingPolicy)).toEqual(["priority", undefined]);
      // A line is a static pod list entry once `pod` is called `name`.
      for (const { pod, ...rest } of pods) expect(Value.Check(StaticPod, { name: pod, ...rest })).toBe(true);
      for (const p of pods) expect((await fetch(`http://${p.address}/health`)).status).toBe(200);
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      await expect(fetch(`http://${pods[0]?.address}/health`)).rejects.toThrow();
    } finally {
      child.kill("SIGKILL");
    }
  });
});
