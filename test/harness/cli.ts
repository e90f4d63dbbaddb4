/**
 * Runs the built CLI (bin/jetroute.js -> dist/) or a bench script to its end, as an operator would:
 * exit code, stdout and stderr. NATS_URL is blanked so only the flags name a server.
 */
import { spawn } from "node:child_process";
import path from "node:path";
import { cliPath } from "../../services/shared/processes.js";

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

function runScript(script: string, args: readonly string[], env: NodeJS.ProcessEnv): Promise<CliRun> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"], env });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d: Buffer) => {
      stdout += d.toString();
    });
    p.stderr.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    p.once("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

/** `jetroute <args>`. */
export function runJetroute(args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<CliRun> {
  return runScript(cliPath(), args, { ...process.env, NATS_URL: "", ...env });
}

/** `node dist/loadtest/bench.js <args>` (the built bench runner). */
export function runBench(args: readonly string[]): Promise<CliRun> {
  return runScript(path.join(path.dirname(path.dirname(cliPath())), "loadtest", "bench.js"), args, process.env);
}
