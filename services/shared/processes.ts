/**
 * Child processes of the `jetroute` binary, for the demo, process-level tests and benchmarks:
 * stdout JSON lines are collected (services print their endpoints that way), stderr goes to a
 * log file when asked, and `stop()` sends SIGTERM then SIGKILL after a grace period.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createWriteStream, existsSync, type WriteStream } from "node:fs";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** Path of the compiled CLI (dist/services/cli.js), whether running from dist/ or from sources. */
export function cliPath(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const distRoot = here.includes(`${path.sep}dist${path.sep}`) ? path.resolve(here, "..", "..") : path.resolve(here, "..", "..", "dist");
  const p = path.join(distRoot, "services", "cli.js");
  if (!existsSync(p)) throw new Error(`${p} is missing: run \`npm run build\` first`);
  return p;
}

export interface ServiceProcess {
  name: string;
  proc: ChildProcess;
  /** Parsed JSON lines printed on stdout so far. */
  readonly jsonLines: unknown[];
  /** Resolves with the first stdout JSON line matching `pred`. */
  waitForLine<T = Record<string, unknown>>(pred: (v: T) => boolean, timeoutMs?: number): Promise<T>;
  stop(graceMs?: number): Promise<void>;
  kill(): Promise<void>;
  readonly exited: Promise<number | null>;
}

export interface SpawnOptions {
  logFile?: string;
  env?: NodeJS.ProcessEnv;
  /** Echo stderr to this process's stderr (debugging). */
  inheritStderr?: boolean;
  /** Flags for node itself, before the CLI (e.g. `--cpu-prof`, which NODE_OPTIONS refuses). */
  nodeArgs?: readonly string[];
}

export function spawnJetroute(name: string, args: string[], opts: SpawnOptions = {}): ServiceProcess {
  const proc = spawn(process.execPath, [...(opts.nodeArgs ?? []), cliPath(), ...args], {
    stdio: ["ignore", "pipe", opts.inheritStderr ? "inherit" : "pipe"],
    env: { ...process.env, ...opts.env },
  });
  let log: WriteStream | undefined;
  if (opts.logFile) log = createWriteStream(opts.logFile, { flags: "a" });
  let stderrTail = "";
  proc.stderr?.on("data", (d: Buffer) => {
    log?.write(d);
    stderrTail = (stderrTail + d.toString()).slice(-4000);
  });
  const jsonLines: unknown[] = [];
  const waiters: Array<{ pred: (v: unknown) => boolean; resolve: (v: unknown) => void }> = [];
  if (proc.stdout) {
    createInterface({ input: proc.stdout }).on("line", (line) => {
      log?.write(`${line}\n`);
      let v: unknown;
      try {
        v = JSON.parse(line);
      } catch {
        return;
      }
      jsonLines.push(v);
      for (const w of [...waiters]) {
        if (w.pred(v)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(v);
        }
      }
    });
  }
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  exited.then(() => log?.end());
  const alive = () => proc.exitCode === null && proc.signalCode === null;
  return {
    name,
    proc,
    jsonLines,
    exited,
    waitForLine<T>(pred: (v: T) => boolean, timeoutMs = 15_000): Promise<T> {
      const hit = jsonLines.find((v) => pred(v as T));
      if (hit) return Promise.resolve(hit as T);
      return new Promise<T>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`${name}: no matching output within ${timeoutMs} ms; stderr: ${stderrTail}`)), timeoutMs);
        exited.then((code) => {
          clearTimeout(t);
          reject(new Error(`${name} exited (${code}) before printing what was expected; stderr: ${stderrTail}`));
        });
        waiters.push({
          pred: (v) => pred(v as T),
          resolve: (v) => {
            clearTimeout(t);
            resolve(v as T);
          },
        });
      });
    },
    async stop(graceMs = 5_000) {
      if (!alive()) return;
      proc.kill("SIGTERM");
      const t = setTimeout(() => alive() && proc.kill("SIGKILL"), graceMs);
      await exited;
      clearTimeout(t);
    },
    async kill() {
      if (!alive()) return;
      proc.kill("SIGKILL");
      await exited;
    },
  };
}
