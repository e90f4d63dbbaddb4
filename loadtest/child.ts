/** Running benchmark pieces as child processes of node, each with its own event loop. */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { cliPath } from "../services/shared/processes.js";

const here = path.dirname(fileURLToPath(import.meta.url));

/** Absolute path of a compiled loadtest module (benchmarks always run from dist/). */
export function loadtestScript(name: string): string {
  return path.join(here, name);
}

/** A loadtest module, compiled (under vitest the benches run from sources; their child processes never do). */
export function compiledScript(name: string): string {
  const beside = loadtestScript(name);
  if (existsSync(beside)) return beside;
  return path.join(path.dirname(path.dirname(cliPath())), "loadtest", name);
}

/** The ext_proc load generator, compiled. */
export function generatorScript(): string {
  return compiledScript("extproc-load.js");
}

export interface Child {
  proc: ChildProcess;
  firstJson: Promise<Record<string, unknown>>;
  stop(): Promise<void>;
}

export function runNode(script: string, args: string[] = []): Child {
  const proc = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr?.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const firstJson = new Promise<Record<string, unknown>>((resolve, reject) => {
    const rl = createInterface({ input: proc.stdout as NodeJS.ReadableStream });
    rl.on("line", (line) => {
      try {
        resolve(JSON.parse(line) as Record<string, unknown>);
      } catch {
        /* not our line */
      }
    });
    proc.once("exit", (code) => reject(new Error(`${path.basename(script)} exited ${code}: ${stderr}`)));
  });
  return {
    proc,
    firstJson,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 5_000);
      await exited;
      clearTimeout(t);
    },
  };
}
