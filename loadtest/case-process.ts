/**
 * A benchmark case in a process of its own, under a time limit.
 *
 * The process leads a process group (it is spawned detached), and everything it starts — gateway
 * processes, nats-servers, the kv-bridge — belongs to that group: past the limit the whole group
 * gets SIGKILL, and so does whatever a case that finished on time left running. Its temporary
 * files (nats-server stores) go to a directory of its own (`TMPDIR`), removed afterwards, since a
 * killed nats-server cannot remove its store. The case prints its result as its last JSON line on
 * stdout; its stderr (progress) is passed through.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";

export interface CaseProcessOutcome {
  /** The last JSON object the case printed on stdout (undefined: none, or it was stopped). */
  result?: Record<string, unknown>;
  timedOut: boolean;
  elapsedMs: number;
  exitCode: number | null;
  /** Live processes of the group when it was stopped at the limit (the case's own included). */
  killed: number;
}

export interface CaseProcessOptions {
  limitMs: number;
  /** Names the temp directory. */
  name: string;
  /** Called with the group's id once the case process runs (tests check it is empty afterwards). */
  onStart?: (pgid: number) => void;
}

/** Live (non-zombie) members of a process group, from /proc (Linux; elsewhere always empty). */
export function processGroupMembers(pgid: number): number[] {
  let pids: string[];
  try {
    pids = readdirSync("/proc").filter((d) => /^\d+$/.test(d));
  } catch {
    return [];
  }
  const out: number[] = [];
  for (const pid of pids) {
    try {
      // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(pgrp) === pgid && state !== "Z") out.push(Number(pid));
    } catch {
      /* exited meanwhile */
    }
  }
  return out;
}

function killGroup(pgid: number): void {
  try {
    process.kill(-pgid, "SIGKILL");
  } catch {
    /* nobody left */
  }
}

async function groupGone(pgid: number, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  while (processGroupMembers(pgid).length > 0) {
    if (performance.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
  return true;
}

/** The group of the case running now, for the signal handlers of `stopCasesOnSignals`. */
const running = new Set<number>();

/**
 * While `run` runs, SIGINT and SIGTERM kill the running case's group before this process exits
 * (detached groups would otherwise outlive an interrupted benchmark).
 */
export async function stopCasesOnSignals<T>(run: () => Promise<T>): Promise<T> {
  const onSignal = (signal: NodeJS.Signals) => {
    for (const pgid of running) killGroup(pgid);
    process.exit(signal === "SIGINT" ? 130 : 143);
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  try {
    return await run();
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

export async function runCaseProcess(script: string, args: string[], o: CaseProcessOptions): Promise<CaseProcessOutcome> {
  const tmp = mkdtempSync(path.join(os.tmpdir(), `jetroute-${o.name.replace(/[^A-Za-z0-9_-]/g, "_")}-`));
  const t0 = performance.now();
  const child = spawn(process.execPath, [script, ...args], { detached: true, stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, TMPDIR: tmp } });
  const pgid = child.pid as number;
  running.add(pgid);
  o.onStart?.(pgid);
  let last: Record<string, unknown> | undefined;
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  lines.on("line", (line) => {
    try {
      const v = JSON.parse(line) as unknown;
      if (v && typeof v === "object" && !Array.isArray(v)) last = v as Record<string, unknown>;
    } catch {
      /* not a result line */
    }
  });
  const exited = new Promise<number | null>((resolve) => {
    child.once("exit", (code) => resolve(code));
    child.once("error", () => resolve(null));
  });
  // `close`: its stdout read to the end too.
  const closed = new Promise<void>((resolve) => child.once("close", () => resolve()));
  let timedOut = false;
  let killed = 0;
  const timer = setTimeout(() => {
    timedOut = true;
    killed = processGroupMembers(pgid).length;
    killGroup(pgid);
  }, o.limitMs);
  const exitCode = await exited;
  clearTimeout(timer);
  const elapsedMs = performance.now() - t0;
  // Whatever the case left behind (a server its cleanup could not stop) goes with it.
  killGroup(pgid);
  let closeTimer: NodeJS.Timeout | undefined;
  await Promise.race([closed, new Promise((r) => (closeTimer = setTimeout(r, 5_000)))]);
  clearTimeout(closeTimer);
  await groupGone(pgid, 10_000);
  running.delete(pgid);
  rmSync(tmp, { recursive: true, force: true });
  return { ...(timedOut ? {} : last ? { result: last } : {}), timedOut, elapsedMs, exitCode, killed };
}
